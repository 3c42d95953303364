"""The CPU of one scheduling pass (the controller's thread CPU time, which another process's load
changes little), in process, without agents: 1,000 nodes x 8 GPUs, QUEUED one-GPU jobs pending;
each step ends ENDS running jobs (their clean-ups gone), queues ENDS new ones and runs one pass.
Prints the mean and median pass and the snapshot's share, the first two passes left out.
To compare two versions, run each (PYTHONPATH=<other checkout>/src picks another).

    .venv/bin/python bench/bench_pass_cpu.py 40000 1000 14    # QUEUED ENDS PASSES
"""
import pathlib
import statistics
import sys
import tempfile
import time

from sqlalchemy import delete, select
import shoal
from shoal.model.resources import ResourceRequest
from shoal.server import jobs as jobsvc
from shoal.server.config import parse_cluster_config
from shoal.server.core import Server
from shoal.store.changes import insert_rows
from shoal.store.models import CleanupRow, JobRow, NodeRow

QUEUED, ENDS, PASSES = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tmp = pathlib.Path(tempfile.mkdtemp(prefix="passbench-"))
config = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node[0001-1000]", "default": True}]})
server = Server(f"sqlite:///{tmp}/db.sqlite", config, tmp)
req = jobsvc.request_to_json(ResourceRequest(nodes=1, ntasks=1, gpus_per_node=1, mem_per_node_mb=1024))
now0 = time.time()


def job(i):
    return dict(name="htc", user="alice", partition="gpu", state="PENDING", reason="None", held=False,
                interactive=False, requeue=False, restart_count=0, priority=1, submit_time=now0, request=req,
                spec={"script": "#!/bin/sh\nsleep 2\n", "account": None}, workdir="/tmp", kind="batch", version=1,
                array_job_id=None, array_task_id=i)


with server.sessions() as s, s.begin():
    s.add_all([NodeRow(name=f"node{n:04d}", address="127.0.0.2", port=6818, state="UP", cpus=128, memory_mb=2 << 20,
                       gpus=[{"index": i, "uuid": f"GPU-{n}-{i}", "product": "NVIDIA A100", "memory_mb": 81920}
                             for i in range(8)], labels={}, features=[], registered_at=now0, last_heartbeat=now0 + 1e6)
               for n in range(1, 1001)])
for k in range(0, QUEUED, 5000):
    with server.sessions() as s, s.begin():
        insert_rows(s, JobRow, [job(i) for i in range(k, min(QUEUED, k + 5000))])
server.leader.start()
while not server.leader.is_leader:
    time.sleep(0.05)
taken = server.snapshot
snap_cpu = []


def snapshot(session, now, **kw):
    t = time.thread_time()
    out = taken(session, now, **kw)
    snap_cpu.append(time.thread_time() - t)
    return out


server.snapshot = snapshot
cpu = []
for _ in range(PASSES):
    t = time.thread_time()
    server.controller.run_pass()
    cpu.append(time.thread_time() - t)
    with server.sessions() as s, s.begin():
        ended = list(s.scalars(select(JobRow).where(JobRow.state == "RUNNING").order_by(JobRow.id).limit(ENDS)))
        for r in ended:
            jobsvc.finish(s, r, jobsvc.JobState.COMPLETED, time.time(), exit_code=0)
    with server.sessions() as s, s.begin():
        s.execute(delete(CleanupRow).where(CleanupRow.job_id.in_([r.id for r in ended])))
    with server.sessions() as s, s.begin():
        insert_rows(s, JobRow, [job(i) for i in range(ENDS)])
w, ws = cpu[2:], snap_cpu[2:]
print(f"{shoal.__file__}: {len(w)} passes after 2: pass CPU mean {1000*statistics.mean(w):.0f} ms "
      f"median {1000*statistics.median(w):.0f}; snapshot mean {1000*statistics.mean(ws):.0f} ms; "
      f"first pass {1000*cpu[0]:.0f} ms; passes {server.controller.passes}")
server.leader.stop()
