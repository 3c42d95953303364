"""/shoal/v1/tokens: shoal token create (admin), list and revoke; a node's credential revoked."""

from __future__ import annotations

from shoal.server import tokens as tokensvc
from shoal.server.deps import Admin, Person, ServerDep, SessionDep
from shoal.server.endpoints import Table
from shoal.server.schemas import TokenCreate

table = Table(prefix="/shoal/v1/tokens")
router = table.router


@table.post("", status_code=201)
def create_token(body: TokenCreate, p: Admin, server: ServerDep, s: SessionDep):
    return tokensvc.create(server, s, body, p.user)


@table.get("")
def list_tokens(p: Person, server: ServerDep, s: SessionDep):
    return tokensvc.list_json(server, s, p)


@table.delete("/{tid}")
def revoke_token(tid: str, p: Person, server: ServerDep, s: SessionDep):
    return tokensvc.revoke(server, s, tid, p)


@table.post("/nodes/{node}/revoke")
def revoke_node(node: str, p: Admin, server: ServerDep, s: SessionDep):
    return tokensvc.revoke_node(server, s, node)
