"""/shoal/v1/nodes: sinfo, scontrol show node and scontrol update node."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header

from shoal.server import listing
from shoal.server import nodes as nodesvc
from shoal.server.endpoints import Table
from shoal.server.deps import Caller, Operator, ServerDep, SessionDep
from shoal.server.schemas import NodeUpdate

table = Table(prefix="/shoal/v1/nodes")
router = table.router


@table.get("", fast=True)
def list_nodes(p: Caller, server: ServerDep, s: SessionDep, view: str | None = None,
               accept_encoding: Annotated[str | None, Header()] = None):
    """Every node; ``view=sinfo``: only the keys sinfo reads (gzipped for a client that asks)."""
    return listing.encoded_response(*nodesvc.list_encoded(server, s, view, listing.accepts_gzip(accept_encoding)))


@table.get("/{name}")
def get_node(name: str, p: Caller, server: ServerDep, s: SessionDep):
    return nodesvc.nodes_json(server, s, [nodesvc.node(s, name)])[0]


@table.patch("/{name}")
def update_node(name: str, body: NodeUpdate, p: Operator, server: ServerDep, s: SessionDep):
    return nodesvc.update(server, s, name, body)
