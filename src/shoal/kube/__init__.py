"""Kubernetes-style serving objects: manifest validation (``manifest``, pydantic and YAML at
the edge) and the pure controller logic the server loop and the simulator drive (``rollout``
for Deployments and ReplicaSets, ``hpa`` for HorizontalPodAutoscalers)."""
