#!/usr/bin/env python3
"""Foundation benchmark: command start-up, submit-to-start latency and batch throughput.

Starts its own local cluster (`shoal up`, 8 nodes x 8 fake GPUs, 128 CPUs each) in a
temporary state dir with ports it picks, measures, stops it, and writes the
``## Foundation`` section of BENCHMARKS.md (other sections are kept).

    .venv/bin/python bench/bench_foundation.py            # full: ~10-15 minutes
    .venv/bin/python bench/bench_foundation.py --short    # a few minutes, fewer repetitions
    .venv/bin/python bench/bench_foundation.py --profile /tmp/prof   # + py-spy of the server

Commands are run as a user's shell loop runs them: a fresh process per call. Comparisons
are interleaved call by call in one run, so machine noise hits every row alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.cluster import BIN, LocalCluster, python_command  # noqa: E402  (the one harness)
from benchmarks_md import write_section  # noqa: E402  (bench/ is on sys.path as the script's folder)

PY = sys.executable
# sbatch, squeue and scancel may be the compiled front end (frontend/shoal-cmd.c); then the
# Python commands are timed beside them, and import times are the Python commands'.
FRONT = " (compiled front end)" if (BIN / "sbatch").read_bytes()[:4] == b"\x7fELF" else ""
SECTION = "## Foundation"
NODES, GPUS, CPUS = 8, 8, 128
ACTIVE_STATES = ("PENDING", "RUNNING")


@dataclass(frozen=True)
class Mode:
    """How many repetitions each measurement gets."""

    name: str
    cli_calls: int
    importtime_runs: int
    latency_jobs: int
    throughput_jobs: int
    parallel_submitters: int = 4


FULL = Mode("full", cli_calls=50, importtime_runs=7, latency_jobs=20, throughput_jobs=1000)
SHORT = Mode("short", cli_calls=15, importtime_runs=3, latency_jobs=8, throughput_jobs=200)


# ---------------------------------------------------------------------- statistics


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def p90(xs: list[float]) -> float:
    if len(xs) < 2:
        return xs[0]
    return statistics.quantiles(xs, n=10, method="inclusive")[8]


def ms(x: float) -> str:
    return f"{x * 1000:.1f}"


# ---------------------------------------------------------------------- machine facts


def machine_facts() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    os_name = platform.platform()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = f"{line.split('=', 1)[1].strip(chr(34))} ({platform.release()})"
    except OSError:
        pass
    commit = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no", "src"):
        commit += " + uncommitted changes in src/"
    return {
        "CPU": cpu,
        "Cores": str(os.cpu_count()),
        "Memory": mem,
        "OS": os_name,
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "Shoal commit": commit,
        "Load average (1/5/15 min) at start": load_average(),
    }


def ensure_bytecode() -> str:
    """Byte-compile Shoal as `make install` does, so start-up figures never include compiling.

    With PYTHONDONTWRITEBYTECODE set (as in some CI and container images) a module whose
    .pyc is missing or stale is compiled again on every start of every command.
    """
    import compileall

    compileall.compile_dir(str(REPO / "src" / "shoal"), quiet=1)
    flag = os.environ.get("PYTHONDONTWRITEBYTECODE")
    return "compiled before measuring" + (f" (PYTHONDONTWRITEBYTECODE={flag} in the environment)" if flag else "")


def load_average() -> str:
    """Other work on the machine skews every figure here; the report says how busy it was."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


# ---------------------------------------------------------------------- cluster


def bench_config(path: Path, max_array_size: int) -> Path:
    """The cluster configuration: the local default's partition, plus room for a 1,000-task array."""
    conf = {
        "cluster_name": "bench",
        "partitions": [{"name": "gpu-a100", "nodes": f"node[01-{NODES:02d}]", "default": True}],
        "scheduler": {"max_array_size": max_array_size},
        "nodes": {"heartbeat_interval_s": 2.0, "heartbeat_timeout_s": 30.0, "kill_wait_s": 2.0},
    }
    path.write_text(json.dumps(conf, indent=2) + "\n")  # JSON is YAML
    return path


