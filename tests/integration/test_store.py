"""The store on every engine Shoal supports: SQLite (the default) and PostgreSQL (`--db`).

An administrator moving a cluster to PostgreSQL expects the same three promises:
the schema comes from the migrations alone, two writers never silently overwrite each
other, and a job the API acknowledged survives the server being killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import delete, inspect, select
from sqlalchemy.orm.exc import StaleDataError

from shoal.kube.jobs import GANG_LABEL
from shoal.store.engine import make_engine, migrate, session_factory
from shoal.store.models import Base, CleanupRow, JobRow, NodeRow
from tests.integration.cluster import free_port, wait_until


@pytest.fixture
def engine(db_url):
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


def _job(**kw) -> JobRow:
    fields = dict(name="train", user="alice", partition="gpu", state="PENDING", submit_time=time.time(),
                  request={"nodes": 2, "ntasks": 2, "gpus_per_node": 4}, spec={"script": "#!/bin/sh\ntrue\n"},
                  workdir="/tmp")
    return JobRow(**{**fields, **kw})


def _whole(sql: str) -> bool:
    """Whether a statement reads whole job rows (their spec column, not one field of it)."""
    return "jobs.spec" in re.sub(r"JSON_EXTRACT\(jobs\.spec|jobs\.spec\s*->", "", sql)


def _said(cache) -> dict[int, tuple]:
    """A JobRowCache's pending jobs' reasons and estimates, by id (an estimate kept only where one is)."""
    assert None not in cache.said_start.values() and cache.said_start.keys() <= cache.said_reason.keys()
    return {jid: (reason, cache.said_start.get(jid)) for jid, reason in cache.said_reason.items()}


def _node(name: str) -> NodeRow:
    now = time.time()
    return NodeRow(name=name, address="127.0.0.2", port=6818, state="UP", cpus=64, memory_mb=512 * 1024,
                   gpus=[{"index": 0, "uuid": "GPU-0"}], labels={"gpu": "a100"}, features=["a100"],
                   registered_at=now, last_heartbeat=now)


# ------------------------------------------------------------------ migrations


def test_migrations_bring_an_empty_database_to_head(engine):
    migrate(engine)
    tables = set(inspect(engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    assert "alembic_version" in tables
    with engine.connect() as conn:
        head = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
    assert head == [_newest_revision()]


def _newest_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from shoal.store.engine import MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    (newest,) = ScriptDirectory.from_config(cfg).get_heads()
    assert newest >= "0002"  # the scheduling-depth migration is part of the chain
    return newest


def test_migrating_twice_is_a_no_op_and_keeps_the_rows(engine):
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as s, s.begin():
        s.add(_job())
    migrate(engine)
    with sessions() as s:
        assert [j.name for j in s.scalars(select(JobRow))] == ["train"]
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM alembic_version").scalar() == 1


def test_the_migrated_schema_matches_the_models(engine):
    """Nothing the ORM relies on is left to the SQLite-only leniency of the migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    migrate(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_rows_round_trip_json_booleans_and_floats(engine):
    migrate(engine)
    sessions = session_factory(engine)
    submitted = 1_767_225_600.123456
    with sessions() as s, s.begin():
        s.add(_job(submit_time=submitted, held=True, allocation={"nodes": [{"name": "n01", "gpus": [0, 1]}]}))
        s.add(_node("n01"))
    with sessions() as s:
        job = s.scalar(select(JobRow))
        node = s.get(NodeRow, "n01")
    assert job.held is True and job.interactive is False and job.requeue is False
    assert job.submit_time == submitted  # double precision, not float4
    assert job.allocation == {"nodes": [{"name": "n01", "gpus": [0, 1]}]}
    assert job.version == 1 and job.reason == "None" and job.priority == 1
    assert node.gpus == [{"index": 0, "uuid": "GPU-0"}] and node.labels == {"gpu": "a100"}


def test_job_ids_keep_counting_across_commits(engine):
    migrate(engine)
    sessions = session_factory(engine)
    ids = []
    for _ in range(3):
        with sessions() as s, s.begin():
            row = _job()
            s.add(row)
            s.flush()
            ids.append(row.id)
    assert ids == sorted(ids) and len(set(ids)) == 3


# ------------------------------------------------------------------ optimistic concurrency


@pytest.mark.parametrize("kind", ["job", "node"])
def test_the_second_of_two_writers_to_one_row_gets_a_stale_data_error(engine, kind):
    """The scheduler and an API call both change a job (or node): the later commit must not win silently."""
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as s, s.begin():
        row = _job() if kind == "job" else _node("n01")
        s.add(row)
        s.flush()
        key = row.id if kind == "job" else row.name
    model = JobRow if kind == "job" else NodeRow

    first, second = sessions(), sessions()
    try:
        a = first.get(model, key)
        b = second.get(model, key)
        assert a.version == b.version == 1
        a.reason = "Priority"
        first.commit()
        b.reason = "Resources"
        with pytest.raises(StaleDataError):
            second.commit()
        second.rollback()
    finally:
        first.close()
        second.close()

    with sessions() as s:
        row = s.get(model, key)
        assert row.reason == "Priority" and row.version == 2


# ------------------------------------------------------------------ the scheduler's row cache


@pytest.mark.parametrize("counted", [False, True], ids=["versions", "change-count"])
def test_the_controllers_row_cache_sees_every_change_a_fresh_read_would(engine, counted):
    """Passes keep job rows by version between them: a submission, a change, a start and an
    end must each show in the next snapshot exactly as in one built from scratch, whether
    the cache reads every live job's version or only the jobs the commits changed."""
    from shoal.server.snapshot import JobRowCache, build
    from shoal.store.changes import ChangeCount

    from shoal.model.resources import ResourceRequest
    from shoal.server.jobs import request_to_json

    migrate(engine)
    sessions = session_factory(engine)
    one_gpu = request_to_json(ResourceRequest(nodes=1, ntasks=1, gpus_per_node=1))
    with sessions() as s, s.begin():
        s.add_all([_job(name=f"j{i}", request=one_gpu) for i in range(6)])
    cache = JobRowCache(ChangeCount(sessions, {JobRow: "id"}) if counted else None)

    def same() -> None:
        with sessions() as s:
            cached = build(s, (), 1.0, cache=cache)
        with sessions() as s:
            fresh = build(s, (), 1.0)
            said = {r.id: (r.reason, r.expected_start)
                    for r in s.scalars(select(JobRow).where(JobRow.state == "PENDING"))}
        assert cached == fresh  # pending_kinds too: kept by the cache as jobs come and go, asked of each job afresh
        assert _said(cache) == said, "each pending job's reason and estimate, as its row has them"

    same()
    with sessions() as s, s.begin():
        rows = list(s.scalars(select(JobRow).order_by(JobRow.id)))
        rows[0].held = True  # a change the scheduler must see (scontrol hold)
        rows[1].state, rows[1].allocation = "RUNNING", {"nodes": [{"name": "n01", "cpus": 1, "memory_mb": 1,
                                                                   "gpus": [0]}]}
        rows[2].state = "CANCELLED"
        s.add(_job(name="late", request=one_gpu))
    same()
    with sessions() as s:
        cached = build(s, (), 1.0, cache=cache)
    assert [p.name for p in cached.pending] == ["j0", "j3", "j4", "j5", "late"]
    assert cached.pending[0].held and [a.name for a in cached.active] == ["j1"]

    # A pass's own writes, kept once committed (JobRowCache.kept): the next read uses them,
    # and still sees a change made by someone else since.
    with sessions() as s, s.begin():
        started, other = s.scalars(select(JobRow).where(JobRow.name.in_(["j3", "j4"])).order_by(JobRow.id)).all()
        started.state, started.allocation = "RUNNING", {"nodes": [{"name": "n02", "cpus": 1, "memory_mb": 1,
                                                                   "gpus": [1]}]}
        other.reason = "Resources"
    cache.kept([started, other])
    same()
    assert cache.row(started.id) is started and cache.row(other.id) is other, "read back though kept"
    with sessions() as s, s.begin():
        s.get(JobRow, other.id).held = True
    same()
    assert cache.row(other.id) is not other
    with sessions() as s, s.begin():
        done = s.get(JobRow, started.id)
        done.state = "COMPLETED"
    cache.kept([done])
    same()

    # A running job requeued (an old id pending again, before the newer ones) and a job that
    # depends on one no longer live: the views keep the queue's order and the records.
    with sessions() as s, s.begin():
        requeued = s.scalars(select(JobRow).where(JobRow.name == "j1")).one()
        requeued.state, requeued.allocation = "PENDING", None
        s.add(_job(name="after", request=one_gpu,
                   spec={"script": "#!/bin/sh\ntrue\n",
                         "dependencies": [{"kind": "afterok", "job_ids": [done.id]}]}))
    same()
    with sessions() as s:
        cached = build(s, (), 1.0, cache=cache)
    assert [p.name for p in cached.pending] == ["j0", "j1", "j4", "j5", "late", "after"]
    assert cached.jobs[done.id].state.value == "COMPLETED" and not cached.active

    # scontrol update priority: the pending jobs stay in the queue's order (Snapshot.in_queue_order).
    with sessions() as s, s.begin():
        s.scalars(select(JobRow).where(JobRow.name == "j5")).one().priority = 2
    same()
    with sessions() as s:
        cached = build(s, (), 1.0, cache=cache)
    assert cached.in_queue_order and [p.name for p in cached.pending] == ["j5", "j0", "j1", "j4", "late", "after"]

    # A pod of a gang (Kueue's pod group), pending, then running, then pending again.
    pod = {"namespace": "default", "labels": {GANG_LABEL: "g"}, "spec": {"containers": [{"name": "c"}]}}
    with sessions() as s, s.begin():
        s.add(_job(name="pod", kind="pod", request=one_gpu, spec={"pod": pod}))
    same()
    held = {"nodes": [{"name": "n03", "cpus": 1, "memory_mb": 1, "gpus": [0]}]}
    for state, allocation, kinds in (("RUNNING", held, set()), ("PENDING", None, {"pod", "gang"})):
        with sessions() as s, s.begin():
            row = s.scalars(select(JobRow).where(JobRow.name == "pod")).one()
            row.state, row.allocation = state, allocation
        same()
        with sessions() as s:
            assert build(s, (), 1.0, cache=cache).pending_kinds == kinds


def _gpu_node(name: str, gpus: int) -> NodeRow:
    row = _node(name)
    row.gpus = [{"index": i, "uuid": f"GPU-{name}-{i}", "product": "NVIDIA A100", "memory_mb": 81920}
                for i in range(gpus)]
    return row


def _queue(db_url, tmp_path, jobs: int):
    """An in-process server (no agents) with two nodes of two GPUs and ``jobs`` one-GPU jobs queued."""
    from shoal.model.resources import ResourceRequest
    from shoal.server.config import parse_cluster_config
    from shoal.server.core import Server
    from shoal.server.jobs import request_to_json

    config = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}]})
    server = Server(db_url, config, tmp_path)
    one_gpu = request_to_json(ResourceRequest(nodes=1, ntasks=1, gpus_per_node=1, mem_per_node_mb=1024))
    with server.sessions() as s, s.begin():
        s.add_all([_gpu_node("node01", 2), _gpu_node("node02", 2)])
        s.add_all([_job(name=f"j{i}", request=one_gpu) for i in range(jobs)])
    with server.sessions() as s:
        ids = list(s.scalars(select(JobRow.id).order_by(JobRow.id)))
    server.leader.start()  # its passes run by hand, not by its loop (never started)
    wait_until(lambda: server.leader.is_leader, 30, "leadership")
    return server, ids


