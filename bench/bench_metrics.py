#!/usr/bin/env python3
"""Metrics benchmark: what ``GET /metrics`` costs a big cluster, and what the request-latency
histogram adds to every request.

1. Scrape: a server on a store filled directly (SQLite, no agents), once per size: NODES nodes
   of 8 GPUs in 4 partitions, ten jobs a node of which a tenth run (one GPU each, on every node in turn), a
   tenth pend (20 users, 10 accounts, reasons Resources/Priority/held) and the rest ended,
   plus a Deployment per 100 nodes. Times ``ServerMetrics.exposition()`` (what the route
   returns: the store read and the text), the first scrape apart (it also loads the ended
   runs' GPU-seconds once), and gives the text's size and series.
2. Request path: the server's ASGI front (FastPaths) in-process, driven by a loop of requests
   as fast as it answers, once with the histogram (``observe``) and once without, in
   interleaved rounds: a fast route (as the agents' long-poll, sbatch's command and the
   reports take) and a FastAPI route (behind it, as squeue's listing). The difference per
   request is the histogram's cost.
3. Per-job GPU accounting: on the largest store, agents' reports of their GPUs' samples
   folded into the running jobs' records (``gpuacct.record`` and its commit), one report a
   transaction as the report route does it.

Writes the ``## Metrics`` section of BENCHMARKS.md (other sections are kept).

    .venv/bin/python bench/bench_metrics.py                       # 1,000 and 5,000 nodes (10 jobs a node)
    .venv/bin/python bench/bench_metrics.py --nodes 200 --scrapes 3 --no-write
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
from shoal.server import gpuacct
from shoal.server.schemas import GPUUsageSample
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


def accounting(server: Server, nodes: list[str], reports: int) -> dict:
    """Reports of the running jobs' GPU samples, one transaction each, as the report route
    runs them: ms of wall clock and of CPU per report."""
    with server.sessions() as s:
        running = [(r.id, r.allocation["nodes"][0]) for r in s.query(JobRow).filter(JobRow.state == "RUNNING")]
    walls, cpus = [], []
    for k in range(reports):
        job_id, held = running[k % len(running)]
        samples = [GPUUsageSample(job_id=job_id, run=0, gpu=g, util=50.0 + k % 40, mem_mib=20000 + k,
                                  energy_mj=1000 * k, power_w=350.0) for g in held["gpus"]]
        t0, c0 = time.perf_counter(), time.process_time()
        with server.sessions() as s, s.begin():
            gpuacct.record(s, held["name"], samples, time.time())
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {"reports": reports, "wall_ms": statistics.median(walls) * 1e3, "cpu_ms": statistics.median(cpus) * 1e3}


def scrape(nodes_n: int, jobs_n: int, rounds: int, reports: int = 0) -> dict:
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
        acct = accounting(server, nodes, reports) if reports else None
        server.engine.dispose()
    series = [line for line in text.decode().splitlines() if line and not line.startswith("#")]
    return {**counts, "nodes": nodes_n, "jobs": jobs_n, "fill_s": fill_s, "first_s": first_s, "times": times,
            "walls": walls, "bytes": len(text), "series": len(series), "accounting": acct}


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


def _growth(sizes: list[dict]) -> str:
    """``: 5x the nodes, 4.9x the text and 5.2x the CPU`` between the smallest size and the largest."""
    a, b = sizes[0], sizes[-1]
    if a is b:
        return ""
    cpu = statistics.median(b["times"]) / max(statistics.median(a["times"]), 1e-9)
    return (f": {b['nodes'] / a['nodes']:.0f}x the nodes, {b['bytes'] / a['bytes']:.1f}x the text and "
            f"{cpu:.1f}x the scrape's CPU")


def render(args, sizes: list[dict], path: dict, facts: dict, load1) -> str:
    def row(name: str, figure) -> str:
        return f"| {name} | " + " | ".join(figure(r) for r in sizes) + " |"

    def ms(x: float) -> str:
        return f"{x * 1e3:.0f} ms"

    acct = sizes[-1]["accounting"]
    lines = [SECTION, "",
             f"Produced by `.venv/bin/python bench/bench_metrics.py --nodes {' '.join(map(str, args.nodes))} "
             f"--scrapes {args.scrapes}` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC). The server's `GET /metrics` "
             "(docs/METRICS.md) on a store filled directly (SQLite, one server, no agents), once per size: "
             f"nodes of {GPUS} GPUs in {PARTITIONS} partitions and ten jobs a node (a tenth running, one GPU "
             "each; a tenth pending; the rest ended; 20 users, 10 accounts), a Deployment per 100 nodes. "
             "Times are of `ServerMetrics.exposition()`, what the route returns: the store read at scrape "
             "time and the text; CPU time of the process, as the machine is shared. The first scrape is apart "
             f"(it also loads the ended runs' GPU-seconds once); then {args.scrapes} scrapes, their median.", "",
             "| Machine | |", "|---|---|", *[f"| {k} | {v} |" for k, v in facts.items()],
             f"| Load average (1/5/15 min) at end | {load1} |", "",
             "| Scrape | " + " | ".join(f"{r['nodes']:,} nodes, {r['jobs']:,} jobs" for r in sizes) + " |",
             "|---|" + "---:|" * len(sizes),
             row("first scrape, CPU", lambda r: ms(r["first_s"])),
             row(f"later scrapes, CPU, median of {args.scrapes}", lambda r: ms(statistics.median(r["times"]))),
             row("later scrapes, CPU, most", lambda r: ms(max(r["times"]))),
             row("later scrapes, wall clock, median (the machine's other work included)",
                 lambda r: ms(statistics.median(r["walls"]))),
             row("text size", lambda r: f"{r['bytes'] / 1024:,.0f} KiB"),
             row("series", lambda r: f"{r['series']:,}"), "",
             "Most of the size is the per-node series (GPUs, CPUs and memory by allocated/idle/drained, state, "
             "heartbeat age: 8 series a node); per-job series are aggregated (jobs by state, partition, account "
             f"and QOS), so the text grows with nodes, not jobs; the scrape's CPU grows with both, as it also "
             f"reads the running and pending jobs{_growth(sizes)}.", "",
             "Request path: the server's ASGI front (`FastPaths`) in-process, each request awaited in turn "
             f"({args.requests:,} per round, {args.rounds} interleaved rounds, median of rounds; CPU time of the "
             "process, so other work on the machine counts less), with the latency histogram (`observe`) and "
             "without; the difference is what the histogram adds to every request.", "",
             "| Route | without µs CPU/request | with µs CPU/request | added µs |", "|---|---:|---:|---:|"]
    for name, runs in path.items():
        a, b = statistics.median(runs["without"]), statistics.median(runs["with"])
        lines.append(f"| {name} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    if acct:
        lines += ["", f"Per-job GPU accounting (docs/METRICS.md, \"Per-job GPU use\"), on the {sizes[-1]['nodes']:,}-node "
                  f"store: {acct['reports']:,} agents' reports of their running job's GPU sample, each folded into "
                  "the job's record for that node (`gpuacct.record`) and committed, one transaction a report: "
                  f"median **{acct['wall_ms']:.1f} ms** of wall clock, {acct['cpu_ms']:.1f} ms of CPU, a report "
                  "(SQLite; the report route's own work, the heartbeat's node row, comes on top)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000], help="cluster sizes (ten jobs a node)")
    p.add_argument("--reports", type=int, default=2000, help="GPU-accounting reports timed on the largest")
    p.add_argument("--scrapes", type=int, default=5)
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--no-write", action="store_true", help="print the section instead of writing BENCHMARKS.md")
    args = p.parse_args()
    facts = machine_facts()  # its load average is the one at the start
    path = request_path(args.requests, args.rounds)
    sizes = [scrape(n, 10 * n, args.scrapes, args.reports if n == max(args.nodes) else 0) for n in args.nodes]
    text = render(args, sizes, path, facts, load_average())
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
