#!/usr/bin/env python3
"""Cgroup containment's cost: per-job set-up and tear-down, and submit-to-start with cgroups on and off.

Four local clusters side by side (`shoal up --cgroups auto` and `--cgroups off`, 2 nodes x 4
fake GPUs each, with nodes of 64 fake CPUs and of the machine's own count), measured in
interleaved rounds so machine noise hits all alike: in each round one job on each cluster
(submit-to-first-line, as bench_foundation's latency), and an array of jobs on each (first
submission to all done). Then, in this process, the agent's own
steps for one job (make the job's cgroup with its limits, the batch step's, open them;
kill-and-remove the emptied cgroup) and what joining costs a launch (a fork with the
``preexec_fn``, against one without). Writes the ``## Cgroups`` section of BENCHMARKS.md.

    sudo .venv/bin/python bench/bench_cgroups.py            # ~5 minutes
    sudo .venv/bin/python bench/bench_cgroups.py --rounds 5 --no-write
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.cluster import BIN, LocalCluster  # noqa: E402  (the one harness)
from benchmarks_md import write_section  # noqa: E402

from shoal.agent import cgroups, supervise  # noqa: E402
from shoal.agent.identity import OpenAs, output_flags  # noqa: E402

SECTION = "## Cgroups"
# The /bin/sh wrapper that joined a supervisor to its cgroups before supervisors joined themselves.
SH_JOIN = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 126; shift; done; shift; exec "$@"'


def median_ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.1f}"


def p90_ms(xs: list[float]) -> str:
    s = sorted(xs)
    return f"{s[min(len(s) - 1, int(0.9 * len(s)))] * 1000:.1f}"


def start_latency(c: LocalCluster, i: int) -> tuple[float, float]:
    """One job: (first script line - before sbatch, first script line - the server's start_time)."""
    out = c.workdir / f"stamp-{i}.out"
    script = c.workdir / "stamp.sh"
    script.write_text("#!/bin/sh\ndate +%s.%N\n")
    t0 = time.time()
    job_id = int(subprocess.run([str(BIN / "sbatch"), "--parsable", f"--output={out}", str(script)], env=c.env,
                                cwd=c.workdir, capture_output=True, text=True, check=True).stdout.split(";")[0])
    deadline = time.time() + 60
    while True:
        try:
            lines = out.read_text().splitlines()
            if lines:
                stamp = float(lines[0])
                break
        except (OSError, ValueError):
            pass
        if time.time() > deadline:
            raise RuntimeError(f"job {job_id} wrote nothing to {out}")
        time.sleep(0.002)
    job = c.wait_for(job_id, timeout=60)
    return stamp - t0, stamp - job["start_time"]


def array_run(c: LocalCluster, jobs: int, i: int) -> float:
    """An array of ``jobs`` trivial jobs: seconds from its submission to all of them ended."""
    name = f"arr{i}"
    t0 = time.time()
    subprocess.run([str(BIN / "sbatch"), "--parsable", f"--job-name={name}", f"--array=0-{jobs - 1}",
                    "--output=/dev/null", "--wrap", "true"], env=c.env, cwd=c.workdir, stdout=subprocess.DEVNULL,
                   check=True)
    while c.api("GET", f"/shoal/v1/jobs?name={name}")["jobs"]:
        time.sleep(0.02)
    rows = c.jobs(name=name)
    bad = [j for j in rows if j["state"] != "COMPLETED"]
    if bad:
        raise RuntimeError(f"array {name}: {len(bad)} jobs did not complete: {bad[0]}")
    return time.time() - t0


def setup_cost(rounds: int) -> tuple[dict[str, list[float]], str]:
    """The agent's per-job cgroup work, timed in this process against the real hierarchy, and
    what the hierarchy is."""
    h = cgroups.detect("auto", f"bench-{os.getpid()}")
    if h is None:
        raise SystemExit("no cgroups on this machine (or not root): nothing to measure")
    containment = cgroups.Containment(h, (0, 1, 2, 3))
    times: dict[str, list[float]] = {k: [] for k in ("setup", "release", "plain", "wrapped", "preexec", "supervised",
                                                     "supervised_in", "migrate")}
    ballast = [bytearray(1000) for _ in range(100_000)]  # a heap of an agent's size: fork copies its page tables
    jobs = Path(tempfile.mkdtemp(prefix="shoal-bench-cg-sup-"))

    def launch(argv: list[str], **kw) -> float:
        t0 = time.perf_counter()
        subprocess.Popen(argv, start_new_session=True, **kw).wait()
        return time.perf_counter() - t0

    def supervised(i: int, step: cgroups.Cgroup | None) -> float:
        """`true` under its supervisor as the agent starts a batch script (shoal-stepd where built)."""
        jobdir = jobs / f"{i}.{'in' if step else 'out'}"
        jobdir.mkdir()
        spec = supervise.Launch(key=f"{i}.0", job_id=i, run=0, user="", argv=["true"], env={"PATH": os.defpath},
                                cwd="/", cwd_fallback=None, files=[OpenAs(1, os.devnull, output_flags(False)),
                                                                   OpenAs(2, same_as=1)],
                                identity=None, cgroups=cgroups.procs_files(step))
        t0 = time.perf_counter()
        supervise.start(jobdir, spec).wait()
        elapsed = time.perf_counter() - t0
        status = supervise.read_status(jobdir)
        if status is None or status.exit_code or status.reason:
            raise RuntimeError(f"supervised `true` failed: {status}")
        return elapsed

    v1_mounts, v2_mount = cgroups.parse_mounts(Path("/proc/self/mounts").read_text())
    own_v1, own_v2 = cgroups.parse_own(Path("/proc/self/cgroup").read_text())
    home = [str(v2_mount / own_v2.lstrip("/") / "cgroup.procs")] if h.version == 2 else \
        [str(v1_mounts[c] / own_v1[c].lstrip("/") / "cgroup.procs") for c in h.base]  # where this process is now
    try:
        for i in range(rounds):
            t0 = time.perf_counter()
            cg = containment.job(f"{i}.0", 1024, 1, [1])
            step = cg.child("step_batch")
            t1 = time.perf_counter()
            times["setup"].append(t1 - t0)
            times["plain"].append(launch(["true"]))
            times["wrapped"].append(launch(["/bin/sh", "-c", SH_JOIN, "sh", *cgroups.procs_files(step), "--", "true"]))
            fds = step.open_procs()
            times["preexec"].append(launch(["true"], preexec_fn=lambda: [os.write(fd, b"0") for fd in fds]))
            cgroups.close_all(fds)
            if i < 15:  # a lone join, as a job's supervisor makes it: 0.1 s after the last (and back out)
                time.sleep(0.1)
                t0 = time.perf_counter()
                supervise.join_cgroups(cgroups.procs_files(step))
                times["migrate"].append(time.perf_counter() - t0)
                supervise.join_cgroups(home)
            times["supervised"].append(supervised(i, None))
            times["supervised_in"].append(supervised(i, step))
            t0 = time.perf_counter()
            containment.release(f"{i}.0", cg)
            times["release"].append(time.perf_counter() - t0)
    finally:
        containment.close()
        shutil.rmtree(jobs, ignore_errors=True)
    del ballast
    return times, h.describe()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--array", type=int, default=100, help="jobs per array run (default %(default)s)")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write BENCHMARKS.md")
    args = ap.parse_args(argv)
    started = time.time()
    load_start = os.getloadavg()[0]
    micro, found = setup_cost(200)
    real = len(os.sched_getaffinity(0))
    # Fake-sized nodes (64 CPUs on this machine: no cpusets) and real-sized ones (cpusets on).
    sizes = {"fake": 64, "real": real}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-cg-") as tmp:
        clusters = {(size, mode): LocalCluster(Path(tmp) / f"{size}-{mode}", nodes=2, gpus_per_node=4,
                                               cpus_per_node=cpus, extra=("--cgroups", mode))
                    for size, cpus in sizes.items() for mode in ("auto", "off")}
        for c in clusters.values():
            c.up()
        try:
            total = {k: [] for k in clusters}
            launch = {k: [] for k in clusters}
            arrays = {k: [] for k in clusters}
            for i in range(args.rounds):
                order = list(clusters) if i % 2 == 0 else list(reversed(clusters))
                for key in order:
                    t, lat = start_latency(clusters[key], i)
                    total[key].append(t)
                    launch[key].append(lat)
                if i % 2 == 0:  # arrays are long: half of the rounds
                    for key in order:
                        arrays[key].append(array_run(clusters[key], args.array, i))
        finally:
            for c in clusters.values():
                c.down()
    minutes = (time.time() - started) / 60
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    lines = [
        SECTION, "",
        f"Produced by `.venv/bin/python bench/bench_cgroups.py` ({args.rounds} rounds, {minutes:.1f} minutes, {when}, "
        f"commit {commit}, as root on the machine of the Foundation section; 1-minute load average "
        f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end: the machine was shared). "
        f"What the agent found: {found}.", "",
        "### Per-job set-up cost (in process, 200 jobs)", "",
        "| Step | median ms | p90 ms |", "|---|---:|---:|",
        f"| make the job's cgroup with its limits, and its batch step's | {median_ms(micro['setup'])} | "
        f"{p90_ms(micro['setup'])} |",
        f"| kill, wait empty, read usage, remove (at the job's end) | {median_ms(micro['release'])} | "
        f"{p90_ms(micro['release'])} |",
        f"| join the step's cgroups, 0.1 s after the last join (what a supervisor does; 15 joins) | "
        f"{median_ms(micro['migrate'])} | {p90_ms(micro['migrate'])} |",
        f"| start `true` under its supervisor (shoal-stepd) and wait, uncontained | "
        f"{median_ms(micro['supervised'])} | {p90_ms(micro['supervised'])} |",
        f"| the same, the supervisor first joining the step's cgroups (`Launch.cgroups`: the agent's way) | "
        f"{median_ms(micro['supervised_in'])} | {p90_ms(micro['supervised_in'])} |",
        f"| start `true` and wait, plain (vfork) | {median_ms(micro['plain'])} | {p90_ms(micro['plain'])} |",
        f"| the same through a `/bin/sh` that joins the step's cgroups, then execs (the agent's way before) | "
        f"{median_ms(micro['wrapped'])} | {p90_ms(micro['wrapped'])} |",
        f"| the same joining in a `preexec_fn` (Python then forks a 100 MB process, not vfork: not used) | "
        f"{median_ms(micro['preexec'])} | {p90_ms(micro['preexec'])} |",
        "",
        f"### Cgroups on and off side by side (four 2-node clusters, {args.rounds} rounds interleaved)", "",
        f"Fake-sized nodes advertise 64 CPUs each on this {real}-CPU machine, so they get no cpusets; real-sized "
        f"ones advertise {real}, and each job is pinned to a cpuset of its CPUs (then at most {real} 1-CPU jobs run "
        "on a node at once, so their arrays take longer on and off alike).", "",
        "| Nodes | Figure | cgroups on: median ms | p90 ms | cgroups off: median ms | p90 ms |",
        "|---|---|---:|---:|---:|---:|",
        *(row for size in sizes for row in (
            f"| {size} | first script line - just before `sbatch` | {median_ms(total[size, 'auto'])} | "
            f"{p90_ms(total[size, 'auto'])} | {median_ms(total[size, 'off'])} | {p90_ms(total[size, 'off'])} |",
            f"| {size} | first script line - start_time (agent: wake-up, cgroup, launch) | "
            f"{median_ms(launch[size, 'auto'])} | {p90_ms(launch[size, 'auto'])} | {median_ms(launch[size, 'off'])} | "
            f"{p90_ms(launch[size, 'off'])} |",
            f"| {size} | array of {args.array} `true` jobs, submission to all ended ({len(arrays[size, 'auto'])} runs) | "
            f"{median_ms(arrays[size, 'auto'])} | {p90_ms(arrays[size, 'auto'])} | {median_ms(arrays[size, 'off'])} | "
            f"{p90_ms(arrays[size, 'off'])} |")),
        "",
        "Submission itself (sbatch to the server's submit_time) does not touch the agent and is unchanged; "
        "the set-up runs in the agent's work loop when the run first appears, before the launch.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
