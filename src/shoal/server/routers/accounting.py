"""sprio's priorities and sshare's fair-share tree, as the scheduler computes them."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from shoal.server import priority as priosvc
from shoal.server.endpoints import Table
from shoal.server.deps import Caller, ServerDep

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
