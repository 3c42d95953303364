"""The web console under /console: committed static pages whose script reads the same API the
commands read, a login that keeps the token in an HttpOnly cookie, and the few read-only
routes the pages need that the API has not (the GPU grid, GPU-hours, gateway figures).

Policy stays in one place: every answer here goes through the server's auth and the same
PrivateData rule as the API's job routes; the pages only hide buttons the API would refuse.
See docs/CONSOLE.md.
"""

from __future__ import annotations

import asyncio
from importlib.resources import files
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy import select

from shoal.model.job import JobState
from shoal.server.auth import AuthError, Principal
from shoal.server import gpuacct
from shoal.server.console import views
from shoal.store.models import CleanupRow, JobRow, NodeRow

COOKIE = "shoal_console"
HEADER = "x-shoal-console"  # the pages' requests carry it: a cross-site form cannot set it
PAGES = ("overview", "queue", "serving", "accounting", "nodes")
REFRESH_S = 5.0  # pages refresh at least this often (utilisation comes with heartbeats)
MIN_GAP_S = 0.5  # and at most this often, however fast the cluster changes

_STATIC = files(__package__) / "static"
# The pages' own files only (no inline script, so an injected <script> does not run; inline
# style attributes draw the bars), and never inside another site's frame (a click there on
# Cancel would be the user's).
PAGE_HEADERS = {"cache-control": "no-store", "x-frame-options": "DENY",
                "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                           "img-src 'self' data:; frame-ancestors 'none'"}
_TYPES = {"js": "text/javascript", "css": "text/css", "html": "text/html", "svg": "image/svg+xml"}


def cookie_credential(authorization: str | None, cookie: str | None, marked: str | None) -> str | None:
    """The Authorization header to resolve: the request's own, else the console's cookie when the
    request carries the console's header (so a cross-site page cannot spend the cookie)."""
    if authorization or not cookie or not marked:
        return authorization
    return f"Bearer {cookie}"


def router(server, *, nodes_json, private_jobs) -> APIRouter:
    r = APIRouter(prefix="/console", include_in_schema=False)

    def viewer_of(request: Request) -> Principal:
        token = request.cookies.get(COOKIE)
        if not token:
            raise AuthError(401, "not logged in to the console")
        return server.auth.resolve(f"Bearer {token}", None, None)

    async def viewer(request: Request) -> Principal:
        return viewer_of(request)

    def page(request: Request, name: str, job_id: int | None = None) -> Response:
        try:
            viewer_of(request)
        except AuthError:
            return RedirectResponse(f"/console/login?next={quote(request.url.path)}", status_code=303)
        html = _asset("shell.html").decode().replace("{{page}}", name).replace(
            "{{job}}", "" if job_id is None else str(job_id))
        return HTMLResponse(html, headers=PAGE_HEADERS)

    # ---------------------------------------------------------------- pages

    @r.get("")
    def root():
        return RedirectResponse("/console/overview", status_code=303)

    @r.get("/login")
    def login_page(next: str = "/console/overview", error: str = ""):
        html = _asset("login.html").decode().replace("{{next}}", _attr(_local(next))).replace(
            "{{error}}", _text(error))
        return HTMLResponse(html, status_code=401 if error else 200, headers=PAGE_HEADERS)

    @r.post("/login")
    async def login(request: Request):
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        target = _local((form.get("next") or ["/console/overview"])[0])
        try:
            p = server.auth.resolve(f"Bearer {token}", None, None)
        except AuthError as e:
            return login_page(target, e.message)
        if p.role not in ("admin", "operator", "user", "read-only"):
            return login_page(target, "the console takes a person's token, not a job's or node's")
        out = RedirectResponse(target, status_code=303)
        # HttpOnly: the pages' script never sees the token, so an injected script cannot carry it
        # off; SameSite=Strict: another site's page never sends it (docs/CONSOLE.md).
        out.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                       secure=request.url.scheme == "https")
        return out

    @r.post("/logout")
    def logout():
        out = RedirectResponse("/console/login", status_code=303)
        out.delete_cookie(COOKIE, path="/")
        return out

    r.add_api_route("/static/{name}", static, methods=["GET"])

    def page_route(name: str):
        def route(request: Request):
            return page(request, name)
        return route

    for name in PAGES:
        r.add_api_route(f"/{name}", page_route(name), methods=["GET"])

    @r.get("/jobs/{job_id}")
    def job_page(request: Request, job_id: int):
        return page(request, "job", job_id)

    _data_routes(r, server, viewer, nodes_json, private_jobs)
    return r


def _data_routes(r: APIRouter, server, viewer, nodes_json, private_jobs) -> None:
    """The pages' live updates and the data the API has not (the GPU grid, GPU-hours, pod load)."""
    # ---------------------------------------------------------------- live updates

    @r.get("/events")
    async def events(p: Principal = Depends(viewer)):
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

    @r.get("/api/overview")
    def overview(p: Principal = Depends(viewer)):
        now = server.clock()
        own = private_jobs(p)
        with server.sessions() as s:
            nodes = nodes_json(s, list(s.scalars(select(NodeRow).order_by(NodeRow.name))))
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

    @r.get("/api/usage")
    def usage(p: Principal = Depends(viewer)):
        """GPU-hours per account and user of the jobs the caller may see (all that started), in
        total and over time, and how busy those GPUs were (the agents' samples)."""
        own = private_jobs(p)
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

    @r.get("/api/pod-load")
    def pod_load(p: Principal = Depends(viewer)):
        """The gateways' last request rate and in-flight count per pod (as the HPA reads them)."""
        return JSONResponse({"pods": server.kube.metrics.pod_load(server.clock())})


def static(name: str):
    ext = name.rpartition(".")[2]
    if "/" in name or ext not in _TYPES:
        raise AuthError(404, f"no such file: {name}")
    try:
        body = _asset(name)
    except FileNotFoundError:
        raise AuthError(404, f"no such file: {name}") from None
    return Response(body, media_type=_TYPES[ext], headers={"cache-control": "no-cache"})


def _asset(name: str) -> bytes:
    return (_STATIC / name).read_bytes()


def _local(target: str) -> str:
    """Only a console path may follow a login (no open redirect to another site)."""
    return target if target.startswith("/console/") and "//" not in target and "\\" not in target else "/console/overview"


def _text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attr(s: str) -> str:
    return _text(s).replace('"', "&quot;")
