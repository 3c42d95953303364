"""An endpoint declared once gives the FastAPI route, the fast path's route and the commands'
in-process route, each reading its parameters as FastAPI does."""

from __future__ import annotations

import asyncio
from typing import Annotated

import pytest
from fastapi import Header, Query
from pydantic import BaseModel, ValidationError

from shoal.server.auth import AuthError, Principal
from shoal.server.deps import Caller, ServerDep, Writer
from shoal.server.endpoints import Context, LocalApi, Table, fast_routes
from shoal.server.routers import ENDPOINTS


class Body(BaseModel):
    count: int = 1


class Auth:
    def resolve(self, authorization, job_token, user):
        if authorization != "Bearer ok":
            raise AuthError(401, "no")
        return Principal(user="alice", role="user")


class Cluster:
    auth = Auth()


def table() -> Table:
    t = Table(prefix="/v1/things")

    @t.get("", local=True)
    def listing(server: ServerDep, p: Caller, ids: Annotated[list[int], Query()] = [],  # noqa: B006
                all: bool = False, wait: Annotated[float, Query(ge=0, le=60)] = 0):
        return {"user": p.user, "ids": ids, "all": all, "wait": wait, "server": server is CLUSTER}

    @t.post("/{thing}/poke", fast=True, local=True, status_code=201)
    def poke(thing: int, p: Writer, body: Body | None = None, x_tag: Annotated[str | None, Header()] = None):
        return {"thing": thing, "count": (body or Body()).count, "tag": x_tag}

    return t


CLUSTER = Cluster()


def test_the_commands_call_an_endpoint_in_process_with_its_parameters_validated():
    local = LocalApi(table().endpoints, CLUSTER, None)
    alice = Principal(user="alice", role="user")
    assert local.call("GET", "/v1/things", alice, query={"ids": ["3", "4"], "all": "true", "wait": 2}) == {
        "user": "alice", "ids": [3, 4], "all": True, "wait": 2.0, "server": True}
    assert local.call("POST", "/v1/things/7/poke", alice, body={"count": 3})["count"] == 3
    assert local.find("POST", "/v1/things/7/other") is None
    with pytest.raises(ValidationError):
        local.call("GET", "/v1/things", alice, query={"wait": 61})  # Query(le=60), as FastAPI checks it
    with pytest.raises(AuthError):  # Writer: a read-only token may not
        local.call("POST", "/v1/things/7/poke", Principal(user="bob", role="read-only"), body={})


def test_the_fast_path_answers_what_it_can_take_and_leaves_the_rest_to_the_app():
    routes = fast_routes(table().endpoints, CLUSTER, None)
    handler, match = routes.match("POST", "/v1/things/5/poke")
    scope = {"query_string": b""}
    headers = {"authorization": "Bearer ok", "x-tag": "t1"}
    status, _, body = asyncio.run(handler(scope, match, headers, b'{"count": 2}'))
    assert (status, body) == (201, b'{"thing": 5, "count": 2, "tag": "t1"}')
    assert asyncio.run(handler(scope, match, headers, b'{"count": "x"}')) is None  # the app's 422
    assert routes.match("GET", "/v1/things") is None  # not declared fast
    handler, match = routes.match("POST", "/v1/things/x/poke")
    assert asyncio.run(handler(scope, match, headers, b"")) is None  # not an int: the app's 422
    assert Context(CLUSTER, None, headers).caller().user == "alice"


def test_the_servers_table_offers_the_job_requests_on_the_fast_and_in_process_paths():
    fast = {(e.method, e.path) for e in ENDPOINTS if e.fast}
    local = {(e.method, e.path) for e in ENDPOINTS if e.local}
    assert fast == {("POST", "/shoal/v1/commands/{name}"), ("GET", "/shoal/v1/agents/{node}/work"),
                    ("POST", "/shoal/v1/agents/{node}/report"), ("GET", "/shoal/v1/jobs"), ("GET", "/shoal/v1/nodes"),
                    ("GET", "/shoal/v1/partitions")}
    assert local == {("POST", "/shoal/v1/jobs"), ("POST", "/shoal/v1/jobs/test"), ("GET", "/shoal/v1/jobs"),
                     ("POST", "/shoal/v1/jobs/cancel"), ("POST", "/shoal/v1/jobs/{job_id}/cancel")}


def asgi_get(app, path: str, query: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    """An ASGI app's answer to a GET: its status, Content-Encoding and body."""
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": query.encode(), "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
             "http_version": "1.1", "scheme": "http", "server": ("test", 80), "client": ("test", 1)}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    head = {k.decode().lower(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], head.get("content-encoding", ""), b"".join(m.get("body", b"") for m in sent[1:])

