"""/shoal/v1/nodes: sinfo, scontrol show node and scontrol update node."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from shoal.server import nodes as nodesvc
from shoal.server.endpoints import Table
from shoal.server.deps import Caller, Operator, ServerDep, SessionDep
from shoal.server.schemas import NodeUpdate

table = Table(prefix="/shoal/v1/nodes")
router = table.router


@table.get("")
def list_nodes(p: Caller, server: ServerDep, s: SessionDep):
    return JSONResponse({"nodes": nodesvc.list_json(server, s)})


@table.get("/{name}")
def get_node(name: str, p: Caller, server: ServerDep, s: SessionDep):
    return nodesvc.nodes_json(server, s, [nodesvc.node(s, name)])[0]


@table.patch("/{name}")
def update_node(name: str, body: NodeUpdate, p: Operator, server: ServerDep, s: SessionDep):
    return nodesvc.update(server, s, name, body)
