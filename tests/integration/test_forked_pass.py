"""A pass over a long queue computes its plan in a forked child (``scheduler.plan_forked_from``);
what it starts and what it says of the jobs that wait are the same as a pass in the server's
own threads, and a child that fails leaves the pass to the server. The server here is in
process, its passes run by hand (as in test_idle_pass)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from shoal.server import forked
from shoal.server.config import parse_cluster_config
from shoal.server.core import Server
from shoal.store.models import JobRow
from tests.integration.cluster import wait_until
from tests.integration.test_idle_pass import Clock, _job, _node

pytestmark = pytest.mark.skipif(not forked.AVAILABLE, reason="this platform cannot fork")


def _server(tmp_path, clock: Clock, forked_from: int | None) -> Server:
    """Two nodes of two GPUs, six one-GPU jobs queued (four fit), the loops not started."""
    config = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}],
                                   "scheduler": {"plan_forked_from": forked_from}})
    server = Server(f"sqlite:///{tmp_path / 'shoal.db'}", config, tmp_path, clock=clock)
    with server.sessions() as s, s.begin():
        s.add_all([_node("node01", clock.t), _node("node02", clock.t)])
        s.add_all([_job(clock.t + i, time_limit_s=600) for i in range(6)])
    server.leader.start()
    wait_until(lambda: server.leader.is_leader, 30, "leadership")
    return server


def _outcome(server: Server) -> list[tuple]:
    with server.sessions() as s:
        return [(r.state, r.reason, r.expected_start, sorted(r.allocation or {}))
                for r in s.scalars(select(JobRow).order_by(JobRow.id))]


def _forked(server: Server, outcome: str) -> float:
    return server.metrics.plans_forked.labels(outcome)._value.get()


def _passes(tmp_path, forked_from: int | None, start: float) -> tuple[list[tuple], Server]:
    """Each job's row after a first pass, and after a second one once the first job ended."""
    clock = Clock()
    clock.t = start  # the same times in both servers: the same start estimates
    server = _server(tmp_path, clock, forked_from)
    server.controller.run_pass()
    first = _outcome(server)
    with server.sessions() as s, s.begin():  # the first job ends: the next pass starts the fifth
        row = s.get(JobRow, 1)
        row.state, row.allocation = "COMPLETED", None
    clock.t += 1
    server.controller.run_pass()
    return first + _outcome(server), server


def _stopped(server: Server) -> None:
    server.leader.stop()
    server.engine.dispose()


def test_a_forked_plan_starts_and_reasons_what_a_plan_in_the_server_does(tmp_path):
    start = float(int(time.time()))
    here, plain = _passes(tmp_path / "here", None, start)
    there, server = _passes(tmp_path / "there", 0, start)
    try:
        assert _forked(plain, "ok") == 0 and _forked(server, "ok") == 2 and _forked(server, "failed") == 0
        assert there == here
        states = [state for state, *_ in there[6:]]
        assert states == ["COMPLETED", "RUNNING", "RUNNING", "RUNNING", "RUNNING", "PENDING"], there
        assert there[11][1] == "Resources" and there[11][2] is not None  # a reason and an estimate
    finally:
        _stopped(plain)
        _stopped(server)


def test_a_pass_whose_child_fails_is_planned_in_the_server(tmp_path, monkeypatch, caplog):
    def fails(*args, **kw):
        raise forked.Failed("the child ended with -9")

    monkeypatch.setattr(forked, "call", fails)
    clock = Clock()
    server = _server(tmp_path, clock, 0)
    try:
        server.controller.run_pass()
        assert [state for state, *_ in _outcome(server)] == ["RUNNING"] * 4 + ["PENDING"] * 2
        assert _forked(server, "failed") == 1
        assert "a forked plan failed (the child ended with -9)" in caplog.text
    finally:
        _stopped(server)


def test_a_short_queue_is_planned_in_the_server(tmp_path):
    server = _server(tmp_path, Clock(), 7)  # six queued, fewer than seven
    try:
        server.controller.run_pass()
        assert _forked(server, "ok") == 0 and _forked(server, "failed") == 0
        assert [state for state, *_ in _outcome(server)].count("RUNNING") == 4
    finally:
        _stopped(server)
