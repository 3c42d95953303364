"""/shoal/v1/agents: node agents join, long-poll their work and report (also answered by
the fast path, server/fastpath.py, without FastAPI's layers)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from fastapi.responses import Response

from shoal.server import agents as agentsvc
from shoal.server.endpoints import Table
from shoal.server.deps import AgentAuth, ServerDep, SessionDep
from shoal.server.schemas import AgentRegister, AgentReport

table = Table(prefix="/shoal/v1/agents")
router = table.router


@table.post("/register")
def register(body: AgentRegister, server: ServerDep, s: SessionDep, authorization: AgentAuth = None):
    return agentsvc.register(server, s, body, authorization)


@table.get("/{node}/work", fast=True)
async def work(node: str, server: ServerDep, epoch: str | None = None, gen: int | None = None,
               wait: Annotated[float, Query(ge=0, le=60)] = 0, authorization: AgentAuth = None):
    return Response(await agentsvc.work(server, node, epoch, gen, wait, authorization), media_type="application/json")


@table.post("/{node}/report", fast=True, quick=agentsvc.quiet_report)
async def report(node: str, body: AgentReport, server: ServerDep, authorization: AgentAuth = None):
    return await agentsvc.report(server, node, body, authorization)
