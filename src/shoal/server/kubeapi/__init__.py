"""The Kubernetes REST API over Shoal's objects (docs/KUBERNETES-API.md)."""
