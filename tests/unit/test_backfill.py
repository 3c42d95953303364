"""Backfill's depth: EASY versus conservative reservations, the window, the depth and the
planned start times a pass reports, with exact plans."""

from __future__ import annotations

import pytest
from sched_cluster import alloc_of, job, nodes, partition, running, snapshot

from shoal.sched import SchedConfig, SchedConfigError, schedule

EASY = SchedConfig(policy="backfill", backfill="easy")
CONSERVATIVE = SchedConfig(policy="backfill", backfill="conservative")
ALL8 = tuple(range(8))


def second_in_line_story(config):
    """Three 8-GPU nodes, now t=1000: gpu1 is busy until t=2000, gpu2 until t=5000, and a
    long job holds half of gpu3 (GPUs 0-3) until t=100000.

    Job 1 (2 whole nodes) can first run at t=5000, on gpu1 and gpu2. Job 2 (2 nodes x 4
    GPUs, 2500 s) could run from t=2000 on gpu3's free half and half of gpu1, done by
    t=4500, before job 1. Job 3 (4 GPUs, 3000 s) fits gpu3's free half now and ends at
    t=4000, before job 1's start, so EASY starts it; but it holds what job 2 needs at
    t=2000, so conservative backfill keeps it waiting (for gpu1's free half at t=2000).
    """
    cluster = nodes("gpu", 3)
    busy = [running(9, {"gpu1": (1, 1000, ALL8)}, start_time=0, time_limit_s=2000),
            running(8, {"gpu2": (1, 1000, ALL8)}, start_time=0, time_limit_s=5000),
            running(7, {"gpu3": (1, 1000, (0, 1, 2, 3))}, start_time=0, time_limit_s=100_000)]
    pending = [job(1, nodes=2, gpus_per_node=8, time_limit_s=3600),
               job(2, nodes=2, gpus_per_node=4, time_limit_s=2500),
               job(3, gpus_per_node=4, time_limit_s=3000)]
    return schedule(snapshot(cluster, [partition("gpu", cluster)], pending, busy, now=1000.0),
                    config)


def test_easy_backfills_a_job_that_delays_the_second_blocked_job():
    plan = second_in_line_story(EASY)
    assert alloc_of(plan, 3) == {"gpu3": (1, 1000, (4, 5, 6, 7))}
    assert plan.reasons == {1: "Resources", 2: "Priority"}
    assert plan.estimates == {1: 5000.0}


def test_conservative_reserves_for_every_blocked_job_and_delays_none():
    plan = second_in_line_story(CONSERVATIVE)
    assert plan.starts == []
    assert plan.reasons == {1: "Resources", 2: "Resources", 3: "Resources"}
    assert plan.estimates == {1: 5000.0, 2: 2000.0, 3: 2000.0}


def test_conservative_still_backfills_what_delays_nobody():
    """Job 4 (1 GPU, 500 s) ends at t=1500, before any reservation starts."""
    cluster = nodes("gpu", 2)
    busy = [running(9, {"gpu1": (1, 1000, ALL8)}, start_time=0, time_limit_s=2000),
            running(8, {"gpu2": (1, 1000, (0, 1, 2, 3, 4, 5, 6))}, start_time=0,
                    time_limit_s=3000)]
    pending = [job(1, nodes=2, gpus_per_node=8, time_limit_s=3600),
               job(2, gpus_per_node=8, time_limit_s=600),
               job(4, gpus_per_node=1, time_limit_s=500)]
    plan = schedule(snapshot(cluster, [partition("gpu", cluster)], pending, busy, now=1000.0),
                    CONSERVATIVE)
    assert alloc_of(plan, 4) == {"gpu2": (1, 1000, (7,))}
    assert plan.reasons == {1: "Resources", 2: "Resources"}
    # Job 2 fits gpu1 from t=2000 and is done by t=2600, before job 1 needs gpu1 at t=3000.
    assert plan.estimates == {1: 3000.0, 2: 2000.0}


