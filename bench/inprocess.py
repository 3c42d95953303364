"""An in-process server for the CPU benchmarks that need no agents or HTTP (bench_pass_cpu.py,
bench_queue_view.py): 1,000 nodes x 8 GPUs in one partition, one-GPU jobs stored as
submissions store them (one Core INSERT per batch), the server leading."""
import pathlib
import tempfile
import time

from sqlalchemy import select, update

from shoal.model.resources import ResourceRequest
from shoal.server import jobs as jobsvc
from shoal.server.config import parse_cluster_config
from shoal.server.core import Server
from shoal.store.changes import insert_rows
from shoal.store.models import CleanupRow, JobRow, NodeRow

NODES = 1000
_REQUEST = jobsvc.request_to_json(ResourceRequest(nodes=1, ntasks=1, gpus_per_node=1, mem_per_node_mb=1024))


def job(i: int, now: float) -> dict:
    """A one-GPU job's row (``i``: its array task id, its array set by ``cluster``)."""
    return dict(name="htc", user="alice", partition="gpu", state="PENDING", reason="None", held=False,
                interactive=False, requeue=False, restart_count=0, priority=1, submit_time=now, request=_REQUEST,
                spec={"script": "#!/bin/sh\nsleep 2\n", "account": None}, workdir="/tmp", kind="batch", version=1,
                array_job_id=None, array_task_id=i)


def cluster(queued: int, array: bool = False) -> Server:
    """The server with ``queued`` jobs pending (``array``: as the tasks of one array), leading."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    config = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": f"node[0001-{NODES}]", "default": True}]})
    server = Server(f"sqlite:///{tmp}/db.sqlite", config, tmp)
    now = time.time()
    with server.sessions() as s, s.begin():
        s.add_all([NodeRow(name=f"node{n:04d}", address="127.0.0.2", port=6818, state="UP", cpus=128,
                           memory_mb=2 << 20, gpus=[{"index": i, "uuid": f"GPU-{n}-{i}", "product": "NVIDIA A100",
                                                     "memory_mb": 81920} for i in range(8)],
                           labels={}, features=[], registered_at=now, last_heartbeat=now + 1e6)
                   for n in range(1, NODES + 1)])
    for k in range(0, queued, 5000):
        with server.sessions() as s, s.begin():
            insert_rows(s, JobRow, [job(i, now) for i in range(k, min(queued, k + 5000))])
    if array:
        with server.sessions() as s, s.begin():  # as a submission sets it: on the connection
            first = s.scalar(select(JobRow.id).order_by(JobRow.id).limit(1))
            s.connection().execute(update(JobRow.__table__).values(array_job_id=first))
    server.leader.start()
    while not server.leader.is_leader:
        time.sleep(0.05)
    return server


def end_running(server: Server, n: int) -> None:
    """End the first ``n`` running jobs, then their clean-ups row by row (as agents report them)."""
    with server.sessions() as s, s.begin():
        ended = list(s.scalars(select(JobRow).where(JobRow.state == "RUNNING").order_by(JobRow.id).limit(n)))
        for r in ended:
            jobsvc.finish(s, r, jobsvc.JobState.COMPLETED, time.time(), exit_code=0)
    with server.sessions() as s, s.begin():
        for c in s.scalars(select(CleanupRow).where(CleanupRow.job_id.in_([r.id for r in ended]))):
            s.delete(c)
