"""Per-job GPU use as pure functions: heartbeats folded into a node's record, records summed per
job as Slurm's TRESUsageIn* treat tasks (here GPUs), and sacct/sstat printing them."""

from __future__ import annotations

from types import SimpleNamespace

from shoal.cli.sacct import render_sacct
from shoal.cli.sstat import render_sstat
from shoal.model.gpuusage import MAX_POINTS, GPUSample, fold, series, summarise
from shoal.slurm.tresusage import count_text, energy_text, usage_text

MiB = 1024 * 1024


def _two_heartbeats():
    node1 = fold(None, 100.0, [GPUSample(0, 80, 1000, 5_000_000, 300.0), GPUSample(1, 20, 200, 9_000_000, 100.0)])
    node1 = fold(node1, 105.0, [GPUSample(0, 100, 3000, 6_500_000, 400.0), GPUSample(1, 40, 200, 9_500_000, 120.0)])
    node2 = fold(None, 101.0, [GPUSample(3, 60, 2048, 1_000, None)])
    node2 = fold(node2, 106.0, [GPUSample(3, 60, 2048, 501_000, None)])
    return [("node01", node1), ("node02", node2)]


def test_heartbeats_fold_into_sums_peaks_energy_and_a_series():
    (_, node1), _ = _two_heartbeats()
    g0 = node1["gpus"]["0"]
    assert (g0["n"], g0["util_sum"], g0["util_max"], g0["mem_sum"], g0["mem_max"]) == (2, 180, 100, 4000, 3000)
    assert g0["energy_j"] == 1500.0  # the counter advanced 1.5 MJ... in mJ: 1,500 J
    assert g0["busy_s"] == 5.0  # 5 s at 100% (the first heartbeat starts the clock)
    assert node1["series"] == [[100.0, 50.0, 1200, 400.0, 1], [105.0, 70.0, 3200, 520.0, 1]]
    assert (node1["first"], node1["last"]) == (100.0, 105.0)


def test_an_energy_counter_that_goes_back_counts_nothing_for_that_heartbeat():
    rec = fold(None, 0.0, [GPUSample(0, 0, 0, 9_000, None)])
    rec = fold(rec, 1.0, [GPUSample(0, 0, 0, 2_000, None)])  # the driver reloaded
    rec = fold(rec, 2.0, [GPUSample(0, 0, 0, 5_000, None)])
    assert rec["gpus"]["0"]["energy_j"] == 3.0


def test_a_long_job_keeps_its_whole_span_in_a_bounded_series():
    rec = None
    for t in range(1000):
        rec = fold(rec, float(t), [GPUSample(0, t % 100, t, None, None)])
    points = rec["series"]
    assert len(points) <= MAX_POINTS
    assert points[0][0] < 10 and points[-1][0] > 990, "the plot still covers the start and the end"
    assert all(a[0] < b[0] for a, b in zip(points, points[1:]))
    steps = [b[0] - a[0] for a, b in zip(points, points[1:-1])]
    assert max(steps) == min(steps), "evenly spaced: old and new heartbeats alike"
    assert sum(p[4] for p in points) == 1000 and abs(points[0][2] - sum(range(16)) / 16) < 1


def test_a_jobs_summary_treats_gpus_as_slurm_treats_tasks():
    s = summarise(_two_heartbeats())
    assert s["gpus"] == 3 and s["samples"] == 6 and (s["first_time"], s["last_time"]) == (100.0, 106.0)
    util = s["gpuutil"]
    # Averages over time: 90, 30 and 60; peaks: 100, 40 and 60.
    assert (util["ave"], util["tot"]) == (60.0, 180.0)
    assert (util["max"], util["max_node"], util["min"], util["min_node"]) == (100, "node01", 40, "node01")
    mem = s["gpumem_bytes"]
    assert (mem["max"], mem["max_node"], mem["min"]) == (3000 * MiB, "node01", 200 * MiB)
    assert mem["tot"] == (2000 + 200 + 2048) * MiB
    energy = s["energy_j"]  # per node, as Slurm's energy TRES
    assert (energy["tot"], energy["max"], energy["max_node"], energy["min_node"]) == (2500.0, 2000.0, "node01", "node02")
    assert [n["node"] for n in series(_two_heartbeats())] == ["node01", "node02"]
    assert summarise([]) is None


