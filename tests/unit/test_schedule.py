"""Scheduling-pass stories an administrator would tell, with exact allocations and reasons."""

from __future__ import annotations


import pytest
from sched_cluster import alloc_of, gpu_node, job, nodes, partition, running, snapshot, started

from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.model.snapshot import Dependency, JobRecord
from shoal.sched import SchedConfig, SchedConfigError, schedule

FIFO = SchedConfig(policy="fifo")
BACKFILL = SchedConfig(policy="backfill")
ALL8 = tuple(range(8))


def one_partition(cluster, **kw):
    return [partition("gpu", cluster, **kw)]


def test_a_gang_that_does_not_fit_waits_whole_and_takes_nothing():
    cluster = nodes("gpu", 8)  # 64 GPUs, 4 of them busy: 60 free
    busy = running(9, {"gpu1": (4, 1000, (0, 1, 2, 3))})
    plan = schedule(snapshot(cluster, one_partition(cluster),
                             [job(1, nodes=8, gpus_per_node=8)], [busy]))
    assert plan.starts == []
    assert plan.reasons == {1: "Resources"}


def test_two_jobs_in_one_pass_never_share_a_gpu():
    cluster = nodes("gpu", 1)
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, gpus_per_node=4), job(2, gpus_per_node=4), job(3, gpus_per_node=1)]))
    assert alloc_of(plan, 1) == {"gpu1": (1, 1000, (0, 1, 2, 3))}
    assert alloc_of(plan, 2) == {"gpu1": (1, 1000, (4, 5, 6, 7))}
    assert plan.reasons == {3: "Resources"}


def test_gang_gets_whole_nodes_in_natural_order():
    cluster = nodes("gpu", 12)
    plan = schedule(snapshot(cluster, one_partition(cluster), [job(1, nodes=3, gpus_per_node=8)]))
    assert alloc_of(plan, 1) == {n: (1, 1000, ALL8) for n in ("gpu1", "gpu2", "gpu3")}


def test_best_fit_puts_a_one_gpu_job_on_the_partly_used_node():
    cluster = nodes("gpu", 3)
    busy = running(9, {"gpu3": (1, 1000, (0,))})
    plan = schedule(snapshot(cluster, one_partition(cluster), [job(1, gpus_per_node=1)], [busy]))
    assert alloc_of(plan, 1) == {"gpu3": (1, 1000, (1,))}


def test_exclusive_job_takes_whole_node_and_later_jobs_go_elsewhere():
    cluster = nodes("gpu", 2, cpus=32, memory_mb=1000)
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, exclusive=True, gpus_per_node=2), job(2, gpus_per_node=1), job(3, gpus_per_node=8)]))
    assert alloc_of(plan, 1) == {"gpu1": (32, 1000, ALL8)}
    assert [s.allocation.exclusive for s in plan.starts if s.job_id == 1] == [True]
    assert alloc_of(plan, 2) == {"gpu2": (1, 1000, (0,))}
    assert plan.reasons == {3: "Resources"}


def test_exclusive_job_waits_for_an_empty_node():
    cluster = nodes("gpu", 1)
    busy = running(9, {"gpu1": (1, 10, ())})
    plan = schedule(snapshot(cluster, one_partition(cluster), [job(1, exclusive=True)], [busy]))
    assert plan.reasons == {1: "Resources"}


def test_completing_jobs_still_hold_their_gpus():
    cluster = nodes("gpu", 1, gpus=2)
    # A job past its time limit is still in snapshot.active until its processes are gone.
    completing = running(9, {"gpu1": (1, 10, (0, 1))}, start_time=0, time_limit_s=10)
    plan = schedule(snapshot(cluster, one_partition(cluster), [job(1, gpus_per_node=1)],
                             [completing]))
    assert plan.reasons == {1: "Resources"}


def test_gpu_type_and_features_pick_the_right_nodes():
    cluster = (gpu_node("a1", product="NVIDIA A100-SXM4-80GB", features=("ib",)),
               gpu_node("h1", features=("ib",)), gpu_node("h2", features=("nvlink",)))
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, gpus_per_node=2, gpu_type="a100"),
        job(2, gpus_per_node=1, gpu_type="h100", features=("nvlink",))]))
    assert alloc_of(plan, 1) == {"a1": (1, 1000, (0, 1))}
    assert alloc_of(plan, 2) == {"h2": (1, 1000, (0,))}


