"""Hollow agents: many fake nodes in one process, as Kubernetes' kubemark runs hollow kubelets.

Each hollow node registers, long-polls its work, heartbeats and reports exits through the
same client (``shoal.api_client``) and the same requests (``agent.wire``) as ``shoal agent``,
at the rate the server asks for; only the node is fake: fake GPUs (the fake NVML's
inventory and labels), no processes. A batch run "runs" for the seconds its script's
``sleep`` commands add up to (``--wrap 'sleep 30'``), or ``SHOAL_HOLLOW_RUNTIME`` from its
environment (a trace's runtime), or the default, then exits 0 (the script's last ``exit N``
gives its code); a run the server lists for killing, or stops listing, ends at once by
SIGTERM. Pods and srun steps are not run.

A node can be silenced (``HollowFleet.silence``; ``shoal agent --hollow N --hollow-silence
FILE``): it stops heartbeating and long-polling, as a node that hangs or falls off the
network, runs' ends included, until it is woken; a benchmark's node-loss wave.

Threads: one per node for the long-poll (a blocked socket costs no CPU), one clock for
heartbeats and runs' ends, and a few reporters that send whichever node's report is due.
"""

from __future__ import annotations

import heapq
import logging
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from shoal.agent import wire
from shoal.api_client import Client, ClientError

log = logging.getLogger("shoal.hollow")

DEFAULT_RUNTIME_S = 1.0
RUNTIME_ENV = "SHOAL_HOLLOW_RUNTIME"
SIGTERM = 15
_SLEEP = re.compile(r"(?:^|[;&|\s])sleep\s+([0-9.]+)([smhd]?)(?=$|[\s;&|])", re.MULTILINE)
_EXIT = re.compile(r"(?:^|[;&|\s])exit\s+([0-9]+)\s*$", re.MULTILINE)
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
LATENCIES_KEPT = 20_000  # the last reports' round trips, for the percentiles


def run_length(batch: dict, default_s: float) -> tuple[float, int]:
    """How long a hollow run lasts and the code it exits with, from its batch entry."""
    env = batch.get("environment") or {}
    exit_code = 0
    script = batch.get("script") or ""
    codes = _EXIT.findall(script)
    if codes:
        exit_code = int(codes[-1]) % 256
    if env.get(RUNTIME_ENV):
        try:
            return max(0.0, float(env[RUNTIME_ENV])), exit_code
        except ValueError:
            pass
    sleeps = _SLEEP.findall(script)
    if sleeps:
        return sum(float(n) * _UNIT[u] for n, u in sleeps), exit_code
    return default_s, exit_code


@dataclass
class HollowRun:
    key: str
    job_id: int
    run: int
    ends: float | None  # None: not alive here (ended, or a multi-node job's other nodes)
    exit_code: int = 0


@dataclass
class HollowStats:
    """What the hollow nodes did, for benchmarks: counts and report round trips."""

    registered: int = 0
    reports: int = 0
    report_errors: int = 0
    work_answers: int = 0
    work_errors: int = 0
    runs_started: int = 0
    runs_ended: int = 0
    runs_killed: int = 0
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCIES_KEPT))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def as_json(self) -> dict:
        with self.lock:
            lat = sorted(self.latencies)
            out = {k: getattr(self, k) for k in ("registered", "reports", "report_errors", "work_answers",
                                                 "work_errors", "runs_started", "runs_ended", "runs_killed")}
        out["report_latency_s"] = {"n": len(lat), "p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99),
                                   "max": lat[-1] if lat else None}
        return out

    def reset_latencies(self) -> None:
        """A new window of round trips. Called from a signal handler, so it takes no lock:
        the handler runs in the main thread, which may be holding it in ``as_json`` (a
        benchmark's SIGUSR1 then hung the hollow process). The deque is replaced whole; a
        round trip a reporter adds to the old one meanwhile belongs to the window before."""
        self.latencies = deque(maxlen=LATENCIES_KEPT)


