"""Kubernetes-style serving objects: store, apply, controllers, routes (docs/SERVING.md)."""
