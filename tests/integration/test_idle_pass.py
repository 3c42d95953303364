"""A periodic scheduling pass is skipped while nothing it reads has changed, and runs again
as soon as something has: a commit to a job, node, reservation, partition or accounting
row, a change of the server's settings, a begin time or reservation boundary reached, or
``idle_pass_s`` gone by. The server here is in process, its passes run by hand, on a
clock the test moves."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from shoal.model.resources import ResourceRequest
from shoal.server.config import parse_cluster_config
from shoal.server.core import Server
from shoal.server.jobs import request_to_json
from shoal.store.models import JobRow, NodeRow, PartitionRow
from tests.integration.cluster import wait_until

ONE_GPU = request_to_json(ResourceRequest(nodes=1, ntasks=1, gpus_per_node=1, mem_per_node_mb=1024))


class Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def _node(name: str, now: float) -> NodeRow:
    return NodeRow(name=name, address="127.0.0.2", port=6818, state="UP", cpus=64, memory_mb=512 * 1024,
                   gpus=[{"index": i, "uuid": f"GPU-{name}-{i}", "product": "NVIDIA A100", "memory_mb": 81920}
                         for i in range(2)],
                   labels={}, features=[], registered_at=now, last_heartbeat=now)


def _job(now: float, **kw) -> JobRow:
    fields = dict(name="j", user="alice", partition="gpu", state="PENDING", submit_time=now, request=ONE_GPU,
                  spec={"script": "#!/bin/sh\ntrue\n"}, workdir="/tmp")
    return JobRow(**{**fields, **kw})


def _config(**scheduler):
    return parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}],
                                 "scheduler": {"idle_pass_s": 30, **scheduler}})


def _server(tmp_path, clock: Clock, jobs: int, db_url: str | None = None, **scheduler) -> tuple[Server, list[int]]:
    """Two nodes of two GPUs, ``jobs`` one-GPU jobs queued, the server's loops not started."""
    server = Server(db_url or f"sqlite:///{tmp_path / 'shoal.db'}", _config(**scheduler), tmp_path, clock=clock)
    with server.sessions() as s, s.begin():
        s.add_all([_node("node01", clock.t), _node("node02", clock.t)])
        s.add_all([_job(clock.t + i) for i in range(jobs)])
    with server.sessions() as s:
        ids = list(s.scalars(select(JobRow.id).order_by(JobRow.id)))
    server.leader.start()
    wait_until(lambda: server.leader.is_leader, 30, "leadership")
    return server, ids


def _submit(server: Server, submit_time: float, **kw) -> tuple[int, bool]:
    """Queue a job as a submission does: its id, and whether the scheduler's step (the loop's,
    told of the submission) ran a pass."""
    with server.sessions() as s, s.begin():
        row = _job(submit_time, **kw)
        s.add(row)
        s.flush()
        jid = row.id
    c = server.controller
    before = c.passes
    c.submitted(alone=False)
    c.step()
    return jid, c.passes > before


def _stop(server: Server) -> None:
    server.leader.stop()
    server.engine.dispose()


def _tick(server: Server, clock: Clock, seconds: float = 1.0) -> bool:
    """One periodic pass, ``seconds`` after the last: whether it ran (was not skipped)."""
    clock.t += seconds
    before = server.controller.passes
    server.controller.run_pass(periodic=True)
    return server.controller.passes > before


def _states(server: Server) -> dict[int, str]:
    with server.sessions() as s:
        return {r.id: r.state for r in s.scalars(select(JobRow))}


def _settle(server: Server, clock: Clock) -> None:
    """Periodic passes until one is skipped: the one after a pass that wrote nothing."""
    for _ in range(5):
        if not _tick(server, clock):
            return
    raise AssertionError("a periodic pass was never skipped")


