#!/usr/bin/env python3
"""Scale benchmark: one server holding 100 / 1,000 / 5,000 hollow nodes (8 fake GPUs each).

For each size it starts a server (SQLite, the default heartbeat interval and the default
timeout of 60 s) and one ``shoal agent --hollow N`` process, waits for every node to
register, then:

1. idle: for ``--idle-s`` seconds only heartbeats and long-polls: the server's CPU per
   heartbeat (its process CPU time over the reports the hollow nodes sent), that as a share
   of one core, the long-polls answered, the reports' round trips (p50/p99, as the hollow
   nodes timed them), the hollow process's own CPU, and the server's RSS per node (after
   registration, over an empty server's);
2. submit: ``--jobs`` single-GPU jobs (``sleep 2``) through the HTTP API from 4 threads,
   one request per job: jobs per second accepted;
3. run: until every job has ended, counted: each COMPLETED exactly once (restart count 0),
   no node DOWN; the end-to-end rate (first submission to last end), the scheduler's mean
   pass time (/metrics' shoal_scheduler_pass_duration_seconds, over the run), and the heartbeat
   round trips meanwhile;
4. reads: ``--reads`` rounds of the requests plain squeue and sinfo make
   (``GET /jobs?view=queue&form=packed&collapse=true``, ``form=rows`` before stop 38; ``GET /nodes?view=sinfo`` +
   ``GET /partitions``; until 2026-12-07 the whole ``/nodes`` listing and the queue view as
   dicts) with the finished jobs still listed;
5. node-loss wave (``--wave``, on by default): half the nodes busy with whole-node jobs of an
   hour (half of them ``--requeue``), then 5% of all nodes (every 20th, busy or idle) fall
   silent at once (``--hollow-silence``: no heartbeats, no long-polls): seconds until each is
   DOWN and each of their jobs requeued or NODE_FAIL (against two heartbeat timeouts), and,
   counted, no other node DOWN and no other job touched (still RUNNING, restart count 0).

Each size runs ``--rounds`` times, sizes interleaved; the tables give medians. ``--save``
keeps the results as JSON and ``--baseline FILE`` puts an earlier saved run beside them
(before/after a change). Writes the ``## Scale`` section of BENCHMARKS.md.

    .venv/bin/python bench/bench_scale.py                         # 100, 1000, 5000 nodes, 3 rounds
    .venv/bin/python bench/bench_scale.py --sizes 1000 --rounds 1 --profile /tmp/prof  # + py-spy
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks_md import write_section  # bench/ is on sys.path as the script's folder

from bench.bench_foundation import ensure_bytecode, load_average, machine_facts, summarise_raw_profile
from shoal.api_client import Client, ClientError
from shoal.slurm import squeue as squeue_command
from tests.integration.cluster import BIN, free_port, wait_until

SECTION = "## Scale"
GPUS = 8
SCRIPT = "#!/bin/sh\nsleep 2\n"
SINFO_NODES = "/shoal/v1/nodes?view=sinfo"  # as sinfo asks (shoal.cli.sinfo): the keys it reads


def squeue_path() -> str:
    """The request plain ``squeue`` makes (its columns as rows, each array's pending tasks as one)."""
    params = squeue_command.query(squeue_command.parse_args([]))
    return "/shoal/v1/jobs?" + urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


class Hollow:
    """A server and one hollow-agents process, in a temporary directory."""

    def __init__(self, root: Path, nodes: int, env: dict, db: str | None = None,
                 scheduler: dict | None = None, stall_log: Path | None = None, stall_ms: float = 100) -> None:
        self.root, self.nodes, self.env, self.db = root, nodes, env, db
        self.stall_log, self.stall_ms = stall_log, stall_ms  # the server's --stall-log and --stall-ms
        self.scheduler = scheduler or {}  # the cluster file's scheduler settings, beyond the array size
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stats_file = root / "hollow-stats.json"
        self.silence_file = root / "hollow-silence"
        self.procs: list[subprocess.Popen] = []

    def start(self, timeout: float = 300) -> None:
        width = max(2, len(str(self.nodes)))
        conf = {"cluster_name": "scale",
                "partitions": [{"name": "gpu", "nodes": f"hollow[{1:0{width}d}-{self.nodes:0{width}d}]",
                                "default": True}],
                "scheduler": {"max_array_size": 100_001, **self.scheduler}}
        (self.root / "cluster.yaml").write_text(json.dumps(conf))
        join = self.root / "join.token"
        join.write_text("join_scale_benchmark_token")
        py = str(BIN / "python")
        server = subprocess.Popen([py, "-m", "shoal", "server", "--listen", f"127.0.0.1:{self.port}", "--config",
                                   str(self.root / "cluster.yaml"), "--state-dir", str(self.root / "server"),
                                   "--join-token-file", str(join), "--tls", "off",
                                   *(["--db", self.db] if self.db else []),
                                   *(["--stall-log", str(self.stall_log), "--stall-ms", str(self.stall_ms)]
                                     if self.stall_log else [])],
                                  stdout=open(self.root / "server.log", "wb"), stderr=subprocess.STDOUT, env=self.env)
        self.procs.append(server)
        self.server = psutil.Process(server.pid)
        admin = self.root / "server" / "admin.token"
        deadline = time.time() + 60
        while not admin.exists() or not _healthy(self.url):
            if time.time() > deadline or server.poll() is not None:
                raise RuntimeError(f"server did not start: {(self.root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.1)
        self.admin = Client(self.url, admin.read_text().strip(), timeout=120)
        self.admin.job_token = None
        time.sleep(2)  # settled: the empty server's RSS, the base of the per-node growth
        self.empty_rss_mb = self.server.memory_info().rss / 2 ** 20
        hollow = subprocess.Popen([py, "-m", "shoal", "agent", "--hollow", str(self.nodes), "--name", "hollow",
                                   "--server", self.url, "--join-token-file", str(join), "--fake-gpus", str(GPUS),
                                   "--cpus", "128", "--memory", "2T", "--hollow-stats", str(self.stats_file),
                                   "--hollow-silence", str(self.silence_file)],
                                  stdout=open(self.root / "hollow.log", "wb"), stderr=subprocess.STDOUT, env=self.env)
        self.procs.append(hollow)
        self.hollow = hollow
        deadline = time.time() + timeout
        while (self.stats() or {}).get("registered", 0) < self.nodes:
            if time.time() > deadline or hollow.poll() is not None:
                raise RuntimeError(f"hollow nodes did not register: {(self.root / 'hollow.log').read_text()[-2000:]}")
            time.sleep(0.5)

    def stats(self) -> dict | None:
        try:
            return json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            return None

    def fresh_stats(self, after: float) -> dict:
        """The stats file written after ``after`` (it is written every second)."""
        while True:
            st = self.stats()
            if st and st["time"] > after:
                return st
            time.sleep(0.2)

    def metric(self, name: str) -> float:
        text = self.admin.get_bytes("/metrics").decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"))

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def _healthy(url: str) -> bool:
    try:
        Client(url).get("/healthz", timeout=1)
        return True
    except ClientError:
        return False


def window(h: Hollow, seconds: float) -> dict:
    """Server CPU and heartbeats over ``seconds`` of whatever is going on."""
    os.kill(h.hollow.pid, signal.SIGUSR1)  # a new window of report round trips
    t0 = time.time()
    hollow = psutil.Process(h.hollow.pid)
    before, cpu0, hcpu0 = h.fresh_stats(t0), cpu_s(h.server), cpu_s(hollow)
    time.sleep(seconds)
    after, cpu1, hcpu1 = h.fresh_stats(time.time()), cpu_s(h.server), cpu_s(hollow)
    span = after["time"] - before["time"]
    reports = after["reports"] - before["reports"]
    used = cpu1 - cpu0
    lat = after["report_latency_s"]
    return {"reports_per_s": reports / span, "server_cpu_share": used / span, "hollow_cpu_share": (hcpu1 - hcpu0) / span,
            "work_answers_per_s": (after["work_answers"] - before["work_answers"]) / span,
            "heartbeat_interval_s": after.get("heartbeat_interval_s"),
            "cpu_ms_per_report": 1000 * used / reports if reports else float("nan"),
            "report_p50_ms": 1000 * (lat["p50"] or 0), "report_p99_ms": 1000 * (lat["p99"] or 0)}


def _said(phase: str, out: dict) -> None:
    """A phase's figures as soon as it ends: a run stopped later (or one size that does not
    hold) keeps what it measured."""
    print(f"  after {phase}: " + json.dumps(out, default=str), flush=True)


def one_size(nodes: int, jobs: int, idle_s: float, reads: int, env: dict, profile: Path | None,
             db: str | None = None, fill: bool = False, wave: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"scale{nodes}-") as tmp:
        h = Hollow(Path(tmp), nodes, env, db)
        t_start = time.time()
        try:
            h.start()
            out: dict = {"nodes": nodes, "register_s": time.time() - t_start}
            first = h.fresh_stats(time.time()).get("heartbeat_interval_s") or 5.0
            time.sleep(first + 1)  # every node past its first heartbeat
            out["server_rss_mb"] = h.server.memory_info().rss / 2 ** 20
            out["empty_rss_mb"] = h.empty_rss_mb
            spy = _py_spy(h.server.pid, profile / f"idle-{nodes}.txt") if profile else None
            out["idle"] = window(h, idle_s)
            if spy:
                _py_spy_stop(spy)
            _said("registration and idle", out)
            # Submit from 4 threads, one request per job.
            workdir = str(Path(tmp))
            passes0 = (h.metric("shoal_scheduler_pass_duration_seconds_sum"),
                       h.metric("shoal_scheduler_pass_duration_seconds_count"))
            clients = [Client(h.url, h.admin.token, timeout=120) for _ in range(4)]
            for c in clients:
                c.job_token = None
            ids: list[int] = []
            lock = threading.Lock()

            def submit(k: int) -> None:
                c = clients[k]
                mine = []
                for _ in range(k, jobs, 4):
                    mine.append(c.post("/shoal/v1/jobs", {"name": "scale", "script": SCRIPT, "workdir": workdir,
                                                          "gpus_per_node": 1, "stdout": "/dev/null"})["job_id"])
                with lock:
                    ids.extend(mine)

            spy = _py_spy(h.server.pid, profile / f"run-{nodes}.txt") if profile else None
            t0 = time.perf_counter()
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(submit, range(4)))
            out["submit_per_s"] = jobs / (time.perf_counter() - t0)
            os.kill(h.hollow.pid, signal.SIGUSR1)
            cpu0, st0 = cpu_s(h.server), h.fresh_stats(time.time())
            wait_until(lambda: not any(j["state"] in ("PENDING", "RUNNING")
                                       for j in h.admin.get("/shoal/v1/jobs", {"view": "queue"})["jobs"]),
                       600, "every job to end", interval=1)
            took = time.perf_counter() - t0
            st1 = h.fresh_stats(time.time())
            if spy:
                _py_spy_stop(spy)
            out["end_to_end_per_s"] = jobs / took
            out["run"] = {"server_cpu_share": (cpu_s(h.server) - cpu0) / (st1["time"] - st0["time"]),
                          "report_p50_ms": 1000 * (st1["report_latency_s"]["p50"] or 0),
                          "report_p99_ms": 1000 * (st1["report_latency_s"]["p99"] or 0)}
            passes1 = (h.metric("shoal_scheduler_pass_duration_seconds_sum"),
                       h.metric("shoal_scheduler_pass_duration_seconds_count"))
            n_passes = passes1[1] - passes0[1]
            out["passes"] = n_passes
            out["pass_ms"] = 1000 * (passes1[0] - passes0[0]) / n_passes if n_passes else float("nan")
            done = [j for j in h.admin.get("/shoal/v1/jobs", {"all": "true"})["jobs"] if j["job_id"] in set(ids)]
            out["completed"] = sum(1 for j in done if j["state"] == "COMPLETED" and j["restart_count"] == 0)
            out["lost_or_twice"] = jobs - out["completed"]
            out["nodes_down"] = sum(1 for n in h.admin.get("/shoal/v1/nodes")["nodes"] if n["state"] != "UP")
            squeue, sinfo = [], []
            for _ in range(reads):
                t = time.perf_counter()
                h.admin.get(squeue_path())
                squeue.append(time.perf_counter() - t)
                t = time.perf_counter()
                h.admin.get(SINFO_NODES)
                h.admin.get("/shoal/v1/partitions")
                sinfo.append(time.perf_counter() - t)
            out["squeue_p50_ms"], out["squeue_p99_ms"] = 1000 * pct(squeue, 0.5), 1000 * pct(squeue, 0.99)
            out["sinfo_p50_ms"], out["sinfo_p99_ms"] = 1000 * pct(sinfo, 0.5), 1000 * pct(sinfo, 0.99)
            _said("run and reads", out)
            if fill:
                out["fill"] = fill_phase(h, workdir, reads)
            if wave:
                spy = _py_spy(h.server.pid, profile / f"wave-{nodes}.txt") if profile else None
                out["wave"] = wave_phase(h, workdir)
                if spy:
                    _py_spy_stop(spy)
            out["hollow_report_errors"] = (h.stats() or {}).get("report_errors")
            return out
        finally:
            h.stop()


def fill_phase(h: Hollow, workdir: str, reads: int, runtime_s: int = 120) -> dict:
    """Every GPU busy: one array of nodes x 8 single-GPU tasks of ``runtime_s`` each, sinfo
    once none is pending, then until every task has ended. Each start and end wakes its node's
    long-poll, whose answer lists the node's runs: this is where an answer's cost in the
    number of running jobs shows. Counted: every task COMPLETED once (restart count 0), no
    node DOWN."""
    tasks = h.nodes * GPUS

    def live() -> tuple[int, int]:
        jobs = h.admin.get("/shoal/v1/jobs", {"view": "queue"})["jobs"]
        return (sum(1 for j in jobs if j["state"] == "RUNNING"), sum(1 for j in jobs if j["state"] == "PENDING"))

    os.kill(h.hollow.pid, signal.SIGUSR1)
    cpu0, t0 = cpu_s(h.server), time.perf_counter()
    h.admin.post("/shoal/v1/jobs", {"name": "fill", "script": f"#!/bin/sh\nsleep {runtime_s}\n", "workdir": workdir,
                                    "gpus_per_node": 1, "stdout": "/dev/null", "array": f"0-{tasks - 1}"})
    deadline = time.time() + 900
    while live()[1]:
        if time.time() > deadline:
            raise RuntimeError(f"fill: {live()} running/pending after 900 s")
        time.sleep(1)
    out: dict = {"tasks": tasks, "runtime_s": runtime_s, "start_s": time.perf_counter() - t0,
                 "start_cpu_s": cpu_s(h.server) - cpu0, "running_at_full": live()[0]}
    st = h.fresh_stats(time.time())
    out["start_report_p99_ms"] = 1000 * (st["report_latency_s"]["p99"] or 0)
    sinfo = []
    for _ in range(reads):
        t = time.perf_counter()
        h.admin.get(SINFO_NODES)
        h.admin.get("/shoal/v1/partitions")
        sinfo.append(time.perf_counter() - t)
    out["sinfo_p50_ms"], out["sinfo_p99_ms"] = 1000 * pct(sinfo, 0.5), 1000 * pct(sinfo, 0.99)
    while sum(live()):
        if time.time() > deadline + runtime_s:
            raise RuntimeError(f"fill: {live()} still live")
        time.sleep(1)
    out["all_s"], out["all_cpu_s"] = time.perf_counter() - t0, cpu_s(h.server) - cpu0
    done = [j for j in h.admin.get("/shoal/v1/jobs", {"all": "true"})["jobs"] if j["name"] == "fill"]
    out["lost_or_twice"] = tasks - sum(1 for j in done if j["state"] == "COMPLETED" and j["restart_count"] == 0)
    out["nodes_down"] = sum(1 for n in h.admin.get("/shoal/v1/nodes")["nodes"] if n["state"] != "UP")
    return out


HEARTBEAT_TIMEOUT_S = 60.0  # the server's default, which this benchmark keeps


def wave_phase(h: Hollow, workdir: str, share: float = 0.05) -> dict:
    """A node-loss wave: half the nodes busy with whole-node jobs of an hour (half of those
    ``--requeue``), then ``share`` of all nodes (every 20th, busy or idle) silenced at once.
    Timed from the silence: the last silent node DOWN, the last of their jobs requeued or
    NODE_FAIL. Counted: silent nodes not DOWN, other nodes DOWN, other jobs no longer in
    their first run."""
    busy = max(2, h.nodes // 2)
    ids = []
    for requeue in (True, False):
        job = h.admin.post("/shoal/v1/jobs", {"name": "wave", "script": "#!/bin/sh\nsleep 3600\n",
                                              "workdir": workdir, "gpus_per_node": GPUS, "exclusive": True,
                                              "stdout": "/dev/null", "requeue": requeue,
                                              "array": f"0-{busy // 2 - 1}"})
        ids.append(job["job_id"])
    t0 = time.time()

    def wave_jobs() -> dict[int, dict]:
        return {j["job_id"]: j for j in h.admin.get("/shoal/v1/jobs", {"all": "true"})["jobs"] if j["name"] == "wave"}

    deadline = t0 + 600
    while True:
        jobs = wave_jobs()
        if len(jobs) == 2 * (busy // 2) and all(j["state"] == "RUNNING" for j in jobs.values()):
            break
        if time.time() > deadline:
            raise RuntimeError("wave: the jobs did not all start in 600 s")
        time.sleep(1)
    started_s = time.time() - t0
    names = sorted(n["name"] for n in h.admin.get("/shoal/v1/nodes")["nodes"])
    silent = set(names[::round(1 / share)])
    held = {jid: {n["name"] for n in j["allocation"]["nodes"]} for jid, j in jobs.items()}
    hit = {jid for jid, on in held.items() if on & silent}
    cpu0 = cpu_s(h.server)
    t1 = time.time()
    h.silence_file.write_text(",".join(sorted(silent)))
    down_s = jobs_s = None
    while time.time() - t1 < 3 * HEARTBEAT_TIMEOUT_S:
        time.sleep(1)
        down = {n["name"] for n in h.admin.get("/shoal/v1/nodes")["nodes"] if n["state"] == "DOWN"}
        if down_s is None and silent <= down:
            down_s = time.time() - t1
        jobs = wave_jobs()
        handled = {jid for jid in hit if jobs[jid]["restart_count"] >= 1 or jobs[jid]["state"] == "NODE_FAIL"}
        if jobs_s is None and handled == hit:
            jobs_s = time.time() - t1
        if down_s is not None and jobs_s is not None:
            break
    cpu = cpu_s(h.server) - cpu0
    jobs = wave_jobs()
    return {"nodes_silenced": len(silent), "busy_nodes": 2 * (busy // 2), "start_s": started_s,
            "jobs_hit": len(hit), "requeued": sum(1 for jid in hit if jobs[jid]["restart_count"] >= 1),
            "node_fail": sum(1 for jid in hit if jobs[jid]["state"] == "NODE_FAIL"),
            "down_s": down_s, "jobs_s": jobs_s, "timeout_s": HEARTBEAT_TIMEOUT_S, "server_cpu_s": cpu,
            "silent_not_down": len(silent - down), "others_down": len(down - silent),
            "others_touched": sum(1 for jid, j in jobs.items() if jid not in hit
                                  and (j["state"] != "RUNNING" or j["restart_count"] != 0))}


def _py_spy(pid: int, path: Path):
    spy = BIN / "py-spy"
    if not spy.exists():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", "100", "--format", "raw",
                          "--nonblocking", "--gil", "--output", str(path)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p, path


def _py_spy_stop(spy) -> None:
    p, path = spy
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
    if path.exists():
        print(f"  profile {path}:")
        for line in summarise_raw_profile(path, top=20):
            print(f"    {line}")


# ---------------------------------------------------------------------- report

ROWS = [  # (label, how to read it from a result, format)
    ("heartbeat interval the server gives (s)", lambda r: r["idle"]["heartbeat_interval_s"], "{:g}"),
    ("server RSS after registration (MiB)", lambda r: r["server_rss_mb"], "{:.0f}"),
    ("server RSS growth per node, over an empty server (KiB)",
     lambda r: 1024 * (r["server_rss_mb"] - r["empty_rss_mb"]) / r["nodes"], "{:.0f}"),
    ("idle: heartbeats per second", lambda r: r["idle"]["reports_per_s"], "{:.0f}"),
    ("idle: long-poll answers per second", lambda r: r["idle"]["work_answers_per_s"], "{:.0f}"),
    ("idle: server CPU per heartbeat (ms)", lambda r: r["idle"]["cpu_ms_per_report"], "{:.2f}"),
    ("idle: server CPU (share of one core)", lambda r: 100 * r["idle"]["server_cpu_share"], "{:.1f}%"),
    ("idle: the hollow nodes' process CPU (share of one core)", lambda r: 100 * r["idle"]["hollow_cpu_share"],
     "{:.1f}%"),
    ("idle: heartbeat round trip p50 (ms)", lambda r: r["idle"]["report_p50_ms"], "{:.1f}"),
    ("idle: heartbeat round trip p99 (ms)", lambda r: r["idle"]["report_p99_ms"], "{:.1f}"),
    ("submit: jobs accepted per second (4 threads)", lambda r: r["submit_per_s"], "{:.0f}"),
    ("run: jobs submitted and ended per second", lambda r: r["end_to_end_per_s"], "{:.0f}"),
    ("run: scheduling pass, mean (ms)", lambda r: r["pass_ms"], "{:.1f}"),
    ("run: server CPU (share of one core)", lambda r: 100 * r["run"]["server_cpu_share"], "{:.0f}%"),
    ("run: heartbeat/exit report round trip p50 (ms)", lambda r: r["run"]["report_p50_ms"], "{:.1f}"),
    ("run: heartbeat/exit report round trip p99 (ms)", lambda r: r["run"]["report_p99_ms"], "{:.1f}"),
    ("reads: squeue (`GET /jobs?view=queue&form=packed...`) p50 (ms)", lambda r: r["squeue_p50_ms"], "{:.1f}"),
    ("reads: squeue p99 (ms)", lambda r: r["squeue_p99_ms"], "{:.1f}"),
    ("reads: sinfo (`GET /nodes?view=sinfo` + `/partitions`) p50 (ms)", lambda r: r["sinfo_p50_ms"], "{:.1f}"),
    ("reads: sinfo p99 (ms)", lambda r: r["sinfo_p99_ms"], "{:.1f}"),
    ("jobs lost or run twice / nodes DOWN", lambda r: (r["lost_or_twice"], r["nodes_down"]), None),
    ("wave: nodes silenced at once (5%) / of them busy / their jobs requeued / NODE_FAIL",
     lambda r: (r["wave"]["nodes_silenced"], r["wave"]["jobs_hit"], r["wave"]["requeued"], r["wave"]["node_fail"]),
     None),
    ("wave: seconds from the silence to the last silent node DOWN (timeout 60 s)",
     lambda r: r["wave"]["down_s"], "{:.0f}"),
    ("wave: seconds to the last of their jobs requeued or failed (target: under 120)",
     lambda r: r["wave"]["jobs_s"], "{:.0f}"),
    ("wave: server CPU from the silence until then (s)", lambda r: r["wave"]["server_cpu_s"], "{:.1f}"),
    ("wave: silent nodes not DOWN / other nodes DOWN / other jobs touched",
     lambda r: (r["wave"]["silent_not_down"], r["wave"]["others_down"], r["wave"]["others_touched"]), None),
    ("fill: every GPU busy (one array, nodes x 8 tasks of 120 s): seconds until none pending",
     lambda r: r["fill"]["start_s"], "{:.0f}"),
    ("fill: server CPU per task started (ms)", lambda r: 1000 * r["fill"]["start_cpu_s"] / r["fill"]["tasks"],
     "{:.2f}"),
    ("fill: heartbeat/exit report round trip p99 while starting (ms)",
     lambda r: r["fill"]["start_report_p99_ms"], "{:.1f}"),
    ("fill: sinfo with every GPU busy p50 (ms)", lambda r: r["fill"]["sinfo_p50_ms"], "{:.1f}"),
    ("fill: seconds from the submission until every task ended", lambda r: r["fill"]["all_s"], "{:.0f}"),
    ("fill: server CPU per task, started and ended (ms)",
     lambda r: 1000 * r["fill"]["all_cpu_s"] / r["fill"]["tasks"], "{:.2f}"),
    ("fill: tasks lost or run twice / nodes DOWN",
     lambda r: (r["fill"]["lost_or_twice"], r["fill"]["nodes_down"]), None),
]


def _median(results: list[dict], get):
    values = [get(r) for r in results]
    if isinstance(values[0], tuple):
        return tuple(max(v[i] for v in values) for i in range(len(values[0])))  # worst, not median
    return statistics.median(values)


def _fmt(value, fmt) -> str:
    if fmt is None:
        return " / ".join(str(v) for v in value)
    return fmt.format(value)


def table(results: dict[int, list[dict]], baseline: dict[int, list[dict]] | None) -> list[str]:
    sizes = sorted(results)
    head = "| | " + " | ".join(
        (f"{n} nodes before | {n} nodes after" if baseline and n in baseline else f"{n} nodes") for n in sizes) + " |"
    cols = sum(2 if baseline and n in baseline else 1 for n in sizes)
    lines = [head, "|---|" + "---:|" * cols]
    for label, get, fmt in ROWS:
        cells = []
        for n in sizes:
            for runs in ([baseline[n]] if baseline and n in baseline else []) + [results[n]]:
                try:
                    cells.append(_fmt(_median(runs, get), fmt))
                except (KeyError, TypeError):  # a figure an older run did not take
                    cells.append("-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _load(path: Path) -> dict:
    """A --save file: {"meta": ..., "results": {size: [round, ...]}} (or the bare results)."""
    doc = json.loads(path.read_text())
    if "results" not in doc:
        doc = {"meta": None, "results": doc}
    doc["results"] = {int(n): rs for n, rs in doc["results"].items()}
    return doc


def render(meta: dict, args, results, baseline, note: str) -> str:
    facts, command = meta["facts"], meta["command"]
    out = [SECTION, "",
           f"One server ({meta.get('store', 'SQLite')}) and one `shoal agent --hollow N` process of N hollow nodes x {GPUS} fake GPUs "
           "on the same machine: the nodes register, heartbeat at the interval the server gives (its default), "
           "long-poll their work and report their "
           "runs' ends exactly as `shoal agent` does (same client, same requests: `shoal.agent.wire`), but run "
           "nothing. Server CPU is its process's CPU time; round trips are timed by the hollow nodes. "
           f"Medians of {args.rounds} round(s) per size, sizes interleaved; lost/twice and DOWN are the worst "
           "round. See docs/SCALE.md for what each figure means and what changed.", "",
           f"- machine: {facts['CPU']}, {facts['Cores']} cores (shared with other work: see the load), "
           f"{facts['Memory']}; {facts['OS']}; {facts['Python']}; Shoal {facts['Shoal commit']}",
           f"- when: {meta.get('when', '?')}; load average before {meta['load_before']}, after "
           f"{meta.get('load_after', '?')}; wall {meta.get('wall_s', float('nan')):.0f} s",
           f"- command: `{command}`",
           f"- per size: {args.idle_s:g} s idle window, {args.jobs} jobs (`sleep 2`, 1 GPU each, from 4 threads), "
           f"{args.reads} read rounds" + ("; then the node-loss wave (half the nodes busy with whole-node jobs, "
                                          "5% of all nodes silenced)" if args.wave else ""),
           ]
    if baseline:
        out.append(f"- before: {note}")
    out += ["", *table(results, baseline), ""]
    return "\n".join(out)


def _postgres():
    """A PostgreSQL server for the run, as the tests start one (a database per size)."""
    import secrets

    from tests.integration.postgres import PostgresServer, _system_user, find_postgres_bin

    bindir = find_postgres_bin()
    if bindir is None:
        raise SystemExit("--postgres: PostgreSQL is not installed (apt-get install -y postgresql)")
    root = Path(tempfile.mkdtemp(prefix="scale-pg-"))
    os.chmod(root, 0o700)
    pg = PostgresServer(bindir=bindir, root=root, port=free_port(), password=secrets.token_hex(16),
                        run_as=_system_user())
    pg._chown(root)
    pg.start()
    return pg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2000)
    # Hollow nodes that registered together renew their long-polls together: a window of one
    # long-poll wait (wire.WORK_WAIT_S) sees each node renew once, whatever the phase.
    ap.add_argument("--idle-s", type=float, default=55.0)
    ap.add_argument("--reads", type=int, default=30)
    ap.add_argument("--save", type=Path, help="keep the results as JSON")
    ap.add_argument("--baseline", type=Path, help="an earlier --save, shown beside these as 'before'")
    ap.add_argument("--baseline-note", default="the same benchmark on the code before the change",
                    help="what the baseline was")
    ap.add_argument("--no-write", action="store_true", help="print, but leave BENCHMARKS.md alone")
    ap.add_argument("--profile", type=Path, help="py-spy the server (idle and run phases) into this folder")
    ap.add_argument("--results", type=Path, help="render an earlier --save instead of running")
    ap.add_argument("--fill", action="store_true",
                    help="then fill every GPU (one array job of nodes x 8 long tasks), read, and cancel it")
    ap.add_argument("--no-wave", dest="wave", action="store_false", help="skip the node-loss wave")
    ap.add_argument("--postgres", action="store_true",
                    help="store on a PostgreSQL server started for the run (tests/integration/postgres.py)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    command = "python bench/bench_scale.py " + shlex.join(sys.argv[1:])
    ensure_bytecode()
    facts = machine_facts()
    args.load_before = load_average()
    env = {**os.environ, "SHOAL_LOG_LEVEL": "WARNING"}
    for k in ("SHOAL_CONFIG", "SHOAL_SERVER", "SHOAL_TOKEN", "SHOAL_JOB_TOKEN"):
        env.pop(k, None)
    results: dict[int, list[dict]] = {n: [] for n in sizes}
    t0 = time.time()
    meta = {"command": command, "load_before": args.load_before, "facts": facts,
            "store": "PostgreSQL, fsync off as the tests run it" if args.postgres else "SQLite"}
    pg = _postgres() if args.postgres and not args.results else None
    if args.results:
        saved = _load(args.results)
        results, meta = saved["results"], saved["meta"] or meta
        args.rounds = len(next(iter(results.values())))
    for rnd in range(0 if args.results else args.rounds):
        for n in sizes:
            print(f"round {rnd + 1}/{args.rounds}: {n} hollow nodes ...", flush=True)
            r = one_size(n, args.jobs, args.idle_s, args.reads, env, args.profile,
                         pg.create_database() if pg else None, args.fill, args.wave)
            print("  " + json.dumps(r), flush=True)
            results[n].append(r)
    if not args.results:
        meta.update(wall_s=time.time() - t0, load_after=load_average(),
                    when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    if pg is not None:
        pg.stop()
        shutil.rmtree(pg.root, ignore_errors=True)
    if args.save:
        args.save.write_text(json.dumps({"meta": meta, "results": {str(n): rs for n, rs in results.items()}},
                                        indent=1))
    baseline = _load(args.baseline)["results"] if args.baseline else None
    text = render(meta, args, results, baseline, args.baseline_note)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
