"""The simulator's engine and reports on small workloads whose outcome is worked out by hand."""

from __future__ import annotations

import pytest

from shoal.model.job import JobState
from shoal.sched import SchedConfig
from shoal.sim import Failure, TraceJob, build_report, parse_sim_cluster, simulate
from shoal.sim.report import percentile, utilisation_series
from shoal.sim.workload import Workload


def two_nodes(**partition):
    """Two 8-GPU nodes, n1 and n2, in one partition ``gpu``."""
    return parse_sim_cluster({
        "partitions": [{"name": "gpu", "nodes": "n[1-2]", **partition}],
        "sim_nodes": [{"names": "n[1-2]", "cpus": 64, "memory": "512G", "gpus": 8}],
    })


def job(id, submit, duration, *, nodes=1, limit=None, account="a", **kw) -> TraceJob:
    return TraceJob(id=id, submit=submit, duration=duration, gpus=8 * nodes, nodes=nodes,
                    time_limit_s=limit, user=f"user-{account}", account=account,
                    name=f"j{id}", **kw)


def by_id(result):
    return {j.id: j for j in result.jobs}


# A whole-node job runs; a two-node job waits for it; a short one-node job arrives after.
BACKFILL_STORY = [
    job(1, 0, 100, limit=100),
    job(2, 1, 50, nodes=2, limit=50),
    job(3, 2, 30, limit=30, account="b"),
]


def test_fifo_holds_the_short_job_behind_the_blocked_gang():
    jobs = by_id(simulate(two_nodes(), BACKFILL_STORY, SchedConfig(policy="fifo")))
    assert [(jobs[i].start, jobs[i].end) for i in (1, 2, 3)] == [(0, 100), (100, 150), (150, 180)]


def test_backfill_starts_the_short_job_on_the_idle_node_without_delaying_the_gang():
    jobs = by_id(simulate(two_nodes(), BACKFILL_STORY, SchedConfig(policy="backfill")))
    assert [(jobs[i].start, jobs[i].end) for i in (1, 2, 3)] == [(0, 100), (100, 150), (2, 32)]
    assert all(j.state is JobState.COMPLETED for j in jobs.values())


def test_backfill_does_not_start_a_job_that_would_outlast_the_reservation():
    story = BACKFILL_STORY[:2] + [job(3, 2, 30, limit=200, account="b")]  # its limit passes 100
    jobs = by_id(simulate(two_nodes(), story, SchedConfig(policy="backfill")))
    assert (jobs[3].start, jobs[2].start) == (150, 100)


def test_a_job_past_its_time_limit_ends_in_timeout_at_the_limit():
    jobs = by_id(simulate(two_nodes(), [job(1, 0, 500, limit=300), job(2, 10, 20)], SchedConfig()))
    assert (jobs[1].state, jobs[1].end) == (JobState.TIMEOUT, 300)
    assert (jobs[2].state, jobs[2].end) == (JobState.COMPLETED, 30)


def test_a_job_without_a_limit_gets_the_partitions_default_time():
    jobs = by_id(simulate(two_nodes(default_time="1:00"), [job(1, 0, 500)], SchedConfig()))
    assert (jobs[1].time_limit_s, jobs[1].state, jobs[1].end) == (60, JobState.TIMEOUT, 60)


def test_the_trace_recorded_end_state_is_kept_when_the_job_ends_in_time():
    jobs = by_id(simulate(two_nodes(), [job(1, 0, 40, state=JobState.FAILED)], SchedConfig()))
    assert (jobs[1].state, jobs[1].end) == (JobState.FAILED, 40)


def test_resources_freed_at_a_timestamp_go_to_jobs_submitted_at_that_timestamp():
    story = [job(1, 0, 100, nodes=2), job(2, 100, 10, nodes=2)]
    result = simulate(two_nodes(), story, SchedConfig())
    assert by_id(result)[2].start == 100
    assert result.passes == 2  # one pass per event batch, none when nothing is pending


def test_events_at_one_timestamp_share_one_scheduling_pass():
    story = [job(i, 5, 10) for i in (1, 2)] + [job(3, 5, 10)]
    result = simulate(two_nodes(), story, SchedConfig())
    starts = sorted(j.start for j in result.jobs)
    assert starts == [5, 5, 15] and result.passes == 2  # at 5 (two start) and at 15


def test_a_job_that_could_never_fit_is_rejected_at_submit_as_sbatch_would():
    jobs = by_id(simulate(two_nodes(), [job(1, 0, 10, nodes=3)], SchedConfig()))
    assert jobs[1].state is None and jobs[1].start is None
    assert jobs[1].reason.startswith("rejected at submit: requested 3 nodes")


def test_a_node_failure_ends_its_jobs_with_node_fail():
    failure = Failure(("n1",), at=100)
    jobs = by_id(simulate(two_nodes(), [job(1, 0, 1000), job(2, 0, 1000)], SchedConfig(),
                          failures=[failure]))
    on_n1 = [j for j in jobs.values() if j.state is JobState.NODE_FAIL]
    assert [(j.end, j.requeues) for j in on_n1] == [(100, 0)]
    assert [j.end for j in jobs.values() if j.state is JobState.COMPLETED] == [1000]


def test_a_requeued_job_restarts_on_a_healthy_node_and_the_failed_node_returns_later():
    story = [job(1, 0, 1000), job(2, 150, 10, nodes=2)]
    jobs = by_id(simulate(two_nodes(), story, SchedConfig(), requeue=True,
                          failures=[Failure(("n1",), at=100, down_for=200)]))
    assert (jobs[1].first_start, jobs[1].start, jobs[1].end, jobs[1].requeues) == (0, 100, 1100, 1)
    assert jobs[1].state is JobState.COMPLETED
    # The gang needs both nodes: n1 is DOWN until 300 and n2 is busy until 1100.
    assert jobs[2].start == 1100


