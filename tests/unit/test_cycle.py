"""The scheduling cycle's rules the server and the simulator share (shoal.sched.cycle)."""

from __future__ import annotations

from shoal.sched import SchedConfig, cycle
from sched_cluster import job


def test_backfill_runs_a_full_pass_at_most_every_bf_interval_and_quick_ones_between():
    backfill = SchedConfig(policy="backfill", bf_interval_s=30)
    assert cycle.full_pass_due(backfill, now=100, last_full=60)
    assert not cycle.full_pass_due(backfill, now=100, last_full=80)
    assert cycle.pass_config(backfill, full=False) == backfill.quick()
    assert cycle.pass_config(backfill, full=True) is backfill
    assert cycle.full_pass_due(SchedConfig(policy="backfill", bf_interval_s=0), now=100, last_full=100)
    assert cycle.full_pass_due(SchedConfig(policy="fifo"), now=100, last_full=100)


def test_jobs_that_jobs_were_preempted_for_go_first_even_beyond_the_passs_depth():
    a, b, c = job(1), job(2), job(3)
    assert cycle.mark_preemptors((a, b), set()) == (a, b)
    marked = cycle.mark_preemptors((a, b), {2})
    assert [(p.id, p.preemptor) for p in marked] == [(1, False), (2, True)]
    deep = cycle.mark_preemptors((a,), {3}, pool={1: a, 2: b, 3: c})  # the depth left job 3 out
    assert [(p.id, p.preemptor) for p in deep] == [(3, True), (1, False)]


def test_a_victims_grace_is_its_signals_time_at_most_grace_time_and_none_without_a_signal():
    assert cycle.preemption_grace_s(60, 30) == 30
    assert cycle.preemption_grace_s(10, 30) == 10
    assert cycle.preemption_grace_s(None, 30) == 0


def test_usage_older_than_thirty_half_lives_is_not_read_and_without_decay_all_is():
    assert cycle.usage_horizon(1000, 10) == 1000 - 300
    assert cycle.usage_horizon(1000, 0) is None
