"""The web console's routes under /console: its pages, the login, and the few read-only
routes the pages need that the API has not (the GPU grid, GPU-hours, pod load). Every
answer goes through the server's auth and the same PrivateData rule as the job routes
(docs/CONSOLE.md); the pages and views are server/console/."""

from __future__ import annotations

import asyncio
from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy import select

from shoal.model.job import JobState
from shoal.server import console, gpuacct, joblist
from shoal.server import nodes as nodesvc
from shoal.server.auth import AuthError, Principal
from shoal.server.console import views
from shoal.server.core import Server
from shoal.server.deps import ServerDep
from shoal.server.endpoints import Table
from shoal.store.models import CleanupRow, JobRow, NodeRow

REFRESH_S = 5.0  # pages refresh at least this often (utilisation comes with heartbeats)
MIN_GAP_S = 0.5  # and at most this often, however fast the cluster changes

table = Table(prefix="/console", include_in_schema=False)


def viewer_of(server: Server, request: Request) -> Principal:
    token = request.cookies.get(console.COOKIE)
    if not token:
        raise AuthError(401, "not logged in to the console")
    return server.auth.resolve(f"Bearer {token}", None, None)


async def viewer(request: Request, server: ServerDep) -> Principal:
    return viewer_of(server, request)


Viewer = Annotated[Principal, Depends(viewer)]


def page(request: Request, server: Server, name: str, job_id: int | None = None) -> Response:
    try:
        viewer_of(server, request)
    except AuthError:
        return RedirectResponse(f"/console/login?next={quote(request.url.path)}", status_code=303)
    return console.page_html(name, job_id)


# ---------------------------------------------------------------- pages


@table.get("")
def root():
    return RedirectResponse("/console/overview", status_code=303)


@table.get("/login")
def login_page(next: str = "/console/overview", error: str = ""):
    return console.login_html(next, error)


@table.post("/login")
async def login(request: Request, server: ServerDep):
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    target = console.local_path((form.get("next") or ["/console/overview"])[0])
    try:
        p = server.auth.resolve(f"Bearer {token}", None, None)
    except AuthError as e:
        return login_page(target, e.message)
    if p.role not in ("admin", "operator", "user", "read-only"):
        return login_page(target, "the console takes a person's token, not a job's or node's")
    out = RedirectResponse(target, status_code=303)
    # HttpOnly: the pages' script never sees the token, so an injected script cannot carry it
    # off; SameSite=Strict: another site's page never sends it (docs/CONSOLE.md).
    out.set_cookie(console.COOKIE, token, httponly=True, samesite="strict", path="/",
                   secure=request.url.scheme == "https")
    return out


@table.post("/logout")
def logout():
    out = RedirectResponse("/console/login", status_code=303)
    out.delete_cookie(console.COOKIE, path="/")
    return out


table.get("/static/{name}")(console.static)


def page_route(name: str):
    def route(request: Request, server: ServerDep):
        return page(request, server, name)
    return route


for _name in console.PAGES:
    table.get(f"/{_name}")(page_route(_name))


@table.get("/jobs/{job_id}")
def job_page(request: Request, job_id: int, server: ServerDep):
    return page(request, server, "job", job_id)


# ---------------------------------------------------------------- live updates


@table.get("/events", streaming=True)
async def events(p: Viewer, server: ServerDep):
    """Server-sent events: one ``change`` whenever the hub sees one (and every REFRESH_S)."""
    async def stream():
        seen = -1
        while True:
            seen = await server.hub.changed(seen, REFRESH_S)
            yield f"event: change\ndata: {seen}\n\n".encode()
            await asyncio.sleep(MIN_GAP_S)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})


# ---------------------------------------------------------------- data the API has not


@table.get("/api/overview")
def overview(p: Viewer, server: ServerDep):
    now = server.clock()
    own = joblist.private_jobs(server, p)
    with server.sessions() as s:
        nodes = nodesvc.nodes_json(server, s, list(s.scalars(select(NodeRow).order_by(NodeRow.name))))
        q = select(JobRow.id, JobRow.kind, JobRow.name, JobRow.user, JobRow.namespace, JobRow.allocation
                   ).where(JobRow.state == JobState.RUNNING.value)
        holders = [views.Holder(*row) for row in s.execute(q)]
        visible_ids = None if own is None else set(s.scalars(select(JobRow.id).where(own)))
        cleanups: dict[int, dict] = {}
        for c in s.scalars(select(CleanupRow)):
            cleanups.setdefault(c.job_id, {"nodes": []})["nodes"].append({"name": c.node, "gpus": c.gpus})
    holders += [views.Holder(jid, "batch", "", "", None, alloc, completing=True) for jid, alloc in cleanups.items()]
    grid = views.gpu_grid(nodes, holders, server.kube.metrics.gpu_utilisation(now),
                          lambda h: visible_ids is None or h.job_id in visible_ids)
    return JSONResponse({"nodes": grid, "partitions": views.partition_totals(grid), "time": now})


@table.get("/api/usage")
def usage(p: Viewer, server: ServerDep):
    """GPU-hours per account and user of the jobs the caller may see (all that started), in
    total and over time, and how busy those GPUs were (the agents' samples)."""
    own = joblist.private_jobs(server, p)
    now = server.clock()
    with server.sessions() as s:
        q = select(JobRow.user, JobRow.spec["account"].as_string(), JobRow.start_time, JobRow.end_time,
                   JobRow.allocation).where(JobRow.start_time.is_not(None))
        if own is not None:
            q = q.where(own)
        found = s.execute(q).all()
        busy_rows = gpuacct.busy_hours(s, own)
    tree = server.account_tree

    def charged(user: str, account: str | None) -> str | None:
        """The account a job charges: its own, else its user's default (as sshare counts it)."""
        return account or (None if tree.empty else tree.default_account.get(user))

    rows = [(user, charged(user, acct), *rest) for user, acct, *rest in found]
    busy: dict[tuple[str, str], float] = {}
    for acct, user, hours in busy_rows:
        key = (charged(user, acct) or views.DEFAULT_ACCOUNT, user)
        busy[key] = busy.get(key, 0.0) + hours
    return JSONResponse({**views.gpu_hours(rows, now, busy), "over_time": views.gpu_hours_over_time(rows, now)})


@table.get("/api/pod-load")
def pod_load(p: Viewer, server: ServerDep):
    """The gateways' last request rate and in-flight count per pod (as the HPA reads them)."""
    return JSONResponse({"pods": server.kube.metrics.pod_load(server.clock())})