def test_a_gang_waits_for_a_failed_node_to_recover():
    jobs = by_id(simulate(two_nodes(), [job(1, 150, 10, nodes=2)], SchedConfig(),
                          failures=[Failure(("n2",), at=100, down_for=200)]))
    assert (jobs[1].start, jobs[1].end) == (300, 310)


def test_failing_a_node_the_cluster_lacks_is_an_error():
    with pytest.raises(ValueError, match="n9"):
        simulate(two_nodes(), [job(1, 0, 1)], SchedConfig(), failures=[Failure(("n9",), 5)])


def test_report_figures_for_the_backfill_story():
    report = build_report(simulate(two_nodes(), BACKFILL_STORY, SchedConfig()), bins=3)
    # JCTs 100, 149, 30; waits 0, 99, 0.
    assert (report.jct.mean, report.jct.median, report.jct.p99) == (93.0, 100.0, 149.0)
    assert (report.wait.mean, report.wait.median, report.wait.p99) == (33.0, 0.0, 99.0)
    assert report.makespan_s == 150
    # 8x100 + 16x50 + 8x30 GPU-seconds of 16 GPUs x 150 s.
    assert report.gpu_utilisation == pytest.approx(1840 / 2400)
    assert report.series_t == [0, 50, 100]
    assert report.series_gpu == pytest.approx([0.8, 0.5, 1.0])
    assert report.states == {"COMPLETED": 3}


def test_fair_share_compares_gpu_seconds_received_while_jobs_arrive_with_those_submitted():
    report = build_report(simulate(two_nodes(), BACKFILL_STORY, SchedConfig()))
    shares = {s.account: s for s in report.shares}
    assert shares["a"].submitted == 1600 and shares["b"].submitted == 240
    # Jobs arrive until t=2; in 0..2 only job 1 (account a, 8 GPUs) ran.
    assert (shares["a"].received, shares["b"].received) == (16, 0)
    assert shares["a"].ratio == pytest.approx(1 / (1600 / 1840))
    assert shares["b"].ratio == 0
    assert report.jain == pytest.approx(0.5)


def test_percentile_is_nearest_rank():
    xs = list(range(1, 101))
    assert (percentile(xs, 50), percentile(xs, 99), percentile(xs, 100)) == (50, 99, 100)
    assert percentile([7.0], 99) == 7.0


def test_utilisation_series_integrates_runs_that_span_bins():
    from shoal.sim.engine import Run

    runs = [Run(1, 5, 25, gpus=4, cpus=0)]
    t, u = utilisation_series(runs, capacity=8, horizon=30, bins=3, what="gpus")
    assert t == [0, 10, 20] and u == pytest.approx([0.25, 0.5, 0.25])


def test_trace_totals_become_per_node_gang_shares():
    w = Workload(two_nodes())
    big = w.pending(TraceJob(id=1, submit=0, duration=1, gpus=16)).request
    small = w.pending(TraceJob(id=2, submit=0, duration=1, gpus=2)).request
    cpu = w.pending(TraceJob(id=3, submit=0, duration=1, cpus=100)).request
    assert (big.nodes, big.gpus_per_node, big.cpus_per_node, big.mem_per_node_mb) == (2, 8, 64, 524288)
    assert (small.nodes, small.gpus_per_node, small.cpus_per_node, small.mem_per_node_mb) == (1, 2, 16, 131072)
    assert (cpu.nodes, cpu.gpus_per_node, cpu.cpus_per_node) == (2, 0, 50)


def test_recorded_cpus_beyond_a_node_are_capped_and_counted():
    w = Workload(two_nodes())
    r = w.pending(TraceJob(id=1, submit=0, duration=1, gpus=8, cpus=500)).request
    assert r.cpus_per_node == 64 and w.capped["cpus"] == 1


def test_exact_limits_use_the_recorded_run_time_rounded_up_to_the_minute():
    w = Workload(two_nodes(), exact_limits=True)
    assert w.pending(TraceJob(id=1, submit=0, duration=61, gpus=1)).time_limit_s == 120


def test_with_bf_interval_the_short_job_backfills_at_the_next_full_pass_and_idle_passes_are_skipped():
    config = SchedConfig(policy="backfill", bf_interval_s=60)
    result = simulate(two_nodes(), BACKFILL_STORY, config)
    jobs = by_id(result)
    # The gang blocks at 1 (quick pass); the short job arrives behind it, so no pass runs
    # until the full one at 60 backfills it; its end at 90 frees too little for the gang.
    assert [jobs[i].start for i in (1, 2, 3)] == [0, 100, 60]
    assert result.passes == 4  # at 0 (full), 1 (quick), 60 (full), 100 (quick)


def test_fifo_skips_the_passes_that_could_start_nothing_and_starts_the_same_jobs():
    story = [job(1, 0, 100, nodes=2), *[job(i, i, 10) for i in range(2, 8)]]
    result = simulate(two_nodes(), story, SchedConfig(policy="fifo"))
    assert sorted(j.start for j in result.jobs) == [0, 100, 100, 110, 110, 120, 120]
    # At 0, at 2 (job 2 finds the gang in the way), 100, 110, 120: none for jobs 3-7's
    # submits, which come behind job 2 while nothing is freed.
    assert result.passes == 5