def test_a_job_that_fits_only_beyond_the_window_gets_no_reservation():
    """bf_window: job 1 would start at t=5000, beyond now + 1000 s, so it has no start
    time and a later long job may take gpu2 now."""
    cluster = nodes("gpu", 2)
    busy = [running(9, {"gpu1": (1, 1000, ALL8)}, start_time=0, time_limit_s=5000)]
    pending = [job(1, nodes=2, gpus_per_node=8, time_limit_s=3600),
               job(2, gpus_per_node=8, time_limit_s=36000)]
    snap = snapshot(cluster, [partition("gpu", cluster)], pending, busy, now=1000.0)
    windowed = schedule(snap, SchedConfig(bf_window_s=1000))
    assert alloc_of(windowed, 2) == {"gpu2": (1, 1000, ALL8)}
    assert (windowed.reasons, windowed.estimates) == ({1: "Resources"}, {})
    unbounded = schedule(snap, SchedConfig())
    assert unbounded.starts == []
    assert (unbounded.reasons, unbounded.estimates) == ({1: "Resources", 2: "Priority"}, {1: 5000.0})


def test_bf_max_job_test_leaves_the_rest_with_priority():
    cluster = nodes("gpu", 1)
    pending = [job(i, gpus_per_node=4) for i in range(1, 5)]
    plan = schedule(snapshot(cluster, [partition("gpu", cluster)], pending),
                    SchedConfig(bf_max_job_test=1))
    assert [s.job_id for s in plan.starts] == [1]
    assert plan.reasons == {2: "Priority", 3: "Priority", 4: "Priority"}


def test_a_running_job_without_time_limit_gives_no_start_time():
    cluster = nodes("gpu", 1)
    busy = [running(9, {"gpu1": (1, 1000, ALL8)}, time_limit_s=None)]
    plan = schedule(snapshot(cluster, [partition("gpu", cluster)], [job(1, gpus_per_node=8)], busy),
                    CONSERVATIVE)
    assert (plan.reasons, plan.estimates) == ({1: "Resources"}, {})


def test_the_quick_pass_is_fifo_with_the_same_settings():
    config = SchedConfig(backfill="conservative", bf_interval_s=30, max_jobs_per_pass=100)
    quick = config.quick()
    assert (quick.policy, quick.max_jobs_per_pass, quick.bf_interval_s, quick.partial) == ("fifo", 100, 30, True)


def test_the_quick_pass_stops_once_no_node_is_left_and_the_jobs_after_keep_their_reasons():
    """Two partitions: job 2 blocks gpu1 (job 1 took half of it), job 3 still starts on gpu2,
    job 4 blocks gpu2; jobs 5 and 6 could start nowhere and are left as an earlier pass said."""
    cluster = nodes("gpu", 2)
    a, b = partition("a", cluster[:1]), partition("b", cluster[1:])
    pending = [job(1, gpus_per_node=4, partition="a"), job(2, gpus_per_node=8, partition="a"),
               job(3, gpus_per_node=4, partition="b"), job(4, gpus_per_node=8, partition="b"),
               job(5, gpus_per_node=1, partition="a"), job(6, gpus_per_node=1, partition="b")]
    snap = snapshot(cluster, [a, b], pending)
    quick = SchedConfig(bf_interval_s=30).quick()
    plan = schedule(snap, quick)
    assert [s.job_id for s in plan.starts] == [1, 3]
    assert plan.reasons == {2: "Resources", 4: "Resources"}
    whole = schedule(snap, SchedConfig(policy="fifo"))
    assert [s.job_id for s in whole.starts] == [1, 3]
    assert whole.reasons == {2: "Resources", 4: "Resources", 5: "Priority", 6: "Priority"}


@pytest.mark.parametrize("kw, message", [
    (dict(backfill="aggressive"), "unknown backfill mode 'aggressive'"),
    (dict(bf_max_job_test=0), "bf_max_job_test must be 1 or more"),
    (dict(bf_window_s=0), "bf_window_s must be 1 or more"),
    (dict(bf_interval_s=-1), "bf_interval_s must be 0 or more"),
])
def test_bad_backfill_settings_are_refused(kw, message):
    with pytest.raises(SchedConfigError, match=message):
        SchedConfig(**kw)
