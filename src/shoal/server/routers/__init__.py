"""The native API's routes, one module per resource, each endpoint declared once on its
module's ``table`` (server/endpoints.py: the FastAPI route, and with ``fast``/``local`` the
fast path's and the in-process commands' routes, are made from it). A handler parses,
authorises through its typed dependencies (server/deps.py) and calls one use case of a
service module, which owns the transaction. The Kubernetes API (server.kubeapi,
server.kube.api) and the console keep their routers beside their services."""

from __future__ import annotations

from shoal.server.endpoints import Table
from shoal.server.routers import (accounting, agents, cluster, commands, jobs, nodes, partitions, reservations,
                                  steps, tokens)

# In the order they are matched.
TABLES: tuple[Table, ...] = (tokens.table, cluster.table, jobs.table, steps.table, nodes.table, partitions.table,
                             reservations.table, accounting.table, agents.table, commands.table)
ENDPOINTS = [e for t in TABLES for e in t.endpoints]