def start_cluster(root: Path, mode: Mode) -> LocalCluster:
    config = bench_config(root / "cluster.yaml", max(2000, mode.throughput_jobs + 1))
    c = LocalCluster(root / "cluster", nodes=NODES, gpus_per_node=GPUS, cpus_per_node=CPUS, memory="2T",
                     config=str(config))
    t0 = time.perf_counter()
    c.up()
    c.up_s = time.perf_counter() - t0
    return c


def active(c: LocalCluster, name: str | None = None) -> list[dict]:
    """Jobs still pending, running or completing (GET /shoal/v1/jobs without all=true)."""
    q = f"?name={name}" if name else ""
    return c.api("GET", f"/shoal/v1/jobs{q}")["jobs"]


def wait_idle(c: LocalCluster, name: str | None = None, timeout: float = 600, interval: float = 0.25) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not active(c, name):
            return time.time()
        time.sleep(interval)
    raise RuntimeError(f"jobs {name or ''} still active after {timeout:g}s")


# ---------------------------------------------------------------------- 1. command start-up


@dataclass
class Timed:
    label: str
    argv: list[str]
    times: list[float] = field(default_factory=list)


def bench_cli(c: LocalCluster, mode: Mode) -> list[Timed]:
    rows = [
        Timed("`python -c pass` (floor)", [PY, "-c", "pass"]),
        Timed("`python -c 'import shoal.cli.sbatch, shoal.slurm.options, shoal.api_client'` (sbatch imports)",
              [PY, "-c", "import shoal.cli.sbatch, shoal.slurm.options, shoal.api_client"]),
        Timed("`python -c 'import shoal.cli.squeue'` (squeue imports)", [PY, "-c", "import shoal.cli.squeue"]),
        Timed(f"`sbatch --wrap true`{FRONT}", [str(BIN / "sbatch"), "--wrap", "true"]),
        Timed(f"`squeue`{FRONT}", [str(BIN / "squeue")]),
    ]
    if FRONT:
        rows += [Timed("`sbatch --wrap true` (the Python command)", python_command("sbatch", "--wrap", "true")),
                 Timed("`squeue` (the Python command)", python_command("squeue"))]
    workdir = c.workdir / "cli"
    workdir.mkdir(exist_ok=True)

    def once(t: Timed) -> float:
        t0 = time.perf_counter()
        out = subprocess.run(t.argv, env=c.env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        dt = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(f"{shlex.join(t.argv)} exited {out.returncode}: {out.stderr.decode()}")
        return dt

    for t in rows:  # warm the page cache and .pyc files
        for _ in range(2):
            once(t)
    for i in range(mode.cli_calls):
        for t in rows[i % len(rows):] + rows[: i % len(rows)]:  # rotate, so no row always goes first
            t.times.append(once(t))
    wait_idle(c)
    return rows


Ranked = list[tuple[str, float]]


def importtime(c: LocalCluster, argv: list[str], runs: int) -> tuple[float, Ranked, Ranked]:
    """`python -X importtime` of a real command: (total s, top-level imports by cumulative, top by self)."""
    cumul: dict[str, list[float]] = {}
    selft: dict[str, list[float]] = {}
    top_level: set[str] = set()
    totals = []
    for _ in range(runs):
        out = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=c.env, cwd=c.workdir, capture_output=True,
                             text=True)
        total = 0.0
        for line in out.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            s, cu, name = line.split(":", 1)[1].split("|", 2)
            name = name[1:]  # the one space after the bar; the rest is nesting (2 per level)
            depth = (len(name) - len(name.lstrip(" "))) // 2
            mod = name.strip()
            selft.setdefault(mod, []).append(int(s) / 1e6)
            cumul.setdefault(mod, []).append(int(cu) / 1e6)
            if depth == 0:
                top_level.add(mod)
                total += int(cu) / 1e6
        totals.append(total)
    by_cumul = sorted(((m, median(cumul[m])) for m in top_level), key=lambda x: -x[1])
    by_self = sorted(((m, median(v)) for m, v in selft.items()), key=lambda x: -x[1])
    return median(totals), by_cumul, by_self


# ---------------------------------------------------------------------- 2. submit-to-start latency


