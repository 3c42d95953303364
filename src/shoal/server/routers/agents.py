"""/shoal/v1/agents: node agents join, long-poll their work and report (also answered by
the fast path, server/fastpath.py, without FastAPI's layers)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from shoal.server import agents as agentsvc
from shoal.server.deps import AgentAuth, ServerDep, SessionDep
from shoal.server.schemas import AgentRegister, AgentReport

router = APIRouter(prefix="/shoal/v1/agents")


@router.post("/register")
def register(body: AgentRegister, server: ServerDep, s: SessionDep, authorization: AgentAuth = None):
    return agentsvc.register(server, s, body, authorization)


@router.get("/{node}/work")
async def work(node: str, server: ServerDep, epoch: str | None = None, gen: int | None = None,
               wait: Annotated[float, Query(ge=0, le=60)] = 0, authorization: AgentAuth = None):
    return Response(await agentsvc.work(server, node, epoch, gen, wait, authorization), media_type="application/json")


@router.post("/{node}/report")
def report(node: str, body: AgentReport, server: ServerDep, s: SessionDep, authorization: AgentAuth = None):
    return agentsvc.report(server, s, node, body, authorization)
