"""The API assembled: FastAPI's app with every router (server/routers/ and the Kubernetes
API's, tokens', the console's), the in-process command path and the fast path in front."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from urllib.parse import parse_qs, unquote

from fastapi import FastAPI
from pydantic import ValidationError

from shoal import __version__
from shoal.server import agents as agentsvc
from shoal.server import commands, console, deps, errors, fastpath, jobcontrol, joblist, tokens
from shoal.server import nodes as nodesvc
from shoal.server.core import Server
from shoal.server.kube import api as kube_api
from shoal.server.kubeapi import routes as kubeapi_routes
from shoal.server.limits import guard
from shoal.server.retry import retry_on_conflict
from shoal.server.routers import ROUTERS
from shoal.server.schemas import AgentReport, BulkCancelRequest, CancelRequest, JobSubmit


def create_app(server: Server) -> fastpath.FastPaths:
    """The API: FastAPI's app behind the fast routes (server/fastpath.py)."""

    @asynccontextmanager
    async def lifespan(app):
        server.hub.loop = asyncio.get_running_loop()
        server.start()
        yield
        server.stop()

    app = FastAPI(title="Shoal", version=__version__, lifespan=lifespan)
    app.state.server = server
    app.state.submissions = submissions = jobcontrol.Submissions(server)
    guard(app)
    errors.install(app)

    def nodes_json(s, rows):
        return nodesvc.nodes_json(server, s, rows)

    app.include_router(kube_api.router(server, deps.principal, deps.admin, retry_on_conflict))
    app.include_router(tokens.router(server, deps.principal, deps.admin))
    for router in ROUTERS:
        app.include_router(router)
    local = command_routes(server, submissions)
    app.include_router(commands.router(local, server.auth.resolve))
    app.include_router(console.router(server, nodes_json=nodes_json,
                                      private_jobs=lambda p: joblist.private_jobs(server, p)))
    app.include_router(kubeapi_routes.router(server, deps.principal, nodes_json, retry_on_conflict))
    # In front of the whole app, FastAPI's own middlewares included (error pages, body limit):
    # these requests do not pass through them (an error escaping a fast route is uvicorn's 500).
    return fastpath.FastPaths(app, routes=fast_routes(server, local), observe=server.metrics.observe_request)


def command_routes(server: Server, submissions: jobcontrol.Submissions) -> commands.LocalRoutes:
    """The job routes sbatch, squeue and scancel call when the server runs them in process."""

    def in_session(use_case, *args):
        with server.sessions() as s:
            return use_case(server, s, *args)

    return commands.LocalRoutes(
        submit=lambda body, p: submissions.submit(JobSubmit.model_validate(body), deps.may_change(p)),
        test_only=lambda body, p: submissions.test_only(JobSubmit.model_validate(body), deps.may_change(p)),
        list_jobs=lambda params, p: {"jobs": joblist.list_jobs(
            server, params.get("job_id") or [], params.get("user"), params.get("partition"),
            name=params.get("name"), all=params.get("all") == "true", view=params.get("view"), viewer=p)},
        bulk_cancel=lambda body, p: in_session(jobcontrol.bulk_cancel, BulkCancelRequest.model_validate(body), p),
        cancel=lambda job_id, body, p: in_session(jobcontrol.cancel, job_id, CancelRequest.model_validate(body), p),
    )


def fast_routes(server: Server, local: commands.LocalRoutes) -> fastpath.Routes:
    """The requests every job costs, answered without FastAPI's layers (shoal.server.fastpath)."""
    fast = fastpath.Routes()

    async def fast_command(scope, match, headers, body):
        return await commands.answer(local, server.auth.resolve, match["name"], body, headers)

    async def fast_work(scope, match, headers, body):
        query = parse_qs(scope["query_string"].decode("latin-1"))
        try:
            gen = int(query["gen"][-1]) if "gen" in query else None
            wait = float(query["wait"][-1]) if "wait" in query else 0.0
        except ValueError:
            return None
        if not 0 <= wait <= 60:
            return None  # the app's 422
        epoch = query["epoch"][-1] if "epoch" in query else None
        return 200, fastpath.JSON, await agentsvc.work(server, unquote(match["node"]), epoch, gen, wait,
                                                       headers.get("authorization"))

    def report(node: str, body: AgentReport, authorization: str | None) -> dict:
        with server.sessions() as s:
            return agentsvc.report(server, s, node, body, authorization)

    async def fast_report(scope, match, headers, body):
        try:
            body = AgentReport.model_validate_json(body)
        except ValidationError:
            return None  # the app's 422
        return fastpath.json_answer(await fastpath.in_thread(report, unquote(match["node"]), body,
                                                            headers.get("authorization")))

    fast.add("POST", r"/shoal/v1/commands/(?P<name>[^/]+)", fast_command)
    fast.add("GET", r"/shoal/v1/agents/(?P<node>[^/]+)/work", fast_work)
    fast.add("POST", r"/shoal/v1/agents/(?P<node>[^/]+)/report", fast_report)
    return fast