def test_a_periodic_pass_over_what_the_last_one_read_is_skipped_and_any_change_brings_it_back(tmp_path):
    clock = Clock()
    server, ids = _server(tmp_path, clock, 6)
    c = server.controller
    try:
        assert _tick(server, clock), "the first pass runs"
        assert [jid for jid, st in _states(server).items() if st == "RUNNING"] == ids[:4]
        _settle(server, clock)
        skipped = c.skipped
        assert not _tick(server, clock) and not _tick(server, clock) and c.skipped == skipped + 2
        server.controller.run_pass()  # a pass asked for (a wake-up) always runs
        assert c.passes and not _tick(server, clock)

        # A job ends (its row and its node's resources): the next periodic pass starts the next one.
        with server.sessions() as s, s.begin():
            row = s.get(JobRow, ids[0])
            row.state, row.allocation = "COMPLETED", None
        assert _tick(server, clock)
        assert _states(server)[ids[4]] == "RUNNING"
        assert not _tick(server, clock), "the pass's own commit (its start, its reasons) calls for no other"

        # A change of a node row, and of a partition (scontrol update), each bring a pass back.
        with server.sessions() as s, s.begin():
            s.get(NodeRow, "node02").state = "DRAIN"
        assert _tick(server, clock)
        _settle(server, clock)
        with server.sessions() as s, s.begin():
            s.add(PartitionRow(name="gpu", changes={"max_time_s": 3600}, updated=clock.t))
        server.refresh_partitions()
        assert _tick(server, clock)
        _settle(server, clock)

        # The server's own settings (a reconfigure) are read too.
        import dataclasses
        server.sched_config = dataclasses.replace(server.sched_config, bf_window_s=3600)
        assert _tick(server, clock)
        _settle(server, clock)

        # With nothing changed, a pass still runs every idle_pass_s.
        assert not _tick(server, clock, 10) and not _tick(server, clock, 10)
        assert _tick(server, clock, 11)
    finally:
        _stop(server)


def test_a_begin_time_reached_with_nothing_else_changed_brings_the_pass_that_starts_the_job(tmp_path):
    clock = Clock()
    server, ids = _server(tmp_path, clock, 2)
    try:
        begin = clock.t + 5
        with server.sessions() as s, s.begin():
            later = _job(clock.t, begin_time=begin)
            s.add(later)
            s.flush()
            later_id = later.id
        assert _tick(server, clock)
        states = _states(server)
        assert [states[jid] for jid in ids] == ["RUNNING", "RUNNING"] and states[later_id] == "PENDING"
        _settle(server, clock)
        assert states == _states(server)
        while clock.t < begin - 1:
            assert not _tick(server, clock), "nothing changes before the begin time"
        assert _tick(server, clock, 1.5), "the begin time passed"
        assert _states(server)[later_id] == "RUNNING", "started on a free GPU by a periodic pass"
    finally:
        _stop(server)


@pytest.mark.postgres
def test_on_a_shared_store_another_server_s_commit_brings_the_pass_back(tmp_path, postgres_url):
    """Another server's commits reach this one's counts on the change feed (their keys sent in
    their transactions): a periodic pass is skipped while nothing changed on either server,
    and the next runs once the other server ended a job."""
    clock = Clock()
    server, ids = _server(tmp_path, clock, 6, postgres_url)
    (tmp_path / "other").mkdir()
    other = Server(postgres_url, _config(), tmp_path / "other", clock=clock)
    try:
        assert server.leader.shared and server.feed is not None and other.feed is not None
        server.feed.start(), other.feed.start()
        wait_until(lambda: server.feed.connected.is_set() and other.feed.connected.is_set(), 15, "both listeners")
        assert _tick(server, clock)
        assert [jid for jid, st in _states(server).items() if st == "RUNNING"] == ids[:4]
        _settle(server, clock)
        assert not _tick(server, clock)
        at = server.job_changes.value
        with other.sessions() as s, s.begin():
            row = s.get(JobRow, ids[0])
            row.state, row.allocation = "COMPLETED", None
        wait_until(lambda: server.job_changes.value > at, 10, "the other server's keys")
        assert _tick(server, clock)
        assert _states(server)[ids[4]] == "RUNNING"
    finally:
        other.feed.stop()
        other.engine.dispose()
        server.feed.stop()
        _stop(server)


def test_a_pass_whose_plan_was_not_applied_is_run_again(tmp_path, monkeypatch):
    """A pass that planned but failed to apply (the store refused its transaction) changed
    nothing: the next periodic pass plans again rather than taking the store as settled."""
    from shoal.server import controller

    clock = Clock()
    server, ids = _server(tmp_path, clock, 6)
    try:
        def refused(*args, **kwargs):
            raise RuntimeError("database is locked")

        real = controller.start_kept
        monkeypatch.setattr(controller, "start_kept", refused)
        with pytest.raises(RuntimeError):
            _tick(server, clock)
        monkeypatch.setattr(controller, "start_kept", real)
        assert _tick(server, clock), "planned again"
        assert [jid for jid, st in _states(server).items() if st == "RUNNING"] == ids[:4]
    finally:
        _stop(server)