@dataclass
class Latency:
    total: list[float] = field(default_factory=list)  # first script line - just before sbatch
    from_submit: list[float] = field(default_factory=list)  # first script line - server's submit_time
    cli: list[float] = field(default_factory=list)  # submit_time - just before sbatch
    schedule: list[float] = field(default_factory=list)  # start_time - submit_time
    launch: list[float] = field(default_factory=list)  # first script line - start_time


def bench_latency(c: LocalCluster, mode: Mode) -> Latency:
    lat = Latency()
    workdir = c.workdir / "latency"
    workdir.mkdir(exist_ok=True)
    script = workdir / "stamp.sh"
    script.write_text("#!/bin/sh\ndate +%s.%N\n")
    for i in range(mode.latency_jobs):
        wait_idle(c, interval=0.05)
        out_file = workdir / f"stamp-{i}.out"
        argv = [str(BIN / "sbatch"), "--parsable", f"--output={out_file}", "--job-name=latency", str(script)]
        t0 = time.time()
        job_id = int(subprocess.run(argv, env=c.env, cwd=workdir, capture_output=True, text=True,
                                    check=True).stdout.strip().split(";")[0])
        deadline = time.time() + 60
        stamp = None
        while stamp is None:
            try:
                first = out_file.read_text().splitlines()
                stamp = float(first[0]) if first else None
            except (OSError, ValueError):
                pass
            if stamp is None:
                if time.time() > deadline:
                    raise RuntimeError(f"job {job_id} wrote no timestamp to {out_file}")
                time.sleep(0.002)
        job = c.wait_for(job_id, timeout=60)
        lat.total.append(stamp - t0)
        lat.from_submit.append(stamp - job["submit_time"])
        lat.cli.append(job["submit_time"] - t0)
        lat.schedule.append(job["start_time"] - job["submit_time"])
        lat.launch.append(stamp - job["start_time"])
    return lat


# ---------------------------------------------------------------------- 3. throughput


@dataclass
class Throughput:
    label: str
    jobs: int
    calls: int
    submit_s: float  # first submission to last sbatch returned
    started_s: float  # first submission to the last job's start (server's start_time)
    completed_s: float  # first submission to the last job's end (server's end_time)
    idle_s: float  # first submission to nothing pending/running/completing, as a poller sees it
    states: dict[str, int]
    load: str = ""  # 1-minute load average just before the run


