#!/usr/bin/env python3
"""Scheduler benchmark: one pass of ``schedule()`` over 5,000 nodes x 8 GPUs, 50,000 jobs.

The cluster is partly full (running jobs with time limits hold about 60% of the GPUs); the
queue mixes 1-, 2-, 4- and 8-GPU single-node jobs with 2- to 16-node gangs of whole nodes
(seeded: the same workload every run). Measured, each the median of ``--repeat`` runs:

* the placing pass: the queue against the partly full cluster, jobs started per second;
* the full backfill pass: the next pass, the starts of the first now running, so the
  cluster is full and every job up to the depth is tested (and, for conservative, reserved).

Writes the ``## Scheduler`` section of BENCHMARKS.md (other sections are kept).

    .venv/bin/python bench/bench_sched.py
    .venv/bin/python bench/bench_sched.py --nodes 1000 --jobs 10000 --no-write
    .venv/bin/python bench/bench_sched.py --profile /tmp/sched.html
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from bench_sim import machine  # noqa: E402
from benchmarks_md import write_section  # noqa: E402
from shoal.model.node import NodeState  # noqa: E402
from shoal.model.resources import GPU, Allocation, NodeAllocation, ResourceRequest  # noqa: E402
from shoal.model.snapshot import ActiveJob, NodeInfo, Partition, PendingJob, Snapshot  # noqa: E402
from shoal.sched import SchedConfig, schedule  # noqa: E402

SECTION = "## Scheduler"
GPUS, CPUS, MEM = 8, 128, 1_024_000
SINGLE = [(1, 40), (2, 15), (4, 15), (8, 20)]  # GPUs per job, weight
GANG_SHARE = 0.10  # of the queue: 2-16 whole nodes
NOW = 1_000_000.0


def cluster(n: int) -> tuple[NodeInfo, ...]:
    return tuple(
        NodeInfo(f"gpu{i:05d}", NodeState.UP, CPUS, MEM,
                 tuple(GPU(g, f"GPU-{i}-{g}", "NVIDIA H100 80GB HBM3", 81_559) for g in range(GPUS)))
        for i in range(1, n + 1))


def running(nodes: tuple[NodeInfo, ...], fill: float, rnd: random.Random) -> tuple[ActiveJob, ...]:
    """Jobs holding about ``fill`` of the GPUs, packed from the first node on."""
    out, jid = [], 10_000_000
    for node in nodes[: int(len(nodes) * fill)]:
        used = 0
        while used < GPUS:
            g = min(rnd.choice((1, 2, 4, 8)), GPUS - used)
            alloc = Allocation(((node.name, NodeAllocation(g * 8, g * 64_000,
                                                           tuple(range(used, used + g)))),))
            out.append(ActiveJob(jid, f"u{jid % 50}", "run", "gpu", alloc,
                                 start_time=NOW - rnd.uniform(0, 3600),
                                 time_limit_s=rnd.choice((3600, 4 * 3600, 12 * 3600))))
            jid += 1
            used += g
    return tuple(out)


def queue(n: int, rnd: random.Random) -> tuple[PendingJob, ...]:
    sizes, weights = zip(*SINGLE)
    out = []
    for jid in range(1, n + 1):
        if rnd.random() < GANG_SHARE:
            gang = rnd.choice((2, 4, 8, 16))
            req = ResourceRequest(nodes=gang, ntasks=gang, cpus_per_task=CPUS, gpus_per_node=GPUS,
                                  mem_per_node_mb=512_000)
        else:
            g = rnd.choices(sizes, weights)[0]
            req = ResourceRequest(gpus_per_node=g, cpus_per_task=g * 8, mem_per_node_mb=g * 64_000)
        out.append(PendingJob(jid, f"u{jid % 50}", f"job{jid}", "gpu", req,
                              submit_time=NOW - n + jid, priority=rnd.randrange(10),
                              time_limit_s=rnd.choice((600, 1800, 3600, 4 * 3600, 24 * 3600))))
    return tuple(out)


def after(snap: Snapshot, plan) -> Snapshot:
    """The next pass's snapshot: the planned starts now run."""
    started = {s.job_id: s.allocation for s in plan.starts}
    active = snap.active + tuple(
        ActiveJob(j.id, j.user, j.name, j.partition, started[j.id], snap.now, j.time_limit_s)
        for j in snap.pending if j.id in started)
    return Snapshot(snap.now + 1, snap.nodes, snap.partitions,
                    tuple(j for j in snap.pending if j.id not in started), active)


