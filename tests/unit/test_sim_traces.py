"""Trace readers on the synthetic samples in examples/traces (values written there by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.model.job import JobState
from shoal.sim.trace import TraceError, read_trace

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"


def by_name(trace):
    return {j.name: j for j in trace.jobs}


def test_swf_fields_header_and_skipped_rows():
    trace = read_trace(TRACES / "sample.swf")
    assert trace.format == "swf" and len(trace.jobs) == 28
    assert trace.header["MaxNodes"] == "8" and trace.origin == 1_700_000_000
    assert dict(trace.skipped) == {"no run time": 1, "cancelled before it started": 1}
    jobs = by_name(trace)
    first = jobs["1"]
    assert (first.id, first.submit, first.duration, first.cpus, first.nodes) == (1, 0, 3600, 128, 2)
    assert (first.time_limit_s, first.user, first.account, first.state) == (7200, "u3", "g1", JobState.COMPLETED)
    fifth = jobs["5"]  # status 0, 200 processors at 64 per node (MaxProcs / MaxNodes)
    assert (fifth.submit, fifth.cpus, fifth.nodes, fifth.state) == (240, 200, 4, JobState.FAILED)
    assert fifth.gpus == 0


def test_helios_cluster_log_columns():
    trace = read_trace(TRACES / "helios_cluster_log.csv")
    assert trace.format == "helios" and len(trace.jobs) == 30
    j = by_name(trace)["5f2b1c"]
    assert (j.id, j.submit, j.duration, j.gpus, j.cpus, j.nodes) == (1, 0, 7200, 16, 96, 2)
    assert (j.user, j.account, j.state) == ("u1024", "vcA", JobState.COMPLETED)
    eval_job = by_name(trace)["5f2b1d"]
    assert (eval_job.submit, eval_job.duration, eval_job.state) == (45, 300, JobState.FAILED)
    cpu_job = by_name(trace)["5f2b1e"]
    assert (cpu_job.gpus, cpu_job.cpus, cpu_job.state) == (0, 4, JobState.CANCELLED)


def test_philly_csv_derivative():
    trace = read_trace(TRACES / "philly.csv")
    assert trace.format == "philly" and len(trace.jobs) == 30
    jobs = by_name(trace)
    a = jobs["application_1506638472019_0001"]
    assert (a.submit, a.duration, a.gpus, a.user, a.account) == (0, 3600, 8, "6214e9", "ee9e8c")
    killed = jobs["application_1506638472019_0003"]
    assert (killed.submit, killed.duration, killed.gpus, killed.state) == (45, 86400, 16, JobState.CANCELLED)


def test_philly_cluster_job_log_json():
    trace = read_trace(TRACES / "philly_cluster_job_log.json")
    assert trace.format == "philly" and dict(trace.skipped) == {"never ran": 1}
    jobs = by_name(trace)
    two_machines = jobs["application_1506638472019_10238"]
    assert (two_machines.submit, two_machines.duration) == (0, 3600)
    assert (two_machines.gpus, two_machines.nodes, two_machines.account) == (8, 2, "ee9e8c")
    retried = jobs["application_1506638472019_10239"]  # first attempt start to last attempt end
    assert (retried.submit, retried.duration, retried.state) == (120, 370, JobState.FAILED)


def test_pai_tasks_sum_into_one_gang_and_users_come_from_the_job_table():
    trace = read_trace(TRACES / "pai_task_table.csv")
    assert trace.format == "pai" and dict(trace.skipped) == {"task without start or end": 1}
    jobs = by_name(trace)
    tf = jobs["4b3ff3b3c6a2c7e3b6e2b1f4"]  # 2 workers x 1 GPU + 1 parameter server
    assert (tf.submit, tf.duration, tf.gpus, tf.cpus) == (0, 3600, 2, 16)
    assert tf.mem_mb == int((2 * 29.3 + 10.0) * 1024)
    assert tf.user == "58540f191766"
    half = jobs["9d1c2a7e0f4e8b2d6c3a5e7f"]  # plan_gpu 50: half a GPU is one whole GPU
    assert (half.submit, half.duration, half.gpus, half.state) == (200, 300, 1, JobState.FAILED)


def test_pai_task_table_with_a_header_line(tmp_path):
    path = tmp_path / "tasks.csv"
    path.write_text("job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,"
                    "plan_gpu,gpu_type\nj1,worker,4,Terminated,10,70,600,30,100,V100\n")
    (j,) = read_trace(path, "pai").jobs
    assert (j.name, j.gpus, j.cpus, j.duration, j.user) == ("j1", 4, 24, 60, "")


def test_limit_keeps_the_first_jobs_by_submit_time():
    trace = read_trace(TRACES / "helios_cluster_log.csv", limit=3)
    assert [j.name for j in trace.jobs] == ["5f2b1c", "5f2b1d", "5f2b1e"]


def test_a_csv_without_the_columns_a_format_needs_is_refused(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("jobid,when\n1,2\n")
    with pytest.raises(TraceError, match="submit_time"):
        read_trace(path, "philly")


def test_an_unrecognisable_file_asks_for_format(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="--format"):
        read_trace(path)


def test_a_short_swf_line_names_its_line(tmp_path):
    path = tmp_path / "x.swf"
    path.write_text("; MaxNodes: 1\n1 0 0 10 1\n")
    with pytest.raises(TraceError, match=r"x\.swf:2: expected 18 SWF fields"):
        read_trace(path)
