#!/usr/bin/env python3
"""Simulator benchmark: replay a 100,000-job GPU trace on a 2,000-GPU cluster.

Writes a synthetic Helios-style cluster_log.csv (seeded: the same trace every run) to a
temporary directory, reads it with the simulator's reader, replays it once per policy
through the real ``schedule()`` and writes the ``## Simulator`` section of BENCHMARKS.md
(other sections are kept).

    .venv/bin/python bench/bench_sim.py                 # 100,000 jobs, fifo and backfill
    .venv/bin/python bench/bench_sim.py --jobs 20000 --no-write
    .venv/bin/python bench/bench_sim.py --profile /tmp/sim.html   # + pyinstrument of one replay

The trace: GPUs per job 1 (50%), 2, 4 (10% each), 8 (20%), 16 (5%), 32 (3%), 64 (2%);
log-normal run times (median 20 min, capped at 2 days); users' limits 1.2-3x the run time;
Poisson arrivals at 1.5x a naive estimate of the GPU capacity (mean GPUs x mean run time; the
workload mapping caps runs, so that is about what keeps queues forming); 40 users in 8 accounts.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from shoal.sched import SchedConfig  # noqa: E402
from benchmarks_md import write_section  # noqa: E402  (bench/ is on sys.path as the script's folder)
from shoal.sim import Simulator, build_report, parse_sim_cluster, read_trace  # noqa: E402

SECTION = "## Simulator"
NODES, GPUS_PER_NODE = 250, 8
GPU_SIZES = [(1, 50), (2, 10), (4, 10), (8, 20), (16, 5), (32, 3), (64, 2)]


def cluster():
    return parse_sim_cluster({
        "cluster_name": "bench",
        "partitions": [{"name": "gpu", "nodes": f"gpu[001-{NODES:03d}]", "default_time": "4:00:00",
                        "max_time": "7-00:00:00"}],
        "sim_nodes": [{"names": f"gpu[001-{NODES:03d}]", "cpus": 128, "memory": "1T",
                       "gpus": GPUS_PER_NODE, "gpu_model": "H100-SXM-80GB"}],
    })


def write_trace(path: Path, jobs: int, seed: int = 2026, load: float = 1.5) -> None:
    rnd = random.Random(seed)
    sizes, weights = zip(*GPU_SIZES)
    mean_gpus = sum(s * w for s, w in GPU_SIZES) / sum(weights)
    mu, sigma, cap = math.log(20 * 60), 1.6, 2 * 86400
    mean_run = min(cap, math.exp(mu + sigma ** 2 / 2))
    rate = load * NODES * GPUS_PER_NODE / (mean_gpus * mean_run)  # jobs per second
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    t = 0.0
    with open(path, "w", encoding="utf-8") as f:
        f.write("job_id,user,vc,jobname,gpu_num,cpu_num,node_num,state,submit_time,start_time,"
                "end_time,duration,queue\n")
        for k in range(jobs):
            t += rnd.expovariate(rate)
            gpus = rnd.choices(sizes, weights)[0]
            run = int(min(cap, max(10, rnd.lognormvariate(mu, sigma))))
            user = rnd.randrange(40)
            submit = (base + timedelta(seconds=int(t))).strftime("%Y-%m-%d %H:%M:%S")
            f.write(f"b{k},u{user},vc{user % 8},job{k},{gpus},{gpus * 8},{max(1, gpus // 8)},"
                    f"COMPLETED,{submit},,,{run},\n")


def limits_from_runs(trace, seed: int = 7):
    """Helios records no limits: give each job a user's overestimate of its run time."""
    from dataclasses import replace

    rnd = random.Random(seed)
    return [replace(j, time_limit_s=int(max(600, j.duration * rnd.uniform(1.2, 3.0))))
            for j in trace.jobs]


def machine() -> dict[str, str]:
    def first(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO).stdout.strip()
        except OSError:
            return ""

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    commit = first(["git", "rev-parse", "--short=12", "HEAD"])
    dirty = first(["git", "status", "--porcelain", "--", "src"])
    return {
        "CPU": cpu,
        "Cores": str(os.cpu_count()),
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "Shoal commit": commit + (" + uncommitted changes in src/" if dirty else ""),
        "Load average (1/5/15 min) at start": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }




def config(policy: str, args: argparse.Namespace) -> SchedConfig:
    """Slurm's defaults for a loaded queue: default_queue_depth jobs tested per pass and,
    for backfill, a full pass at most every bf_interval seconds (quick ones in between)."""
    return SchedConfig(policy=policy, max_jobs_per_pass=args.depth or None,
                       bf_interval_s=args.bf_interval if policy == "backfill" else 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--policy", default="fifo,backfill")
    ap.add_argument("--depth", type=int, default=100,
                    help="max_jobs_per_pass (Slurm's default_queue_depth; 0: unlimited)")
    ap.add_argument("--bf-interval", type=float, default=30.0,
                    help="bf_interval_s for backfill: seconds between full passes (0: every pass)")
    ap.add_argument("--no-write", action="store_true", help="print, do not touch BENCHMARKS.md")
    ap.add_argument("--profile", type=Path, help="write a pyinstrument HTML profile of the first replay")
    args = ap.parse_args()
    started = datetime.now(timezone.utc)
    info = machine()
    c = cluster()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster_log.csv"
        write_trace(path, args.jobs)
        t0 = time.perf_counter()
        trace = read_trace(path, "helios")
        read_s = time.perf_counter() - t0
    jobs = limits_from_runs(trace)
    for i, policy in enumerate(args.policy.split(",")):
        sim = Simulator(c, jobs, config(policy, args), label=policy)
        c0 = time.process_time()
        if args.profile and i == 0:
            from pyinstrument import Profiler

            with Profiler(interval=0.005) as prof:
                result = sim.run()
            args.profile.write_text(prof.output_html(), encoding="utf-8")
            print(prof.output_text(unicode=False, color=False, show_all=False)[:6000])
        else:
            result = sim.run()
        cpu_s = time.process_time() - c0
        t1 = time.perf_counter()
        report = build_report(result)
        report_s = time.perf_counter() - t1
        rows.append((policy, result, report, report_s, cpu_s))
        print(f"{policy}: replay {result.wall_s:.1f}s ({cpu_s:.1f}s CPU), {result.passes} passes, "
              f"report {report_s:.1f}s, GPU util {100 * report.gpu_utilisation:.1f}%, "
              f"wait mean {report.wait.mean / 60:.1f} min", flush=True)
    lines = [
        SECTION,
        "",
        f"Produced by `.venv/bin/python bench/bench_sim.py"
        f"{' --jobs ' + str(args.jobs) if args.jobs != 100_000 else ''}"
        f"{' --depth ' + str(args.depth) if args.depth != 100 else ''}"
        f"{' --bf-interval ' + str(args.bf_interval) if args.bf_interval != 30.0 else ''}` "
        f"({started:%Y-%m-%d %H:%M} UTC). A synthetic Helios-style trace of {args.jobs:,} jobs "
        f"(seeded; see the script's docstring) replayed on {NODES} nodes x {GPUS_PER_NODE} GPUs "
        f"({NODES * GPUS_PER_NODE:,} GPUs) through the real `schedule()`, one process, one policy "
        f"at a time, with Slurm's defaults for a loaded queue: `max_jobs_per_pass` "
        f"{args.depth or 'unlimited'} (default_queue_depth) and, for backfill, `bf_interval_s` "
        f"{args.bf_interval:g} (full passes at most that often, quick ones between; see "
        "docs/SIMULATOR.md for when passes run). Target: under 60 s per replay.",
        "",
        "| Machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in info.items()],
        "",
        f"Reading the trace (CSV, {args.jobs:,} rows): {read_s:.1f} s.",
        "",
        "| Policy | replay s (CPU s) | scheduling passes | ms per pass | report s | GPU utilisation | "
        "mean wait | p99 wait | makespan |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy, result, report, report_s, cpu_s in rows:
        lines.append(
            f"| {policy} | {result.wall_s:.1f} ({cpu_s:.1f}) | {result.passes:,} | "
            f"{1000 * result.wall_s / max(result.passes, 1):.2f} | {report_s:.1f} | "
            f"{100 * report.gpu_utilisation:.1f}% | {report.wait.mean / 60:.1f} min | "
            f"{report.wait.p99 / 3600:.1f} h | {report.makespan_s / 86400:.1f} d |")
    if rows and args.jobs < 100_000:
        per_job = max(r.wall_s for _, r, _, _, _ in rows) / args.jobs
        lines += ["", f"Not the full 100,000 jobs: at this rate they would take about "
                      f"{per_job * 100_000:.0f} s per replay (passes grow with submits)."]
    lines += ["", "Wall time is what the target is judged on; CPU time shows how much of it was "
                  "other load on a shared machine (see the load average)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