def timed(snap: Snapshot, config: SchedConfig, repeat: int):
    """Median wall and CPU seconds of ``repeat`` passes (CPU: the machine may be shared)."""
    times, cpu, plan = [], [], None
    for _ in range(repeat):
        # Cold, as the server's passes are: each builds a fresh snapshot (new node tuples),
        # so none reuses the free-resource state a pass over the same tuple keeps (no cache).
        t0, c0 = time.perf_counter(), time.process_time()
        plan = schedule(snap, config)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu), plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--fill", type=float, default=0.6, help="share of GPUs held at the start")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print, do not touch BENCHMARKS.md")
    ap.add_argument("--profile", type=Path, help="write a pyinstrument HTML profile of one pass")
    args = ap.parse_args()
    started = datetime.now(timezone.utc)
    info = machine()
    rnd = random.Random(2026)
    nodes = cluster(args.nodes)
    part = Partition("gpu", tuple(n.name for n in nodes), default=True)
    active = running(nodes, args.fill, rnd)
    first = Snapshot(NOW, nodes, (part,), queue(args.jobs, rnd), active)
    configs = [("easy", SchedConfig()),
               ("conservative", SchedConfig(backfill="conservative", bf_max_job_test=500))]
    if args.profile:
        from pyinstrument import Profiler

        plan = schedule(first)
        with Profiler(interval=0.001) as prof:
            schedule(first)
            schedule(after(first, plan))
        args.profile.write_text(prof.output_html(), encoding="utf-8")
        print(prof.output_text(unicode=False, color=False, show_all=False)[:8000])
    rows = []
    for label, config in configs:
        place_s, place_cpu, plan = timed(first, config, args.repeat)
        second = after(first, plan)
        full_s, full_cpu, plan2 = timed(second, config, args.repeat)
        rows.append((label, config, place_s, place_cpu, len(plan.starts), full_s, full_cpu,
                     len(second.pending), len(plan2.starts), len(plan2.estimates)))
        print(f"{label}: placing pass {place_s:.3f}s ({len(plan.starts)} starts, "
              f"{len(plan.starts) / place_s:,.0f}/s); full pass {full_s:.3f}s "
              f"({len(plan2.starts)} starts, {len(plan2.estimates)} estimates)", flush=True)
    held = sum(len(a.gpus) for j in active for _, a in j.allocation.nodes)
    lines = [
        SECTION,
        "",
        f"Produced by `.venv/bin/python bench/bench_sched.py"
        f"{'' if args.nodes == 5000 else f' --nodes {args.nodes}'}"
        f"{'' if args.jobs == 50_000 else f' --jobs {args.jobs}'}` ({started:%Y-%m-%d %H:%M} UTC). "
        f"One `schedule()` call, one process: {args.nodes:,} nodes x {GPUS} GPUs, {CPUS} CPUs; "
        f"{len(active):,} running jobs holding {held:,} of {args.nodes * GPUS:,} GPUs; "
        f"{args.jobs:,} pending jobs (1/2/4/8-GPU single-node jobs, {GANG_SHARE:.0%} gangs of "
        f"2-16 whole nodes; seeded, see the script's docstring). Median of {args.repeat} runs. "
        "Targets: the placing pass starts at least 1,000 jobs per second; the full backfill "
        "pass (cluster full, every job up to `bf_max_job_test` tested) takes under 1 s.",
        "",
        "| Machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in info.items()],
        "",
        "| Backfill | bf_max_job_test | placing pass s (CPU s) | jobs started | started per s | "
        "full pass s (CPU s) | pending in it | started in it | start estimates |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, config, place_s, place_cpu, starts, full_s, full_cpu, pending, starts2, estimates in rows:
        lines.append(f"| {label} | {config.bf_max_job_test or 'all'} | {place_s:.3f} ({place_cpu:.3f}) | "
                     f"{starts:,} | {starts / place_s:,.0f} | {full_s:.3f} ({full_cpu:.3f}) | "
                     f"{pending:,} | {starts2:,} | {estimates:,} |")
    lines += ["", "Wall time is what the targets are judged on; CPU time shows how much of it "
              "was other load on a shared machine (see the load average)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
