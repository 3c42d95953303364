#!/usr/bin/env python3
"""Load benchmark: a full cluster with 10,000 queued jobs answering 100 API requests per second.

Starts its own local cluster (`shoal up`, 4 nodes x 8 fake GPUs) in a temporary state dir,
fills every GPU with a long job, queues 10,000 more (20 users, each an array of 400 tasks
and 100 single jobs, half of them held), then sends requests at a fixed rate for a bounded
time, in the mix a busy cluster's server sees: users' squeue, the whole queue, job detail,
scontrol show job, sinfo and submissions through the HTTP API, and some through the real
commands (`squeue -u`, `sbatch`, `sinfo`, `scontrol show job`). Writes the ``## Load``
section of BENCHMARKS.md (other sections are kept).

    .venv/bin/python bench/bench_load.py            # full: 60 s of load, ~3 minutes in all
    .venv/bin/python bench/bench_load.py --short    # 15 s of load
    .venv/bin/python bench/bench_load.py --short --profile /tmp/prof   # + py-spy of the server

The load is open-loop: request i is due at start + i / rate whatever happened to earlier
ones, and its latency counts from when it was due, so a slow server shows as latency
(queueing included) rather than as a politely lower rate.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks_md import write_section  # bench/ is on sys.path as the script's folder

from bench.bench_foundation import (
    _start_py_spy,
    _stop_py_spy,
    ensure_bytecode,
    load_average,
    machine_facts,
)
from shoal.api_client import Client
from tests.integration.cluster import BIN, LocalCluster

SECTION = "## Load"
NODES, GPUS = 4, 8
USERS = 20
ARRAY_TASKS = 400  # per user; plus SINGLE_JOBS single jobs each
SINGLE_JOBS = 100
SCRIPT = "#!/bin/sh\nsleep 60\n"


@dataclass(frozen=True)
class Mode:
    name: str
    duration_s: float
    rate: float


FULL = Mode("full", 60, 100)
SHORT = Mode("short", 15, 100)


@dataclass(frozen=True)
class Kind:
    """One kind of request: its share of the load and what it does."""

    label: str
    weight: int
    command: bool = False  # a real command in a fresh process, not an HTTP call from here


# Per 100 requests. Reads dominate, as on a real cluster: users polling their queue and
# their jobs, dashboards polling sinfo; a tenth are submissions.
KINDS = [
    Kind("API squeue of one user (`GET /jobs?user=U&view=queue`)", 20),
    Kind("API squeue of the whole queue (`GET /jobs?view=queue`, admin)", 4),
    Kind("API job detail (`GET /jobs/ID`)", 24),
    Kind("API scontrol show job (`GET /jobs?job_id=ID`)", 15),
    Kind("API sinfo (`GET /nodes` + `GET /partitions`)", 15),
    Kind("API submit (`POST /jobs`, 1 GPU, half held)", 17),
    Kind("`squeue -u U` (command)", 2, command=True),
    Kind("`sbatch --hold` (command)", 1, command=True),
    Kind("`sinfo` (command)", 1, command=True),
    Kind("`scontrol show job ID` (command)", 1, command=True),
]


@dataclass
class Sample:
    kind: str
    latency: float  # from when the request was due (open-loop: any wait in this generator counts)
    service: float  # from when it was sent: the server's own answer time
    error: str | None = None


@dataclass
class Result:
    samples: list[Sample] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0
    server_cpu_s: float = 0.0
    agents_cpu_s: float = 0.0
    machine_busy: float = 0.0  # share of all cores busy, every process on the machine
    load_before: str = ""
    load_after: str = ""
    queued_before: int = 0
    queued_after: int = 0


# ---------------------------------------------------------------------- statistics


def pct(xs: list[float], p: float) -> float:
    """The p-th percentile (nearest rank), p in 0-100."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def ms(x: float) -> str:
    return f"{x * 1000:.1f}"


# ---------------------------------------------------------------------- the cluster