def test_counts_print_as_slurms_convert_num_unit():
    assert [count_text(n) for n in (0, 73, 1024, 2 * 1024 ** 3, int(2.5 * 1024 ** 3), 1000 * MiB + 1)] == \
        ["0", "73", "1K", "2G", "2.50G", "1048576001"]
    assert [energy_text(j) for j in (0, 950, 12_345, 3_000_000)] == ["0", "950", "12.35K", "3M"]


def _job(**kw):
    job = {"job_id": 7, "array_job_id": None, "array_task_id": None, "name": "train", "user": "ada",
           "partition": "gpu", "account": "ml", "state": "COMPLETED", "cpus": 4, "nodes": 2, "nodelist": "node[01-02]",
           "batch_host": "node01", "submit_time": 0, "start_time": 100, "end_time": 200, "exit_code": 0, "signal": 0,
           "steps": [{"step_id": "batch", "name": "batch", "state": "COMPLETED", "start_time": 100, "end_time": 200,
                      "nodelist": "node01", "cpus": 2, "max_rss_kb": 1268, "cpu_s": 65.2},
                     {"step_id": "0", "name": "python", "state": "COMPLETED", "start_time": 101, "end_time": 199,
                      "nodelist": "node[01-02]", "ntasks": 2}],
           "gpu_usage": summarise(_two_heartbeats())}
    job.update(kw)
    return job


def _options(fields):
    return SimpleNamespace(format=fields, brief=False, long=False, state=None, name=None, user=None, allusers=True,
                           starttime="1970-01-01", endtime=None, jobs="7", allocations=False, parsable=False,
                           parsable2=True, noheader=True, delimiter="|")


def test_sacct_prints_the_gpu_figures_on_the_batch_line_as_slurm_23_02_does():
    out = render_sacct([_job()], _options("JobID,TRESUsageInMax,TRESUsageInMaxNode,TRESUsageInTot,ConsumedEnergy"),
                       300).splitlines()
    assert out == [
        "7||||2.50K",
        "7.batch|cpu=00:01:05,energy=2000,gres/gpumem=3000M,gres/gpuutil=100,mem=1268K|"
        "cpu=node01,energy=node01,gres/gpumem=node01,gres/gpuutil=node01,mem=node01|"
        "cpu=00:01:05,energy=2500,gres/gpumem=4248M,gres/gpuutil=180,mem=1268K|2.50K",
        "7.0||||",
    ]


def test_a_job_without_a_batch_step_carries_its_gpu_figures_on_its_own_line():
    job = _job(steps=[])
    assert usage_text(None, job, "ave") == "energy=1250,gres/gpumem=1416M,gres/gpuutil=60"
    assert render_sacct([job], _options("JobID,ConsumedEnergyRaw"), 300) == "7|2500\n"
    assert usage_text(None, _job(steps=[], gpu_usage=None), "ave") is None


def test_sstat_of_the_batch_step_adds_the_jobs_gpu_figures_to_its_cgroups():
    rows = [{"job_id": 7, "gpu_usage": _job()["gpu_usage"],
             "step": {"step_id": "batch", "nodes": [{"node": "node01", "max_rss_kb": 2048, "cpu_s": 3.0, "tasks": 1}]}},
            {"job_id": 7, "gpu_usage": _job()["gpu_usage"],
             "step": {"step_id": "0", "nodes": [{"node": "node01", "max_rss_kb": 1024, "cpu_s": 1.0, "tasks": 1}]}}]
    out = render_sstat(rows, _options("JobID,TRESUsageInAve,ConsumedEnergyRaw")).splitlines()
    assert out == ["7.batch|cpu=00:00:03,energy=1250,gres/gpumem=1416M,gres/gpuutil=60,mem=2M|2500",
                   "7.0|cpu=00:00:01,mem=1M|"]
    rows[1]["step"]["nodes"].append({"node": "node02", "max_rss_kb": 3072, "cpu_s": 5.0, "tasks": 3})
    top = render_sstat(rows[1:], _options("JobID,TRESUsageInMax,TRESUsageInMinNode,TRESUsageInAve")).splitlines()
    assert top == ["7.0|cpu=00:00:05,mem=3M|cpu=node01,mem=node01|cpu=00:00:01,mem=1M"]