def test_passes_between_node_changes_keep_the_cluster_s_free_resources(tmp_path):
    """The scheduler's placement cache keeps the free resources (and the nodes sorted) by the
    node tuple's identity and brings them up to date by starts and ends: the controller's
    passes hand it the same tuple until a node row changes (a new tuple per pass rebuilt
    5,000 nodes each pass), and the kept state plans as a fresh one would."""
    clock = Clock()
    server, ids = _server(tmp_path, clock, 6)
    c = server.controller
    try:
        c.run_pass()
        kept = c._placement.free
        assert [jid for jid, st in _states(server).items() if st == "RUNNING"] == ids[:4]
        with server.sessions() as s, s.begin():
            row = s.get(JobRow, ids[0])
            row.state, row.allocation = "COMPLETED", None
        c.run_pass()
        assert c._placement.free.nodes is kept.nodes, "no node changed: the same nodes, the kept state"
        assert _states(server)[ids[4]] == "RUNNING", "the freed GPU found through the kept state"

        with server.sessions() as s, s.begin():
            s.get(NodeRow, "node02").state = "DRAIN"
            row = next(r for r in s.scalars(select(JobRow).where(JobRow.state == "RUNNING"))
                       if r.allocation["nodes"][0]["name"] == "node02")
            row.state, row.allocation = "COMPLETED", None
        c.run_pass()
        assert c._placement.free is None or c._placement.free.nodes is not kept.nodes
        with server.sessions() as s:
            assert s.get(JobRow, ids[5]).state == "PENDING", "node02 drained: its freed GPU is not used"
    finally:
        _stop(server)


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_submission_that_would_wait_like_a_job_the_last_pass_settled_costs_no_pass(tmp_path, store, request):
    """On a full cluster the GPUs kept free for a reserved job fit most submissions, so each
    cost a pass over the whole queue that started nothing (most of a storm's server time). A
    job queued like one the last pass settled behind the reservation (its request, partition,
    limit and rank) waits for the periodic pass instead; one ranked otherwise (another user)
    still gets its pass at once. (On PostgreSQL the rank's account, QOS and nice are read
    from the spec's JSON by the database.)"""
    clock = Clock()
    db_url = request.getfixturevalue("postgres_url") if store == "postgres" else None
    server, ids = _server(tmp_path, clock, 1, db_url)  # job 1: one GPU, no limit: runs for ever
    c = server.controller
    two_nodes = request_to_json(ResourceRequest(nodes=2, ntasks=2, gpus_per_node=2, mem_per_node_mb=1024))
    try:
        with server.sessions() as s, s.begin():
            s.add_all([_job(clock.t + 1, request=two_nodes), _job(clock.t + 2)])
        c.wake()
        c.step()  # a pass, as the loop runs it
        with server.sessions() as s:
            rows = {r.id: r for r in s.scalars(select(JobRow))}
        blocker, settled = sorted(rows)[1:]
        assert rows[ids[0]].state == "RUNNING" and rows[blocker].reason == "Resources"
        assert rows[settled].reason == "Priority", "held off the blocker's nodes: 3 GPUs free, none to take"

        def submit(**kw) -> tuple[int, bool]:
            return _submit(server, clock.t + 3, **kw)

        alike, passed = submit()
        assert not passed, "queued like the settled job: no pass"
        alike_too, passed = submit()
        assert not passed
        other, passed = submit(user="bob")
        assert passed, "another user's job may rank above the blocker: a pass"
        with server.sessions() as s:
            assert s.get(JobRow, other).reason == "Priority"
            assert s.get(JobRow, alike).state == "PENDING"
        niced, passed = submit(spec={"script": "#!/bin/sh\ntrue\n", "nice": 10})
        assert passed, "another rank (nice): a pass, which gave every job queued since its reason"
        with server.sessions() as s:
            assert {s.get(JobRow, j).reason for j in (alike, alike_too, niced)} == {"Priority"}
            assert list(s.scalars(select(JobRow.id).where(JobRow.state == "RUNNING"))) == ids, "nothing else started"
    finally:
        _stop(server)


def _reasons(server: Server) -> dict[int, str]:
    with server.sessions() as s:
        return {r.id: r.reason for r in s.scalars(select(JobRow).where(JobRow.state == "PENDING"))}


