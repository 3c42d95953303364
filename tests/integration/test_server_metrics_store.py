"""The server's metrics on each store engine: state read at scrape time, events counted only
once their transaction commits, and a text that says what prometheus-client's own would."""

from __future__ import annotations

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shoal.model.job import JobState
from shoal.server import jobs as jobsvc
from shoal.server.config import parse_cluster_config
from shoal.server.core import Server
from shoal.store.models import JobRow

def _running(server: Server, now: float) -> int:
    with server.sessions() as s, s.begin():
        row = JobRow(name="train", user="alice", partition="gpu", state=JobState.RUNNING.value, submit_time=now - 100,
                     start_time=now - 60, request={}, spec={"account": "physics"}, workdir="/tmp",
                     allocation={"exclusive": False, "nodes": [{"name": "node01", "cpus": 4, "memory_mb": 1,
                                                                "gpus": [0, 1]}]})
        s.add(row)
    return row.id


def _samples(text: str) -> dict:
    """Every sample of a Prometheus text, by name and labels, without the timing histograms'
    values (they change between two scrapes)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value if "duration" not in s.name else None
            for f in text_string_to_metric_families(text) for s in f.samples}


def _value(server: Server, name: str, labels: dict) -> float | None:
    return server.metrics.registry.get_sample_value(name, labels)


def test_a_jobs_end_counts_once_its_transaction_commits(db_url, tmp_path):
    config = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}]})
    now = 1000.0
    server = Server(db_url, config, tmp_path, clock=lambda: now)
    try:
        job = _running(server, now)
        with server.sessions() as s, s.begin():
            s.add(JobRow(name="wait", user="bob", partition="gpu", state=JobState.PENDING.value, submit_time=now,
                         reason="Resources", request={}, spec={"account": "physics", "qos": "high"}, workdir="/tmp"))
        text = server.metrics.exposition().decode()
        assert 'shoal_jobs{state="running",partition="gpu",account="physics",qos="normal",kind="batch"} 1\n' in text
        assert 'shoal_jobs{state="pending",partition="gpu",account="physics",qos="high",kind="batch"} 1\n' in text
        assert 'shoal_pending_jobs{partition="gpu",reason="Resources"} 1\n' in text
        # A running job's usage so far (server/running.py's index): two GPUs and four CPUs for 60 s.
        assert 'shoal_account_gpu_seconds_total{account="physics",user="alice"} 120\n' in text
        assert 'shoal_account_cpu_seconds_total{account="physics",user="alice"} 240\n' in text
        with server.sessions() as s:
            with s.begin():
                jobsvc.finish(s, s.get(JobRow, job), JobState.COMPLETED, now, exit_code=0)
                s.rollback()  # lost a race: nothing happened, so nothing is counted
        labels = {"partition": "gpu", "state": "COMPLETED"}
        assert _value(server, "shoal_jobs_ended_total", labels) is None
        with server.sessions() as s, s.begin():
            jobsvc.finish(s, s.get(JobRow, job), JobState.COMPLETED, now, exit_code=0)
        assert _value(server, "shoal_jobs_ended_total", labels) == 1
        assert _value(server, "shoal_job_run_time_seconds_sum", {"partition": "gpu"}) == 60
        assert _value(server, "shoal_store_commit_duration_seconds_count", {}) >= 2
        # GPU-seconds by account: the ended run's two GPUs for 60 s, read at the scrape.
        text = server.metrics.exposition().decode()
        assert 'shoal_account_gpu_seconds_total{account="physics",user="alice"} 120\n' in text
        # The text says what prometheus-client's own exposition says, sample for sample.
        assert _samples(text) == _samples(generate_latest(server.metrics.registry).decode())
    finally:
        server.engine.dispose()