def start_cluster(root: Path) -> LocalCluster:
    config = root / "cluster.yaml"
    conf = {"cluster_name": "load", "partitions": [{"name": "gpu", "nodes": f"node[01-{NODES:02d}]", "default": True}],
            "scheduler": {"max_array_size": ARRAY_TASKS + 1}}
    config.write_text(json.dumps(conf) + "\n")  # JSON is YAML
    c = LocalCluster(root / "cluster", nodes=NODES, gpus_per_node=GPUS, cpus_per_node=64, memory="1T",
                     config=str(config))
    return c.up()


def fill(c: LocalCluster) -> tuple[dict[str, Client], list[int]]:
    """Every GPU busy with a long job, then 10,000 jobs queued behind them; (user clients, job ids)."""
    c.sbatch(f"--array=0-{NODES * GPUS - 1}", "--gpus=1", "--output=/dev/null", "--wrap", "sleep 3600")
    users = {}
    for i in range(USERS):
        user = f"user{i:02d}"
        token = c.api("POST", "/shoal/v1/tokens", {"user": user, "description": "load benchmark"})["token"]
        users[user] = Client(c.server, token)
        users[user].job_token = None
    workdir = str(c.workdir)

    def queue(user: str) -> list[int]:
        client = users[user]
        out = client.request("POST", "/shoal/v1/jobs", {"name": f"{user}-array", "script": SCRIPT, "workdir": workdir,
                                                      "gpus_per_node": 1, "array": f"0-{ARRAY_TASKS - 1}"})
        ids = [out["job_id"]]
        for j in range(SINGLE_JOBS):
            ids.append(client.request("POST", "/shoal/v1/jobs", {"name": f"{user}-{j}", "script": SCRIPT,
                                                               "workdir": workdir, "gpus_per_node": 1,
                                                               "hold": j % 2 == 0})["job_id"])
        return ids

    with ThreadPoolExecutor(4) as pool:
        ids = [i for chunk in pool.map(queue, users) for i in chunk]
    return users, ids


def queued(c: LocalCluster) -> int:
    return len(c.api("GET", "/shoal/v1/jobs?state=PENDING&view=queue")["jobs"])


# ---------------------------------------------------------------------- the load


class Load:
    """Sends the requests of KINDS at a fixed rate from a thread pool; records every one."""

    def __init__(self, c: LocalCluster, users: dict[str, Client], job_ids: list[int], seed: int) -> None:
        self.c = c
        self.users = users
        self.user_names = list(users)
        self.job_ids = job_ids
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.admin = Client(c.server, c.admin_token)
        self.admin.job_token = None
        self.cmd_dir = c.workdir / "commands"
        self.cmd_dir.mkdir(exist_ok=True)

    def _pick(self) -> tuple[str, int]:
        with self.lock:
            return self.rng.choice(self.user_names), self.rng.choice(self.job_ids)

    def do(self, kind: Kind) -> None:
        """One request of ``kind``; raises on any error."""
        user, job_id = self._pick()
        label = kind.label
        if kind.command:
            if label.startswith("`squeue"):
                argv = ["squeue", "-u", user]
            elif label.startswith("`sbatch"):
                argv = ["sbatch", "--hold", "--gpus=1", "--output=/dev/null", "--wrap", "sleep 60"]
            elif label.startswith("`sinfo"):
                argv = ["sinfo"]
            else:
                argv = ["scontrol", "show", "job", str(job_id)]
            out = subprocess.run([str(BIN / argv[0]), *argv[1:]], env=self.c.env, cwd=self.cmd_dir,
                                 capture_output=True, text=True, timeout=60, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"{shlex.join(argv)} exited {out.returncode}: {out.stderr.strip()[:200]}")
            return
        client = self.users[user]
        if "one user" in label:
            client.get("/shoal/v1/jobs", {"user": user, "view": "queue"})
        elif "whole queue" in label:
            self.admin.get("/shoal/v1/jobs", {"view": "queue"})
        elif "job detail" in label:
            self.admin.get(f"/shoal/v1/jobs/{job_id}")
        elif "scontrol" in label:
            self.admin.get("/shoal/v1/jobs", {"job_id": job_id})
        elif "sinfo" in label:
            client.get("/shoal/v1/nodes")
            client.get("/shoal/v1/partitions")
        else:
            hold = self.rng.random() < 0.5
            out = client.post("/shoal/v1/jobs", {"name": f"{user}-load", "script": SCRIPT, "workdir": str(self.c.workdir),
                                               "gpus_per_node": 1, "hold": hold})
            with self.lock:
                self.job_ids.append(out["job_id"])

    def run(self, mode: Mode, profile: Path | None = None) -> Result:
        n = int(mode.duration_s * mode.rate)
        plan = [k for k in KINDS for _ in range(k.weight)]
        order = [plan[i % len(plan)] for i in range(n)]
        self.rng.shuffle(order)
        result = Result()
        server = psutil.Process(self.c.state["pids"]["server"])
        agents = [psutil.Process(p) for p in self.c.state["pids"]["agents"].values()]

        def cpu(p: psutil.Process) -> float:
            t = p.cpu_times()
            return t.user + t.system

        def one(kind: Kind, due: float) -> None:
            error = None
            sent = time.perf_counter()
            try:
                self.do(kind)
            except Exception as e:  # every failure counts; the kind and message go in the report
                error = f"{type(e).__name__}: {e}"[:300]
            end = time.perf_counter()
            sample = Sample(kind.label, end - due, end - sent, error)
            with self.lock:
                result.samples.append(sample)

        spy = _start_py_spy(self.c, profile, "load") if profile else None
        result.load_before = load_average()
        server_cpu, agents_cpu = cpu(server), sum(cpu(a) for a in agents)
        machine = psutil.cpu_times()
        start = time.perf_counter()
        result.started = start
        with ThreadPoolExecutor(max_workers=128) as pool:
            for i, kind in enumerate(order):
                due = start + i / mode.rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                pool.submit(one, kind, due)
        result.finished = time.perf_counter()
        after = psutil.cpu_times()
        busy = (after.user + after.system + after.nice) - (machine.user + machine.system + machine.nice)
        total = sum(after) - sum(machine)
        result.machine_busy = busy / total if total else 0.0
        result.server_cpu_s = cpu(server) - server_cpu
        result.agents_cpu_s = sum(cpu(a) for a in agents) - agents_cpu
        result.load_after = load_average()
        if spy:
            _stop_py_spy(spy)
        return result