def test_nodelist_and_exclude():
    cluster = nodes("gpu", 4)
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, nodes=2, nodelist=("gpu3",), exclude=("gpu1",), gpus_per_node=8)]))
    assert alloc_of(plan, 1) == {"gpu2": (1, 1000, ALL8), "gpu3": (1, 1000, ALL8)}


def test_down_and_drained_nodes_are_skipped():
    cluster = (gpu_node("gpu1", state=NodeState.DOWN), gpu_node("gpu2", state=NodeState.DRAIN),
               gpu_node("gpu3"))
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, gpus_per_node=8), job(2, gpus_per_node=8)]))
    assert alloc_of(plan, 1) == {"gpu3": (1, 1000, ALL8)}
    assert plan.reasons == {2: "Resources"}


def test_a_job_needing_drained_nodes_waits_without_blocking_others():
    cluster = (gpu_node("gpu1", state=NodeState.DRAIN), gpu_node("gpu2"))
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, nodes=2), job(2)]), FIFO)
    assert plan.reasons == {1: "ReqNodeNotAvail"}
    assert alloc_of(plan, 2) == {"gpu2": (1, 1000, ())}


def test_nodelist_naming_a_down_node_waits_with_req_node_not_avail():
    cluster = (gpu_node("gpu1"), gpu_node("gpu2", state=NodeState.DOWN))
    plan = schedule(snapshot(cluster, one_partition(cluster), [job(1, nodelist=("gpu2",))]))
    assert plan.reasons == {1: "ReqNodeNotAvail, UnavailableNodes:gpu2"}


def test_mem_zero_takes_the_whole_memory_of_an_unshared_node():
    cluster = nodes("gpu", 2, memory_mb=4000)
    busy = running(9, {"gpu1": (1, 100, ())})
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, mem_per_node_mb=0), job(2, mem_per_node_mb=0)], [busy]))
    assert alloc_of(plan, 1) == {"gpu2": (1, 4000, ())}
    assert plan.reasons == {2: "Resources"}


def test_array_throttle_keeps_at_most_two_tasks_active():
    cluster = nodes("gpu", 4)
    task = running(50, {"gpu1": (1, 1000, (0,))}, array_job_id=100)
    tasks = [job(100 + i, gpus_per_node=1, array_job_id=100, array_task_id=i, array_throttle=2)
             for i in range(1, 5)]
    plan = schedule(snapshot(cluster, one_partition(cluster), tasks, [task]))
    assert started(plan) == [101]
    assert plan.reasons == {102: "JobArrayTaskLimit", 103: "JobArrayTaskLimit",
                            104: "JobArrayTaskLimit"}


def test_array_throttle_counts_tasks_started_in_the_same_pass():
    cluster = nodes("gpu", 4)
    tasks = [job(100 + i, gpus_per_node=1, array_job_id=100, array_task_id=i, array_throttle=2)
             for i in range(1, 5)]
    plan = schedule(snapshot(cluster, one_partition(cluster), tasks))
    assert started(plan) == [101, 102]
    assert set(plan.reasons.values()) == {"JobArrayTaskLimit"}


def test_held_jobs_and_future_begin_times_wait():
    cluster = nodes("gpu", 1)
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, held=True), job(2, begin_time=5000.0), job(3, begin_time=500.0)], now=1000.0))
    assert plan.reasons == {1: "JobHeldUser", 2: "BeginTime"}
    assert started(plan) == [3]


def test_held_job_does_not_hold_back_fifo_queue():
    cluster = nodes("gpu", 1)
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, held=True, gpus_per_node=8), job(2, gpus_per_node=8)]), FIFO)
    assert started(plan) == [2]


def dep(kind, *ids):
    return (Dependency(kind, tuple(ids)),)


