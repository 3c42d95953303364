"""The native API's routes, one module per resource; each handler parses, authorises through
its typed dependencies (server.deps) and calls one use case of a service module, which owns
the transaction. The Kubernetes API (server.kubeapi, server.kube.api), tokens and the
console keep their routers beside their services."""

from __future__ import annotations

from fastapi import APIRouter

from shoal.server.routers import accounting, agents, cluster, jobs, nodes, partitions, reservations, steps

# In the order they are matched.
ROUTERS: tuple[APIRouter, ...] = (cluster.router, jobs.router, steps.router, nodes.router, partitions.router,
                                  reservations.router, accounting.router, agents.router)
