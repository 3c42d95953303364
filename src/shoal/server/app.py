"""The API assembled: FastAPI's app with every router (server/routers/ and the Kubernetes
API's, the console's), and in front of it the fast path made from the same
endpoint table (server/endpoints.py) as the commands' in-process routes."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI

from shoal import __version__
from shoal.server import console, deps, endpoints, errors, fastpath, jobcontrol, joblist
from shoal.server import nodes as nodesvc
from shoal.server.core import Server
from shoal.server.kube import api as kube_api
from shoal.server.kubeapi import routes as kubeapi_routes
from shoal.server.limits import guard
from shoal.server.retry import retry_on_conflict
from shoal.server.routers import ENDPOINTS, TABLES


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
    app.state.submissions = jobcontrol.Submissions(server)
    app.state.local = endpoints.LocalApi(ENDPOINTS, server, app.state)
    guard(app)
    errors.install(app)

    def nodes_json(s, rows):
        return nodesvc.nodes_json(server, s, rows)

    app.include_router(kube_api.router)
    for table in TABLES:
        app.include_router(table.router)
    app.include_router(console.router(server, nodes_json=nodes_json,
                                      private_jobs=lambda p: joblist.private_jobs(server, p)))
    app.include_router(kubeapi_routes.router(server, deps.principal, nodes_json, retry_on_conflict))
    # In front of the whole app, FastAPI's own middlewares included (error pages, body limit):
    # these requests do not pass through them (an error escaping a fast route is uvicorn's 500).
    return fastpath.FastPaths(app, routes=endpoints.fast_routes(ENDPOINTS, server, app.state),
                              observe=server.metrics.observe_request)