# ---------------------------------------------------------------------- report


def render(facts: dict[str, str], command: str, mode: Mode, r: Result, wall_s: float, seed: int) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    span = r.finished - r.started
    by_kind: dict[str, list[Sample]] = {}
    for s in r.samples:
        by_kind.setdefault(s.kind, []).append(s)
    errors = [s for s in r.samples if s.error]
    ok = [s.latency for s in r.samples]
    served = [s.service for s in r.samples]
    detail = statistics.median(s.service for s in by_kind[KINDS[2].label])
    out = [SECTION, ""]
    out.append(f"Produced by `{command}` ({mode.name} mode: {mode.duration_s:g} s of load, {wall_s / 60:.1f} minutes "
               f"in all, {when}; seed {seed}). A local cluster of {NODES} nodes x {GPUS} fake GPUs (`shoal up`, "
               f"SQLite store, the default scheduler settings, everything on one machine): every GPU busy with a "
               f"long job, and {r.queued_before:,} jobs queued behind them ({USERS} users, each an array of "
               f"{ARRAY_TASKS} tasks and {SINGLE_JOBS} single jobs, half of those held). Then {mode.rate:g} requests "
               f"per second, open-loop (request i is due at start + i/rate; its latency counts from then, so "
               f"queueing in this load generator counts too), from a pool of 128 threads on the same machine; the "
               f"real commands are fresh processes (`sbatch` and `squeue` are the compiled front end when it is "
               f"installed).")
    out.append("")
    out.append("| Machine | |")
    out.append("|---|---|")
    for k, v in facts.items():
        out.append(f"| {k} | {v} |")
    out.append("")
    out.append(f"The machine is shared and noisy (other engineers' tests and builds run on the same "
               f"{facts.get('Cores', '?')} cores): load average {r.load_before} before the load and {r.load_after} "
               f"after it; all processes together kept {r.machine_busy * 100:.0f}% of the cores busy meanwhile. "
               f"Figures from a quiet machine would be lower; compare rows within this table rather than with "
               f"other sections.")
    out.append("")
    out.append(f"**{len(r.samples):,} requests, {len(errors)} errors**; achieved {len(r.samples) / span:.1f} "
               f"requests/s (asked {mode.rate:g}/s); the server process used {r.server_cpu_s:.1f} CPU s "
               f"({r.server_cpu_s / span:.2f} cores), the {NODES} agents {r.agents_cpu_s:.1f} CPU s; "
               f"{r.queued_after:,} jobs queued at the end (submissions added to the queue). Server CPU per "
               f"request (the scheduler's passes included): **{r.server_cpu_s / len(r.samples) * 1000:.1f} ms**, "
               f"so about {len(r.samples) / r.server_cpu_s:.0f} requests per second of one core, which bounds the "
               f"rate whatever the machine (the server is one Python process).")
    out.append("")
    out.append("Latency from when a request was due includes any wait for a free thread in this generator "
               "(when the server falls behind, that backlog dominates); from when it was sent it is the "
               "server's own answer time, with up to 128 requests in flight.")
    out.append("")
    out.append("| Request | count | errors | p50 ms | p90 ms | p99 ms | max ms | from sent: p50 ms | p99 ms "
               "| p50 from sent / job detail's |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in KINDS:
        samples = by_kind.get(kind.label, [])
        if not samples:
            continue
        xs, ys = [s.latency for s in samples], [s.service for s in samples]
        errs = sum(1 for s in samples if s.error)
        out.append(f"| {kind.label} | {len(xs)} | {errs} | {ms(pct(xs, 50))} | {ms(pct(xs, 90))} | {ms(pct(xs, 99))} "
                   f"| {ms(max(xs))} | {ms(pct(ys, 50))} | {ms(pct(ys, 99))} | {pct(ys, 50) / detail:.1f}x |")
    out.append(f"| **all** | {len(ok)} | {len(errors)} | {ms(pct(ok, 50))} | {ms(pct(ok, 90))} | {ms(pct(ok, 99))} "
               f"| {ms(max(ok))} | {ms(pct(served, 50))} | {ms(pct(served, 99))} | {pct(served, 50) / detail:.1f}x |")
    out.append("")
    if errors:
        out.append("Errors (first 5 kinds):")
        out.append("")
        for msg, n in Counter(f"{s.kind}: {s.error}" for s in errors).most_common(5):
            out.append(f"- {n} x {msg}")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="15 s of load instead of 60 s")
    ap.add_argument("--seed", type=int, default=6, help="the request mix's order and targets")
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"), help="file to write (default %(default)s)")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write the file")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="py-spy the server and one agent during the "
                    "load; raw profiles go to DIR")
    ap.add_argument("--keep", action="store_true", help="keep the temporary state dir (logs) afterwards")
    args = ap.parse_args(argv)
    mode = SHORT if args.short else FULL
    command = shlex.join([".venv/bin/python", "bench/bench_load.py", *(sys.argv[1:] if argv is None else argv)])
    started = time.time()
    facts = machine_facts()
    facts["Shoal bytecode"] = ensure_bytecode()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-load-"))
    print(f"state in {root}; machine: {facts}", flush=True)
    c = start_cluster(root)
    try:
        t0 = time.perf_counter()
        users, ids = fill(c)
        before = queued(c)
        print(f"queued {before} jobs in {time.perf_counter() - t0:.1f}s; load for {mode.duration_s:g}s "
              f"at {mode.rate:g}/s...", flush=True)
        load = Load(c, users, ids, args.seed)
        result = load.run(mode, args.profile)
        result.queued_before = before
        result.queued_after = queued(c)
    except Exception:
        traceback.print_exc()
        print(f"logs kept in {root}", flush=True)
        c.down()
        return 1
    c.down()
    facts["Load average (1/5/15 min) at end"] = load_average()
    errors = sum(1 for s in result.samples if s.error)
    print(f"{len(result.samples)} requests, {errors} errors", flush=True)
    text = render(facts, command, mode, result, time.time() - started, args.seed)
    if args.no_write:
        print(text)
    else:
        write_section(SECTION, text, Path(args.output))
        print(text)
        print(f"wrote the {SECTION!r} section of {args.output}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