def bench_throughput(c: LocalCluster, label: str, jobs: int, command: str, submitters: int = 1,
                     array: bool = False, profile: Path | None = None) -> Throughput:
    name = f"tp-{label}"
    workdir = c.workdir / name
    workdir.mkdir(exist_ok=True)
    base = [str(BIN / "sbatch"), "--parsable", f"--job-name={name}", "--cpus-per-task=1"]

    def submit_many(count: int) -> None:
        for _ in range(count):
            subprocess.run([*base, "--wrap", command], env=c.env, cwd=workdir, stdout=subprocess.DEVNULL,
                           check=True)

    load = f"{os.getloadavg()[0]:.1f}"
    spy = _start_py_spy(c, profile, name) if profile else None
    t0 = time.time()
    if array:
        subprocess.run([*base, f"--array=0-{jobs - 1}", "--wrap", command], env=c.env, cwd=workdir,
                       stdout=subprocess.DEVNULL, check=True)
        calls = 1
    elif submitters == 1:
        submit_many(jobs)
        calls = jobs
    else:
        shares = [jobs // submitters + (1 if i < jobs % submitters else 0) for i in range(submitters)]
        with ThreadPoolExecutor(submitters) as pool:
            list(pool.map(submit_many, shares))
        calls = jobs
    t_submitted = time.time()
    t_idle = wait_idle(c, name, timeout=900)
    if spy:
        _stop_py_spy(spy)
    rows = c.jobs(name=name)
    states = Counter(j["state"] for j in rows)
    return Throughput(
        label=label, jobs=jobs, calls=calls, submit_s=t_submitted - t0,
        started_s=max(j["start_time"] or 0 for j in rows) - t0,
        completed_s=max(j["end_time"] or 0 for j in rows) - t0,
        idle_s=t_idle - t0, states=dict(states), load=load,
    )


# ---------------------------------------------------------------------- profiling (optional)


def _start_py_spy(c: LocalCluster, out_dir: Path, name: str):
    spy = BIN / "py-spy"
    if not spy.exists():
        print("  (py-spy not installed in the venv: .venv/bin/pip install py-spy; not profiling)", file=sys.stderr)
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = {"server": c.state["pids"]["server"], "agent-node01": c.agent_pid("node01")}
    procs = []
    for who, pid in targets.items():
        path = out_dir / f"{name}-{who}.txt"
        p = subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", "100", "--format", "raw",
                              "--nonblocking", "--threads", "--output", str(path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append((p, path))
    time.sleep(0.5)
    return procs


def _stop_py_spy(procs) -> None:
    for p, _ in procs:
        p.send_signal(signal.SIGINT)
    for p, path in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        if path.exists():
            print(f"  profile {path}:")
            for line in summarise_raw_profile(path):
                print(f"    {line}")


def summarise_raw_profile(path: Path, top: int = 12) -> list[str]:
    """py-spy's raw (collapsed-stack) output: the functions that were on-CPU most, self and inclusive."""
    self_c: Counter = Counter()
    incl: Counter = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        if frames and frames[0].startswith("thread"):
            frames = frames[1:]
        if not frames or "(idle)" in stack:
            continue
        count = int(n)
        total += count
        self_c[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    if not total:
        return ["(no samples)"]
    lines = [f"{total} active samples; top self:"]
    lines += [f"  {100 * k / total:5.1f}%  {f}" for f, k in self_c.most_common(top)]
    lines.append("top inclusive (shoal frames):")
    lines += [f"  {100 * k / total:5.1f}%  {f}" for f, k in incl.most_common(200) if "shoal/" in f][:top]
    return lines


# ---------------------------------------------------------------------- report


def render(facts: dict[str, str], command: str, mode: Mode, c: LocalCluster, cli: list[Timed],
           imports: dict[str, tuple], lat: Latency, tps: list[Throughput], job_command: str,
           elapsed: float) -> str:
    out = [SECTION, ""]
    out.append(f"Produced by `{command}` ({mode.name} mode, {elapsed / 60:.1f} minutes, "
               f"{time.strftime('%Y-%m-%d %H:%M %Z')}). A local cluster of {NODES} nodes x {GPUS} fake GPUs, "
               f"{CPUS} CPUs each (`shoal up`, started in {c.up_s:.1f} s), SQLite store, everything on one machine.")
    out.append("")
    out.append("| Machine | |")
    out.append("|---|---|")
    out += [f"| {k} | {v} |" for k, v in facts.items()]
    out.append("")

    out.append(f"### Command start-up (fresh process per call, {mode.cli_calls} calls each, interleaved)")
    out.append("")
    out.append("| Command | median ms | p90 ms | min ms | median above the floor ms |")
    out.append("|---|---:|---:|---:|---:|")
    floor = median(cli[0].times)
    for t in cli:
        out.append(f"| {t.label} | {ms(median(t.times))} | {ms(p90(t.times))} | {ms(min(t.times))} "
                   f"| {ms(median(t.times) - floor)} |")
    out.append("")
    for cmd, (total, by_cumul, by_self) in imports.items():
        out.append(f"`python -X importtime {cmd}` (the Python command; median of {mode.importtime_runs} runs): "
                   f"{ms(total)} ms of imports in all.")
        out.append("")
        out.append("| Top-level import | cumulative ms | | Biggest single module | self ms |")
        out.append("|---|---:|---|---|---:|")
        for (m1, v1), (m2, v2) in zip(by_cumul[:10], by_self[:10]):
            out.append(f"| `{m1}` | {ms(v1)} | | `{m2}` | {ms(v2)} |")
        out.append("")

    out.append(f"### Submit-to-start latency (idle cluster, {len(lat.total)} single jobs, one at a time)")
    out.append("")
    out.append("The job's script prints `date +%s.%N` as its first line.")
    out.append("")
    out.append("| Interval | median ms | p90 ms |")
    out.append("|---|---:|---:|")
    for label, xs in (("first script line - just before `sbatch` was run", lat.total),
                      ("first script line - server's submit_time", lat.from_submit),
                      ("  of which: submit_time - start of `sbatch` (process start-up + request)", lat.cli),
                      ("  of which: start_time - submit_time (scheduler)", lat.schedule),
                      ("  of which: first script line - start_time (agent: long-poll wake-up, launch)", lat.launch)):
        out.append(f"| {label} | {ms(median(xs))} | {ms(p90(xs))} |")
    out.append("")

    out.append(f"### Throughput ({tps[0].jobs} jobs of `{job_command}`, 1 CPU each, first submission to all done)")
    out.append("")
    out.append("Times are from just before the first `sbatch` to: the last `sbatch` returning, the last job's "
               "start and end as the server recorded them, and the poller (GET /shoal/v1/jobs every 0.25 s) "
               "seeing nothing pending, running or completing.")
    out.append("")
    out.append("| Submission | sbatch calls | submitted s | submissions/s | last start s | all COMPLETED s "
               "| jobs/s | idle seen s | end states | load before |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for t in tps:
        states = ", ".join(f"{k} {v}" for k, v in sorted(t.states.items()))
        out.append(f"| {t.label} | {t.calls} | {t.submit_s:.1f} | {t.jobs / t.submit_s:.1f} | {t.started_s:.1f} "
                   f"| {t.completed_s:.1f} | {t.jobs / t.completed_s:.1f} | {t.idle_s:.1f} | {states} | {t.load} |")
    out.append("")
    return "\n".join(out)




# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="fewer repetitions and 200-job throughput runs")
    ap.add_argument("--jobs", type=int, help="jobs per throughput run (default 1000; 200 with --short)")
    ap.add_argument("--job-command", default="sleep 0.5", help="what each throughput job runs")
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"), help="file to write (default %(default)s)")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write the file")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="py-spy the server and one agent during "
                    "the throughput runs; raw profiles go to DIR")
    ap.add_argument("--keep", action="store_true", help="keep the temporary state dir (logs) afterwards")
    args = ap.parse_args(argv)
    mode = SHORT if args.short else FULL
    if args.jobs:
        mode = Mode(mode.name, mode.cli_calls, mode.importtime_runs, mode.latency_jobs, args.jobs)
    command = shlex.join([".venv/bin/python", "bench/bench_foundation.py", *(sys.argv[1:] if argv is None else argv)])
    started = time.time()
    facts = machine_facts()
    facts["Shoal bytecode"] = ensure_bytecode()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    print(f"state in {root}; machine: {facts}", flush=True)
    c = start_cluster(root, mode)
    try:
        print(f"cluster up in {c.up_s:.1f}s ({c.server}); command start-up...", flush=True)
        cli = bench_cli(c, mode)
        for t in cli:
            print(f"  {t.label}: median {ms(median(t.times))} ms, p90 {ms(p90(t.times))} ms", flush=True)
        imports = {
            "sbatch --wrap true": importtime(c, python_command("sbatch", "--wrap", "true"), mode.importtime_runs),
            "squeue": importtime(c, python_command("squeue"), mode.importtime_runs),
        }
        wait_idle(c)
        print("submit-to-start latency...", flush=True)
        lat = bench_latency(c, mode)
        print(f"  median {ms(median(lat.total))} ms (from submit_time {ms(median(lat.from_submit))} ms)", flush=True)
        tps = []
        for label, kw in (("serial, 1 submitter", {}),
                          (f"{mode.parallel_submitters} parallel submitters", {"submitters": mode.parallel_submitters}),
                          (f"one array `--array=0-{mode.throughput_jobs - 1}`", {"array": True})):
            print(f"throughput: {label}...", flush=True)
            tps.append(bench_throughput(c, label.split(",")[0].split(" `")[0].replace(" ", "-"),
                                        mode.throughput_jobs, args.job_command, profile=args.profile, **kw))
            tps[-1].label = label
            t = tps[-1]
            print(f"  submitted {t.submit_s:.1f}s, all completed {t.completed_s:.1f}s, idle {t.idle_s:.1f}s, "
                  f"{t.states}", flush=True)
    finally:
        c.down()
    facts["Load average (1/5/15 min) at end"] = load_average()
    text = render(facts, command, mode, c, cli, imports, lat, tps, args.job_command, time.time() - started)
    if args.no_write:
        print(text)
    else:
        write_section(SECTION, text, Path(args.output))
        print(f"wrote the {SECTION!r} section of {args.output}")
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
