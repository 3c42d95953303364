"""Every route the server answers, in the order they are matched: each module's ``table``
(server/endpoints.py), where an endpoint is declared once and the FastAPI route, and with
``fast``/``local`` the fast path's and the in-process commands' routes, are made from it.

- the native API: one module here per resource; a handler parses, authorises through its
  typed dependencies (server/deps.py) and calls one use case of a service module, which owns
  the transaction; Shoal's own Kubernetes-style routes (/shoal/v1/kube) are
  ``server.kube.api``'s, beside their services;
- the console (``console``: /console);
- the Kubernetes API (``server.kubeapi.routes``), its routes made per resource of
  ``server.kubeapi.registry``, from which its discovery and OpenAPI documents come too.
"""

from __future__ import annotations

from shoal.server.endpoints import Endpoint, Table
from shoal.server.kube import api as kube_objects
from shoal.server.kubeapi import routes as kubernetes
from shoal.server.routers import (accounting, agents, cluster, commands, console, jobs, nodes, partitions,
                                  reservations, steps, tokens)

TABLES: tuple[Table, ...] = (kube_objects.table, tokens.table, cluster.table, jobs.table, steps.table, nodes.table,
                             partitions.table, reservations.table, accounting.table, agents.table, commands.table,
                             console.table, kubernetes.table)
ENDPOINTS: list[Endpoint] = [e for t in TABLES for e in t.endpoints]
