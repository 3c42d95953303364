"""/shoal/v1/commands: sbatch, squeue and scancel run in the server for the compiled front end
(server/commands.py), on the fast path too."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Request
from fastapi.responses import Response

from shoal.server import commands
from shoal.server.deps import LocalDep, ServerDep
from shoal.server.endpoints import Table

table = Table(prefix="/shoal/v1/commands")
router = table.router

@table.post("/{name}", fast=True)
async def command(name: str, request: Request, server: ServerDep, local: LocalDep,
                  authorization: Annotated[str | None, Header()] = None,
                  x_shoal_job_token: Annotated[str | None, Header()] = None,
                  x_shoal_user: Annotated[str | None, Header()] = None):
    headers = {"authorization": authorization, "x-shoal-job-token": x_shoal_job_token, "x-shoal-user": x_shoal_user}
    status, extra, content = await commands.answer(local, server.auth.resolve, name, await request.body(), headers)
    return Response(content, status_code=status, headers={k.decode(): v.decode() for k, v in extra})
