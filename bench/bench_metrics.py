#!/usr/bin/env python3
"""Metrics benchmark: what ``GET /metrics`` costs a big cluster, and what the request-latency
histogram adds to every request.

1. Scrape: a server on a store filled directly (SQLite, no agents): NODES nodes of 8 GPUs in
   4 partitions, JOBS jobs of which a tenth run (one GPU each, on every node in turn), a
   tenth pend (20 users, 10 accounts, reasons Resources/Priority/held) and the rest ended,
   plus a Deployment per 100 nodes. Times ``ServerMetrics.exposition()`` (what the route
   returns: the store read and the text), the first scrape apart (it also loads the ended
   runs' GPU-seconds once), and gives the text's size and series.
2. Request path: the server's ASGI front (FastPaths) in-process, driven by a loop of requests
   as fast as it answers, once with the histogram (``observe``) and once without, in
   interleaved rounds: a fast route (as the agents' long-poll, sbatch's command and the
   reports take) and a FastAPI route (behind it, as squeue's listing). The difference per
   request is the histogram's cost.

Writes the ``## Metrics`` section of BENCHMARKS.md (other sections are kept).

    .venv/bin/python bench/bench_metrics.py                       # 5,000 nodes, 50,000 jobs
    .venv/bin/python bench/bench_metrics.py --nodes 1000 --jobs 10000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks_md import write_section  # bench/ is on sys.path as the script's folder

from bench.bench_foundation import load_average, machine_facts
from shoal.model.hostlist import compress
from shoal.server.config import parse_cluster_config
from shoal.server.core import Server
from shoal.store.models import JobRow, NodeRow, ObjectRow

SECTION = "## Metrics"
GPUS, CPUS, MEM_MB = 8, 128, 2 * 1024 * 1024
PARTITIONS = 4


def fill(server: Server, nodes: list[str], jobs: int, now: float) -> dict:
    """Nodes, jobs and Deployments written straight into the store, as a long-lived cluster has them."""
    gpus = [{"index": i, "uuid": f"GPU-{i}", "product": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
            for i in range(GPUS)]
    running = pending = 0
    with server.sessions() as s, s.begin():
        for name in nodes:
            s.add(NodeRow(name=name, address="127.0.0.1", port=1, state="DRAIN" if name.endswith("7") else "UP",
                          cpus=CPUS, memory_mb=MEM_MB, gpus=gpus, labels={}, features=[], taints=[],
                          gpu_health=[], registered_at=now, last_heartbeat=now - 3, version=1))
    batch = 5000
    for first in range(0, jobs, batch):
        with server.sessions() as s, s.begin():
            for i in range(first, min(first + batch, jobs)):
                user, account = f"user{i % 20:02d}", f"acct{i % 10}"
                part = f"p{i % PARTITIONS}"
                kind = i % 10
                row = dict(id=i + 1, name=f"job{i}", user=user, partition=part, submit_time=now - 7200,
                           request={"cpus_per_task": 8, "ntasks": 1, "gpus": 1}, workdir="/tmp",
                           spec={"account": account, "qos": "normal"}, version=1)
                if kind == 0:
                    node = nodes[running % len(nodes)]
                    running += 1
                    row.update(state="RUNNING", start_time=now - 600, reason="None", batch_host=node,
                               allocation={"exclusive": False, "nodes": [
                                   {"name": node, "cpus": 8, "memory_mb": 65536, "gpus": [running % GPUS]}]})
                elif kind == 1:
                    pending += 1
                    row.update(state="PENDING", reason=("Resources", "Priority")[i % 2], held=i % 7 == 0)
                else:
                    node = nodes[i % len(nodes)]
                    row.update(state="COMPLETED", start_time=now - 5000, end_time=now - 1000, exit_code=0,
                               batch_host=node, allocation={"exclusive": False, "nodes": [
                                   {"name": node, "cpus": 8, "memory_mb": 65536, "gpus": [i % GPUS]}]})
                s.add(JobRow(**row))
    with server.sessions() as s, s.begin():
        for d in range(max(1, len(nodes) // 100)):
            s.add(ObjectRow(uid=f"uid-{d}", kind="Deployment", namespace="default", name=f"llm-{d}",
                            body={"spec": {"replicas": 4}}, status={"readyReplicas": 4}, created=now))
    return {"running": running, "pending": pending, "ended": jobs - running - pending}


def scrape(nodes_n: int, jobs_n: int, rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="shoal-bench-metrics-") as tmp:
        nodes = [f"node{i:05d}" for i in range(1, nodes_n + 1)]
        per = -(-nodes_n // PARTITIONS)
        config = parse_cluster_config({"partitions": [
            {"name": f"p{k}", "nodes": compress(nodes[k * per:(k + 1) * per]), "default": k == 0}
            for k in range(PARTITIONS)]})
        server = Server(f"sqlite:///{tmp}/shoal.db", config, tmp)
        now = time.time()
        t0 = time.perf_counter()
        counts = fill(server, nodes, jobs_n, now)
        fill_s = time.perf_counter() - t0
        c0 = time.process_time()
        text = server.metrics.exposition()
        first_s = time.process_time() - c0
        times, walls = [], []
        for _ in range(rounds):
            t0, c0 = time.perf_counter(), time.process_time()
            text = server.metrics.exposition()
            times.append(time.process_time() - c0)
            walls.append(time.perf_counter() - t0)
        server.engine.dispose()
    series = [line for line in text.decode().splitlines() if line and not line.startswith("#")]
    return {**counts, "fill_s": fill_s, "first_s": first_s, "times": times, "walls": walls, "bytes": len(text),
            "series": len(series)}


# ------------------------------------------------------------------ request path


def request_path(requests: int, rounds: int) -> dict:
    from fastapi import FastAPI
    from fastapi.responses import Response

    from shoal.server import fastpath
    from shoal.server.metrics import ServerMetrics

    class _Server:  # what ServerMetrics reads at construction; its collector is never scraped here
        sessions = None

    metrics = ServerMetrics(_Server())
    app = FastAPI()

    @app.get("/shoal/v1/jobs/{job_id}")
    async def job(job_id: int):
        return Response(b"{}", media_type="application/json")

    routes = fastpath.Routes()

    async def work(scope, match, headers, body):
        return 200, fastpath.JSON, b"{}"

    routes.add("GET", r"/shoal/v1/agents/(?P<node>[^/]+)/work", work)
    plain = fastpath.FastPaths(app, routes)
    timed = fastpath.FastPaths(app, routes, observe=metrics.observe_request)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        pass

    def scope(path: str) -> dict:
        return {"type": "http", "method": "GET", "path": path, "headers": [(b"host", b"x")], "query_string": b"",
                "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2),
                "root_path": "", "raw_path": path.encode()}

    async def loop(front, path: str) -> float:
        # CPU time of this process: other work on a shared machine does not count.
        t0 = time.process_time()
        for _ in range(requests):
            await front(scope(path), receive, send)
        return (time.process_time() - t0) / requests * 1e6

    out: dict[str, dict[str, list[float]]] = {}
    paths = {"fast route (agents' long-poll)": "/shoal/v1/agents/node01/work",
             "FastAPI route (job detail)": "/shoal/v1/jobs/7"}
    for i in range(rounds):
        for name, path in paths.items():
            fronts = [("without", plain), ("with", timed)]
            for label, front in fronts if i % 2 == 0 else fronts[::-1]:  # neither always goes first
                out.setdefault(name, {}).setdefault(label, []).append(asyncio.run(loop(front, path)))
    return out


def render(args, scraped: dict, path: dict, facts: dict, load1) -> str:
    times = sorted(scraped["times"])
    lines = [SECTION, "",
             f"Produced by `.venv/bin/python bench/bench_metrics.py --nodes {args.nodes} --jobs {args.jobs}` "
             f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC). The server's `GET /metrics` "
             "(docs/METRICS.md) on a store filled directly (SQLite, one server, no agents): "
             f"**{args.nodes:,} nodes** of {GPUS} GPUs in {PARTITIONS} partitions and **{args.jobs:,} jobs** "
             f"({scraped['running']:,} running, {scraped['pending']:,} pending, {scraped['ended']:,} ended; "
             f"20 users, 10 accounts), {max(1, args.nodes // 100)} Deployments. "
             "Times are of `ServerMetrics.exposition()`, what the route returns: the store read at scrape "
             "time and the text; CPU time of the process, as the machine is shared.", "",
             "| Machine | |", "|---|---|", *[f"| {k} | {v} |" for k, v in facts.items()],
             f"| Load average (1/5/15 min) at end | {load1} |", "",
             "| Scrape | figure |", "|---|---:|",
             f"| first scrape, CPU (also loads the ended runs' GPU-seconds once) | {scraped['first_s'] * 1e3:.0f} ms |",
             f"| later scrapes, CPU, median of {len(times)} | {statistics.median(times) * 1e3:.0f} ms |",
             f"| later scrapes, CPU, most | {times[-1] * 1e3:.0f} ms |",
             f"| later scrapes, wall clock, median (the machine's other work included) | "
             f"{statistics.median(scraped['walls']) * 1e3:.0f} ms |",
             f"| text size | {scraped['bytes'] / 1024:,.0f} KiB |",
             f"| series | {scraped['series']:,} |", "",
             "Most of the size is the per-node series (GPUs, CPUs and memory by allocated/idle/drained, state, "
             "heartbeat age: 8 series a node); per-job series are aggregated (jobs by state, partition, account "
             "and QOS), so the text grows with nodes, not jobs.", "",
             "Request path: the server's ASGI front (`FastPaths`) in-process, each request awaited in turn "
             f"({args.requests:,} per round, {args.rounds} interleaved rounds, median of rounds; CPU time of the "
             "process, so other work on the machine counts less), with the latency histogram (`observe`) and "
             "without; the difference is what the histogram adds to every request.", "",
             "| Route | without µs CPU/request | with µs CPU/request | added µs |", "|---|---:|---:|---:|"]
    for name, runs in path.items():
        a, b = statistics.median(runs["without"]), statistics.median(runs["with"])
        lines.append(f"| {name} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--jobs", type=int, default=50000)
    p.add_argument("--scrapes", type=int, default=5)
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--no-write", action="store_true", help="print the section instead of writing BENCHMARKS.md")
    args = p.parse_args()
    facts = machine_facts()  # its load average is the one at the start
    path = request_path(args.requests, args.rounds)
    scraped = scrape(args.nodes, args.jobs, args.scrapes)
    text = render(args, scraped, path, facts, load_average())
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