def _pct(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


@dataclass
class NodeSpec:
    """What a hollow node says of itself at registration."""

    name: str
    address: str
    port: int
    cpus: int
    memory_mb: int
    gpus: list[dict]
    labels: dict[str, str]
    features: list[str]


class HollowNode:
    def __init__(self, spec: NodeSpec, fleet: "HollowFleet") -> None:
        self.spec = spec
        self.fleet = fleet
        self.client = Client(fleet.server, fleet.join_token, timeout=wire.WORK_TIMEOUT_S, ca_file=fleet.ca_file,
                             keep_alive=True)
        self.client.job_token = None
        self.lock = threading.Lock()
        self.runs: dict[str, HollowRun] = {}
        self.pending: list[dict] = []  # exit events not yet accepted by the server
        self.registered = threading.Event()
        self.heartbeat_interval = 5.0
        self.due = 0.0  # when its next heartbeat is due (monotonic); earlier heap entries are stale
        self.queued = False  # in the reporters' queue
        self.awake = threading.Event()  # cleared: silenced, it sends nothing
        self.awake.set()

    def alive_keys(self) -> list[str]:
        with self.lock:
            return sorted(k for k, r in self.runs.items() if r.ends is not None)

    def register(self) -> None:
        s = self.spec
        with self.lock:
            events = list(self.pending)
        body = wire.register_body(name=s.name, address=s.address, port=s.port, cpus=s.cpus, memory_mb=s.memory_mb,
                                  gpus=s.gpus, labels=s.labels, features=s.features,
                                  boot_time=self.fleet.boot_time, alive=self.alive_keys(), taints=[], events=events)
        self.client.token = self.fleet.join_token
        reply = self.client.post(wire.REGISTER, body)
        self.client.token = reply["credential"]
        self.heartbeat_interval = float(reply["heartbeat_interval_s"])
        self._accepted(events)
        with self.fleet.stats.lock:
            self.fleet.stats.registered += 1
        self.registered.set()

    def work_loop(self) -> None:
        fleet = self.fleet
        delay = 0.2
        while not fleet.stop.is_set():
            try:
                with fleet.registering:
                    self.register()
                break
            except ClientError as e:
                if e.status in (401, 403, 422):
                    log.error("%s: registration refused: %s", self.spec.name, e)
                    return
                fleet.stop.wait(delay * (1 + random.random()))
                delay = min(delay * 2, 5.0)
        fleet.schedule_report(self, time.monotonic() + self.heartbeat_interval * random.random())
        epoch, gen, failures = None, None, 0
        while not fleet.stop.is_set():
            if not self.awake.wait(1.0):
                continue
            try:
                work = self.client.get(wire.work_path(self.spec.name), wire.work_params(epoch, gen),
                                       timeout=wire.WORK_TIMEOUT_S)
                failures = 0
            except ClientError as e:
                failures += 1
                with fleet.stats.lock:
                    fleet.stats.work_errors += 1
                if e.status in (401, 403, 404):
                    try:
                        self.register()
                    except ClientError:
                        pass
                fleet.stop.wait(min(0.2 * 2 ** failures, 5.0))
                epoch = None
                continue
            if not self.awake.is_set():
                continue  # silenced while it waited: a hung node acts on nothing
            with fleet.stats.lock:
                fleet.stats.work_answers += 1
            epoch, gen = work["epoch"], work["gen"]
            self.reconcile(work)

    def reconcile(self, work: dict) -> None:
        now = time.monotonic()
        started, ended = [], []
        listed = {r["key"] for r in work["runs"]}
        kill = {k["key"] for k in work["kill"]}
        with self.lock:
            for entry in work["runs"]:
                if entry["key"] in self.runs or "pod" in entry:
                    continue
                batch = entry.get("batch")
                ends, code = None, 0
                if batch is not None:
                    length, code = run_length(batch, self.fleet.default_runtime_s)
                    ends = now + length
                    started.append((ends, entry["key"]))
                self.runs[entry["key"]] = HollowRun(entry["key"], entry["job_id"], entry["run"], ends, code)
            for key, run in list(self.runs.items()):
                if (key in kill or key not in listed) and run.ends is not None:
                    run.ends = None  # killed: TERM ends a hollow run at once
                    ended.append(run)
                    self.pending.append({**wire.exit_event(key, run.job_id, run.run, 0, SIGTERM, time.time()),
                                         "killed": True})
                if key not in listed and key not in kill:
                    del self.runs[key]  # ended here and done with on the server
        for ends, key in started:
            self.fleet.at(ends, self, key)
        stats = self.fleet.stats
        with stats.lock:
            stats.runs_started += len(started)
            stats.runs_killed += len(ended)
        if ended or kill:  # the server hears promptly that they are gone
            self.fleet.report_now(self)

    def run_ended(self, key: str) -> None:
        """A run's time is up: it exits, and the server hears at once."""
        with self.lock:
            run = self.runs.get(key)
            if run is None or run.ends is None:
                return  # killed meanwhile
            run.ends = None  # no longer alive here; the server's next work stops listing it
            self.pending.append(wire.exit_event(key, run.job_id, run.run, run.exit_code, 0, time.time()))
        with self.fleet.stats.lock:
            self.fleet.stats.runs_ended += 1
        self.fleet.report_now(self)

    def report(self) -> None:
        with self.lock:
            events = list(self.pending)
        body = wire.report_body(events, self.alive_keys(), [], [], self.fleet.usage(self))
        t0 = time.perf_counter()
        self.client.post(wire.report_path(self.spec.name), body, timeout=wire.REPORT_TIMEOUT_S)
        took = time.perf_counter() - t0
        self._accepted(events)
        stats = self.fleet.stats
        with stats.lock:
            stats.reports += 1
            stats.latencies.append(took)

    def _accepted(self, sent: list[dict]) -> None:
        if sent:
            ids = {id(e) for e in sent}
            with self.lock:
                self.pending = [e for e in self.pending if id(e) not in ids]


class HollowFleet:
    """N hollow nodes against one server (or several, comma-separated)."""

    def __init__(self, server: str, join_token: str, specs: list[NodeSpec], *, ca_file: str | None = None,
                 default_runtime_s: float = DEFAULT_RUNTIME_S, reporters: int | None = None,
                 registering: int = 32) -> None:
        self.server = server
        self.join_token = join_token
        self.ca_file = ca_file
        self.default_runtime_s = default_runtime_s
        self.boot_time = time.time()
        self.stats = HollowStats()
        self.stop = threading.Event()
        self.registering = threading.BoundedSemaphore(registering)  # registrations in flight at once
        self.nodes = [HollowNode(s, self) for s in specs]
        self._heap: list[tuple[float, int, HollowNode, str | None]] = []  # (when, tie, node, run key or None)
        self._tie = 0
        self._heap_lock = threading.Condition()
        self._due: deque[HollowNode] = deque()
        self._due_lock = threading.Condition()
        # Reports in flight at once: enough that a slow server (a second per answer) still
        # hears every node once per interval, as N agents of their own would be heard.
        self._reporters = reporters or max(8, len(specs) // 50)

    # ---------------------------------------------------------------- timers

    def at(self, when: float, node: HollowNode, key: str | None) -> None:
        """At ``when`` (monotonic): the run ``key`` ends, or (None) the node's heartbeat is due."""
        with self._heap_lock:
            self._tie += 1
            heapq.heappush(self._heap, (when, self._tie, node, key))
            if self._heap[0][1] == self._tie:
                self._heap_lock.notify()

    def schedule_report(self, node: HollowNode, when: float) -> None:
        node.due = when
        self.at(when, node, None)

    def report_now(self, node: HollowNode) -> None:
        with self._due_lock:
            if not node.queued:
                node.queued = True
                self._due.append(node)
                self._due_lock.notify()

    def _clock(self) -> None:
        while not self.stop.is_set():
            with self._heap_lock:
                now = time.monotonic()
                if not self._heap or self._heap[0][0] > now:
                    self._heap_lock.wait(min(1.0, self._heap[0][0] - now) if self._heap else 1.0)
                    continue
                _, _, node, key = heapq.heappop(self._heap)
            if key is not None:
                node.run_ended(key)
            elif node.due <= time.monotonic() + 1e-3:
                self.report_now(node)

    def _reporter(self) -> None:
        while not self.stop.is_set():
            with self._due_lock:
                while not self._due and not self.stop.is_set():
                    self._due_lock.wait(1.0)
                if self.stop.is_set():
                    return
                node = self._due.popleft()
                node.queued = False
            if not node.awake.is_set():  # silenced: its heartbeat is due again, not sent
                self.schedule_report(node, time.monotonic() + node.heartbeat_interval)
                continue
            try:
                node.report()
                self.schedule_report(node, time.monotonic() + node.heartbeat_interval)
            except ClientError as e:
                with self.stats.lock:
                    self.stats.report_errors += 1
                if e.status in (401, 403, 404):
                    try:
                        node.register()
                    except ClientError:
                        pass
                self.schedule_report(node, time.monotonic() + 0.5)

    def silence(self, names: set[str]) -> None:
        """Silence the nodes named (no heartbeats, no long-polls) and wake every other one."""
        for node in self.nodes:
            if node.spec.name in names:
                node.awake.clear()
            elif not node.awake.is_set():
                node.awake.set()
                self.report_now(node)  # back: it reports at once, its runs' ends included

    def usage(self, node: HollowNode) -> dict:
        """The heartbeat's usage sample, as a real agent sends it once per heartbeat (idle GPUs:
        nothing really runs on them)."""
        return {"gpu_util": {str(g["index"]): 0.0 for g in node.spec.gpus}}

    # ---------------------------------------------------------------- life

    def start(self) -> None:
        threading.stack_size(512 * 1024)  # a thousand long-polls: their stacks need little
        threading.Thread(target=self._clock, name="hollow-clock", daemon=True).start()
        for i in range(self._reporters):
            threading.Thread(target=self._reporter, name=f"hollow-report-{i}", daemon=True).start()
        for node in self.nodes:
            threading.Thread(target=node.work_loop, name=f"hollow-{node.spec.name}", daemon=True).start()

    def wait_registered(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(n.registered.wait(max(0.0, deadline - time.monotonic())) for n in self.nodes)

    def shutdown(self) -> None:
        self.stop.set()
        with self._heap_lock:
            self._heap_lock.notify_all()
        with self._due_lock:
            self._due_lock.notify_all()


def node_specs(names: list[str], *, gpus: int, gpu_model: str, cpus: int, memory_mb: int, address: str,
               port: int, labels: dict[str, str], features: list[str]) -> list[NodeSpec]:
    """The nodes' registrations: each with its own fake GPUs (seeded by its name, as a real
    agent's ``--fake-gpus``), their GFD labels and the GPU type as a feature."""
    from shoal.agent.gpus import discover_gpus_or_none, fake_nvml_from_flags
    from shoal.agent.labels import gpu_labels, gpu_type, merge_labels

    out = []
    for name in names:
        inv = discover_gpus_or_none(fake_nvml_from_flags(gpus, gpu_model, seed=name)) if gpus else None
        node_labels = dict(labels)
        node_features = set(features)
        gpu_list: list[dict] = []
        if inv is not None and inv.gpus:
            gpu_list = [g.__dict__ for g in inv.gpus]
            node_labels = merge_labels(gpu_labels(inv.gpus, inv.driver_version, inv.cuda_version,
                                                  compute_capability=inv.compute_capabilities[0]
                                                  if inv.compute_capabilities else None), labels)
            node_features |= {gpu_type(g.product) for g in inv.gpus}
        out.append(NodeSpec(name, address, port, cpus, memory_mb, gpu_list, node_labels, sorted(node_features)))
    return out