def test_between_full_passes_a_quick_pass_starts_what_it_can_and_leaves_the_queue_behind_as_it_was(tmp_path):
    """With bf_interval_s, a job's end brings a quick pass (Slurm's main scheduler): it gives
    the first job that cannot start its reason and stops there, every node held back for it;
    the jobs behind keep their reasons (one queued since, the None its submission gave it)
    until the next full pass. A job submitted then comes after where that pass stopped: it
    costs no pass though it fits the GPU left free, unless its priority puts it ahead. Periodic
    passes over what the last quick one read are skipped until the next full one is due."""
    clock = Clock()
    server, ids = _server(tmp_path, clock, 4, bf_interval_s=30)  # two nodes of two GPUs: all four run
    c = server.controller
    two = request_to_json(ResourceRequest(nodes=1, ntasks=1, gpus_per_node=2, mem_per_node_mb=1024))
    try:
        with server.sessions() as s, s.begin():
            s.add_all([_job(clock.t + 5, request=two), _job(clock.t + 6)])
        blocker, behind = max(ids) + 1, max(ids) + 2
        assert _tick(server, clock), "the first pass runs, a full one"
        assert _reasons(server) == {blocker: "Resources", behind: "Priority"}
        with server.sessions() as s, s.begin():
            s.get(JobRow, ids[0]).state = "COMPLETED"
            s.get(JobRow, ids[0]).allocation = None
            s.add(_job(clock.t + 10))
        late = behind + 1
        assert _tick(server, clock)
        assert server.metrics.cycles["quick"].count == 1
        assert _reasons(server) == {blocker: "Resources", behind: "Priority", late: "None"}, \
            "one GPU is free, but behind the blocker nothing may take it"

        def submit(**kw) -> bool:
            return _submit(server, clock.t + 20, **kw)[1]

        c.wake()
        c.step()  # a quick pass, as the loop runs it: it starts nothing and stops where the last one did
        assert c._stopped is not None
        assert not submit(), "behind where the quick pass stopped: no pass"
        assert submit(priority=5), "ahead of where it stopped: a pass, which starts it"
        assert _states(server)[late + 2] == "RUNNING"

        _settle(server, clock)  # quick passes over what the last read are skipped too, until a full one is due
        quick = server.metrics.cycles["quick"].count
        assert _tick(server, clock, 30), "a full pass, bf_interval_s after the last"
        assert server.metrics.cycles["quick"].count == quick
        assert _reasons(server) == {blocker: "Resources", behind: "Priority", late: "Priority", late + 1: "Priority"}
    finally:
        _stop(server)


def test_a_commit_made_while_a_pass_plans_still_brings_the_next_pass(tmp_path, monkeypatch):
    """A pass's own commit calls for no other pass, but only when nothing else was committed
    since it read the store: a change made while it planned (here, a job held) was not read,
    and the next periodic pass runs for it."""
    from shoal.server import controller

    clock = Clock()
    server, ids = _server(tmp_path, clock, 6)
    planned = controller.schedule
    schedule = _holding_first(server, ids[5], planned)

    try:
        assert _tick(server, clock)
        _settle(server, clock)
        with server.sessions() as s, s.begin():
            s.get(JobRow, ids[5]).priority = 3  # ahead of ids[4]: the next periodic pass runs and writes both reasons
        monkeypatch.setattr(controller, "schedule", schedule)
        assert _tick(server, clock)
        assert _reasons(server)[ids[4]] == "Priority", "the pass wrote (a commit of its own)"
        monkeypatch.setattr(controller, "schedule", planned)
        assert _tick(server, clock), "the hold came after the pass read the store: a pass for it"
        assert not _tick(server, clock)
    finally:
        _stop(server)


def test_a_commit_made_while_a_pass_that_writes_nothing_plans_still_brings_the_next_pass(tmp_path, monkeypatch):
    """A pass that writes nothing makes no commit of its own: a change committed while it
    applies its plan moves the count by one all the same, and is not its own. (Taken for its
    own, the next periodic passes were skipped until ``idle_pass_s``: an srun waited a minute
    in CI.)"""
    from shoal.server import controller

    clock = Clock()
    server, ids = _server(tmp_path, clock, 6)
    applied = controller.start_kept
    start_kept = _holding_first(server, ids[5], applied)  # inside the pass's transaction, after it noted the count

    try:
        assert _tick(server, clock)
        _settle(server, clock)
        monkeypatch.setattr(controller, "start_kept", start_kept)
        before = server.controller.passes
        server.controller.run_pass()  # asked for (an end, a submission): it finds nothing to write
        assert server.controller.passes == before + 1 and _reasons(server)[ids[5]] != "JobHeldUser"
        monkeypatch.setattr(controller, "start_kept", applied)
        assert _tick(server, clock), "the hold came after the pass read the store: a pass for it"
        assert _reasons(server)[ids[5]] == "JobHeldUser"
        assert not _tick(server, clock)
    finally:
        _stop(server)


def _holding_first(server: Server, job_id: int, call):
    """``call``, after a hold of ``job_id`` committed from a session of its own: a change made
    while the caller's pass runs."""
    def wrapped(*args, **kw):
        with server.sessions() as s, s.begin():
            s.get(JobRow, job_id).held = True
        return call(*args, **kw)
    return wrapped