@pytest.mark.parametrize(
    "kind, target_state, expected",
    [
        ("after", JobState.PENDING, "Dependency"),
        ("after", JobState.RUNNING, None),
        ("after", JobState.CANCELLED, None),
        ("afterany", JobState.RUNNING, "Dependency"),
        ("afterany", JobState.FAILED, None),
        ("afterok", JobState.RUNNING, "Dependency"),
        ("afterok", JobState.COMPLETED, None),
        ("afterok", JobState.FAILED, "DependencyNeverSatisfied"),
        ("afternotok", JobState.RUNNING, "Dependency"),
        ("afternotok", JobState.TIMEOUT, None),
        ("afternotok", JobState.COMPLETED, "DependencyNeverSatisfied"),
    ],
)
def test_dependency_kinds(kind, target_state, expected):
    cluster = nodes("gpu", 1)
    target = JobRecord(7, target_state)
    plan = schedule(snapshot(cluster, one_partition(cluster), [job(1, dependencies=dep(kind, 7))],
                             jobs={7: target}))
    if expected is None:
        assert started(plan) == [1]
    else:
        assert plan.reasons == {1: expected} and plan.starts == []


def test_a_pending_target_keeps_afterok_waiting():
    cluster = nodes("gpu", 1)
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, held=True), job(2, dependencies=dep("afterok", 1))]))
    assert plan.reasons == {1: "JobHeldUser", 2: "Dependency"}


def test_every_listed_target_must_satisfy_unless_any_is_asked():
    cluster = nodes("gpu", 1)
    jobs = {7: JobRecord(7, JobState.COMPLETED), 8: JobRecord(8, JobState.RUNNING)}
    both = dep("afterok", 7, 8)
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, dependencies=both), job(2, dependencies=both, dependency_any=True)], jobs=jobs))
    assert plan.reasons == {1: "Dependency"}
    assert started(plan) == [2]


def test_any_is_never_satisfied_only_when_every_clause_is_never():
    cluster = nodes("gpu", 1)
    jobs = {7: JobRecord(7, JobState.FAILED), 8: JobRecord(8, JobState.RUNNING)}
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, dependencies=dep("afterok", 7, 8), dependency_any=True),
        job(2, dependencies=dep("afterok", 7), dependency_any=True)], jobs=jobs))
    assert plan.reasons == {1: "Dependency", 2: "DependencyNeverSatisfied"}


def test_unknown_dependency_target_is_never_satisfied():
    cluster = nodes("gpu", 1)
    plan = schedule(snapshot(cluster, one_partition(cluster), [job(1, dependencies=dep("afterany", 404))]))
    assert plan.reasons == {1: "DependencyNeverSatisfied"}


def test_kill_invalid_depend_moves_never_satisfied_jobs_to_never():
    cluster = nodes("gpu", 1)
    plan = schedule(snapshot(cluster, one_partition(cluster), [job(1, dependencies=dep("afterok", 7))],
                             jobs={7: JobRecord(7, JobState.FAILED)}),
                    SchedConfig(kill_invalid_depend=True))
    assert plan.never == {1: "DependencyNeverSatisfied"} and plan.reasons == {}


def test_singleton_waits_for_running_and_earlier_pending_jobs_of_same_name_and_user():
    cluster = nodes("gpu", 2)
    single = dep("singleton")
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, name="etl", dependencies=single),
        job(2, name="etl", dependencies=single),
        job(3, name="etl", user="carol", dependencies=single),
        job(4, name="nightly", dependencies=single),
    ], [running(9, {"gpu1": (1, 1, ())}, user="alice", name="nightly")]))
    assert started(plan) == [1, 3]
    assert plan.reasons == {2: "Dependency", 4: "Dependency"}


def test_singleton_sees_a_job_of_the_same_name_started_in_this_pass():
    cluster = nodes("gpu", 2)
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, name="etl", dependencies=dep("singleton")),
        job(2, name="etl", priority=10)]))
    assert started(plan) == [2]
    assert plan.reasons == {1: "Dependency"}


def test_partition_limits_and_state():
    cluster = nodes("gpu", 4)
    parts = [partition("gpu", cluster, max_nodes=2, max_time_s=3600),
             partition("down", cluster, state="DOWN")]
    plan = schedule(snapshot(cluster, parts, [
        job(1, nodes=3), job(2, time_limit_s=7200), job(3, "down"), job(4, "nope"),
        job(5, time_limit_s=None)]))
    assert plan.reasons == {1: "PartitionNodeLimit", 2: "PartitionTimeLimit",
                            3: "PartitionDown", 4: "PartitionConfig"}
    assert started(plan) == [5]  # no --time: runs under the partition's MaxTime