def _stop(server) -> None:
    server.leader.stop()
    server.engine.dispose()


def _states(server) -> dict[int, tuple[str, int]]:
    with server.sessions() as s:
        return {r.id: (r.state, r.version) for r in s.scalars(select(JobRow))}


@pytest.mark.parametrize("change", ["cancel", "hold"])
def test_a_job_cancelled_or_held_between_the_snapshot_and_the_apply_is_not_started(db_url, tmp_path, change):
    """A pass starts jobs from the rows its snapshot read (a versioned UPDATE): a job changed
    in between must not start, and the pass, planned again, starts the others, each once."""
    from shoal.server import jobs as jobsvc

    server, ids = _queue(db_url, tmp_path, 5)
    first, snapshots = ids[0], []
    taken = server.snapshot

    def snapshot(session, now, **kw):
        snap = taken(session, now, **kw)
        if not snapshots:  # the first pass's snapshot has the job pending; then it changes
            assert first in {p.id for p in snap.pending}
            with server.sessions() as s, s.begin():
                row = s.get(JobRow, first)
                if change == "cancel":
                    jobsvc.finish(s, row, jobsvc.JobState.CANCELLED, 1000.0)
                else:
                    row.held = True
        snapshots.append(snap)
        return snap

    server.snapshot = snapshot
    try:
        server.controller.run_pass()
        states = _states(server)
        assert states[first][0] == ("CANCELLED" if change == "cancel" else "PENDING")
        assert [jid for jid in ids if states[jid][0] == "RUNNING"] == ids[1:5], "the other four on the four GPUs"
        assert len(snapshots) == 2, "the apply refused the first plan, and the pass planned again"
        with server.sessions() as s:  # each started once: one allocation each, no GPU twice
            held = [(n["name"], g) for r in s.scalars(select(JobRow).where(JobRow.state == "RUNNING"))
                    for n in r.allocation["nodes"] for g in n["gpus"]]
        assert len(held) == len(set(held)) == 4
    finally:
        _stop(server)


def test_the_jobs_a_pass_starts_are_seen_by_the_next_pass_and_by_the_agents_work(db_url, tmp_path):
    """Starts written from the kept rows (not through the ORM) are counted as changes: the
    running jobs' index (agents' work) and the queue view see them, and the next pass's
    snapshot, from the rows kept, is the one a fresh read makes."""
    from shoal.server.snapshot import build

    server, ids = _queue(db_url, tmp_path, 6)
    try:
        with server.sessions() as s:  # both read once before: then only from the changes counted
            assert not server.running.on_node(s, "node01")
        assert len(server.queue.jobs()) == 6
        server.controller.run_pass()
        states = _states(server)
        running = [jid for jid in ids if states[jid][0] == "RUNNING"]
        assert running == ids[:4] and all(states[jid][1] == 2 for jid in running), "one write each"
        with server.sessions() as s:
            on = {n: [j.id for j in server.running.on_node(s, n)] for n in ("node01", "node02")}
        assert sorted(on["node01"] + on["node02"]) == running
        assert {j["job_id"]: j["state"] for j in server.queue.jobs()} == {jid: states[jid][0] for jid in ids}
        now = server.clock()
        with server.sessions() as s:
            kept = build(s, server.partitions, now, cache=server.controller._rows)
        with server.sessions() as s:
            fresh = build(s, server.partitions, now)
        assert kept == fresh
        with server.sessions() as s, s.begin():  # one ends (and is cleaned up): the next in line starts
            jobsvc_finish(s, s.get(JobRow, running[0]))
        with server.sessions() as s, s.begin():
            s.execute(delete(CleanupRow).where(CleanupRow.job_id == running[0]))
        server.controller.run_pass()
        states = _states(server)
        assert [jid for jid in ids if states[jid][0] == "RUNNING"] == ids[1:5]
    finally:
        _stop(server)


