"""What squeue's (and sinfo's) answer costs the server after each change of a deep queue, in process, without
agents or HTTP: 1,000 nodes x 8 GPUs, an array of QUEUED one-GPU tasks (8,000 of them
running once the first pass ran, the rest pending). Each round ends ENDS running tasks (their
clean-ups gone), runs one scheduling pass (which starts as many) and then makes plain squeue's
answer (``GET /jobs?view=queue&form=rows&collapse=true``, gzipped) as the endpoint does; the
thread CPU of that answer is timed, and of the first one (the view read whole); so is sinfo's
(``GET /nodes?view=sinfo``, gzipped), made after squeue's. Prints medians
over ROUNDS rounds, the first two left out, and what a full collection of the cyclic garbage
collector then takes (the interpreter set as the server sets it; one full collection made
after the queue was built, then the rounds). To compare two versions, run each
(PYTHONPATH=<other checkout>/src picks another).

    .venv/bin/python bench/bench_queue_view.py 100000 2 20    # QUEUED ENDS ROUNDS
"""
import gc
import statistics
import sys
import time

import shoal
from shoal.server import interpreter, joblist
from shoal.server.auth import Principal

from inprocess import cluster, end_running

QUEUED, ENDS, ROUNDS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
interpreter.set_for_server()
server = cluster(QUEUED, array=True)
operator = Principal(user="root", role="operator")


def answer() -> tuple[float, int]:
    """Plain squeue's answer as the endpoint makes it: (thread CPU seconds, bytes sent)."""
    t = time.thread_time()
    jobs = joblist.list_jobs(server, [], view="queue", viewer=operator, collapse=True)
    body = joblist.Listing(jobs, server.queue, "rows", gzip=True).response().body
    return time.thread_time() - t, len(body)


def sinfo() -> float:
    """sinfo's nodes answer as the endpoint makes it: thread CPU seconds."""
    t = time.thread_time()
    with server.sessions() as s:
        server.node_listing.sinfo(s, True)
    return time.thread_time() - t


server.controller.run_pass()
cold, size = answer()
again, _ = answer()
sinfo()
gc.collect()
cpu, nodes = [], []
for _ in range(ROUNDS):
    end_running(server, ENDS)
    server.controller.run_pass()
    cpu.append(answer()[0])
    nodes.append(sinfo())
w = cpu[2:]
t = time.perf_counter()
gc.collect()
collection = time.perf_counter() - t
print(f"{shoal.__file__}: squeue's answer ({size / 1024:.0f} KiB gzipped): first {1000 * cold:.0f} ms CPU, "
      f"unchanged {1000 * again:.2f} ms; after each change (end {ENDS}, a pass) median {1000 * statistics.median(w):.1f} "
      f"ms, max {1000 * max(w):.1f} ms over {len(w)} rounds; sinfo's then median "
      f"{1000 * statistics.median(nodes[2:]):.1f} ms; then a full collection {1000 * collection:.0f} ms")
server.leader.stop()
