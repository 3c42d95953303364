#!/usr/bin/env python3
"""Shoal vs Slurm: the same workloads on Debian's Slurm and on a Shoal local cluster, one machine.

Installs slurm-wlm and munge when they are missing (needs root), writes a private Slurm
configuration (bench/slurm/: slurmctld and one slurmd per node on 127.0.0.1, fake GPUs
through GRES), starts munged, slurmctld and the slurmd daemons itself and stops exactly
those processes. Slurm runs twice, with its default scheduler settings and tuned as its
High Throughput Computing guide recommends; the table quotes the better of the two. Beside
them, `shoal up` with the same nodes, CPUs and GPUs. All are up at once: the idle figures
are taken one cluster at a time, the throughput runs in rounds over every cluster. Writes
the ``## Shoal vs Slurm`` section of BENCHMARKS.md (other sections are kept).

    .venv/bin/python bench/bench_vs_slurm.py            # full: ~20 minutes (the HTC profile waits ~20 s per single job)
    .venv/bin/python bench/bench_vs_slurm.py --short    # a few minutes, smaller workloads
    .venv/bin/python bench/bench_vs_slurm.py --short --targets shoal --no-write   # one side only
    .venv/bin/python bench/bench_vs_slurm.py --targets slurm-htc,shoal --workloads sequential --runs 5 --no-write

Targets: slurm-default, slurm-htc, shoal, and shoal-python (the same Shoal with
SHOAL_FRONTEND=python, so sbatch/squeue/scancel run as the Python commands: the figure
without the compiled front end). With py-spy in .venv/bin, one extra sequential run on
shoal, not counted (sampling slows the server), is profiled (--gil) and the table says
where the server's Python time went.

Every command is run as a user's shell runs it, a fresh process per call, by absolute path:
/usr/bin/sbatch for Slurm, .venv/bin/sbatch for Shoal. CI does not run this.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_foundation import ensure_bytecode, load_average, machine_facts, median  # noqa: E402
from bench.slurm import cluster as slurm  # noqa: E402
from benchmarks_md import write_section  # noqa: E402  (bench/ is on sys.path as the script's folder)
from tests.integration.cluster import BIN, LocalCluster  # noqa: E402  (the one local-cluster harness)

SECTION = "## Shoal vs Slurm"
NODES, GPUS, CPUS, MEMORY_MB = 4, 8, 32, 65536
TARGETS = ("slurm-default", "slurm-htc", "shoal", "shoal-python", "shoal-nocg")
# shoal-nocg (asked for by name): agents with `--cgroups off`, jobs uncontained (containment's cost).
DEFAULT_TARGETS = TARGETS[:4]
WORKLOADS = ("latency", "gang", "squeue", "sequential", "burst", "array")
"""Rows 3, 5, 4 (idle and queue figures, one cluster at a time), then 1, 2a and 2b (in rounds)."""


@dataclass(frozen=True)
class Mode:
    """Workload sizes and repetitions."""

    name: str
    seq_jobs: int  # 1. sequential `sbatch --wrap true`
    burst_jobs: int  # 2. jobs submitted at once, and the same as one array
    runs: int  # repetitions of 1. and 2.; the table gives the median
    latency_jobs: int  # 3. single jobs on an idle cluster
    pending_jobs: int  # 4. held jobs in the queue while squeue is timed
    squeue_calls: int
    gang_jobs: int  # 5. 2-node jobs on free nodes
    profile_jobs: int  # the profiled (extra, not counted) run of 1.: long enough for a few hundred samples
    submitters: int = 4


FULL = Mode("full", seq_jobs=300, burst_jobs=1000, runs=3, latency_jobs=20, pending_jobs=1000, squeue_calls=20,
            gang_jobs=5, profile_jobs=1000)
SHORT = Mode("short", seq_jobs=100, burst_jobs=200, runs=1, latency_jobs=5, pending_jobs=200, squeue_calls=10,
             gang_jobs=3, profile_jobs=300)


# ---------------------------------------------------------------------- the two systems


class Target(Protocol):
    """What the workloads need from a cluster: its commands, their environment, a queue count."""

    label: str
    env: dict[str, str]
    workdir: Path

    def bin(self, command: str) -> str: ...

    def active(self, name: str | None = None) -> int: ...

    def pids(self) -> list[int]: ...


class ShoalTarget:
    """A `shoal up` cluster, seen through the Target protocol."""

    def __init__(self, root: Path, nodes: int, gpus: int, cpus: int, memory_mb: int,
                 python_commands: bool = False, cgroups: bool = True) -> None:
        self.label = "Shoal, Python commands" if python_commands else "Shoal" if cgroups else "Shoal, cgroups off"
        self.python_commands = python_commands
        self.cluster = LocalCluster(root, nodes=nodes, gpus_per_node=gpus, cpus_per_node=cpus,
                                    memory=f"{memory_mb // 1024}G", extra=() if cgroups else ("--cgroups", "off"))
        self.env = self.cluster.env
        if python_commands:  # the compiled front end hands every call to the Python command
            self.env["SHOAL_FRONTEND"] = "python"
        self.workdir = self.cluster.workdir
        self.nodes = nodes
        self.up_s = 0.0

    def up(self) -> "ShoalTarget":
        t0 = time.perf_counter()
        self.cluster.up()
        self.up_s = time.perf_counter() - t0
        return self

    def down(self) -> None:
        self.cluster.down()

    def bin(self, command: str) -> str:
        return str(BIN / command)

    def active(self, name: str | None = None) -> int:
        """Pending, running or completing jobs (GET /shoal/v1/jobs without all=true, squeue's
        columns only, as Slurm's side asks squeue): no process per poll."""
        q = f"&name={name}" if name else ""
        return len(self.cluster.api("GET", f"/shoal/v1/jobs?view=queue{q}")["jobs"])

    def pids(self) -> list[int]:
        """The server's and the node agents'."""
        return [self.cluster.state["pids"]["server"], *self.cluster.state["pids"]["agents"].values()]


class SlurmTarget:
    """A bench/slurm cluster; `active` runs /usr/bin/squeue, a C program that starts in milliseconds."""

    def __init__(self, root: Path, profile: slurm.Profile, nodes: int, gpus: int, cpus: int, memory_mb: int) -> None:
        self.label = f"Slurm {profile.name}"
        self.cluster = slurm.SlurmCluster(root, profile, nodes=nodes, gpus_per_node=gpus, cpus_per_node=cpus,
                                          memory_mb=memory_mb)
        self.env = self.cluster.env
        self.workdir = self.cluster.workdir
        self.nodes = self.cluster.nodes

    @property
    def up_s(self) -> float:
        return self.cluster.up_s

    def up(self) -> "SlurmTarget":
        self.cluster.up()
        return self

    def down(self) -> None:
        self.cluster.down()

    def bin(self, command: str) -> str:
        return self.cluster.bin(command)

    def active(self, name: str | None = None) -> int:
        return self.cluster.active(name)

    def pids(self) -> list[int]:
        """munged's, slurmctld's and every slurmd's."""
        return [p.pid for p in self.cluster.procs.values() if p.poll() is None]


# ---------------------------------------------------------------------- helpers


def sbatch(t: Target, *args: str) -> str:
    out = subprocess.run([t.bin("sbatch"), *args], env=t.env, cwd=t.workdir, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{t.label}: sbatch {shlex.join(args)} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def submit_parallel(t: Target, jobs: int, submitters: int, args: list[str]) -> list[str]:
    """``jobs`` sbatch calls shared among ``submitters`` shell loops running side by side; the job ids."""
    shares = [jobs // submitters + (1 if i < jobs % submitters else 0) for i in range(submitters)]
    with ThreadPoolExecutor(submitters) as pool:
        outs = pool.map(lambda n: [sbatch(t, "--parsable", *args) for _ in range(n)], shares)
    return [out.strip().split(";")[0] for share in outs for out in share]


def wait_idle(t: Target, name: str | None = None, timeout: float = 900, interval: float = 0.1) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not t.active(name):
            return time.time()
        time.sleep(interval)
    raise RuntimeError(f"{t.label}: jobs {name or ''} still active after {timeout:g}s")


def read_stamps(path: Path, want: int, timeout: float = 60) -> list[float]:
    """Wait until a job's output holds ``want`` `date +%s.%N` lines; return them."""
    deadline = time.time() + timeout
    while True:
        try:
            stamps = [float(x) for x in path.read_text().split()]
        except (OSError, ValueError):
            stamps = []
        if len(stamps) >= want:
            return stamps
        if time.time() > deadline:
            raise RuntimeError(f"{path}: {len(stamps)} of {want} timestamps after {timeout:g}s")
        time.sleep(0.002)


def cpu_s(pids: list[int]) -> float:
    """CPU seconds used so far by these processes, the children they have reaped and those alive now."""
    total = 0.0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
            for c in p.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    t = c.cpu_times()
                    total += t.user + t.system
        except psutil.Error:
            continue
    return total


# ---------------------------------------------------------------------- the workloads


@dataclass
class Results:
    """Every figure one target produced; lists hold one value per run or per job."""

    label: str
    nodes: int
    up_s: float = 0.0
    seq_rate: list[float] = field(default_factory=list)  # submissions per second
    burst_s: list[float] = field(default_factory=list)  # first submission to all completed
    burst_submit_s: list[float] = field(default_factory=list)
    array_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    squeue_s: list[float] = field(default_factory=list)
    gang_start_s: list[float] = field(default_factory=list)  # batch script's first line
    gang_tasks_s: list[float] = field(default_factory=list)  # `srun` task running on both nodes
    notes: list[str] = field(default_factory=list)
    profile: list[tuple[str, float]] = field(default_factory=list)  # (part of the server, % of its Python time)
    profile_busy: float = 0.0  # share of the run the server held the GIL
    profile_samples: int = 0
    # CPU seconds the other clusters' daemons used during each run of 1., 2a. and 2b.
    others_cpu: dict[str, list[float]] = field(default_factory=lambda: {"1": [], "2a": [], "2b": []})


# Where the Shoal server's Python time goes, by the innermost frame that names a part
# (py-spy --gil stacks, sampled without stopping the server: stopping it 200 times a second
# slowed the profiled loop to a third of its rate); the first pattern found from the leaf up wins.
PROFILE_PARTS = (
    ("sbatch in the server (commands endpoint: parse, validate, submit, commit)", ("run_command", "locals>.submit ")),
    ("serving controllers (Deployments, pods, HPA)", ("server/kube/",)),
    ("scheduling pass (snapshot, schedule(), apply)", ("Controller._schedule",)),
    ("controller checks (heartbeats, time limits, preemption grace)", ("server/controller.py",)),
    ("agent endpoints (work long-poll, reports)", ("locals>.agent_work", "locals>.agent_report", "locals>._agent_exit")),
    ("HTTP layer (uvicorn, the fast path, FastAPI routing and middleware, event loop, thread hand-off)",
     ("uvicorn", "anyio", "server/fastpath.py")),
)


def profile_summary(raw: Path, seconds: float, rate: int) -> tuple[list[tuple[str, float]], float, int]:
    """py-spy raw (collapsed) stacks -> (part, % of samples) rows, the GIL-held share of the run
    and the number of samples."""
    counts: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        frames = stack.split(";")
        part = "other"
        for frame in reversed(frames):
            hit = next((label for label, pats in PROFILE_PARTS if any(p in frame + " " for p in pats)), None)
            if hit:
                part = hit
                break
        counts[part] = counts.get(part, 0) + int(n)
    rows = sorted(((k, 100.0 * v / total) for k, v in counts.items()), key=lambda kv: -kv[1]) if total else []
    return rows, min(1.0, total / (seconds * rate)) if seconds else 0.0, total


def bench_sequential(t: Target, jobs: int) -> float:
    name = "seq"
    t0 = time.perf_counter()
    for _ in range(jobs):
        sbatch(t, f"--job-name={name}", "--output=/dev/null", "--wrap", "true")
    rate = jobs / (time.perf_counter() - t0)
    wait_idle(t, name)
    return rate


def bench_burst(t: Target, jobs: int, submitters: int) -> tuple[float, float]:
    """(submitted s, all completed s): ``jobs`` sbatch calls at once from ``submitters`` loops."""
    name = "burst"
    t0 = time.time()
    submit_parallel(t, jobs, submitters, [f"--job-name={name}", "--output=/dev/null", "--wrap", "true"])
    submitted = time.time() - t0
    return submitted, wait_idle(t, name) - t0


def bench_array(t: Target, jobs: int) -> float:
    name = "array"
    t0 = time.time()
    sbatch(t, f"--job-name={name}", "--output=/dev/null", f"--array=0-{jobs - 1}", "--wrap", "true")
    return wait_idle(t, name) - t0


def bench_latency(t: Target, jobs: int) -> list[float]:
    """Just before `sbatch` to the job's first line (`date +%s.%N`), one job at a time on an idle cluster."""
    d = t.workdir / "latency"
    d.mkdir(exist_ok=True)
    script = d / "stamp.sh"
    script.write_text("#!/bin/sh\ndate +%s.%N\n")
    out = []
    for i in range(jobs):
        wait_idle(t, interval=0.05)
        path = d / f"stamp-{i}.out"
        t0 = time.time()
        sbatch(t, "--job-name=latency", f"--output={path}", str(script))
        out.append(read_stamps(path, 1)[0] - t0)
    wait_idle(t)
    return out


def bench_gang(t: Target, jobs: int, gpus: int) -> tuple[list[float], list[float]]:
    """A 2-node job taking every GPU of both nodes: to its batch script's start, and to a task on each node."""
    d = t.workdir / "gang"
    d.mkdir(exist_ok=True)
    script = d / "gang.sh"
    script.write_text("#!/bin/sh\ndate +%s.%N\nsrun --ntasks-per-node=1 date +%s.%N\n")
    start, tasks = [], []
    for i in range(jobs):
        wait_idle(t, interval=0.05)
        path = d / f"gang-{i}.out"
        t0 = time.time()
        sbatch(t, "--job-name=gang", "--nodes=2", "--ntasks-per-node=1", f"--gpus-per-node={gpus}",
               f"--output={path}", str(script))
        stamps = read_stamps(path, 3)
        start.append(stamps[0] - t0)
        tasks.append(max(stamps[1:3]) - t0)
    wait_idle(t)
    return start, tasks


def bench_squeue(t: Target, pending: int, calls: int, submitters: int) -> list[float]:
    """`squeue` (fresh process, default format) while ``pending`` held jobs wait in the queue."""
    name = "pending"
    ids = submit_parallel(t, pending, submitters, [f"--job-name={name}", "--hold", "--output=/dev/null", "--wrap", "true"])
    if (n := t.active(name)) != pending:
        raise RuntimeError(f"{t.label}: {n} of {pending} held jobs in the queue")
    times = []
    for _ in range(calls + 2):  # two to warm the page cache
        t0 = time.perf_counter()
        out = subprocess.run([t.bin("squeue")], env=t.env, cwd=t.workdir, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if out.returncode != 0 or len(out.stdout.splitlines()) < pending:
            raise RuntimeError(f"{t.label}: squeue exited {out.returncode} with "
                               f"{len(out.stdout.splitlines())} lines: {out.stderr.strip()}")
    for i in range(0, len(ids), 100):  # by id: Shoal's `scancel --name` alone is refused by its server today
        subprocess.run([t.bin("scancel"), *ids[i:i + 100]], env=t.env, cwd=t.workdir, check=True)
    wait_idle(t, name)
    return times[2:]


def profile_run(t: ShoalTarget, work: Callable[[], float]) -> tuple[list[tuple[str, float]], float, int, float]:
    """``work()`` with py-spy sampling the Shoal server's GIL holder: (summary, busy share, samples,
    work's figure)."""
    import signal

    rate = 200
    raw = t.workdir / "server-profile.txt"
    spy = subprocess.Popen([str(BIN / "py-spy"), "record", "--gil", "--nonblocking", "-r", str(rate), "-f", "raw",
                            "-o", str(raw),
                            "-p", str(t.cluster.state["pids"]["server"])],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    t0 = time.perf_counter()
    figure = work()
    seconds = time.perf_counter() - t0
    spy.send_signal(signal.SIGINT)
    spy.wait(timeout=60)
    rows, busy, samples = profile_summary(raw, seconds + 1.0, rate) if raw.exists() else ([], 0.0, 0)
    return rows, busy, samples, figure


def idle_figures(t: SlurmTarget | ShoalTarget, mode: Mode, gpus: int, log: Callable[[str], None],
                 workloads: tuple[str, ...] = WORKLOADS) -> Results:
    """The figures taken on an idle cluster (latency, gang), then the queue's (squeue)."""
    r = Results(t.label, t.nodes)
    r.up_s = t.up_s
    if "latency" in workloads:
        log(f"{t.label}: latency...")
        r.latency_s = bench_latency(t, mode.latency_jobs)
        log(f"  latency median {median(r.latency_s) * 1000:.0f} ms")
    if "gang" in workloads and t.nodes >= 2:
        r.gang_start_s, r.gang_tasks_s = bench_gang(t, mode.gang_jobs, gpus)
        log(f"  {t.label}: gang start median {median(r.gang_start_s) * 1000:.0f} ms, "
            f"tasks {median(r.gang_tasks_s) * 1000:.0f} ms")
    elif "gang" in workloads:
        r.notes.append("one slurmd only: this Slurm build lacks --enable-multiple-slurmd, so no 2-node job")
    if "squeue" in workloads:
        log(f"  {t.label}: squeue with {mode.pending_jobs} pending...")
        r.squeue_s = bench_squeue(t, mode.pending_jobs, mode.squeue_calls, mode.submitters)
        log(f"  squeue median {median(r.squeue_s) * 1000:.1f} ms")
    if "sequential" in workloads and isinstance(t, ShoalTarget) and not t.python_commands \
            and (BIN / "py-spy").exists():
        r.profile, r.profile_busy, r.profile_samples, rate = profile_run(
            t, lambda: bench_sequential(t, mode.profile_jobs))
        log(f"  profiled run of 1. (not counted, {mode.profile_jobs} submissions, {r.profile_samples} samples): "
            f"{rate:.1f} submissions/s")
    return r


def throughput_round(t: SlurmTarget | ShoalTarget, r: Results, mode: Mode, log: Callable[[str], None],
                     workloads: tuple[str, ...] = WORKLOADS, others: tuple[Target, ...] = ()) -> None:
    """One run of each throughput workload (1., 2a., 2b.), added to ``r``, with the CPU that
    ``others`` (the clusters idle meanwhile) used during each: their background work (Slurm
    purging ended jobs' records, say) is a cost the measured cluster pays."""
    done = []

    def measured(row: str, work: Callable[[], object]):
        pids = [pid for o in others for pid in o.pids()]
        before = cpu_s(pids)
        out = work()
        r.others_cpu[row].append(cpu_s(pids) - before)
        return out

    if "sequential" in workloads:
        r.seq_rate.append(measured("1", lambda: bench_sequential(t, mode.seq_jobs)))
        done.append(f"{r.seq_rate[-1]:.1f} submissions/s")
    if "burst" in workloads:
        sub, end = measured("2a", lambda: bench_burst(t, mode.burst_jobs, mode.submitters))
        r.burst_submit_s.append(sub)
        r.burst_s.append(end)
        done.append(f"burst submitted {sub:.1f}s, done {end:.1f}s")
    if "array" in workloads:
        r.array_s.append(measured("2b", lambda: bench_array(t, mode.burst_jobs)))
        done.append(f"array done {r.array_s[-1]:.1f}s")
    spent = ", ".join(f"{row} {cpu[-1]:.1f}" for row, cpu in r.others_cpu.items() if cpu)
    log(f"  {t.label}: {'; '.join(done)} (the other clusters' CPU s meanwhile: {spent})")


def run_targets(targets: dict[str, SlurmTarget | ShoalTarget], mode: Mode, gpus: int,
                log: Callable[[str], None], workloads: tuple[str, ...] = WORKLOADS) -> dict[str, Results]:
    """Every cluster up at once. Each one's idle and queue figures in turn, then the throughput
    workloads in rounds, each round running them on every cluster one after the other: a
    shared machine's speed drifts over the half hour a full run takes, and in rounds the
    drift falls on every system alike, not on whichever came last. Each round starts one
    cluster further along, so that no cluster always follows the same one (and its
    after-effects: Slurm's default configuration purges ended jobs' records 300 s later)."""
    results: dict[str, Results] = {}
    try:
        for t in targets.values():
            t.up()
            log(f"{t.label}: up in {t.up_s:.1f}s")
        for key, t in targets.items():
            results[key] = idle_figures(t, mode, gpus, log, workloads)
        for run in range(mode.runs if {"sequential", "burst", "array"} & set(workloads) else 0):
            log(f"round {run + 1}/{mode.runs} of the throughput workloads")
            keys = list(targets)
            keys = keys[run % len(keys):] + keys[:run % len(keys)]
            for key in keys:
                others = tuple(o for k, o in targets.items() if k != key)
                throughput_round(targets[key], results[key], mode, log, workloads, others)
    finally:
        for t in targets.values():
            t.down()
    return results


# ---------------------------------------------------------------------- report


@dataclass(frozen=True)
class Row:
    label: str
    unit: str
    get: Callable[[Results], list[float]]
    higher_is_better: bool = False
    scale: float = 1.0  # seconds -> unit

    def value(self, r: Results | None) -> float | None:
        xs = self.get(r) if r else []
        return median(xs) * self.scale if xs else None

    def better(self, a: float | None, b: float | None) -> float | None:
        vals = [v for v in (a, b) if v is not None]
        if not vals:
            return None
        return max(vals) if self.higher_is_better else min(vals)

    def speedup(self, slurm_v: float | None, shoal_v: float | None) -> float | None:
        """How many times faster Shoal is (above 1: Shoal better; below 1: Slurm better)."""
        if slurm_v is None or shoal_v is None or 0 in (slurm_v, shoal_v):
            return None
        return shoal_v / slurm_v if self.higher_is_better else slurm_v / shoal_v


def rows(mode: Mode) -> list[Row]:
    runs = f"median of {mode.runs} run{'s' if mode.runs > 1 else ''}"
    return [
        Row(f"1. sequential `sbatch --wrap true`, {mode.seq_jobs} submissions ({runs})", "submissions/s",
            lambda r: r.seq_rate, higher_is_better=True),
        Row(f"2a. {mode.burst_jobs} trivial jobs submitted at once ({mode.submitters} parallel sbatch loops): "
            f"first submission to all completed ({runs})", "s", lambda r: r.burst_s),
        Row(f"2b. the same as one {mode.burst_jobs}-task array `--array=0-{mode.burst_jobs - 1}` ({runs})", "s",
            lambda r: r.array_s),
        Row(f"3. submit-to-start latency, one job on an idle cluster (median of {mode.latency_jobs})", "ms",
            lambda r: r.latency_s, scale=1000),
        Row(f"4. `squeue` with {mode.pending_jobs} pending jobs (median of {mode.squeue_calls} calls)", "ms",
            lambda r: r.squeue_s, scale=1000),
        Row(f"5a. 2-node gang job (all 8 GPUs of each node), submit to batch script start "
            f"(median of {mode.gang_jobs})", "ms", lambda r: r.gang_start_s, scale=1000),
        Row(f"5b. the same, submit to `srun` task running on both nodes (median of {mode.gang_jobs})", "ms",
            lambda r: r.gang_tasks_s, scale=1000),
    ]


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    return f"{v:.1f}" if unit != "s" or v < 100 else f"{v:.0f}"


def render(facts: dict[str, str], command: str, mode: Mode, results: dict[str, Results], elapsed: float,
           nodes: int, gpus: int, cpus: int) -> str:
    d, h, s = (results.get(k) for k in TARGETS[:3])
    # One more Shoal column: the Python commands', or else the cgroups-off agents'.
    alt = next((k for k in TARGETS[3:] if k in results), None)
    py = results.get(alt) if alt else None
    alt_label = "Shoal, Python commands" if alt == "shoal-python" else "Shoal, cgroups off"
    out = [SECTION, ""]
    out.append(f"Produced by `{command}` ({mode.name} mode, {elapsed / 60:.1f} minutes, "
               f"{time.strftime('%Y-%m-%d %H:%M %Z')}). Both systems on this one machine with {nodes} nodes x "
               f"{gpus} fake GPUs and {cpus} CPUs each: Slurm as slurmctld plus one slurmd per node on 127.0.0.1 "
               f"(bench/slurm/), Shoal as `shoal up`. Every command is a fresh process, run by absolute path.")
    out.append("")
    out.append("| Machine and versions | |")
    out.append("|---|---|")
    out += [f"| {k} | {v} |" for k, v in facts.items()]
    out.append("")
    out.append("Slurm runs twice, with its default scheduler settings and tuned as its High Throughput "
               "Computing guide recommends; \"Slurm, better\" is the better of the two per row, and the speed-up "
               "is Shoal against that figure (above 1: Shoal faster; below 1: Slurm faster).")
    out.append("")
    extra = f" {alt_label} | its speed-up |" if py else ""
    out.append(f"| Workload | unit | Slurm default | Slurm HTC-tuned | Slurm, better | Shoal | Shoal speed-up |{extra}")
    out.append("|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if py else ""))
    for row in rows(mode):
        dv, hv, sv = row.value(d), row.value(h), row.value(s)
        best = row.better(dv, hv)
        up = row.speedup(best, sv)
        line = (f"| {row.label} | {row.unit} | {fmt(dv, row.unit)} | {fmt(hv, row.unit)} | {fmt(best, row.unit)} "
                f"| {fmt(sv, row.unit)} | {'n/a' if up is None else f'{up:.2f}x'} |")
        if py:
            pv = row.value(py)
            pup = row.speedup(best, pv)
            line += f" {fmt(pv, row.unit)} | {'n/a' if pup is None else f'{pup:.2f}x'} |"
        out.append(line)
    out.append("")
    if py and alt == "shoal-python":
        out.append("\"Shoal, Python commands\" is the same Shoal with `SHOAL_FRONTEND=python`: sbatch, squeue and "
                   "scancel run as the Python commands, as without the compiled front end (the before figure).")
        out.append("")
    out.append("| Cluster start-up and per-run figures | Slurm default | Slurm HTC-tuned | Shoal |"
               + (f" {alt_label} |" if py else ""))
    out.append("|---|---|---|---|" + ("---|" if py else ""))
    per_run = (("started in s", lambda r: [r.up_s]), ("1. submissions/s, each run", lambda r: r.seq_rate),
               ("2a. all submitted s, each run", lambda r: r.burst_submit_s),
               ("2a. all completed s, each run", lambda r: r.burst_s), ("2b. array completed s, each run",
                                                                       lambda r: r.array_s),
               ("other clusters' CPU s during each run of 1.", lambda r: r.others_cpu["1"]),
               ("the same during 2a.", lambda r: r.others_cpu["2a"]),
               ("the same during 2b.", lambda r: r.others_cpu["2b"]))
    for label, get in per_run:
        cells = [", ".join(f"{x:.1f}" for x in get(r)) if r else "not run" for r in (d, h, s, *([py] if py else []))]
        out.append(f"| {label} | {' | '.join(cells)} |")
    out.append("")
    if s and s.profile:
        out.append(f"Where the Shoal server's Python time went during an extra run of 1. with {mode.profile_jobs} "
                   f"submissions, not counted in the table (py-spy --gil --nonblocking at 200 Hz on the server "
                   f"process, which it does not stop to sample: {s.profile_samples} samples; it held the GIL "
                   f"{s.profile_busy * 100:.0f}% of the run, which includes waiting for the jobs to end; each "
                   f"submission's job also starts, runs `true` and is cleaned up meanwhile):")
        out.append("")
        out.append("| Part of the server | share of its Python time |")
        out.append("|---|---:|")
        out += [f"| {label} | {pct:.1f}% |" for label, pct in s.profile]
        out.append("")
    notes = sorted({n for r in (d, h, s, py) if r for n in r.notes})
    out += [
        "How it is measured:",
        "",
        "- Jobs are `--wrap true` with `--output=/dev/null`; \"completed\" is the first poll that finds none of "
        "them pending, running or completing (Slurm: `squeue -h -n NAME` every 0.1 s; Shoal: GET "
        "/shoal/v1/jobs?view=queue, squeue's columns, every 0.1 s, so no Python start-up per poll).",
        "- Latency and gang jobs print `date +%s.%N` first; the figure is that stamp minus the time just before "
        "`sbatch` was started, so it includes the command's own start-up. 5b adds `srun --ntasks-per-node=1 "
        "date +%s.%N` and takes the later of the two nodes' stamps.",
        "- `squeue` is the default format over every job, with the pending jobs submitted `--hold` and "
        "cancelled afterwards; two warm-up calls are not counted.",
        "- Every cluster is up for the whole run. Each one's latency, gang and squeue figures are taken in turn, "
        "the others idle; then the throughput workloads (1., 2a., 2b.) run in rounds, each round on every "
        "cluster one after the other, so that the machine's drift in speed over the run falls on all of them "
        "alike. Each round starts one cluster further along. The idle clusters are not quiet: Slurm's default "
        "configuration purges ended jobs' records 300 s after they end (MinJobAge), whichever cluster is "
        "measured then; the per-run table gives the CPU the other clusters' daemons used during each run.",
        "- Slurm schedules a batch job not at submit but within SchedulerParameters' batch_sched_delay "
        "(3 s by default, 20 s in the HTC guide's example), which is what rows 3 and 5 show; that is the "
        "setting to lower for latency, and the guide raises it for throughput.",
        "- Slurm's configuration: bench/slurm/slurm.conf.in (select/cons_tres with CR_Core, proctrack/linuxproc, "
        "task/none, no accounting, SlurmdParameters=config_overrides so slurmd takes the configured CPUs). "
        "Fake GPUs: Slurm 22.05's gres/gpu ignores gres.conf lines without File=, so each node's "
        "File= names character devices with /dev/null's numbers made in the temporary dir.",
        "- HTC tuning (bench/slurm/htc.conf): the guide's example SchedulerParameters verbatim, sched/builtin, "
        "priority/basic, MinJobAge=2, MessageTimeout=30, SlurmctldDebug=error, SlurmdDebug=error, four "
        "SlurmctldPort ports, `munged --num-threads=10`. Not applied, as they change the shared machine: the "
        "guide's sysctl and ulimit settings.",
        *(f"- {n}" for n in notes),
    ]
    return "\n".join(out) + "\n"




# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="smaller workloads, one run each (a few minutes)")
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                    help=f"comma list of %(default)s (or {TARGETS[-1]}: agents with --cgroups off)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of %(default)s (rows 3, 5, "
                    "4, 1, 2a, 2b); the others' rows say n/a")
    ap.add_argument("--runs", type=int, help="rounds of the throughput workloads (default: 3, short mode 1)")
    ap.add_argument("--nodes", type=int, default=NODES, help="nodes on both sides (default %(default)s)")
    ap.add_argument("--gpus-per-node", type=int, default=GPUS)
    ap.add_argument("--cpus-per-node", type=int, default=CPUS)
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"), help="file to write (default %(default)s)")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write the file")
    ap.add_argument("--keep", action="store_true", help="keep the temporary dirs (configuration, logs) afterwards")
    args = ap.parse_args(argv)
    mode = SHORT if args.short else FULL
    if args.runs is not None:
        if args.runs < 1:
            ap.error("--runs must be at least 1")
        mode = dataclasses.replace(mode, runs=args.runs)
    targets = [x.strip() for x in args.targets.split(",") if x.strip()]
    if unknown := set(targets) - set(TARGETS):
        ap.error(f"unknown targets {sorted(unknown)}; choose from {', '.join(TARGETS)}")
    workloads = tuple(x.strip() for x in args.workloads.split(",") if x.strip())
    if unknown := set(workloads) - set(WORKLOADS):
        ap.error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    command = shlex.join([".venv/bin/python", "bench/bench_vs_slurm.py", *(sys.argv[1:] if argv is None else argv)])
    started = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {msg}", flush=True)

    facts = machine_facts()
    facts["Shoal bytecode"] = ensure_bytecode()
    shoal_version = subprocess.run([str(BIN / "shoal"), "--version"], capture_output=True, text=True).stdout.strip()
    facts["Shoal"] = f"{shoal_version} (commit {facts.pop('Shoal commit')})"
    compiled = (BIN / "sbatch").read_bytes()[:4] == b"\x7fELF"
    facts["Shoal commands"] = ("sbatch, squeue, scancel: the compiled front end (frontend/shoal-cmd.c; the server "
                               "runs the commands' Python code)" if compiled else
                               "the Python commands (no compiled front end: no C compiler when `make` ran)")
    if any(t.startswith("slurm") for t in targets):
        facts["Slurm installation"] = slurm.ensure_installed()
        facts["Slurm"] = (f"{slurm.slurm_version()} (Debian slurm-wlm {slurm.package_version('slurm-wlm')}, "
                          f"munge {slurm.package_version('munge')}); several slurmd on one host: "
                          f"{'yes' if slurm.multiple_slurmd_supported() else 'no, one node only'}")
    base = Path(tempfile.mkdtemp(prefix="shoal-vs-slurm-"))
    base.chmod(0o755)  # munged runs as the munge user and must reach its socket dir below
    log(f"state in {base}")
    shape = (args.nodes, args.gpus_per_node, args.cpus_per_node, MEMORY_MB)
    clusters: dict[str, SlurmTarget | ShoalTarget] = {}
    for key in targets:
        root = base / key
        if key.startswith("shoal"):
            clusters[key] = ShoalTarget(root, *shape, python_commands=key == "shoal-python",
                                        cgroups=key != "shoal-nocg")
        else:
            clusters[key] = SlurmTarget(root, slurm.DEFAULT if key == "slurm-default" else slurm.HTC, *shape)
    results = run_targets(clusters, mode, args.gpus_per_node, log, workloads)
    facts["Load average (1/5/15 min) at end"] = load_average()
    text = render(facts, command, mode, results, time.time() - started, args.nodes, args.gpus_per_node,
                  args.cpus_per_node)
    print(text)
    if not args.no_write:
        write_section(SECTION, text, Path(args.output))
        log(f"wrote the {SECTION!r} section of {args.output}")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