def test_a_step_and_a_silent_nodes_lost_clean_ups_count_as_changes_to_their_jobs_alone(db_url, tmp_path):
    """srun's step-id lock (a no-op write of its job) and a silent node's clean-ups dropped
    are counted as changes to those jobs, not as "any job" (``ALL``), which made squeue's view
    and the scheduler's rows read the whole queue again at every srun."""
    from shoal.server import jobcontrol
    from shoal.server.auth import Principal
    from shoal.server.schemas import StepCreate
    from shoal.store.changes import ALL, ChangeCount

    server, ids = _queue(db_url, tmp_path, 6)
    seen = ChangeCount(server.sessions, {JobRow: "id", CleanupRow: "job_id"})
    try:
        server.controller.run_pass()
        running = [jid for jid, (state, _) in _states(server).items() if state == "RUNNING"]
        assert len(running) == 4
        seen.take()
        with server.sessions() as s:
            step = jobcontrol.create_step(server, s, running[0], StepCreate(argv=["hostname"]),
                                          Principal(user="alice", role="user"))
        assert step["step_id"] == 0 and seen.take() == set(), "no job changed (its version is written as it was)"
        with server.sessions() as s:
            on = [r.id for r in s.scalars(select(JobRow).where(JobRow.id.in_(running)))
                  if r.allocation["nodes"][0]["name"] == "node01"]
        with server.sessions() as s, s.begin():  # a job on node01 ends: its clean-up is left there
            jobsvc_finish(s, s.get(JobRow, on[0]))
        seen.take()
        assert [j["job_id"] for j in server.queue.jobs() if j["completing"]] == [on[0]]
        with server.sessions() as s, s.begin():  # node01 is silent: its jobs and clean-ups go
            server.controller.fail_nodes_jobs(s, frozenset({"node01"}), server.clock(), silent=True)
        keys = seen.take()
        assert ALL not in keys and keys == set(on), keys
        with server.sessions() as s:
            assert not s.scalars(select(CleanupRow).where(CleanupRow.node == "node01")).all()
        assert _states(server)[on[1]][0] == "NODE_FAIL"  # not --requeue
        assert not set(on) & {j["job_id"] for j in server.queue.jobs()}, "both gone from the queue"
    finally:
        _stop(server)


def jobsvc_finish(session, row) -> None:
    from shoal.server import jobs as jobsvc

    jobsvc.finish(session, row, jobsvc.JobState.COMPLETED, row.start_time + 1, exit_code=0)


def test_a_passes_reasons_are_written_only_to_rows_unchanged_since_its_snapshot_and_seen_at_once(engine):
    """The pass writes its new reasons and start estimates as one versioned UPDATE
    (controller.write_reasons): squeue's view shows them at once, each written row's version
    moves (the caches read it), and a job cancelled or held between the snapshot and the
    write keeps what it has; the row cache then says what a fresh read would."""
    from shoal.model.resources import ResourceRequest
    from shoal.server.controller import write_reasons
    from shoal.server.jobs import request_to_json
    from shoal.server.queueview import QueueView
    from shoal.server.snapshot import JobRowCache, build
    from shoal.store.changes import ChangeCount
    from shoal.store.models import CleanupRow

    migrate(engine)
    sessions = session_factory(engine)
    view = QueueView(sessions, ChangeCount(sessions, {JobRow: "id", CleanupRow: "job_id"}))
    cache = JobRowCache(ChangeCount(sessions, {JobRow: "id"}))
    with sessions() as s, s.begin():
        jobs = [_job(name=f"j{i}", request=request_to_json(ResourceRequest(nodes=1, ntasks=1, gpus_per_node=1)))
                for i in range(4)]
        s.add_all(jobs)
    ids = [j.id for j in jobs]

    def snapshot():
        with sessions() as s:
            cached = build(s, (), 1.0, cache=cache)
        with sessions() as s:
            assert cached == build(s, (), 1.0)
            assert _said(cache) == {r.id: (r.reason, r.expected_start)
                                    for r in s.scalars(select(JobRow).where(JobRow.state == "PENDING"))}

    def stored() -> list[tuple]:
        with sessions() as s:
            return [(r.state, r.reason, r.expected_start, r.held, r.version)
                    for r in s.scalars(select(JobRow).where(JobRow.id.in_(ids)).order_by(JobRow.id))]

    snapshot()
    assert [j["reason"] for j in view.jobs()] == ["None"] * 4
    with sessions() as s, s.begin():  # scancel and scontrol hold after the pass's snapshot
        s.get(JobRow, ids[2]).state = "CANCELLED"
        row = s.get(JobRow, ids[3])
        row.held, row.reason = True, "JobHeldUser"
    with sessions() as s, s.begin():
        written = write_reasons(s, cache, {ids[0]: ("Priority", 50.0), ids[1]: ("Resources", 100.0),
                                           ids[2]: ("Priority", 60.0), ids[3]: ("Priority", 70.0)}, full=True)
    assert written == []  # not every row was written: the next read re-reads them all
    assert stored() == [("PENDING", "Priority", 50.0, False, 2), ("PENDING", "Resources", 100.0, False, 2),
                        ("CANCELLED", "None", None, False, 2), ("PENDING", "JobHeldUser", None, True, 2)]
    assert [(j["job_id"], j["reason"]) for j in view.jobs()] == [
        (ids[0], "Priority"), (ids[1], "Resources"), (ids[3], "JobHeldUser")]
    snapshot()
    assert cache.row(ids[0]).reason == "Priority" and cache.row(ids[0]).version == 2

    # Every row written: the cache's rows are made to match once committed, not read back.
    with sessions() as s, s.begin():
        written = write_reasons(s, cache, {ids[0]: ("Resources", None), ids[1]: ("Priority", None)}, full=False)
    assert [(jid, seen) for jid, seen, _ in written] == [(ids[0], 2), (ids[1], 2)]
    kept = cache.row(ids[0])
    for jid, seen, values in written:
        cache.written(jid, seen, values)
    assert stored()[:2] == [("PENDING", "Resources", 50.0, False, 3), ("PENDING", "Priority", 100.0, False, 3)]
    snapshot()
    assert cache.row(ids[0]) is kept and (kept.reason, kept.expected_start, kept.version) == ("Resources", 50.0, 3)
    assert [j["reason"] for j in view.jobs()] == ["Resources", "Priority", "JobHeldUser"]


# ------------------------------------------------------------------ the agents' work answers


@pytest.mark.parametrize("watched", [True, False], ids=["one-server", "shared-store"])
def test_an_agents_work_lists_its_runs_as_the_store_has_them_after_every_change(engine, watched):
    """Batch runs' entries are kept between answers by row version (RunEntries): an unchanged
    job is not read again, a changed one is, an ended one is dropped, and a pod's entry is
    built afresh each time (it names its node's current address). The node's jobs come from
    the running jobs' index (RunningJobs), or from a read per answer where its change count
    is off (several servers on one store)."""
    from sqlalchemy import event

    from shoal.server.hub import WorkHub
    from shoal.server.running import RunningJobs
    from shoal.server.work import RunEntries, node_work
    from shoal.store.changes import ChangeCount

    migrate(engine)
    sessions = session_factory(engine)
    addresses = {"n01": "127.0.0.2", "n02": "127.0.0.3"}
    entries = RunEntries()
    running = RunningJobs(sessions, ChangeCount(sessions, {JobRow: "id"}, enabled=watched), entries.drop)
    server = SimpleNamespace(run_entries=entries, running=running, hub=WorkHub(), submit_host="login",
                             secret=b"k" * 32,
                             node_address=addresses.get,
                             config=SimpleNamespace(cluster_name="c", nodes=SimpleNamespace(
                                 kill_wait_s=2.0, heartbeat_interval_s=5.0)))
    two = {"nodes": [{"name": "n01", "cpus": 2, "memory_mb": 10, "gpus": [0, 1]},
                     {"name": "n02", "cpus": 2, "memory_mb": 10, "gpus": [3]}]}
    with sessions() as s, s.begin():
        gang = _job(name="gang", state="RUNNING", allocation=two, batch_host="n01", start_time=100.0,
                    time_limit_s=60)
        pod = _job(name="web", state="RUNNING", kind="pod", batch_host="n02", start_time=100.0,
                   allocation={"nodes": [two["nodes"][1]]},
                   spec={"pod": {"namespace": "default", "name": "web-1", "uid": "u1", "spec": {}}})
        s.add_all([gang, pod, _job(name="waiting")])
    full_reads = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, sql, *a: full_reads.append(sql) if _whole(sql) else None)

    def work(node: str) -> dict:
        with sessions() as s:
            return {r["job_id"]: r for r in json.loads(node_work(s, server, node, 7))["runs"]}

    first, second = work("n01"), work("n02")
    assert set(first) == {gang.id} and set(second) == {gang.id, pod.id}
    assert first[gang.id]["batch"]["slurm_env"]["SLURM_JOB_NODELIST"] == "n[01-02]"
    assert first[gang.id]["batch"]["slurm_env"]["SLURM_JOB_END_TIME"] == "160"
    assert "batch" not in second[gang.id] and second[gang.id]["nodeid"] == 1 and second[gang.id]["gpus"] == [3]
    assert second[pod.id]["pod"]["env"]["POD_IP"] == "127.0.0.3"
    reads = len(full_reads)
    addresses["n02"] = "127.0.0.9"
    again = work("n02")
    assert again[gang.id] == second[gang.id]
    assert again[pod.id]["pod"]["env"]["POD_IP"] == "127.0.0.9"
    assert len(full_reads) == reads + 1, "the unchanged batch job was read again (only the pod's row should be)"

    with sessions() as s, s.begin():
        s.get(JobRow, gang.id).time_limit_s = 120  # scontrol update TimeLimit: a new version
    assert work("n01")[gang.id]["batch"]["slurm_env"]["SLURM_JOB_END_TIME"] == "220"
    with sessions() as s, s.begin():
        s.get(JobRow, gang.id).state = "COMPLETED"
    assert set(work("n01")) == set() and set(work("n02")) == {pod.id}
    assert len(server.run_entries) == 0


