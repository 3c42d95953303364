"""An idle node's heartbeat answered before its route reads it (server/agents.quiet_report):
the same answer as the route's, its time and GPU samples taken; anything the route would
treat otherwise (news, a value to convert, an unknown field, bad JSON) left to the route."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from shoal.agent import wire
from shoal.server import agents as agentsvc
from shoal.server.app import create_app
from shoal.server.config import parse_cluster_config
from shoal.server.core import Server

JOIN = "join_" + "q" * 32


def _post(app, path: str, body: bytes, authorization: str) -> tuple[int, bytes]:
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": [(b"authorization", authorization.encode()),
                                              (b"content-type", b"application/json"),
                                              (b"content-length", str(len(body)).encode())],
             "http_version": "1.1", "scheme": "http", "server": ("test", 80), "client": ("127.0.0.1", 1)}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture
def node(tmp_path):
    config = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}]})
    server = Server(f"sqlite:///{tmp_path}/shoal.db", config, tmp_path, join_token=JOIN)
    app = create_app(server)
    server.leader.start()
    deadline = time.monotonic() + 30
    while not server.leader.is_leader and time.monotonic() < deadline:
        time.sleep(0.05)
    body = wire.register_body(name="node01", address="127.0.0.1", port=1, cpus=8, memory_mb=1024, gpus=[],
                              labels={}, features=[], boot_time=time.time(), alive=[], taints=[])
    status, out = _post(app, wire.REGISTER, json.dumps(body).encode(), f"Bearer {JOIN}")
    assert status == 200, out
    try:
        yield server, app, "Bearer " + json.loads(out)["credential"]
    finally:
        server.leader.stop()
        server.engine.dispose()


def _report(**fields) -> bytes:
    return json.dumps(wire.report_body([], [], [], [], {"gpu_util": {"0": 12.5, "1": 40}}) | fields).encode()


def test_an_idle_nodes_heartbeat_is_answered_as_the_route_answers_it_with_its_time_and_samples_taken(node, monkeypatch):
    server, app, credential = node
    path = wire.report_path("node01")
    assert _post(app, path, _report(), credential) == (200, b'{"ok": true}')  # the route's (what is kept is built)
    routed: list[str] = []
    report = agentsvc.report

    async def counted(server, node, body, authorization):
        routed.append(node)
        return await report(server, node, body, authorization)
    monkeypatch.setattr(agentsvc, "report", counted)

    before = server.heartbeats.latest("node01", 0.0)
    time.sleep(0.01)
    assert _post(app, path, _report(alive=[]), credential) == (200, json.dumps({"ok": True}).encode())
    assert routed == [], "a quiet heartbeat is answered before the route"
    assert server.heartbeats.latest("node01", 0.0) > before, "its time is kept"
    assert server.kube.metrics.gpu_utilisation(server.clock())[("node01", 1)] == 40.0, "its samples taken, as floats"

    status, out = _post(app, path, _report(), "Bearer node_" + "0" * 64)
    assert (status, json.loads(out)["detail"]) == (403, "this credential does not belong to node node01")
    assert routed == [], "a wrong credential is refused as the route refuses it"

    for body, status_wanted in (
            (_report(events=[{"type": "exit", "key": "9.0", "job_id": 9, "run": 0, "exit_code": 0}]), 200),  # news: the route
            # stores it (a run this server never started: noted and answered)
            (_report(gpu_util={"0": "12.5"}), 200),  # a number as a string: the route converts it
            (_report(gpu_util={"0": True}), None),  # a bool: the route decides
            (_report(images=[]), 200),  # the node's image cache: the route stores it
            (_report(surprise=1), 422),  # an unknown field: the route's validation error
            (b"{not json", 422),
            (_report(alive="1.0"), 422)):
        routed.clear()
        status, out = _post(app, path, body, credential)
        assert routed == ["node01"] or status == 422, (body, status, out)
        if status_wanted is not None:
            assert status == status_wanted, (body, out)
