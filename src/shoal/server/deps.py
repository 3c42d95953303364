"""The routes' typed dependencies: the server, a store session and the caller (FastAPI's
``Annotated`` aliases, so a handler's signature says what it needs and nothing else)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from shoal.server import console, tokens
from shoal.server.auth import AuthError, Principal
from shoal.server.core import Server
from shoal.server.endpoints import LocalApi
from shoal.server.jobcontrol import Submissions


async def get_server(request: Request) -> Server:
    return request.app.state.server


ServerDep = Annotated[Server, Depends(get_server)]


async def get_submissions(request: Request) -> Submissions:
    return request.app.state.submissions


SubmissionsDep = Annotated[Submissions, Depends(get_submissions)]


async def get_local(request: Request) -> LocalApi:
    return request.app.state.local


LocalDep = Annotated[LocalApi, Depends(get_local)]


def session(server: ServerDep) -> Iterator[Session]:
    """A store session, closed before the answer is sent; the service it is given owns the
    transaction (``with s.begin()``)."""
    with server.sessions() as s:
        yield s


SessionDep = Annotated[Session, Depends(session, scope="function")]
SESSION = session


# Async: a synchronous dependency costs a thread hand-off per request, and these only
# read the token cache (a miss is one indexed lookup, then cached).
async def principal(request: Request, server: ServerDep, authorization: Annotated[str | None, Header()] = None,
                    x_shoal_job_token: Annotated[str | None, Header()] = None,
                    x_shoal_user: Annotated[str | None, Header()] = None) -> Principal:
    if authorization is None and x_shoal_job_token is None:
        # The console's pages send the token as its cookie (server/console), with their header:
        # read only here, so the commands' and agents' requests parse no cookies.
        authorization = console.cookie_credential(None, request.cookies.get(console.COOKIE),
                                                  request.headers.get(console.HEADER))
    return server.auth.resolve(authorization, x_shoal_job_token, x_shoal_user)


Caller = Annotated[Principal, Depends(principal)]


def need_admin(p: Principal) -> Principal:
    if not p.is_admin:
        raise AuthError(403, "Access/permission denied: this needs an admin token")
    return p


def need_operator(p: Principal) -> Principal:
    if not p.is_operator:
        raise AuthError(403, "Access/permission denied: this needs an operator or admin token")
    return p


async def admin(p: Caller) -> Principal:
    return need_admin(p)


async def operator(p: Caller) -> Principal:
    return need_operator(p)


def may_change(p: Principal) -> Principal:
    if not p.may_change:
        raise AuthError(403, "Access/permission denied: a read-only token cannot do this"
                        if p.role == "read-only" else
                        "Access/permission denied: a job or node credential cannot do this")
    return p


async def user_or_admin(p: Caller) -> Principal:
    return may_change(p)


async def person(p: Caller) -> Principal:
    return tokens.need_person(p)


Admin = Annotated[Principal, Depends(admin)]
Person = Annotated[Principal, Depends(person)]  # a person's token (any role), not a credential
Operator = Annotated[Principal, Depends(operator)]
Writer = Annotated[Principal, Depends(user_or_admin)]
AgentAuth = Annotated[str | None, Header(alias="authorization")]


# Each dependency as a direct call has it (server.endpoints.Context: the fast path and the
# commands' in-process calls), without FastAPI; SESSION is opened around the call.
DIRECT: dict[Callable, Callable[[Any], Any]] = {
    get_server: lambda ctx: ctx.server,
    get_submissions: lambda ctx: ctx.state.submissions,
    get_local: lambda ctx: ctx.state.local,
    principal: lambda ctx: ctx.caller(),
    admin: lambda ctx: need_admin(ctx.caller()),
    operator: lambda ctx: need_operator(ctx.caller()),
    user_or_admin: lambda ctx: may_change(ctx.caller()),
    person: lambda ctx: tokens.need_person(ctx.caller()),
}
