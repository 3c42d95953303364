#!/usr/bin/env python3
"""Throughput and a busy API at 1,000 hollow nodes: short array tasks, a submission storm, reads.

One server (SQLite, or ``--postgres``) and one ``shoal agent --hollow N`` process (as
bench_scale.py starts them: ``bench_scale.Hollow``), then, in order:

1. throughput: ``--arrays`` job arrays of ``--array-size`` single-GPU tasks of
   ``--task-s`` seconds (Slurm's HTC guide counts array tasks as jobs), submitted at once;
   until every task has ended. Counted in the store: each task COMPLETED exactly once
   (restart count 0). The sustained rate is the tasks that ended between the 10th and the
   90th percentile of the end times over that span (ramp-up and tail left out); also the
   rate from the first submission to the last end, and the server's CPU per task;
2. storm: ``--storm`` jobs of mixed shapes (1/2/4/8 GPUs, one in twenty on 2 nodes x 8 GPUs,
   one in fifty an array of 10 tasks) that would run an hour, from ``--submitters``
   threads, one ``POST /jobs`` each: every request's round trip (p50/p99) and the rate;
3. queue: one array that brings the jobs queued to ``--queued`` (pending and running);
4. reads: ``--readers`` threads, each ``--reads`` rounds of the requests squeue
   (``GET /jobs?view=queue&form=packed&collapse=true``, as ``shoal.slurm.squeue.query`` makes it),
   sinfo (``GET /nodes?view=sinfo`` + ``GET /partitions``) and ``scontrol show job ID``
   (``GET /jobs?all=true&job_id=ID``) make, through the client library (which asks for gzip):
   each request's round trip with its body read and decompressed (p50/p99), and, apart, what
   decoding squeue's JSON into its jobs costs a client, and the answers' sizes as sent. The
   clients are threads of this process (their CPU counted, each thread's own), or with
   ``--reader-processes`` processes of their own, as that many squeue commands at once are
   (on 2 cores the threads' figures were no worse: the clients use ~2 ms of CPU a round
   against the server's 30 to 70). The reads start once a scheduling pass begun after the
   queue was filled has ended (``--no-settle``: at once, as before 2026-12-05 evening): the
   first pass over 90,000 new tasks loads each of them, seconds of the server's time that
   were most of what the reads waited on.

``--profile DIR`` records the server with py-spy during the throughput phase, the storm and the reads.
``--save``/``--baseline`` keep results and show an earlier run beside them. Writes the
``## Scale: throughput and API load`` section of BENCHMARKS.md (``--no-write``: only print).

    .venv/bin/python bench/bench_htc.py                      # 1000 nodes, the issue's sizes
    .venv/bin/python bench/bench_htc.py --nodes 100 --arrays 4 --array-size 500 --storm 2000 --queued 10000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks_md import publish  # bench/ is on sys.path as the script's folder

from bench.bench_foundation import ensure_bytecode, load_average, machine_facts
from bench.bench_scale import SINFO_NODES, Hollow, _postgres, _py_spy, _py_spy_stop, cpu_s, pct, squeue_path
from tests.integration.cluster import wait_until
from shoal.api_client import Client
from shoal.server import stalls
from shoal.slurm import squeue

SECTION = "## Scale: throughput and API load"  # its own section: bench_scale.py rewrites "## Scale" whole
LONG = "#!/bin/sh\nsleep 3600\n"


def _client(h: Hollow) -> Client:
    c = Client(h.url, h.admin.token, timeout=300)
    c.job_token = None
    return c


def _ms(xs: list[float]) -> dict:
    return {"p50_ms": 1000 * pct(xs, 0.5), "p99_ms": 1000 * pct(xs, 0.99), "n": len(xs)}


def throughput(h: Hollow, workdir: str, arrays: int, size: int, task_s: float, profile: Path | None) -> dict:
    """Short array tasks through the whole cluster, counted."""
    spy = _py_spy(h.server.pid, profile / "throughput.txt") if profile else None
    passes0 = (h.metric("shoal_scheduler_pass_duration_seconds_sum"),
               h.metric("shoal_scheduler_pass_duration_seconds_count"))
    cpu0, t0 = cpu_s(h.server), time.time()
    clients = [_client(h) for _ in range(min(4, arrays))]

    def submit(k: int) -> int:
        return clients[k % len(clients)].post("/shoal/v1/jobs", {
            "name": "htc", "script": f"#!/bin/sh\nsleep {task_s:g}\n", "workdir": workdir, "gpus_per_node": 1,
            "stdout": "/dev/null", "array": f"0-{size - 1}"})["job_id"]

    with ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(submit, range(arrays)))
    submitted_s = time.time() - t0
    total = arrays * size
    wait_until(lambda: not any(j["name"] == "htc" for j in h.admin.get("/shoal/v1/jobs", {"view": "queue"})["jobs"]),
               900, "throughput: every task to end", interval=0.5)
    wall = time.time() - t0
    cpu = cpu_s(h.server) - cpu0
    if spy:
        _py_spy_stop(spy)
    passes1 = (h.metric("shoal_scheduler_pass_duration_seconds_sum"),
               h.metric("shoal_scheduler_pass_duration_seconds_count"))
    done = h.admin.get("/shoal/v1/jobs", {"all": "true", "name": "htc"})["jobs"]
    ok = [j for j in done if j["state"] == "COMPLETED" and j["restart_count"] == 0]
    ends = sorted(j["end_time"] for j in ok)
    lo, hi = (ends[int(0.1 * len(ends))], ends[int(0.9 * len(ends)) - 1]) if len(ends) >= 10 else (0.0, 0.0)
    n_passes = passes1[1] - passes0[1]
    not_up = [n for n in h.admin.get("/shoal/v1/nodes")["nodes"] if n["state"] != "UP"]
    return {"tasks": total, "task_s": task_s, "submit_s": submitted_s, "wall_s": wall,
            "end_to_end_per_s": total / wall,
            "sustained_per_s": (0.8 * len(ends)) / (hi - lo) if hi > lo else float("nan"),
            "server_cpu_ms_per_task": 1000 * cpu / total, "server_cpu_share": cpu / wall,
            "passes": n_passes,
            "pass_ms": 1000 * (passes1[0] - passes0[0]) / n_passes if n_passes else float("nan"),
            "completed_once": len(ok), "lost_or_twice": total - len(ok),
            "nodes_down": len(not_up),
            "not_up": [(n["name"], n["state"], n.get("reason")) for n in not_up[:5]]}  # why, for the first few


def storm_body(k: int, workdir: str) -> dict:
    """The k-th storm job: 1/2/4/8 GPUs, one in twenty on two whole nodes, one in fifty an array."""
    body = {"name": "storm", "script": LONG, "workdir": workdir, "stdout": "/dev/null",
            "gpus_per_node": (1, 2, 4, 8)[k % 4]}
    if k % 20 == 7:
        body.update(nodes=2, gpus_per_node=8, exclusive=True)
    elif k % 50 == 11:
        body.update(array="0-9", gpus_per_node=1)
    return body


def storm(h: Hollow, workdir: str, n: int, submitters: int, profile: Path | None) -> dict:
    spy = _py_spy(h.server.pid, profile / "storm.txt") if profile else None
    clients = [_client(h) for _ in range(submitters)]
    lat: list[list[float]] = [[] for _ in range(submitters)]
    jobs = [0] * submitters

    def submitter(i: int) -> None:
        c = clients[i]
        for k in range(i, n, submitters):
            body = storm_body(k, workdir)
            t = time.perf_counter()
            c.post("/shoal/v1/jobs", body)
            lat[i].append(time.perf_counter() - t)
            jobs[i] += 10 if "array" in body else 1

    passes0 = h.metric(PASS_S), h.metric(PASSES)
    cpu0, t0 = cpu_s(h.server), time.perf_counter()
    with ThreadPoolExecutor(submitters) as pool:
        list(pool.map(submitter, range(submitters)))
    wall = time.perf_counter() - t0
    cpu = cpu_s(h.server) - cpu0
    passes1 = h.metric(PASS_S), h.metric(PASSES)
    if spy:
        _py_spy_stop(spy)
    every = [x for xs in lat for x in xs]
    return {"requests": n, "jobs": sum(jobs), "submitters": submitters, "wall_s": wall,
            "requests_per_s": n / wall, "jobs_per_s": sum(jobs) / wall,
            "server_cpu_ms_per_request": 1000 * cpu / n, **_ms(every),
            "passes": passes1[1] - passes0[1], "pass_s": passes1[0] - passes0[0]}


def wire_bytes(h: Hollow, path: str) -> tuple[int, str]:
    """The answer's size as sent to a client that accepts gzip, and its Content-Encoding."""
    request = urllib.request.Request(h.url + path, headers={"Authorization": f"Bearer {h.admin.token}",
                                                            "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=300) as answer:  # urllib leaves the body encoded
        return len(answer.read()), answer.headers.get("Content-Encoding") or "identity"


READS = ("squeue", "sinfo", "scontrol")


def read_rounds(url: str, token: str, rounds: int, paths: dict[str, tuple[str, ...]], start) -> tuple[dict, float]:
    """One client: ``rounds`` rounds of each command's requests (``paths``), each timed with its
    whole answer read and (when gzipped) decompressed, from when ``start`` (a barrier) lets it;
    and the CPU it used meanwhile (its own thread's)."""
    c = Client(url, token, timeout=300)
    c.job_token = None
    mine: dict[str, list[float]] = {k: [] for k in paths}
    start.wait()
    cpu0 = time.thread_time()
    for _ in range(rounds):
        for k, requests in paths.items():
            t = time.perf_counter()
            for path in requests:
                c.get_bytes(path)
            mine[k].append(time.perf_counter() - t)
    return mine, time.thread_time() - cpu0


def _reader_process(url: str, token: str, rounds: int, paths: dict, start, results) -> None:
    results.put(read_rounds(url, token, rounds, paths, start))


class Churn:
    """Running jobs ended at ``per_s`` a second (each cancelled, as scancel does) in a thread,
    so that scheduling passes over the whole queue go on while the reads are timed: a full
    cluster's jobs end and the next ones start (8,000 one-GPU jobs of an hour end 2.2 times a
    second)."""

    def __init__(self, h: Hollow, per_s: float) -> None:
        self.h, self.per_s, self.ended = h, per_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Churn":
        if self.per_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        if self.per_s > 0:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        c = _client(self.h)
        running = [j["job_id"] for j in c.get("/shoal/v1/jobs", {"view": "queue"})["jobs"] if j["state"] == "RUNNING"]
        next_at = time.perf_counter()
        while running and not self._stop.is_set():
            c.post(f"/shoal/v1/jobs/{running.pop()}/cancel", {})
            self.ended += 1
            next_at += 1 / self.per_s
            self._stop.wait(max(0.0, next_at - time.perf_counter()))


def reads(h: Hollow, readers: int, rounds: int, some_job: int, profile: Path | None = None,
          processes: bool = False, churn_per_s: float = 0.0) -> dict:
    """Each squeue, sinfo and scontrol request timed as a client library makes it: sent, its
    whole answer read and (when gzipped) decompressed; what decoding squeue's JSON into its
    jobs costs is measured apart (one client, after the load). The clients are threads of
    this process, or (``processes``) processes of their own, as many commands run at once are."""
    queue_path = squeue_path()
    paths = {"squeue": (queue_path,), "sinfo": (SINFO_NODES, "/shoal/v1/partitions"),
             "scontrol": ("/shoal/v1/jobs?" + urlencode({"all": "true", "job_id": some_job}),)}
    args = (h.url, h.admin.token, rounds, paths)
    if processes:
        spawn = multiprocessing.get_context("spawn")  # no copy of this process's threads
        start, results = spawn.Barrier(readers + 1), spawn.Queue()
        clients = [spawn.Process(target=_reader_process, args=(*args, start, results)) for _ in range(readers)]
        for p in clients:
            p.start()
    else:
        start = threading.Barrier(readers + 1)
        pool = ThreadPoolExecutor(readers)
        futures = [pool.submit(read_rounds, *args, start) for _ in range(readers)]
    spy = _py_spy(h.server.pid, profile / "reads.txt") if profile else None
    # Scraped while the clients wait at the barrier: a scrape of /metrics with 100,000 jobs
    # queued is about a hundred milliseconds of the server, and taken after the start it fell
    # on the first round, every client's first request waiting behind it.
    passes0 = h.metric(PASSES)
    start.wait(timeout=120)  # every client ready (a process started and imported): go
    cpu0, t0, began = cpu_s(h.server), time.perf_counter(), time.time()
    with Churn(h, churn_per_s) as churn:
        if processes:
            done = [results.get(timeout=600) for _ in clients]
            wall = time.perf_counter() - t0
            for p in clients:
                p.join()
        else:
            done = [f.result() for f in futures]
            wall = time.perf_counter() - t0
            pool.shutdown()
    cpu = cpu_s(h.server) - cpu0
    ended = time.time()
    passes = h.metric(PASSES) - passes0
    if spy:
        _py_spy_stop(spy)
    got: dict[str, list[float]] = {k: [x for mine, _ in done for x in mine[k]] for k in READS}
    # Which rounds the slowest squeue requests were in (the first: every client at once).
    slowest = sorted(((x, r) for mine, _ in done for r, x in enumerate(mine["squeue"])), reverse=True)
    slow_rounds = [r for _, r in slowest[:max(1, len(slowest) // 50)]]
    client_cpu = sum(used for _, used in done)
    body = h.admin.get_bytes(queue_path)
    t = time.perf_counter()
    listed = len(squeue.listed_jobs(json.loads(body)))
    decode = time.perf_counter() - t
    wire, encoding = wire_bytes(h, queue_path)
    nodes_wire, _ = wire_bytes(h, SINFO_NODES)
    nodes_bytes = len(h.admin.get_bytes(SINFO_NODES))
    alone = []
    for _ in range(rounds):
        t = time.perf_counter()
        h.admin.get_bytes(queue_path)
        alone.append(time.perf_counter() - t)
    return {"readers": readers, "rounds": rounds, "processes": processes, "listed": listed, "squeue_bytes": len(body),
            "squeue_path": queue_path, "squeue_wire_bytes": wire, "squeue_encoding": encoding,
            "sinfo_nodes_bytes": nodes_bytes, "sinfo_nodes_wire_bytes": nodes_wire,
            "squeue_decode_ms": 1000 * decode, "squeue_alone": _ms(alone),
            "server_cpu_ms_per_round": 1000 * cpu / (readers * rounds), "wall_s": wall, "passes": passes,
            "churn_per_s": churn_per_s, "churned": churn.ended,
            "client_cpu_ms_per_round": 1000 * client_cpu / (readers * rounds), "squeue_slowest_rounds": slow_rounds,
            **({"stalls_s": stalls_between(h.stall_log, began, ended)} if h.stall_log else {}),
            **{k: _ms(v) for k, v in got.items()}}


def stalls_between(log: Path, began: float, ended: float) -> list[float]:
    """How long each stall the server's stall log names, begun between two Unix times, lasted."""
    return [took for at, took in stalls.logged(log.read_text()) if began <= at <= ended]


PASSES = "shoal_scheduler_pass_duration_seconds_count"
PASS_S = "shoal_scheduler_pass_duration_seconds_sum"
SKIPPED = "shoal_scheduler_passes_skipped_total"


def settle(h: Hollow, timeout_s: float = 300) -> float:
    """Seconds until a scheduling pass begun after now has ended: the first pass over a queue
    just filled loads every new job once (seconds of the server's time at 90,000 tasks), which
    the reads would otherwise share; later passes read only what changed. Then, on a server
    that skips periodic passes with nothing to do, until it has skipped one (at most 10 s
    more): the scheduler has come to rest."""
    t0, passes = time.perf_counter(), h.metric(PASSES)
    wait_until(lambda: h.metric(PASSES) >= passes + 2, timeout_s, "a whole pass after the queue was filled",
               interval=0.5)
    skipped = h.metric(SKIPPED)
    if f"\n{SKIPPED} ".encode() in h.admin.get_bytes("/metrics"):
        try:
            wait_until(lambda: h.metric(SKIPPED) > skipped, 10, "a pass skipped", interval=0.5)
        except AssertionError:
            pass
    return time.perf_counter() - t0


def run(args, env: dict, db: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="htc-") as tmp:
        stall_log = None
        if args.stall_log:
            args.stall_log.mkdir(parents=True, exist_ok=True)
            stall_log = args.stall_log / f"stalls-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}.log"
        h = Hollow(Path(tmp), args.nodes, env, db,
                   scheduler={"bf_interval_s": args.bf_interval} if args.bf_interval else None, stall_log=stall_log,
                   stall_ms=args.stall_ms)
        try:
            h.start()
            time.sleep(6)  # every node past its first heartbeat
            out: dict = {"nodes": args.nodes}
            if args.arrays:
                print("  throughput ...", flush=True)
                out["throughput"] = throughput(h, tmp, args.arrays, args.array_size, args.task_s, args.profile)
                print("  " + json.dumps(out["throughput"]), flush=True)
            if args.storm:
                print("  storm ...", flush=True)
                out["storm"] = storm(h, tmp, args.storm, args.submitters, args.profile)
                print("  " + json.dumps(out["storm"]), flush=True)
            if args.readers:
                queued = len(h.admin.get("/shoal/v1/jobs", {"view": "queue"})["jobs"])
                if args.queued > queued:
                    print(f"  queue to {args.queued} ...", flush=True)
                    t = time.perf_counter()
                    h.admin.post("/shoal/v1/jobs", {"name": "fill", "script": LONG, "workdir": tmp,
                                                    "stdout": "/dev/null", "gpus_per_node": 1,
                                                    "array": f"0-{args.queued - queued - 1}"})
                    out["queue_submit_s"] = time.perf_counter() - t
                    time.sleep(2)
                if args.settle:
                    out["settle_s"] = settle(h)
                jobs = h.admin.get("/shoal/v1/jobs", {"view": "queue"})["jobs"]
                out["queued"] = len(jobs)
                print(f"  reads with {len(jobs)} jobs queued ...", flush=True)
                out["reads"] = reads(h, args.readers, args.reads, jobs[len(jobs) // 2]["job_id"], args.profile,
                                     args.reader_processes, args.churn)
                print("  " + json.dumps(out["reads"]), flush=True)
            out["server_rss_mb"] = h.server.memory_info().rss / 2 ** 20
            out["hollow_report_errors"] = (h.stats() or {}).get("report_errors")
            return out
        except Exception:
            print((Path(tmp) / "server.log").read_text()[-3000:], file=sys.stderr)  # gone with the folder
            raise
        finally:
            h.stop()


# ---------------------------------------------------------------------- report

ROWS = [  # (label, how to read it from a result, format)
    ("throughput: tasks (single-GPU array tasks)", lambda r: r["throughput"]["tasks"], "{:.0f}"),
    ("throughput: sustained, tasks ended per second (10th-90th percentile of the ends)",
     lambda r: r["throughput"]["sustained_per_s"], "{:.0f}"),
    ("throughput: first submission to last end, tasks per second", lambda r: r["throughput"]["end_to_end_per_s"],
     "{:.0f}"),
    ("throughput: server CPU per task, started and ended (ms)",
     lambda r: r["throughput"]["server_cpu_ms_per_task"], "{:.2f}"),
    ("throughput: server CPU (share of one core)", lambda r: 100 * r["throughput"]["server_cpu_share"], "{:.0f}%"),
    ("throughput: scheduling passes / mean pass (ms)",
     lambda r: (int(r["throughput"]["passes"]), round(r["throughput"]["pass_ms"], 1)), None),
    ("throughput: tasks lost or run twice / nodes DOWN",
     lambda r: (r["throughput"]["lost_or_twice"], r["throughput"]["nodes_down"]), None),
    ("storm: requests (jobs, array tasks counted)", lambda r: (r["storm"]["requests"], r["storm"]["jobs"]), None),
    ("storm: requests per second", lambda r: r["storm"]["requests_per_s"], "{:.0f}"),
    ("storm: submit round trip p50 (ms)", lambda r: r["storm"]["p50_ms"], "{:.1f}"),
    ("storm: submit round trip p99 (ms)", lambda r: r["storm"]["p99_ms"], "{:.1f}"),
    ("storm: server CPU per request (ms)", lambda r: r["storm"]["server_cpu_ms_per_request"], "{:.2f}"),
    ("storm: scheduling passes / seconds spent in them",
     lambda r: (int(r["storm"].get("passes", -1)), round(r["storm"].get("pass_s", float("nan")), 1)), None),
    ("reads: jobs queued (pending and running)", lambda r: r["queued"], "{:.0f}"),
    ("reads: squeue (its `GET /jobs?view=queue...`, read and decompressed) p50 / p99 (ms)",
     lambda r: (round(r["reads"]["squeue"]["p50_ms"]), round(r["reads"]["squeue"]["p99_ms"])), None),
    ("reads: squeue answer (MiB) / a client's JSON decoding of it into its jobs (ms)",
     lambda r: (round(r["reads"]["squeue_bytes"] / 2 ** 20, 1), round(r["reads"]["squeue_decode_ms"])), None),
    ("reads: squeue answer as sent (KiB) / rows listed (a pending array's tasks as one)",
     lambda r: (round(r["reads"].get("squeue_wire_bytes", r["reads"]["squeue_bytes"]) / 2 ** 10),
                r["reads"]["listed"]), None),
    ("reads: squeue, one client alone p50 (ms)", lambda r: r["reads"]["squeue_alone"]["p50_ms"], "{:.0f}"),
    ("reads: sinfo's nodes answer / as sent (KiB)",
     lambda r: (round(r["reads"]["sinfo_nodes_bytes"] / 2 ** 10), round(r["reads"]["sinfo_nodes_wire_bytes"] / 2 ** 10)),
     None),
    ("reads: sinfo (`GET /nodes` + `/partitions`) p50 / p99 (ms)",
     lambda r: (round(r["reads"]["sinfo"]["p50_ms"]), round(r["reads"]["sinfo"]["p99_ms"])), None),
    ("reads: scontrol show job (`GET /jobs?all=true&job_id=`) p50 / p99 (ms)",
     lambda r: (round(r["reads"]["scontrol"]["p50_ms"]), round(r["reads"]["scontrol"]["p99_ms"])), None),
    ("reads: server CPU per client round of the three (ms)",
     lambda r: r["reads"]["server_cpu_ms_per_round"], "{:.0f}"),
    ("reads: scheduling passes run during the reads / running jobs ended meanwhile",
     lambda r: (r["reads"].get("passes", float("nan")), r["reads"].get("churned", 0)), None),
    ("reads: the server's stalls during them (`--stall-log`, over `--stall-ms`): how many / the longest (ms)",
     lambda r: (len(r["reads"]["stalls_s"]), round(1000 * max(r["reads"]["stalls_s"], default=0))), None),
    ("reads: the clients' own CPU per round of the three (ms)",
     lambda r: r["reads"]["client_cpu_ms_per_round"], "{:.0f}"),
    ("server RSS at the end (MiB)", lambda r: r["server_rss_mb"], "{:.0f}"),
]


def _median(results: list[dict], get):
    values = [get(r) for r in results]
    if isinstance(values[0], tuple):
        return tuple(statistics.median(v[i] for v in values) for i in range(len(values[0])))
    return statistics.median(values)


def table(results: list[dict], baseline: list[dict] | None) -> list[str]:
    cols = ([("before", baseline)] if baseline else []) + [("after" if baseline else "measured", results)]
    lines = ["| " + f"{results[0]['nodes']} hollow nodes x 8 GPUs | " + " | ".join(c for c, _ in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for label, get, fmt in ROWS:
        cells = []
        for _, runs in cols:
            try:
                v = _median(runs, get)
                cells.append(" / ".join(str(x) for x in v) if fmt is None else fmt.format(v))
            except (KeyError, TypeError, ValueError, statistics.StatisticsError):
                cells.append("-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _sizes(r: dict) -> str:
    """What a run did, from its results (so an earlier --save renders right)."""
    out = []
    if "throughput" in r:
        out.append(f"throughput {r['throughput']['tasks']} tasks of `sleep {r['throughput']['task_s']:g}`")
    if "storm" in r:
        out.append(f"storm {r['storm']['requests']} requests from {r['storm']['submitters']} threads")
    if "reads" in r:
        kind = "processes" if r["reads"].get("processes") else "threads of one process"
        out.append(f"reads {r['reads']['readers']} clients ({kind}) x {r['reads']['rounds']} rounds with "
                   f"{r['queued']} jobs queued")
    return "; ".join(out)


def render(meta: dict, args, results: list[dict], baseline: list[dict] | None, note: str) -> str:
    facts = meta["facts"]
    out = [SECTION, "",
           f"One server ({meta['store']}) and one `shoal agent --hollow {results[0]['nodes']}` process on the same machine "
           "(as above). Throughput: single-GPU array tasks that \"run\" a few seconds, all submitted at once, "
           "counted in the store (each COMPLETED once). Storm: one `POST /jobs` per request from parallel "
           "submitters, the jobs an hour long, so the queue grows. Reads: concurrent clients making squeue's, "
           "sinfo's and scontrol show job's requests, each timed with its answer's body read. "
           f"Medians of {len(results)} run(s). docs/SCALE.md says what changed and why.", "",
           f"- machine: {facts['CPU']}, {facts['Cores']} cores (shared with other work: see the load), "
           f"{facts['Memory']}; {facts['OS']}; {facts['Python']}; Shoal {facts['Shoal commit']}",
           f"- when: {meta.get('when', '?')}; load average before {meta['load_before']}, after "
           f"{meta.get('load_after', '?')}; wall {meta.get('wall_s', float('nan')):.0f} s",
           f"- command: `{meta['command']}`",
           f"- per run (as the command says): {_sizes(results[0])}"]
    if baseline:
        out.append(f"- before: {note}")
    out += ["", *table(results, baseline), ""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--arrays", type=int, default=8, help="throughput: job arrays (0: skip the phase)")
    ap.add_argument("--array-size", type=int, default=5000)
    ap.add_argument("--task-s", type=float, default=2.0, help="each task's sleep")
    ap.add_argument("--storm", type=int, default=50_000, help="storm requests (0: skip)")
    ap.add_argument("--submitters", type=int, default=8)
    ap.add_argument("--queued", type=int, default=100_000, help="jobs queued for the reads")
    ap.add_argument("--readers", type=int, default=20, help="concurrent read clients (0: skip the reads)")
    ap.add_argument("--reads", type=int, default=10, help="rounds per read client")
    ap.add_argument("--no-settle", dest="settle", action="store_false",
                    help="start the reads at once after the queue is filled, not after a whole pass")
    ap.add_argument("--churn", type=float, default=0.0,
                    help="running jobs ended per second during the reads (cancelled; 0: none)")
    ap.add_argument("--bf-interval", type=float, default=0.0,
                    help="the server's bf_interval_s: full backfill passes at most this often, quick ones "
                         "between (Slurm's default is 30; 0: the server's default, every pass full)")
    ap.add_argument("--reader-processes", action="store_true",
                    help="each read client a process of its own (default: threads of this process)")
    ap.add_argument("--save", type=Path)
    ap.add_argument("--baseline", type=Path, help="an earlier --save, shown beside these as 'before'")
    ap.add_argument("--baseline-note", default="the same benchmark on the code before the change")
    ap.add_argument("--results", type=Path, help="render an earlier --save instead of running")
    ap.add_argument("--no-write", action="store_true", help="print, but leave BENCHMARKS.md alone")
    ap.add_argument("--profile", type=Path, help="py-spy the server (throughput, storm, reads) into this folder")
    ap.add_argument("--postgres", action="store_true", help="store on a PostgreSQL started for the run")
    ap.add_argument("--stall-log", type=Path, metavar="DIR",
                    help="keep each run's `shoal server --stall-log` here, and count its stalls during the reads")
    ap.add_argument("--stall-ms", type=float, default=100, help="with --stall-log: the server's --stall-ms")
    args = ap.parse_args()
    ensure_bytecode()
    env = {**os.environ, "SHOAL_LOG_LEVEL": "WARNING"}
    for k in ("SHOAL_CONFIG", "SHOAL_SERVER", "SHOAL_TOKEN", "SHOAL_JOB_TOKEN"):
        env.pop(k, None)
    meta = {"command": "python bench/bench_htc.py " + shlex.join(sys.argv[1:]), "load_before": load_average(),
            "facts": machine_facts(),
            "store": "PostgreSQL, fsync off as the tests run it" if args.postgres else "SQLite"}
    results: list[dict] = []
    if args.results:
        saved = json.loads(args.results.read_text())
        results, meta = saved["results"], saved["meta"]
    else:
        t0 = time.time()
        pg = _postgres() if args.postgres else None
        try:
            for rnd in range(args.rounds):
                print(f"round {rnd + 1}/{args.rounds}: {args.nodes} hollow nodes", flush=True)
                results.append(run(args, env, pg.create_database() if pg else None))
        finally:
            if pg is not None:
                pg.stop()
                shutil.rmtree(pg.root, ignore_errors=True)
        meta.update(wall_s=time.time() - t0, load_after=load_average(),
                    when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    if args.save:
        args.save.write_text(json.dumps({"meta": meta, "results": results}, indent=1))  # --results reads it
    baseline = json.loads(args.baseline.read_text())["results"] if args.baseline else None
    publish(SECTION, render(meta, args, results, baseline, args.baseline_note).splitlines(), not args.no_write)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a killed run still stops its server (finally)
    sys.exit(main())