def test_the_running_jobs_index_holds_what_a_fresh_read_would_and_reads_only_what_changed(engine):
    """RunningJobs (agents' work answers, sinfo): after every kind of change (start, a
    multi-node start, an update, an end, a bulk UPDATE) each node's jobs and their holdings
    (one by one and summed, as sinfo shows them) are those a fresh read of the store gives; an answer with nothing changed reads nothing,
    one after a change reads only the changed jobs; ended jobs are reported once."""
    from sqlalchemy import event, update

    from shoal.server.running import _COLUMNS, RunningJobs, _running, summed
    from shoal.store.changes import ChangeCount

    migrate(engine)
    sessions = session_factory(engine)
    ended: list[int] = []
    index = RunningJobs(sessions, ChangeCount(sessions, {JobRow: "id"}), ended.extend)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, sql, params, *a: statements.append((sql, params)) if "FROM jobs" in sql else None)

    def one(name: str, gpus: int) -> dict:
        return {"name": name, "cpus": 2 * gpus, "memory_mb": 100 * gpus, "gpus": list(range(gpus))}

    def fresh(node: str) -> list:
        with sessions() as s:
            rows = s.execute(select(*_COLUMNS).where(JobRow.state == "RUNNING").order_by(JobRow.id)).all()
        return [j for j in (_running(*r) for r in rows) if node in j.nodes]

    def check() -> None:
        """The index against a fresh read; ``statements`` left holding only the index's reads."""
        expected = {node: fresh(node) for node in ("n01", "n02", "n03")}
        del statements[:]
        with sessions() as s:
            got = {node: index.on_node(s, node) for node in expected}
            every = sorted(j.id for j in index.all(s))
            _, use = index.use(s)
        assert got == expected
        assert use == {node: summed(node, jobs) for node, jobs in expected.items() if jobs}
        assert every == sorted({j.id for jobs in expected.values() for j in jobs})

    with sessions() as s, s.begin():
        jobs = [_job(name=f"j{i}", state="RUNNING", allocation={"nodes": [one(f"n0{1 + i % 2}", 1 + i)]},
                     user=f"u{i % 2}", start_time=100.0 + i, spec={"account": "physics"} if i % 2 else {})
                for i in range(4)] + [_job(name="waiting")]
        s.add_all(jobs)
    check()
    check()
    assert statements == [], "an answer with nothing changed read the jobs again"

    with sessions() as s, s.begin():  # a gang job starts on all three nodes
        gang = _job(name="gang", state="RUNNING", allocation={"nodes": [one("n01", 1), one("n02", 2), one("n03", 4)]})
        s.add(gang)
    check()
    assert len(statements) == 1 and " IN " in statements[0][0], "the change was not read by id alone"
    ids = statements[0][1].values() if isinstance(statements[0][1], dict) else statements[0][1]
    assert [v for v in ids if isinstance(v, int)] == [gang.id]
    with sessions() as s:
        assert [j.nodes["n03"].gpus for j in index.on_node(s, "n03")] == [4]

    with sessions() as s, s.begin():  # one ends, one changes (a new version), one pending starts
        s.get(JobRow, jobs[0].id).state = "COMPLETED"
        s.get(JobRow, jobs[1].id).time_limit_s = 60
        s.get(JobRow, jobs[1].id).spec = {"account": "chem"}  # (the index keeps the account: /metrics)
        w = s.get(JobRow, jobs[4].id)
        w.state, w.allocation = "RUNNING", {"nodes": [one("n03", 1)]}
    check()
    assert ended == [jobs[0].id]
    with sessions() as s, s.begin():  # a bulk UPDATE: any job may have changed
        s.execute(update(JobRow).where(JobRow.id == gang.id).values(state="CANCELLED"))
    check()
    assert sorted(ended) == sorted([jobs[0].id, gang.id])


@pytest.mark.parametrize("watched", [True, False], ids=["one-server", "shared-store"])
def test_the_first_agent_woken_by_a_pass_encodes_every_nodes_new_runs_for_the_others(engine, watched):
    """A pass that starts a job on each of many nodes wakes every agent at once: the first
    answer reads and encodes the new runs of all of them in one read, and the other nodes'
    answers find theirs kept (one read each under one lock had a thousand answers wait in
    turn, past the agents' timeout on PostgreSQL)."""
    from sqlalchemy import event

    from shoal.server.hub import WorkHub
    from shoal.server.running import RunningJobs
    from shoal.server.work import RunEntries, node_work
    from shoal.store.changes import ChangeCount

    migrate(engine)
    sessions = session_factory(engine)
    entries = RunEntries()
    running = RunningJobs(sessions, ChangeCount(sessions, {JobRow: "id"}, enabled=watched), entries.drop)
    server = SimpleNamespace(run_entries=entries, running=running, hub=WorkHub(), submit_host="login",
                             secret=b"k" * 32, node_address=lambda node: "127.0.0.2",
                             config=SimpleNamespace(cluster_name="c", nodes=SimpleNamespace(
                                 kill_wait_s=2.0, heartbeat_interval_s=5.0)))
    nodes = [f"n{i:02d}" for i in range(20)]
    with sessions() as s, s.begin():
        jobs = [_job(name=f"t{i}", state="RUNNING", batch_host=node, start_time=100.0,
                     allocation={"nodes": [{"name": node, "cpus": 1, "memory_mb": 10, "gpus": [0]}]})
                for i, node in enumerate(nodes)]
        s.add_all(jobs)
    whole_reads = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, sql, *a: whole_reads.append(sql) if _whole(sql) else None)

    def work(node: str) -> list[int]:
        with sessions() as s:
            return [r["job_id"] for r in json.loads(node_work(s, server, node, 1))["runs"]]

    assert [work(node) for node in nodes] == [[j.id] for j in jobs]
    assert len(whole_reads) == 1, f"{len(whole_reads)} reads of whole job rows for {len(nodes)} nodes' new runs"


