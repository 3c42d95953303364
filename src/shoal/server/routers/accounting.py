"""sprio's priorities and sshare's fair-share tree, as the scheduler computes them; sacctmgr's
accounts, users and QOS; sdiag's and sreport's figures."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from shoal.server import accounting as acctsvc
from shoal.server import priority as priosvc
from shoal.server import reports as reportsvc
from shoal.server.endpoints import Table
from shoal.server.deps import Caller, Operator, ServerDep, SessionDep
from shoal.server.jobs import JobError
from shoal.server.schemas import AccountingChange

table = Table(prefix="/shoal/v1")
router = table.router


@table.get("/priority")
def priority(p: Caller, server: ServerDep, job_id: Annotated[list[str], Query()] = [],  # noqa: B006
             user: str | None = None):
    """sprio: pending jobs' multifactor priorities, computed as the scheduler computes them."""
    return priosvc.priorities(server, job_id, user)


@table.get("/shares")
def shares(p: Caller, server: ServerDep):
    """sshare: the account tree with shares, decayed usage and fair-share factors."""
    return {**priosvc.shares(server), "user": p.user}


@table.get("/accounting")
def get_accounting(p: Caller, server: ServerDep):
    """sacctmgr show: accounts, users (their associations are the accounts' users) and QOS."""
    return server.accounting.public(server.config.cluster_name)


@table.post("/accounting")
def change_accounting(body: AccountingChange, p: Operator, server: ServerDep, s: SessionDep):
    """sacctmgr add/modify/delete (operators and admins)."""
    return acctsvc.change_request(server, s, body.model_dump())


@table.get("/diag")
def diag(p: Caller, server: ServerDep, s: SessionDep):
    """sdiag: jobs since the server's start, the queue, its scheduling passes."""
    return reportsvc.diag(s, server.metrics, server.clock())


@table.get("/usage")
def usage(start: float, end: float, p: Caller, s: SessionDep):
    """sreport: resource-seconds used in [start, end), by user and account, and the capacity."""
    if end <= start:
        raise JobError("the period is empty: end must be after start")
    return reportsvc.usage(s, start, end)
