"""Preemption stories: which running jobs a blocked high-QOS job stops, exactly, and which it never does."""

from __future__ import annotations

import dataclasses

from sched_cluster import job, nodes, partition, running, snapshot, started

from shoal.model.accounting import QOS
from shoal.model.snapshot import Preemption
from shoal.sched import SchedConfig, schedule
from shoal.sched.preempt import outcome

NOW = 1000.0
QOS_TABLE = (
    QOS("scavenger", preempt_mode="requeue"),
    QOS("pinned", preempt_mode="off"),
    QOS("high", preempt=("scavenger", "pinned")),
)
GPUS = {4: (0, 1, 2, 3), 8: tuple(range(8))}


def holds(id: int, qos: str | None, where: dict[str, tuple[int, ...]], started_at: float, **kw):
    """A running job of ``qos`` holding those GPUs (one CPU per GPU) on each node, since ``started_at``."""
    a = running(id, {n: (len(g), 1000, g) for n, g in where.items()}, start_time=started_at, **kw)
    return dataclasses.replace(a, qos=qos)


def urgent(id: int = 1, qos: str = "high", **request):
    request.setdefault("gpus_per_node", 8)
    request.setdefault("cpus_per_task", 1)
    return dataclasses.replace(job(id, **request), qos=qos)


def plan_for(pending, active, count: int = 2, config: SchedConfig = SchedConfig(), qos=QOS_TABLE):
    cluster = nodes("gpu", count)
    snap = dataclasses.replace(snapshot(cluster, [partition("gpu", cluster)], pending, active, now=NOW),
                               qos=qos)
    return schedule(snap, config)


def victims(plan) -> dict[int, tuple[int, ...]]:
    return {p.preemptor_id: p.victim_ids for p in plan.preemptions}


def test_the_fewest_gpu_hours_go_even_when_that_is_two_jobs_rather_than_one():
    # gpu1: one 8-GPU job 1000 s old (8000 GPU-s). gpu2: two 4-GPU jobs, 100 s and 500 s old (2400).
    plan = plan_for([urgent()], [
        holds(10, "scavenger", {"gpu1": GPUS[8]}, 0.0),
        holds(11, "scavenger", {"gpu2": (0, 1, 2, 3)}, 900.0),
        holds(12, "scavenger", {"gpu2": (4, 5, 6, 7)}, 500.0),
    ])
    assert plan.preemptions == [Preemption(1, (11, 12), 4 * 100 + 4 * 500)]
    assert plan.starts == [] and plan.reasons == {1: "Resources"}


def test_a_cheap_job_that_would_not_help_is_spared():
    # Job 20 is cheapest, but gpu1 stays half full of a normal job, so only gpu2 can be freed.
    plan = plan_for([urgent()], [
        holds(20, "scavenger", {"gpu1": (0, 1, 2, 3)}, 990.0),
        holds(21, None, {"gpu1": (4, 5, 6, 7)}, 0.0),
        holds(22, "scavenger", {"gpu2": GPUS[8]}, 0.0),
    ])
    assert victims(plan) == {1: (22,)}


def test_a_gang_counts_the_gpus_of_all_its_nodes():
    # Per node the 2-node gang 30 costs 400 GPU-s, less than job 31's 600; as a whole it costs 800.
    plan = plan_for([urgent(gpus_per_node=4)], [
        holds(30, "scavenger", {"gpu1": (0, 1, 2, 3), "gpu2": (0, 1, 2, 3)}, 900.0),
        holds(31, "scavenger", {"gpu1": (4, 5, 6, 7)}, 850.0),
        holds(32, "scavenger", {"gpu2": (4, 5, 6, 7)}, 700.0),
    ])
    assert victims(plan) == {1: (31,)}


def test_a_gang_victim_is_taken_whole_and_frees_every_node_it_held():
    plan = plan_for([urgent(nodes=2, gpus_per_node=4)], [
        holds(40, "scavenger", {"gpu1": (0, 1, 2, 3), "gpu2": (0, 1, 2, 3)}, 0.0),
        holds(41, None, {"gpu1": (4, 5, 6, 7)}, 0.0),
        holds(42, None, {"gpu2": (4, 5, 6, 7)}, 0.0),
    ])
    assert plan.preemptions == [Preemption(1, (40,), 8 * 1000)]