def test_long_polls_woken_together_on_a_shared_store_share_one_fresh_read_of_the_running_jobs(engine):
    """With several servers on one store the running jobs' index is off and each answer needs
    the store as it is now: a pass's starts wake a thousand long-polls at once, and a read each
    (a pool connection checked out meanwhile) ran PostgreSQL's pool dry. The answers that come
    in while one read is under way share the next read, which begins after they came: each
    sees every job committed before it asked, none waits holding a connection."""
    from sqlalchemy import event

    from shoal.server.running import RunningJobs
    from shoal.store.changes import ChangeCount

    migrate(engine)
    sessions = session_factory(engine)
    index = RunningJobs(sessions, ChangeCount(sessions, {JobRow: "id"}, enabled=False))
    on_n01 = {"nodes": [{"name": "n01", "cpus": 1, "memory_mb": 10, "gpus": [0]}]}
    with sessions() as s, s.begin():
        early = _job(name="early", state="RUNNING", allocation=on_n01)
        s.add(early)
    reads: list[float] = []
    gate = threading.Event()

    def read_done(conn, cursor, sql, *a) -> None:
        if "FROM jobs" in sql and "jobs.allocation" in sql:
            reads.append(time.monotonic())
            if len(reads) == 1:
                gate.wait(30)  # the first read holds its result until the others have asked

    event.listen(engine, "after_cursor_execute", read_done)

    def jobs_on_n01() -> set[int]:
        with sessions() as s:
            return {j.id for j in index.on_node(s, "n01")}

    with ThreadPoolExecutor(60) as pool:
        first = pool.submit(jobs_on_n01)
        deadline = time.monotonic() + 30
        while not reads and time.monotonic() < deadline:
            time.sleep(0.01)
        with sessions() as s, s.begin():  # a pass starts a job while the first read is under way
            late = _job(name="late", state="RUNNING", allocation=on_n01)
            s.add(late)
        woken = [pool.submit(jobs_on_n01) for _ in range(50)]  # the long-polls it wakes
        time.sleep(2)
        gate.set()
        assert first.result(30) == {early.id}
        assert all(w.result(30) == {early.id, late.id} for w in woken), "an answer missed a job started before it asked"
    assert len(reads) <= 3, f"{len(reads)} reads of the running jobs for 51 answers"


# ------------------------------------------------------------------ durability


CONFIG = {"cluster_name": "store-test", "partitions": [{"name": "gpu", "nodes": "n[01-02]", "default": True}]}


