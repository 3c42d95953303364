"""The CPU of one scheduling pass (the controller's thread CPU time, which another process's load
changes little), in process, without agents: 1,000 nodes x 8 GPUs, QUEUED one-GPU jobs pending;
each step ends ENDS running jobs (their clean-ups gone), queues ENDS new ones and runs one pass.
Prints the mean and median pass, the plan's share (``sched.schedule`` alone), the snapshot's
and the comparison of the plan's reasons with the rows' (``Controller._changed_reasons``),
the first two passes left out, and
how long another thread waited for the interpreter meanwhile: a thread that sleeps 1 ms over
and over, timed (the longest wait and the 99th percentile; a pass in one long C call, a sort
or a collection, makes every request beside it wait that long). The interpreter is set as the
server sets it (``interpreter.set_for_server``: switch interval, collector thresholds, freezing).
Then the same for 6 scrapes of ``/metrics`` (``exposition()``, after one left out) on that cluster.
To compare two versions, run each (PYTHONPATH=<other checkout>/src picks another).

    .venv/bin/python bench/bench_pass_cpu.py 40000 1000 14    # QUEUED ENDS PASSES
    .venv/bin/python bench/bench_pass_cpu.py 92000 2 12 quick  # the passes after the first quick ones

``quick``: the server's ``bf_interval_s`` set beyond the run, so that after the first pass, a full
one, every pass is the quick one that Slurm's main scheduler is (``SchedConfig.quick()``).
"""
import dataclasses
import statistics
import sys
import threading
import time

import shoal
from shoal.server import controller, interpreter
from shoal.store.changes import insert_rows
from shoal.store.models import JobRow

from inprocess import cluster, end_running, job

QUEUED, ENDS, PASSES = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
server = cluster(QUEUED)
if sys.argv[4:] == ["quick"]:
    server.sched_config = dataclasses.replace(server.sched_config, bf_interval_s=1e9)
taken = server.snapshot
snap_cpu = []


def snapshot(session, now, **kw):
    t = time.thread_time()
    out = taken(session, now, **kw)
    snap_cpu.append(time.thread_time() - t)
    return out


server.snapshot = snapshot
compare = server.controller._changed_reasons
compare_cpu = []


def changed_reasons(reasons, estimates):
    """The plan's reasons and estimates compared with the rows' (which to write), timed."""
    t = time.thread_time()
    out = compare(reasons, estimates)
    compare_cpu.append(time.thread_time() - t)
    return out


server.controller._changed_reasons = changed_reasons
plan_cpu = []


def schedule(*args, **kw):
    """The plan itself (``sched.schedule``, the pure function), timed."""
    t = time.thread_time()
    out = planned(*args, **kw)
    plan_cpu.append(time.thread_time() - t)
    return out


planned, controller.schedule = controller.schedule, schedule
interpreter.set_for_server()
waits: list[float] = []
measuring = threading.Event()
done = threading.Event()


def sleeper() -> None:
    """Sleeps 1 ms over and over while a measured pass runs; each overrun is a wait for the interpreter."""
    while not done.is_set():
        t = time.perf_counter()
        time.sleep(0.001)
        if measuring.is_set():
            waits.append(time.perf_counter() - t - 0.001)


threading.Thread(target=sleeper, daemon=True).start()
cpu = []
for i in range(PASSES):
    if i >= 2:
        measuring.set()
    t = time.thread_time()
    server.controller.run_pass()
    cpu.append(time.thread_time() - t)
    measuring.clear()
    end_running(server, ENDS)
    with server.sessions() as s, s.begin():
        insert_rows(s, JobRow, [job(i, time.time()) for i in range(ENDS)])
w, ws = cpu[2:], snap_cpu[2:]
print(f"{shoal.__file__}: {len(w)} passes after 2: pass CPU mean {1000*statistics.mean(w):.0f} ms "
      f"median {1000*statistics.median(w):.0f}; plan median {1000*statistics.median(plan_cpu[2:]):.0f} ms; "
      f"snapshot mean {1000*statistics.mean(ws):.0f} ms; reasons compared "
      f"median {1000*statistics.median(compare_cpu[2:]):.1f} ms; "
      f"first pass {1000*cpu[0]:.0f} ms; passes {server.controller.passes}; another thread's wait for the "
      f"interpreter during them: longest {1000*max(waits):.0f} ms, p99 {1000*statistics.quantiles(waits, n=100)[98]:.1f} ms")
scrapes, waits[:] = [], []
for i in range(7):
    if i:
        measuring.set()
    t = time.thread_time()
    server.metrics.exposition()
    scrapes.append(time.thread_time() - t)
    measuring.clear()
print(f"/metrics scrape CPU median {1000*statistics.median(scrapes[1:]):.0f} ms of 6; another thread's wait for the "
      f"interpreter during them: longest {1000*max(waits):.0f} ms")
done.set()
server.leader.stop()