def test_jobs_of_a_qos_not_listed_or_marked_off_are_never_chosen():
    # Every GPU is held by a normal job or a pinned one (preempt_mode: off), though high lists pinned.
    plan = plan_for([urgent()], [
        holds(50, None, {"gpu1": GPUS[8]}, 999.0),
        holds(51, "pinned", {"gpu2": GPUS[8]}, 999.0),
    ])
    assert plan.preemptions == []
    assert plan.reasons == {1: "Resources"}


def test_nobody_is_preempted_when_even_every_candidate_would_not_be_enough():
    plan = plan_for([urgent()], [
        holds(60, None, {"gpu1": (0, 1, 2, 3)}, 0.0),
        holds(61, "scavenger", {"gpu1": (4, 5, 6, 7)}, 0.0),
        holds(62, None, {"gpu2": (0,)}, 0.0),
        holds(63, "scavenger", {"gpu2": (1, 2, 3, 4, 5, 6, 7)}, 0.0),
    ])
    assert plan.preemptions == []


def test_only_a_qos_with_a_preempt_list_preempts():
    active = [holds(70, "scavenger", {"gpu1": GPUS[8]}, 0.0)]
    assert plan_for([urgent(qos="normal")], active, count=1).preemptions == []
    assert plan_for([urgent(qos="scavenger")], active, count=1).preemptions == []
    assert victims(plan_for([urgent()], active, count=1)) == {1: (70,)}


def test_a_held_job_or_one_waiting_on_a_dependency_preempts_nobody():
    active = [holds(80, "scavenger", {"gpu1": GPUS[8]}, 0.0)]
    held = plan_for([urgent(held=True)], active, count=1)
    assert held.preemptions == [] and held.reasons == {1: "JobHeldUser"}
    later = plan_for([urgent(begin_time=NOW + 60)], active, count=1)
    assert later.preemptions == [] and later.reasons == {1: "BeginTime"}


def test_preemption_switched_off_in_the_config_preempts_nobody():
    plan = plan_for([urgent()], [holds(90, "scavenger", {"gpu1": GPUS[8]}, 0.0)], count=1,
                    config=SchedConfig(preemption=False))
    assert plan.preemptions == [] and plan.reasons == {1: "Resources"}


def test_a_preemptor_waiting_for_its_victims_chooses_no_more():
    going = dataclasses.replace(holds(100, "scavenger", {"gpu1": GPUS[8]}, 900.0), preempted_by=1)
    other = holds(101, "scavenger", {"gpu2": GPUS[8]}, 0.0)
    plan = plan_for([dataclasses.replace(urgent(1), preemptor=True)], [going, other])
    assert plan.preemptions == [] and plan.reasons == {1: "Resources"}


def test_a_job_already_being_preempted_is_not_chosen_again():
    # Job 100 is the cheaper victim, but it is already going for job 1: job 2 must take job 101.
    going = dataclasses.replace(holds(100, "scavenger", {"gpu1": GPUS[8]}, 900.0), preempted_by=1)
    other = holds(101, "scavenger", {"gpu2": GPUS[8]}, 0.0)
    plan = plan_for([urgent(2)], [going, other])
    assert victims(plan) == {2: (101,)}


def test_what_was_freed_for_a_preemptor_goes_to_it_before_the_requeued_victim():
    victim = urgent(5, qos="scavenger", submit_time=0.0)
    preemptor = dataclasses.replace(urgent(6), preemptor=True)
    plan = plan_for([victim, preemptor], [], count=1)
    assert started(plan) == [6]
    assert plan.reasons == {5: "Resources"}


def test_a_victim_requeues_only_when_its_qos_says_so_and_it_may_be_requeued():
    scavenger, normal = QOS_TABLE[0], QOS("normal")
    assert outcome(scavenger, requeueable=True) == "requeue"
    assert outcome(scavenger, requeueable=False) == "cancel"
    assert outcome(normal, requeueable=True) == "cancel"
