"""The CPU of one scheduling pass (the controller's thread CPU time, which another process's load
changes little), in process, without agents: 1,000 nodes x 8 GPUs, QUEUED one-GPU jobs pending;
each step ends ENDS running jobs (their clean-ups gone), queues ENDS new ones and runs one pass.
Prints the mean and median pass and the snapshot's share, the first two passes left out.
To compare two versions, run each (PYTHONPATH=<other checkout>/src picks another).

    .venv/bin/python bench/bench_pass_cpu.py 40000 1000 14    # QUEUED ENDS PASSES
"""
import statistics
import sys
import time

import shoal
from shoal.store.changes import insert_rows
from shoal.store.models import JobRow

from inprocess import cluster, end_running, job

QUEUED, ENDS, PASSES = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
server = cluster(QUEUED)
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
    end_running(server, ENDS)
    with server.sessions() as s, s.begin():
        insert_rows(s, JobRow, [job(i, time.time()) for i in range(ENDS)])
w, ws = cpu[2:], snap_cpu[2:]
print(f"{shoal.__file__}: {len(w)} passes after 2: pass CPU mean {1000*statistics.mean(w):.0f} ms "
      f"median {1000*statistics.median(w):.0f}; snapshot mean {1000*statistics.mean(ws):.0f} ms; "
      f"first pass {1000*cpu[0]:.0f} ms; passes {server.controller.passes}")
server.leader.stop()
