"""The API assembled: FastAPI's app with every table of routes (server/routers.TABLES: the
native API's, the console's, the Kubernetes API's), and in front of it the fast path made
from the same endpoints (server/endpoints.py) as the commands' in-process routes."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI

from shoal import __version__
from shoal.server import endpoints, errors, fastpath, jobcontrol
from shoal.server.core import Server
from shoal.server.kubeapi.service import KubeService
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
    app.state.kube_api = KubeService(server, retry_on_conflict)  # the Kubernetes API's, with its watch cache
    guard(app)
    errors.install(app)
    for table in TABLES:
        app.include_router(table.router)
    # In front of the whole app, FastAPI's own middlewares included (error pages, body limit):
    # these requests do not pass through them (an error escaping a fast route is uvicorn's 500).
    return fastpath.FastPaths(app, routes=endpoints.fast_routes(ENDPOINTS, server, app.state),
                              observe=server.metrics.observe_request)
