"""Multifactor priority and the queue order it gives, with exact numbers."""

from __future__ import annotations

import dataclasses

from sched_cluster import job, nodes, partition, running, snapshot, started

from shoal.model.accounting import QOS, Account, UsageRecord, UserShare
from shoal.sched import SchedConfig, schedule
from shoal.sched.config import DAY_S, Multifactor
from shoal.sched.priority import PriorityBreakdown, PriorityFactors, job_priorities

WEIGHTS = Multifactor(weight_age=1000, weight_fairshare=10000, weight_jobsize=100,
                      weight_partition=1000, weight_qos=2000, max_age_s=7 * DAY_S)
NOW = 100 * DAY_S


def two_nodes_two_partitions():
    cluster = nodes("gpu", 2)  # 16 GPUs
    parts = [partition("gpu", cluster), partition("big", cluster, priority_job_factor=2)]
    return cluster, parts


def test_every_factor_weighted_and_summed_as_slurm_does():
    cluster, parts = two_nodes_two_partitions()
    j = dataclasses.replace(job(1, gpus_per_node=4, submit_time=NOW - 3.5 * DAY_S), qos="high", nice=25)
    snap = dataclasses.replace(snapshot(cluster, parts, [j], now=NOW), qos=(QOS("high", priority=10),))
    got = job_priorities(snap, WEIGHTS)[1]
    # age 3.5/7 days, fairshare 1 (no usage), 4 of 16 GPUs, factor 1 of max 2, QOS 10 of 10
    assert got == PriorityBreakdown(
        total=500 + 10000 + 25 + 500 + 2000 - 25, age=500.0, fairshare=10000.0, jobsize=25.0,
        partition=500.0, qos=2000.0, nice=25,
        factors=PriorityFactors(age=0.5, fairshare=1.0, jobsize=0.25, partition=0.5, qos=1.0))


def test_age_counts_from_the_begin_time_and_stops_at_max_age():
    cluster, parts = two_nodes_two_partitions()
    later = job(1, submit_time=NOW - 7 * DAY_S, begin_time=NOW - DAY_S)
    ancient = job(2, submit_time=NOW - 30 * DAY_S)
    waiting = job(3, submit_time=NOW - DAY_S, begin_time=NOW + DAY_S)
    got = job_priorities(snapshot(cluster, parts, [later, ancient, waiting], now=NOW), WEIGHTS)
    assert got[1].factors.age == 1 / 7
    assert got[2].factors.age == 1.0
    assert got[3].factors.age == 0.0


def test_favor_small_turns_the_job_size_factor_around():
    cluster, parts = two_nodes_two_partitions()
    snap = snapshot(cluster, parts, [job(1, gpus_per_node=8, nodes=2), job(2, gpus_per_node=4)], now=NOW)
    big = job_priorities(snap, WEIGHTS)
    small = job_priorities(snap, dataclasses.replace(WEIGHTS, favor_small=True))
    assert (big[1].factors.jobsize, big[2].factors.jobsize) == (1.0, 0.25)
    assert (small[1].factors.jobsize, small[2].factors.jobsize) == (0.0, 0.75)


def test_with_every_weight_zero_every_job_has_priority_one():
    cluster, parts = two_nodes_two_partitions()
    got = job_priorities(snapshot(cluster, parts, [job(1), job(2)], now=NOW), Multifactor())
    assert {b.total for b in got.values()} == {1}


def heavy_user_snapshot(pending):
    """Team a's alice ran 8 GPUs for a day; team b's bob never ran anything."""
    cluster = nodes("gpu", 1)
    snap = snapshot(cluster, [partition("gpu", cluster)], pending,
                    [running(9, {"gpu1": (1, 1000, tuple(range(8)))}, user="carol")], now=NOW)
    return dataclasses.replace(
        snap,
        accounts=(Account("a", users=(UserShare("alice"),)), Account("b", users=(UserShare("bob"),))),
        usage=(UsageRecord("alice", "a", gpus=8, cpus=8, start=NOW - 2 * DAY_S, end=NOW - DAY_S),))


def test_the_team_that_ran_less_goes_first_under_multifactor_but_not_basic():
    pending = [job(1, user="alice", gpus_per_node=8), job(2, user="bob", gpus_per_node=8)]
    snap = heavy_user_snapshot(pending)
    fair = SchedConfig(policy="fifo", priority="multifactor",
                       multifactor=Multifactor(weight_fairshare=10000))
    prios = job_priorities(snap, fair.multifactor)
    assert prios[1].factors.fairshare == 0.25  # alice used it all: S = 1/2, UE = 1
    assert prios[2].factors.fairshare == 1.0
    # The node is busy: under fifo the first job in order is the one waiting for Resources.
    assert schedule(snap, fair).reasons == {2: "Resources", 1: "Priority"}
    assert schedule(snap, SchedConfig(policy="fifo")).reasons == {1: "Resources", 2: "Priority"}


def test_usage_that_decayed_away_restores_submit_order():
    pending = [job(1, user="alice", gpus_per_node=8), job(2, user="bob", gpus_per_node=8)]
    snap = heavy_user_snapshot(pending)
    cfg = SchedConfig(policy="fifo", priority="multifactor",
                      multifactor=Multifactor(weight_fairshare=10000, weight_age=1000,
                                              decay_half_life_s=60))
    prios = job_priorities(snap, cfg.multifactor)
    assert prios[1].factors.fairshare > 0.999  # a day is 1440 half-lives: nothing left
    assert schedule(snap, cfg).reasons == {1: "Resources", 2: "Priority"}


def test_multifactor_still_starts_what_fits():
    cluster = nodes("gpu", 1)
    snap = snapshot(cluster, [partition("gpu", cluster)], [job(1, gpus_per_node=4), job(2, gpus_per_node=4)])
    assert started(schedule(snap, SchedConfig(priority="multifactor"))) == [1, 2]