def test_queue_order_is_priority_then_submit_time_then_id():
    cluster = nodes("gpu", 1)
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(1, gpus_per_node=8, submit_time=5.0), job(2, gpus_per_node=8, submit_time=1.0),
        job(3, gpus_per_node=8, priority=1, submit_time=9.0)]))
    assert started(plan) == [3]
    plan = schedule(snapshot(cluster, one_partition(cluster), [
        job(5, gpus_per_node=8, submit_time=1.0), job(4, gpus_per_node=8, submit_time=1.0)]))
    assert started(plan) == [4]


# --- FIFO versus backfill -------------------------------------------------------------

def hole_story(policy):
    """gpu1 is full until t=2000; a 2-node job waits for it; gpu2 sits idle meanwhile.

    The waiting job (1) is reserved gpu1 and gpu2's GPUs 0-3 from t=2000. Job 2 (long) fits on
    gpu2's GPUs 4-7, which the reservation does not need; job 3 (long) would need a reserved
    GPU; job 4 is short enough to finish by t=2000 and may use them.
    """
    cluster = nodes("gpu", 2)
    busy = running(9, {"gpu1": (1, 1000, ALL8)}, start_time=0, time_limit_s=2000)
    pending = [
        job(1, nodes=2, gpus_per_node=4, time_limit_s=3600),
        job(2, gpus_per_node=4, time_limit_s=36000),
        job(3, gpus_per_node=1, time_limit_s=36000),
        job(4, gpus_per_node=4, time_limit_s=900),
        job(5, gpus_per_node=1, time_limit_s=900),
    ]
    return schedule(snapshot(cluster, one_partition(cluster), pending, [busy], now=1000.0),
                    policy)


def test_backfill_fills_the_hole_without_delaying_the_reserved_job():
    plan = hole_story(BACKFILL)
    assert alloc_of(plan, 2) == {"gpu2": (1, 1000, (4, 5, 6, 7))}
    assert alloc_of(plan, 4) == {"gpu2": (1, 1000, (0, 1, 2, 3))}
    assert plan.reasons == {1: "Resources", 3: "Priority", 5: "Priority"}


def test_fifo_lets_nothing_pass_the_blocked_job():
    plan = hole_story(FIFO)
    assert plan.starts == []
    assert plan.reasons == {1: "Resources", 2: "Priority", 3: "Priority", 4: "Priority",
                            5: "Priority"}


def test_short_job_backfills_but_a_long_one_waits():
    cluster = nodes("gpu", 2)
    busy = running(9, {"gpu1": (1, 1000, ALL8)}, start_time=0, time_limit_s=2000)
    pending = [job(1, nodes=2, gpus_per_node=8), job(2, gpus_per_node=8, time_limit_s=36000),
               job(3, gpus_per_node=8, time_limit_s=1000)]
    plan = schedule(snapshot(cluster, one_partition(cluster), pending, [busy], now=1000.0))
    assert alloc_of(plan, 3) == {"gpu2": (1, 1000, ALL8)}
    assert plan.reasons == {1: "Resources", 2: "Priority"}


def test_no_reservation_behind_a_job_without_time_limit():
    cluster = nodes("gpu", 2)
    other = (gpu_node("cpu1", gpus=0),)
    forever = running(9, {"gpu1": (1, 1000, ALL8)}, time_limit_s=None)
    parts = [partition("gpu", cluster), partition("cpu", other)]
    pending = [job(1, nodes=2, gpus_per_node=8), job(2, gpus_per_node=8, time_limit_s=60),
               job(3, "cpu")]
    plan = schedule(snapshot(cluster + other, parts, pending, [forever]))
    assert plan.reasons == {1: "Resources", 2: "Priority"}
    assert alloc_of(plan, 3) == {"cpu1": (1, 1000, ())}


def test_fifo_blocks_only_partitions_sharing_nodes():
    cluster = nodes("gpu", 2)
    parts = [partition("a", ["gpu1"]), partition("ab", ["gpu1", "gpu2"]), partition("b", ["gpu2"])]
    busy = running(9, {"gpu1": (1, 1000, ALL8)})
    pending = [job(1, "a", gpus_per_node=8), job(2, "ab", gpus_per_node=1),
               job(3, "b", gpus_per_node=1)]
    plan = schedule(snapshot(cluster, parts, pending, [busy]), FIFO)
    assert plan.reasons == {1: "Resources", 2: "Priority"}
    assert alloc_of(plan, 3) == {"gpu2": (1, 1000, (0,))}


