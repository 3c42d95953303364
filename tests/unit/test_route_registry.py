"""One registry lists every route the server answers: the native API's, the console's and the
Kubernetes API's (made per resource of its registry), each with its method; the app serves
exactly those, so a route wired by hand anywhere else fails here."""

from __future__ import annotations

import pytest
from fastapi.routing import APIWebSocketRoute, iter_route_contexts

from shoal.server.app import create_app
from shoal.server.config import parse_cluster_config
from shoal.server.core import Server
from shoal.server.endpoints import WEBSOCKET, Table
from shoal.server.kubeapi.registry import RESOURCES
from shoal.server.routers import ENDPOINTS

# What FastAPI itself serves for the native API's documentation (FastAPI(...)'s own arguments).
DOCUMENTATION = {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")}


def registered() -> list[tuple[str, str]]:
    return [(e.method, e.path) for e in ENDPOINTS]


def served(tmp_path) -> list[tuple[str, str]]:
    server = Server(f"sqlite:///{tmp_path}/shoal.db",
                    parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node[1-2]"}]}), tmp_path)
    app = create_app(server).app
    out = []
    for ctx in iter_route_contexts(app.router.routes):
        if isinstance(ctx.original_route, APIWebSocketRoute):
            out.append((WEBSOCKET, ctx.path))
        else:
            out += [(m, ctx.path) for m in sorted(ctx.methods - {"HEAD"})]
    return out


def test_the_app_serves_exactly_the_registered_routes_in_their_order(tmp_path):
    app = served(tmp_path)
    assert set(DOCUMENTATION) <= set(app)
    unregistered = [r for r in app if r not in DOCUMENTATION and r not in set(registered())]
    assert unregistered == [], f"routes served but not declared on a Table of server/routers.TABLES: {unregistered}"
    assert [r for r in app if r not in DOCUMENTATION] == sorted(registered(), key=app.index)
    assert len(set(registered())) == len(registered()), "a method and path declared twice"


def test_the_registry_lists_the_native_the_console_and_the_kubernetes_routes():
    listing = registered()
    for route in [("POST", "/shoal/v1/jobs"), ("GET", "/shoal/v1/agents/{node}/work"),
                  ("POST", "/shoal/v1/kube/apply"), ("GET", "/console/overview"), ("POST", "/console/login"),
                  ("GET", "/version"), ("GET", "/apis/{group}/{version}"), ("GET", "/openapi/v3/{path:path}"),
                  ("GET", "/api/v1/namespaces/{namespace}/pods/{name}/log"),
                  (WEBSOCKET, "/api/v1/namespaces/{namespace}/pods/{name}/exec"),
                  ("PATCH", "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale")]:
        assert route in listing, route
    streaming = {(e.method, e.path) for e in ENDPOINTS if e.streaming}
    assert ("GET", "/apis/apps/v1/deployments") in streaming  # a watch
    assert ("GET", "/console/events") in streaming
    assert not [e for e in ENDPOINTS if e.streaming and (e.fast or e.local)]


@pytest.mark.parametrize("res", RESOURCES, ids=lambda r: r.qualified)
def test_each_kubernetes_resource_gets_the_routes_of_its_verbs_and_subresources(res):
    listing = set(registered())
    collection, item = res.base_path("{namespace}"), res.base_path("{namespace}") + "/{name}"
    assert ("GET", collection) in listing and ("GET", item) in listing
    assert (("POST", collection) in listing) == ("create" in res.verbs)
    for verb, method in (("update", "PUT"), ("patch", "PATCH"), ("delete", "DELETE")):
        assert ((method, item) in listing) == (verb in res.verbs), (verb, item)
    for sub in res.subresources:
        assert any(path == f"{item}/{sub.name}" for _, path in listing), sub.name


def test_a_stream_is_offered_over_http_only():
    t = Table(prefix="/v1")
    with pytest.raises(ValueError, match="HTTP-only"):
        t.get("/watch", streaming=True, fast=True)
    with pytest.raises(ValueError, match="HTTP-only"):
        t.get("/watch", streaming=True, local=True)