class ServerProcess:
    """`shoal server` alone (no agents): enough to submit jobs and read them back."""

    def __init__(self, root: Path, db: str) -> None:
        self.root = root
        self.db = db
        self.port = free_port()
        self.config = root / "cluster.yaml"
        self.config.write_text(json.dumps(CONFIG))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerProcess":
        env = {**os.environ, "SHOAL_LOG_LEVEL": "WARNING"}
        log = open(self.root / "server.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shoal", "server", "--listen", f"127.0.0.1:{self.port}", "--config",
             str(self.config), "--state-dir", str(self.root / "state"), "--db", self.db],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"shoal server exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.client().get("/healthz", timeout=1)
                return self
            except Exception:
                time.sleep(0.05)
        raise AssertionError(f"shoal server did not come up within 60s:\n{self.log_tail()}")

    def client(self):
        from shoal.api_client import Client

        token_file = self.root / "state" / "admin.token"
        token = token_file.read_text().strip() if token_file.exists() else None
        c = Client(self.url, token)
        c.job_token = None
        return c

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log_tail(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def server_process(tmp_path, db_url):
    procs: list[ServerProcess] = []

    def make() -> ServerProcess:
        p = ServerProcess(tmp_path, db_url)
        procs.append(p)
        return p

    yield make
    for p in procs:
        p.kill()


def test_a_submitted_job_survives_the_server_being_killed(server_process, tmp_path):
    server = server_process().start()
    body = {"name": "survivor", "script": "#!/bin/sh\nsleep 1\n", "workdir": str(tmp_path), "nodes": 2,
            "gpus_per_node": 4, "comment": "must outlive a SIGKILL"}
    job_id = server.client().request("POST", "/shoal/v1/jobs", body)["job_id"]

    server.kill()  # no shutdown hooks, no flush: only what was committed before the 201 counts
    server.start()

    job = server.client().get(f"/shoal/v1/jobs/{job_id}")
    assert job["job_id"] == job_id
    assert job["name"] == "survivor" and job["state"] == "PENDING"
    assert job["nodes"] == 2 and job["gpus_per_node"] == 4 and job["comment"] == "must outlive a SIGKILL"
    # The restarted server keeps counting: no job id is handed out twice.
    again = server.client().request("POST", "/shoal/v1/jobs", {**body, "name": "after-restart"})["job_id"]
    assert again > job_id


def test_the_change_count_goes_up_once_a_job_write_is_committed_and_only_then(engine):
    from sqlalchemy import update

    from shoal.store.changes import ALL, ChangeCount
    from shoal.store.models import CleanupRow

    migrate(engine)
    sessions = session_factory(engine)
    changes = ChangeCount(sessions, {JobRow: "id", CleanupRow: "job_id"})
    with sessions() as s, s.begin():
        job = _job()
        s.add(job)
        s.flush()
        assert changes.value == 0, "counted before the commit: a reader could cache the old rows under it"
    assert changes.value == 1 and changes.take() == {job.id} and changes.take() == set()
    with sessions() as s, s.begin():
        s.add(_node("n01"))  # not a watched table
    assert changes.value == 1
    with sessions() as s:
        s.begin()
        s.scalar(select(JobRow)).state = "RUNNING"
        s.flush()
        s.rollback()
    assert changes.value == 1, "a rolled-back write changed nothing"
    assert changes.take() == set()
    with sessions() as s, s.begin():
        s.execute(update(JobRow).values(reason="Priority"))  # a bulk statement, not the unit of work
    assert changes.value == 2 and changes.take() == {ALL}
    with sessions() as s, s.begin():
        s.add(CleanupRow(job_id=job.id, run=0, node="n01", cpus=1, memory_mb=1, since=time.time()))
    assert changes.value == 3 and changes.take() == {job.id}
    with sessions() as s, s.begin():
        s.scalar(select(JobRow)).reason = "Resources"
    with pytest.raises(RuntimeError), changes.taken() as keys:  # a reader's read of them fails
        assert keys == {job.id}
        raise RuntimeError("the store is gone")
    with changes.taken() as keys:
        assert keys == {job.id}, "given back for the next reader"
    assert changes.take() == set()


def test_an_arrays_submission_counts_as_a_change_to_its_tasks_alone(engine):
    """An array's tasks are stored with their array's id; the change count names those tasks,
    not "any job" (which would make the scheduler and squeue's view read the whole queue)."""
    from shoal.server.jobs import _insert
    from shoal.store.changes import ALL, ChangeCount
    from shoal.store.models import CleanupRow

    migrate(engine)
    sessions = session_factory(engine)
    changes = ChangeCount(sessions, {JobRow: "id", CleanupRow: "job_id"})
    common = {c: getattr(_job(), c) for c in ("name", "user", "partition", "state", "submit_time", "request",
                                              "spec", "workdir")}
    with sessions() as s, s.begin():
        answer = _insert(s, common, [0, 1, 2], None)
    keys = changes.take()
    assert ALL not in keys
    with sessions() as s:
        tasks = s.execute(select(JobRow.id, JobRow.array_job_id, JobRow.array_task_id).order_by(JobRow.id)).all()
    assert keys == {t.id for t in tasks} and len(tasks) == 3
    assert {(t.array_job_id, t.array_task_id) for t in tasks} == {(answer["job_id"], i) for i in range(3)}


def test_the_queue_view_kept_in_memory_lists_what_the_store_says(engine):
    """squeue's view (server.queueview) after each kind of change, against a read of the store."""
    from sqlalchemy import update

    import gzip

    from shoal.server import listing
    from shoal.server.queueview import QueueView
    from shoal.slurm import squeue
    from shoal.store.changes import ChangeCount
    from shoal.store.models import CleanupRow

    migrate(engine)
    sessions = session_factory(engine)
    view = QueueView(sessions, ChangeCount(sessions, {JobRow: "id", CleanupRow: "job_id"}))

    def listed() -> list[tuple]:
        jobs = view.jobs()
        # The whole answer squeue gets, encoded once per change and then kept (in each form,
        # gzipped or not, its arrays merged or not), says the same.
        for _ in range(2):
            assert json.loads(view.encoded(view.jobs())) == {"jobs": jobs}
            assert json.loads(gzip.decompress(view.encoded(view.jobs(), "jobs", True))) == {"jobs": jobs}
            for merged in (False, True):
                wanted = listing.collapse(jobs) if merged else jobs
                got = view.collapsed_jobs() if merged else view.jobs()
                for form in ("rows", "packed"):
                    assert squeue.listed_jobs(json.loads(gzip.decompress(view.encoded(got, form, True)))) == \
                        squeue.listed_jobs(json.loads(listing.encode(wanted, "rows")))
        return [(j["job_id"], j["state"], j["reason"], j["completing"]) for j in jobs]

    with sessions() as s, s.begin():
        jobs = [_job(name=f"j{i}") for i in range(5)]
        s.add_all(jobs)
    ids = [j.id for j in jobs]
    assert listed() == [(i, "PENDING", "None", False) for i in ids]
    with sessions() as s, s.begin():
        s.get(JobRow, ids[0]).state = "RUNNING"
        s.get(JobRow, ids[1]).state = "COMPLETED"  # ended: gone from the queue
        row = s.get(JobRow, ids[2])
        row.state = "COMPLETED"
        s.add(CleanupRow(job_id=row.id, run=0, node="n01", cpus=1, memory_mb=1, since=time.time()))
    assert listed() == [(ids[0], "RUNNING", "None", False), (ids[2], "COMPLETED", "None", True),
                        (ids[3], "PENDING", "None", False), (ids[4], "PENDING", "None", False)]
    with sessions() as s, s.begin():
        s.delete(s.get(CleanupRow, (ids[2], 0, "n01")))  # its clean-up done: no longer completing
        s.execute(update(JobRow).where(JobRow.id == ids[3]).values(reason="Priority"))
    assert listed() == [(ids[0], "RUNNING", "None", False), (ids[3], "PENDING", "Priority", False),
                        (ids[4], "PENDING", "None", False)]
    with sessions() as s:  # rolled back: nothing to see
        s.begin()
        s.get(JobRow, ids[4]).state = "RUNNING"
        s.flush()
        s.rollback()
    assert listed()[-1] == (ids[4], "PENDING", "None", False)

    def merged() -> list[tuple]:
        """The rows squeue gets gzipped, each array's pending tasks as one."""
        got = json.loads(gzip.decompress(view.encoded(view.collapsed_jobs(), "packed", True)))
        return [(j["job_id"], j["state"], j["array_tasks"]) for j in squeue.listed_jobs(got)]

    with sessions() as s, s.begin():
        tasks = [_job(name="sweep", array_job_id=10 ** 6, array_task_id=t) for t in range(3)]
        s.add_all(tasks)
    assert merged()[-1] == (tasks[0].id, "PENDING", "0-2") and len(merged()) == 4
    with sessions() as s, s.begin():
        s.get(JobRow, tasks[1].id).state = "RUNNING"  # a task starts: the kept answers are made again
    assert merged()[-2:] == [(tasks[0].id, "PENDING", "0,2"), (tasks[1].id, "RUNNING", None)]
    stale = view.collapsed_jobs()  # a request's listing, replaced by a change before it is encoded
    with sessions() as s, s.begin():
        s.get(JobRow, tasks[2].id).state = "RUNNING"
    assert view.collapsed_jobs() is not stale and merged()[-1] == (tasks[2].id, "RUNNING", None)
    for _ in range(2):
        got = json.loads(gzip.decompress(view.encoded(stale, "packed", True)))
        assert squeue.listed_jobs(got) == squeue.listed_jobs(json.loads(listing.encode(stale, "rows")))
    assert merged()[-1] == (tasks[2].id, "RUNNING", None)


def test_the_follower_syncs_squeues_view_and_the_running_index_and_encodes_the_rows_squeue_shows(
        engine, monkeypatch):
    """The follower (server/follower.py) syncs the queue view and the running jobs' index after
    commits with no request asking, and encodes the rows plain squeue shows, so the first
    squeue or sinfo after a storm finds them made; a sync that fails (the store unreachable)
    gives the change keys it had taken back, so the next one reads those jobs."""
    from sqlalchemy.exc import OperationalError

    from shoal.server import listing
    from shoal.server.follower import Follower
    from shoal.server.queueview import QueueView
    from shoal.server.running import RunningJobs
    from shoal.slurm import squeue
    from shoal.store.changes import ChangeCount

    migrate(engine)
    sessions = session_factory(engine)
    view = QueueView(sessions, ChangeCount(sessions, {JobRow: "id", CleanupRow: "job_id"}))
    running = RunningJobs(sessions, ChangeCount(sessions, {JobRow: "id"}))
    follower = Follower([view.sync, running.sync], interval_s=0.02)
    follower.start()
    try:
        with sessions() as s, s.begin():
            s.add_all([_job(name=f"j{i}") for i in range(3)]
                      + [_job(name="sweep", array_job_id=10 ** 6, array_task_id=t) for t in range(4)])
        wait_until(lambda: view.current, 5, "the follower to sync the view")
        with sessions() as s, s.begin():
            row = s.scalar(select(JobRow).where(JobRow.name == "j0"))
            row.state, row.allocation = "RUNNING", {"nodes": [{"name": "n01", "cpus": 2, "memory_mb": 8, "gpus": []}]}
        wait_until(lambda: [j.id for j in running.known()] == [row.id], 5, "the follower to sync the running jobs")
        wait_until(lambda: view.current, 5, "the follower to sync the view")
    finally:
        follower.stop()  # its last sync ended
    made: list[dict] = []
    monkeypatch.setitem(listing.ENCODERS, "packed", lambda job: made.append(job) or listing.packed_row(job))
    rows = squeue.listed_jobs(json.loads(view.encoded(view.collapsed_jobs(), "packed")))
    assert [(j["name"], j["state"]) for j in rows] == [("j0", "RUNNING"), ("j1", "PENDING"), ("j2", "PENDING"),
                                                        ("sweep", "PENDING")]
    assert made == [], "the follower encoded the answer's pages: the request only joins them"
    with sessions() as s, s.begin():  # with no follower, the request makes the page that changed
        s.scalar(select(JobRow).where(JobRow.name == "j2")).reason = "Priority"
    rows = squeue.listed_jobs(json.loads(view.encoded(view.collapsed_jobs(), "packed")))
    assert [(j["name"], j["reason"]) for j in rows][2] == ("j2", "Priority")
    assert sorted(j["name"] for j in made) == ["j2", "sweep"], "the changed job and the merged row made again"
    with sessions() as s, s.begin():
        s.scalar(select(JobRow).where(JobRow.name == "j1")).state = "RUNNING"
    real = view.sessions

    def unreachable():
        raise OperationalError("SELECT", {}, Exception("the store is gone"))

    view.sessions = running.sessions = unreachable
    for sync in (view.sync, running.sync):
        with pytest.raises(OperationalError):
            sync()
    view.sessions = running.sessions = real
    assert [(j["name"], j["state"]) for j in view.jobs()][:3] == [("j0", "RUNNING"), ("j1", "RUNNING"),
                                                                 ("j2", "PENDING")]
    with sessions() as s:
        assert sorted(j.id for j in running.all(s)) == sorted(s.scalars(select(JobRow.id).where(
            JobRow.state == "RUNNING")))


def test_a_savepoints_rollback_keeps_the_change_keys_of_the_transaction_around_it(engine):
    from shoal.store.changes import ChangeCount
    from shoal.store.models import CleanupRow

    migrate(engine)
    sessions = session_factory(engine)
    changes = ChangeCount(sessions, {JobRow: "id", CleanupRow: "job_id"})
    with sessions() as s, s.begin():
        kept = _job(name="kept")
        s.add(kept)
        s.flush()
        savepoint = s.begin_nested()
        s.add(_job(name="undone"))
        s.flush()
        savepoint.rollback()
    assert changes.value == 1 and kept.id in changes.take()


def test_rows_inserted_by_a_core_statement_are_stored_whole_and_counted_as_a_flush_counts_them(engine):
    """insert_rows (submissions' INSERT, without the unit of work): the keys in order, the
    columns' defaults and the version an ORM insert would give, and the counts told only
    once the rows are committed."""
    from shoal.store.changes import ChangeCount, insert_rows

    migrate(engine)
    sessions = session_factory(engine)
    jobs = ChangeCount(sessions, {JobRow: "id"})
    nodes = ChangeCount(sessions, {NodeRow: "name"})
    fields = dict(name="train", user="alice", partition="gpu", state="PENDING", submit_time=1.0,
                  request={"nodes": 1}, spec={"script": "#!/bin/sh\ntrue\n", "argv": ["a"]}, workdir="/tmp",
                  version=1)
    with sessions() as s, s.begin():
        one = insert_rows(s, JobRow, [fields])
        many = insert_rows(s, JobRow, [{**fields, "name": f"t{i}"} for i in range(5)])
        assert jobs.value == 0, "counted before the commit"
    assert len(one) == 1 and many == sorted(many) and one[0] < many[0]
    assert jobs.value == 1 and jobs.take() == {*one, *many} and nodes.value == 0
    with sessions() as s:
        rows = {r.id: r for r in s.scalars(select(JobRow))}
        assert [rows[i].name for i in many] == [f"t{i}" for i in range(5)]
        head = rows[one[0]]
        assert (head.reason, head.held, head.kind, head.priority, head.version) == ("None", False, "batch", 1, 1)
        assert head.spec == fields["spec"] and head.request == {"nodes": 1}
        head.state = "RUNNING"  # the optimistic version check finds the version it expects
        s.commit()
        assert head.version == 2
    with sessions() as s:
        s.begin()
        insert_rows(s, JobRow, [fields])
        s.rollback()
    assert jobs.value == 2 and jobs.take() == {one[0]}, "a rolled-back insert was counted"


def test_two_change_counts_on_one_session_factory_each_see_their_own_tables(engine):
    """The jobs' count (squeue's view) and the nodes' (sbatch's node check) on one factory:
    one commit writing both tables moves each, with its own keys."""
    from shoal.store.changes import ChangeCount

    migrate(engine)
    sessions = session_factory(engine)
    jobs = ChangeCount(sessions, {JobRow: "id"})
    nodes = ChangeCount(sessions, {NodeRow: "name"})
    with sessions() as s, s.begin():
        job = _job()
        s.add_all([job, _node("n01")])
    assert (jobs.value, nodes.value) == (1, 1)
    assert jobs.take() == {job.id} and nodes.take() == {"n01"}
    with sessions() as s, s.begin():
        s.get(NodeRow, "n01").state = "DRAIN"
    assert (jobs.value, nodes.value) == (1, 2) and jobs.take() == set() and nodes.take() == {"n01"}


def test_submissions_check_the_nodes_as_the_store_has_them_after_every_change(engine):
    """server.snapshot.NodeInfoCache: kept between submissions, read again after any node
    write this process commits (registration, drain, a bulk update), and its feasibility
    verdicts dropped with it."""
    from sqlalchemy import update

    from shoal.model.resources import ResourceRequest
    from shoal.model.snapshot import Partition
    from shoal.sched.placement import check_feasible
    from shoal.server.snapshot import NodeInfoCache
    from shoal.store.changes import ChangeCount

    migrate(engine)
    sessions = session_factory(engine)
    checks = []

    def check(*args, **kw):
        checks.append(args[0])
        return check_feasible(*args, **kw)

    cache = NodeInfoCache(ChangeCount(sessions, {NodeRow: "name"}), check)
    part = Partition(name="gpu", nodes=("n01", "n02"), default=True)
    two = ResourceRequest(nodes=2, ntasks=2, cpus_per_task=1, mem_per_node_mb=1, gpus_per_node=1)

    def verdict() -> str | None:
        with sessions() as s:
            nodes = cache.nodes(s)
        members = cache.members(part)
        assert members == [n for n in nodes if n.name in part.nodes]
        return cache.feasible(two, part, members, time_limit_s=None)

    gpu = {"index": 0, "uuid": "GPU-0", "product": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920}
    with sessions() as s, s.begin():
        s.add(_node("n01"))
        s.flush()
        s.execute(update(NodeRow).values(gpus=[gpu]))
    assert verdict() is not None, "two nodes asked of a partition holding one"
    assert verdict() is not None and len(checks) == 1, "the same request on the same nodes: checked once"
    with sessions() as s:
        kept = cache.nodes(s)
        assert cache.nodes(s) is kept, "the same tuple until a change (the scheduler's cache goes by its identity)"
    with sessions() as s, s.begin():
        node = _node("n02")
        node.gpus = [gpu]
        s.add(node)  # registered
    assert verdict() is None and len(checks) == 2
    with sessions() as s:
        assert cache.nodes(s) is not kept and [n.name for n in cache.members(part)] == ["n01", "n02"]
    with sessions() as s, s.begin():
        s.execute(update(NodeRow).values(gpus=[]))  # a bulk update: every node may have changed
    assert verdict() is not None and len(checks) == 3
    with sessions() as s:
        assert [n.gpus for n in cache.nodes(s)] == [(), ()]

    disabled = NodeInfoCache(ChangeCount(sessions, {NodeRow: "name"}, enabled=False), check)
    with sessions() as s:
        first = disabled.nodes(s)
        with sessions() as other, other.begin():
            other.get(NodeRow, "n01").state = "DRAIN"
        assert [n.state.value for n in disabled.nodes(s)] != [n.state.value for n in first], \
            "several servers on one store: nothing is kept"


def test_heartbeats_are_stored_together_and_leave_the_node_cache_alone(engine):
    """server.heartbeats: a report with nothing else in it is noted in memory, its time
    written with the others' in one statement; that write moves no node's version and no
    change count, so the node rows kept for submissions and passes stay kept. A report time
    older than the stored one (a registration since) never moves it back."""
    from sqlalchemy import update

    from shoal.server.heartbeats import Heartbeats, only_a_heartbeat
    from shoal.server.snapshot import NodeInfoCache
    from shoal.store.changes import ChangeCount
    from shoal.store.models import CleanupRow

    migrate(engine)
    sessions = session_factory(engine)
    changes = ChangeCount(sessions, {NodeRow: "name"})
    cache = NodeInfoCache(changes, check=None)
    gpu = {"index": 0, "uuid": "GPU-0", "product": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920}
    with sessions() as s, s.begin():
        s.add_all([_node("n01"), _node("n02")])
        s.flush()
        s.execute(update(NodeRow).values(gpus=[gpu]))
    with sessions() as s:
        kept = cache.nodes(s)
        stored = {n.name: (n.last_heartbeat, n.version) for n in s.scalars(select(NodeRow))}
    count = changes.value
    beats = Heartbeats(sessions, flush_s=60)
    t = time.time() + 10
    beats.seen("n01", t)
    beats.seen("n02", t + 1)
    beats.seen("n02", t - 5)  # late and out of order: the newer time stays
    assert beats.latest("n01", stored["n01"][0]) == t
    assert beats.flush() == 2 and beats.flush() == 0, "written once, then nothing left to write"
    with sessions() as s:
        now = {n.name: (n.last_heartbeat, n.version) for n in s.scalars(select(NodeRow))}
        assert now == {"n01": (t, stored["n01"][1]), "n02": (t + 1, stored["n02"][1])}
        assert cache.nodes(s) is kept and changes.value == count, "a heartbeat is no change to the node"
    with sessions() as s, s.begin():
        s.get(NodeRow, "n01").last_heartbeat = t + 100  # registered again since
    beats.seen("n01", t + 50)
    beats.flush()
    with sessions() as s:
        assert s.get(NodeRow, "n01").last_heartbeat == t + 100
        assert only_a_heartbeat(s, "n01", [], has_news=False)
        assert not only_a_heartbeat(s, "n01", [], has_news=True)
        assert not only_a_heartbeat(s, "n09", [], has_news=False), "an unknown node: the full path says so"
    # The same answers from what a server keeps while its change counts stand still.
    clock = [0.0]
    kept = Heartbeats(sessions, 60, changes, ChangeCount(sessions, {JobRow: "id", CleanupRow: "job_id"}),
                      monotonic=lambda: clock[0])
    assert kept.known("n01", [], False) is None, "nothing kept yet: the event loop must not decide"
    assert kept.only_a_heartbeat("n01", [], has_news=False) and not kept.only_a_heartbeat("n09", [], False)
    # Kept: the event loop answers without a thread or a read (server/agents.py, report).
    assert kept.known("n01", [], False) is True and kept.known("n09", [], False) is False
    assert kept.known("n01", [], has_news=True) is False
    with sessions() as s, s.begin():
        s.add(CleanupRow(job_id=7, run=0, node="n01", since=t, cpus=1, memory_mb=1, gpus=[]))
    assert kept.known("n01", [], False) is None, "a clean-up since: not known until read"
    with sessions() as s:
        assert only_a_heartbeat(s, "n01", ["7.0"], has_news=False), "its clean-up still alive there"
        assert not only_a_heartbeat(s, "n01", [], has_news=False), "a clean-up to drop: written"
    # Within a second of the last whole read, the node's own rows are read, not every node's.
    assert kept.only_a_heartbeat("n01", ["7.0"], False) and not kept.only_a_heartbeat("n01", [], False)
    assert kept.known("n01", ["7.0"], False) is None
    clock[0] += 2  # then the whole read again, and the loop may answer once more
    assert kept.only_a_heartbeat("n01", ["7.0"], False) and not kept.only_a_heartbeat("n01", [], False)
    assert kept.known("n01", ["7.0"], False) is True and kept.known("n01", [], False) is False
    with sessions() as s, s.begin():
        row = s.get(NodeRow, "n02")
        row.state, row.reason = "DOWN", "Not responding"
    with sessions() as s:
        assert not only_a_heartbeat(s, "n02", [], has_news=False), "back from silence: written"
    assert not kept.only_a_heartbeat("n02", [], False)


def test_sinfos_answer_is_kept_until_what_it_shows_changes_and_a_heartbeat_leaves_it_be(db_url, tmp_path):
    """sinfo's whole answer (``GET /nodes?view=sinfo``) is kept, gzipped once: after every change
    an administrator could see in sinfo (a node drained, its GPUs, a job started, a clean-up, a
    maintenance window opening, a partition changed) it is what a fresh listing gives; after a
    heartbeat, or a change sinfo does not show (a node's images, its labels), it is the very same
    bytes, not made again. (With several servers on one store nothing is kept: the same bytes.)"""
    import gzip

    from shoal.server import nodes as nodesvc
    from shoal.server import partitions as partsvc
    from shoal.server.config import parse_cluster_config
    from shoal.server.core import Server
    from shoal.server.listing import dumps
    from shoal.server.nodelist import SINFO_VIEW
    from shoal.server.schemas import NodeUpdate, PartitionUpdate
    from shoal.store.models import ReservationRow

    clock = [time.time()]
    config = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node[01-40]", "default": True}]})
    server = Server(db_url, config, tmp_path, clock=lambda: clock[0])
    with server.sessions() as s, s.begin():
        s.add_all([_gpu_node(f"node{i:02d}", 2) for i in range(1, 41)])
    kept = server.node_changes.enabled  # one server: PostgreSQL's counts on others sharing it

    def same(a: bytes, b: bytes) -> bool:
        return a is b if kept else a == b

    def sinfo(zipped: bool = False) -> bytes:
        with server.sessions() as s:
            body, is_gzipped = nodesvc.list_encoded(server, s, "sinfo", zipped)
            assert is_gzipped == zipped, "forty nodes are worth a gzip, and only for a client that asks"
            fresh = dumps({"nodes": server.node_listing.all_json(s, SINFO_VIEW)})
        assert (gzip.decompress(body) if zipped else body) == fresh, "the kept answer is not what the nodes show"
        return body

    def shown(node: str) -> dict:
        return next(n for n in json.loads(sinfo())["nodes"] if n["name"] == node)

    first, zipped = sinfo(), sinfo(zipped=True)
    assert same(sinfo(), first) and same(sinfo(zipped=True), zipped), "made again with nothing changed"

    server.heartbeats.seen("node01", clock[0] + 1)  # heartbeats, noted and written
    server.heartbeats.flush()
    with server.sessions() as s, s.begin():  # a change sinfo does not show
        row = s.get(NodeRow, "node02")
        row.images = [{"name": "pytorch:24.01"}]
        row.labels = {**row.labels, "rack": "r7"}
    assert same(sinfo(), first) and same(sinfo(zipped=True), zipped), "a heartbeat or an unseen change made a new answer"

    with server.sessions() as s:
        nodesvc.update(server, s, "node03", NodeUpdate(state="DRAIN", reason="fan"))
    assert shown("node03")["display_state"] == "drain"
    with server.sessions() as s, s.begin():
        s.get(NodeRow, "node04").gpus = []
    assert shown("node04")["gres"] == ""
    one = {"name": "node05", "cpus": 2, "memory_mb": 100, "gpus": [0]}
    with server.sessions() as s, s.begin():
        job = _job(state="RUNNING", allocation={"nodes": [one]})
        s.add(job)
    assert shown("node05")["cpus_alloc"] == 2
    with server.sessions() as s, s.begin():
        s.get(JobRow, job.id).state = "COMPLETED"
        s.add(CleanupRow(job_id=job.id, run=0, node="node06", since=clock[0], cpus=3, memory_mb=1, gpus=[]))
    assert shown("node05")["cpus_alloc"] == 0 and shown("node06")["cpus_alloc"] == 3
    with server.sessions() as s, s.begin():
        s.add(ReservationRow(name="fw", start_time=clock[0] + 60, end_time=clock[0] + 3600, nodes=["node07"],
                             flags=["MAINT"], created_by="root"))
    assert shown("node07")["display_state"] != "maint"
    clock[0] += 120  # the window opens: nothing was written
    assert shown("node07")["display_state"] == "maint"
    before = sinfo()
    with server.sessions() as s:
        partsvc.change(server, s, "gpu", PartitionUpdate(nodes="node[01-39]"))
    assert shown("node40")["partitions"] == [] and sinfo() != before
    server.engine.dispose()


def test_squeues_sinfos_and_scontrols_requests_get_the_same_answers_from_the_fast_path_as_from_the_app(db_url, tmp_path):
    """GET /jobs, /nodes and /partitions are answered without FastAPI's layers (server/fastpath.py):
    each answer (status, gzip or not, the JSON) is the one FastAPI's route gives, errors included."""
    import gzip

    from shoal.server.app import create_app
    from shoal.server.core import ADMIN_TOKEN_FILE
    from tests.unit.test_endpoints import asgi_get

    server, ids = _queue(db_url, tmp_path, 30)
    try:
        fast = create_app(server)
        token = (tmp_path / ADMIN_TOKEN_FILE).read_text().strip()
        with server.sessions() as s, s.begin():
            s.get(JobRow, ids[0]).state = "RUNNING"
            s.get(JobRow, ids[0]).allocation = {"nodes": [{"name": "node01", "cpus": 1, "memory_mb": 1, "gpus": [0]}]}
        requests = [
            ("/shoal/v1/jobs", "view=queue&form=rows&collapse=true"), ("/shoal/v1/jobs", f"all=true&job_id={ids[3]}"),
            ("/shoal/v1/jobs", "view=queue&form=packed&collapse=true"), ("/shoal/v1/jobs", "user=alice&form=packed"),
            ("/shoal/v1/jobs", "view=queue&form=packed&user=alice"),
            ("/shoal/v1/jobs", "state=PENDING&user=alice"), ("/shoal/v1/nodes", "view=sinfo"), ("/shoal/v1/nodes", ""),
            ("/shoal/v1/partitions", ""),
            ("/shoal/v1/nodes", "view=whole"), ("/shoal/v1/jobs", "form=tables"), ("/shoal/v1/jobs", "since=nan"),
        ]
        for path, query in requests:
            for headers in ({"authorization": f"Bearer {token}", "accept-encoding": "gzip"},
                            {"authorization": f"Bearer {token}"}, {"authorization": "Bearer wrong"}):
                assert fast.routes.match("GET", path) is not None, f"{path} is not on the fast path"
                got, want = asgi_get(fast, path, query, headers), asgi_get(fast.app, path, query, headers)
                assert got[:2] == want[:2], (path, query, headers)
                unzip = gzip.decompress if got[1] == "gzip" else bytes
                assert json.loads(unzip(got[2])) == json.loads(unzip(want[2])), (path, query, headers)
        assert asgi_get(fast, "/shoal/v1/nodes", "view=whole", headers)[0] == 401
    finally:
        _stop(server)