def test_max_jobs_per_pass_leaves_the_rest_with_priority():
    cluster = nodes("gpu", 4)
    plan = schedule(snapshot(cluster, one_partition(cluster), [job(i) for i in range(1, 5)]),
                    SchedConfig(max_jobs_per_pass=2))
    assert started(plan) == [1, 2]
    assert plan.reasons == {3: "Priority", 4: "Priority"}


def test_bad_config_is_refused_with_a_clear_message():
    with pytest.raises(SchedConfigError, match="unknown scheduling policy 'lifo'"):
        SchedConfig(policy="lifo")  # type: ignore[arg-type]


def test_a_thousand_nodes_and_five_thousand_jobs_each_get_a_start_or_a_reason():
    # Speed is bench/bench_sched.py's to measure (a wall-clock bound here fails on a busy machine).
    cluster = nodes("gpu", 1000)
    shapes = [dict(gpus_per_node=1), dict(gpus_per_node=8), dict(nodes=4, gpus_per_node=8),
              dict(gpus_per_node=2, ntasks=8), dict(ntasks=4)]
    pending = [job(i, priority=i % 7, time_limit_s=600 * (1 + i % 5), **shapes[i % len(shapes)])
               for i in range(1, 5001)]
    snap = snapshot(cluster, one_partition(cluster), pending)
    plan = schedule(snap)
    started = {s.job_id for s in plan.starts}
    assert len(started) + len(plan.reasons) == 5000 and not started & set(plan.reasons)
    held = [(name, g) for s in plan.starts for name, a in s.allocation.nodes for g in a.gpus]
    assert len(held) == len(set(held)), "a GPU was handed out twice"


def test_a_gang_starts_whole_or_not_at_all_and_its_room_goes_to_the_jobs_behind():
    """Three 2-GPU members of one gang on a node with 4 free GPUs: none starts (two could),
    and the 2-GPU job behind them gets the room they would have taken."""
    from dataclasses import replace

    from shoal.sched import queue as q

    cluster = [gpu_node("n1", gpus=8)]
    busy = running(90, {"n1": (1, 1000, (0, 1, 2, 3))})
    gang = [replace(job(i, gpus_per_node=2, priority=10), gang="ml/ft") for i in (1, 2, 3)]
    behind = job(4, gpus_per_node=2)
    plan = schedule(snapshot(cluster, [partition("gpu", cluster)], [*gang, behind], [busy]))
    assert started(plan) == [4]
    assert plan.reasons[1] == plan.reasons[2] == q.GANG  # could have started, held for the third
    assert plan.reasons[3] == q.RESOURCES
    roomy = schedule(snapshot(cluster, [partition("gpu", cluster)], [*gang, behind]))
    assert started(roomy) == [1, 2, 3, 4]
    # A gang with one pending member left (its others run) starts it alone.
    plan = schedule(snapshot(cluster, [partition("gpu", cluster)], [gang[2]], [busy]))
    assert started(plan) == [3]


def test_a_quick_pass_leaves_a_gang_member_it_did_not_reach_unsaid():
    """A quick pass (``SchedConfig.quick``) stops once every node is held back: a member of a
    gang that would start in part, queued after the stop, keeps the reason an earlier pass gave
    it (none here), as the rest of the queue does; it is not said to wait for its gang, which
    the whole pass would not say (it is held). Found by the partial-pass property."""
    from dataclasses import replace

    from shoal.sched import queue as q

    cluster = [gpu_node("n1", gpus=8), gpu_node("n2", gpus=8)]
    first = replace(job(1, gpus_per_node=8, submit_time=1.0), gang="ml/ft")
    blocker = job(2, nodes=2, gpus_per_node=8, submit_time=2.0)  # cannot start beside 1: every node held back
    last = replace(job(3, gpus_per_node=8, submit_time=3.0, held=True), gang="ml/ft")
    snap = snapshot(cluster, [partition("gpu", cluster)], [first, blocker, last])
    whole = schedule(snap, SchedConfig(policy="fifo"))
    assert started(whole) == [2] and whole.reasons == {1: q.GANG, 3: q.HELD}  # 2: the room 1 would take
    quick = schedule(snap, SchedConfig(policy="fifo").quick())
    assert started(quick) == [2] and quick.reasons == {1: q.GANG}
