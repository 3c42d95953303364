"""The server's Prometheus metrics (``GET /metrics``), listed in docs/METRICS.md.

Two kinds, as Prometheus' instrumentation guide asks: state (jobs by state, resources per
node and partition, agents, Deployments) is read from the store when Prometheus scrapes,
by :class:`ClusterCollector`, so it is never out of step with what squeue and sinfo show
and costs nothing between scrapes; events (a job's start and end, a scheduling pass, a
preemption, an HPA decision, a request, a commit) are counted where they happen. Events
inside a transaction are counted once it commits (``after_commit``), so a retried or
rolled-back transaction counts nothing.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy import event, func, select

from shoal import __version__
from shoal.model.exposition import label_set
from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.server.running import Running
from shoal.store.models import CleanupRow, JobRow, NodeRow, ObjectRow

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics", "NodeUse", "node_use", "partition_use"]

_MiB = 1024 * 1024
_INF = float("inf")
# Queue waits and run times of batch jobs span seconds to days.
_JOB_SECONDS = (1, 5, 15, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400)
_REQUEST_SECONDS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)
_JOB_COUNTS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


@dataclass
class NodeUse:
    """One node's resources at one moment, split as sinfo's CPUS(A/I/O/T) splits CPUs:
    allocated, idle (free on a node that takes work) and drained (free on a DRAIN or DOWN node)."""

    state: str
    gpu_model: str
    total: dict[str, int]  # resource -> amount (gpus, cpus, memory in bytes)
    allocated: dict[str, int] = field(default_factory=lambda: {"gpus": 0, "cpus": 0, "memory": 0})

    def split(self, resource: str) -> dict[str, int]:
        """allocated and idle (an UP node) or allocated and drained (any other): a node's free
        resources are one or the other, and the series that is always 0 is left out (a third
        fewer series from a big cluster, whose text is mostly per-node series)."""
        used = min(self.allocated[resource], self.total[resource])
        free = self.total[resource] - used
        return {"allocated": used, "idle" if self.state == NodeState.UP.value else "drained": free}


def node_use(nodes: Iterable[tuple[str, str, int, int, list]],
             holds: Iterable[tuple[str, int, int, int]]) -> dict[str, NodeUse]:
    """Each node's use from its (name, state, cpus, memory_mb, gpus) and the holds on it
    (node, cpus, memory_mb, gpu count) of running jobs and of ended jobs still cleaning up."""
    out = {name: NodeUse(state, (gpus[0].get("product") or "") if gpus else "",
                         {"gpus": len(gpus), "cpus": cpus, "memory": memory_mb * _MiB})
           for name, state, cpus, memory_mb, gpus in nodes}
    for node, cpus, memory_mb, ngpus in holds:
        use = out.get(node)
        if use is not None:
            use.allocated["gpus"] += ngpus
            use.allocated["cpus"] += cpus
            use.allocated["memory"] += memory_mb * _MiB
    return out


def partition_use(use: dict[str, NodeUse], partitions) -> dict[str, dict[str, dict[str, int]]]:
    """partition -> resource -> allocated/idle/drained, summed over its nodes (a node in two
    partitions counts in both, as sinfo lists it under both)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for p in partitions:
        sums = {r: {"allocated": 0, "idle": 0, "drained": 0} for r in ("gpus", "cpus", "memory")}
        for name in p.nodes:
            if name in use:
                for r, split in sums.items():
                    for k, v in use[name].split(r).items():
                        split[k] += v
        out[p.name] = sums
    return out


class CycleStats:
    """One kind of scheduling pass, as sdiag reports it: counts, last and longest, sums."""

    def __init__(self) -> None:
        self.count = self.started = self.depth_sum = self.queue_sum = 0
        self.last_s = self.max_s = self.sum_s = 0.0
        self.last_depth = self.last_queue = 0
        self.last_when: float | None = None

    def add(self, seconds: float, depth: int, started: int, queue: int, when: float) -> None:
        self.count += 1
        self.started += started
        self.last_s, self.max_s, self.sum_s = seconds, max(self.max_s, seconds), self.sum_s + seconds
        self.last_depth, self.depth_sum = depth, self.depth_sum + depth
        self.last_queue, self.queue_sum = queue, self.queue_sum + queue
        self.last_when = when

    def public(self) -> dict:
        return {"count": self.count, "started": self.started, "last_s": self.last_s, "max_s": self.max_s,
                "sum_s": self.sum_s, "last_depth": self.last_depth, "depth_sum": self.depth_sum,
                "last_queue": self.last_queue, "queue_sum": self.queue_sum, "last_when": self.last_when}


class ServerMetrics:
    """The server's registry: event counters and histograms, and the collector of state."""

    def __init__(self, server) -> None:
        # The *_created series (OpenMetrics' start times) would double the text Prometheus
        # reads at every scrape, for a value no query of ours uses.
        disable_created_metrics()
        self.server = server
        self.registry = CollectorRegistry(auto_describe=False)
        # sdiag's figures since this server started: its passes, quick (Slurm's main scheduler)
        # and full (backfill, which plans start times).
        self.since = time.time()
        self.cycles = {"quick": CycleStats(), "full": CycleStats()}
        r = self.registry
        self.requests = Histogram("shoal_http_request_duration_seconds",
                                  "API requests by method, route template and status code.",
                                  ["method", "route", "code"], buckets=_REQUEST_SECONDS, registry=r)
        self.commits = Histogram("shoal_store_commit_duration_seconds",
                                 "Store transactions' flush and commit.", buckets=_REQUEST_SECONDS, registry=r)
        self.passes = Histogram("shoal_scheduler_pass_duration_seconds",
                                "Scheduling passes (full: backfill plans start times; quick: in between).",
                                ["pass"], buckets=_REQUEST_SECONDS, registry=r)
        self.pass_starts = Histogram("shoal_scheduler_pass_started_jobs", "Jobs a scheduling pass started.",
                                     buckets=_JOB_COUNTS, registry=r)
        self.pass_depth = Histogram("shoal_scheduler_pass_depth_jobs",
                                    "Pending jobs a scheduling pass tested for a start (sdiag's depth).",
                                    ["pass"], buckets=_JOB_COUNTS, registry=r)
        self.passes_skipped = Counter("shoal_scheduler_passes_skipped",
                                      "Periodic scheduling passes not run: nothing a pass reads had changed.",
                                      registry=r)
        self.started = Counter("shoal_jobs_started", "Jobs started.", ["partition"], registry=r)
        self.ended = Counter("shoal_jobs_ended", "Job runs ended, by the state they ended in (requeued: PENDING).",
                             ["partition", "state"], registry=r)
        self.queue_wait = Histogram("shoal_job_queue_wait_seconds", "From submission (or requeue) to start.",
                                    ["partition"], buckets=_JOB_SECONDS, registry=r)
        self.run_time = Histogram("shoal_job_run_time_seconds", "From start to end of a job's run.",
                                  ["partition"], buckets=_JOB_SECONDS, registry=r)
        self.preemptions = Counter("shoal_preemptions", "Running jobs preempted, by their partition and QOS.",
                                   ["partition", "qos"], registry=r)
        self.hpa_decisions = Counter("shoal_hpa_decisions",
                                     "HorizontalPodAutoscaler decisions: up, down or none (kept).",
                                     ["namespace", "horizontalpodautoscaler", "direction"], registry=r)
        self._children: dict[tuple[str, str, int], object] = {}  # request histogram children by labels
        self.usage = AccountUsage(server.sessions)
        r.register(ClusterCollector(server, self.usage))

    # ------------------------------------------------------------ hooks

    def watch_commits(self, sessions) -> None:
        """Time every commit of ``sessions`` and count the events its transaction recorded."""
        @event.listens_for(sessions, "before_commit")
        def _before(session):
            session.info["commit_t0"] = time.perf_counter()

        @event.listens_for(sessions, "after_commit")
        def _after(session):
            t0 = session.info.pop("commit_t0", None)
            if t0 is not None:
                self.commits.observe(time.perf_counter() - t0)
            for apply in session.info.pop("metrics", ()):
                apply()

        @event.listens_for(sessions, "after_rollback")
        def _rolled_back(session):
            session.info.pop("metrics", None)
            session.info.pop("commit_t0", None)

    def observe_request(self, method: str, route: str, code: int, seconds: float) -> None:
        """One API request (kept cheap: it runs for every request, on the event loop)."""
        key = (method, route, code)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.requests.labels(method, route, str(code))
        child.observe(seconds)

    def run_started(self, row: JobRow, now: float) -> None:
        wait = now - max(row.submit_time, row.begin_time or 0.0)
        self.started.labels(row.partition).inc()
        self.queue_wait.labels(row.partition).observe(max(wait, 0.0))

    def run_ended(self, session, row: JobRow, state: str, now: float) -> None:
        """A run ends (``state``: what it ended in); counted when ``session`` commits."""
        partition, start, allocation = row.partition, row.start_time, row.allocation
        account, user = row.spec.get("account") or "", row.user

        def apply():
            self.ended.labels(partition, state).inc()
            if start is not None:
                self.run_time.labels(partition).observe(max(now - start, 0.0))
                self.usage.ended(account, user, allocation, start, now)
        session.info.setdefault("metrics", []).append(apply)

    def preempted(self, session, row: JobRow) -> None:
        partition, qos = row.partition, row.spec.get("qos") or "normal"
        session.info.setdefault("metrics", []).append(lambda: self.preemptions.labels(partition, qos).inc())

    def scheduled(self, full: bool, seconds: float, started: int, tested: int, queue: int = 0) -> None:
        kind = "full" if full else "quick"
        # sdiag's backfill cycles: full passes that left jobs pending (one that started the whole
        # queue had nothing to backfill: it did what Slurm's main scheduler does).
        self.cycles["full" if full and queue > started else "quick"].add(seconds, tested, started, queue,
                                                                        time.time())
        self.passes.labels(kind).observe(seconds)
        self.pass_starts.observe(started)
        self.pass_depth.labels(kind).observe(tested)

    def hpa_decided(self, namespace: str, name: str, current: int, desired: int) -> None:
        direction = "up" if desired > current else "down" if desired < current else "none"
        self.hpa_decisions.labels(namespace, name, direction).inc()

    def exposition(self) -> bytes:
        """The text Prometheus scrapes (format 0.0.4)."""
        return render(self.registry.collect())


def render(families) -> bytes:
    """Metric families in Prometheus' text format 0.0.4, as ``generate_latest`` writes them
    less its checks of names, which are ours and valid: with 5,000 nodes (40,000 series) those
    checks were most of a scrape's time (BENCHMARKS.md, Metrics)."""
    out: list[str] = []
    for family in families:
        name, kind = family.name, family.type
        if kind == "counter":
            name += "_total"
        elif kind == "unknown":
            kind = "untyped"
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = sample.labels
            out.append(f"{sample.name}{label_set(**labels) if labels else ''} {_number(sample.value)}\n")
    return "".join(out).encode()


def _number(value: float) -> str:
    value = float(value)
    if value != value:
        return "NaN"
    if value in (_INF, -_INF):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def alloc_gpus_cpus(allocation: dict | None) -> tuple[int, int]:
    nodes = (allocation or {}).get("nodes") or ()
    return sum(len(n["gpus"]) for n in nodes), sum(n["cpus"] for n in nodes)


class AccountUsage:
    """GPU- and CPU-seconds each (account, user) has used: the ended runs', loaded from the
    store at the first scrape and added to as runs end, plus the running jobs' so far, read at
    each scrape. Summing every ended job at each scrape would read every job ever run."""

    def __init__(self, sessions) -> None:
        self.sessions = sessions
        self._lock = threading.Lock()
        self._ended: dict[tuple[str, str], list[float]] | None = None  # None: not loaded yet

    def ended(self, account: str, user: str, allocation: dict | None, start: float, end: float) -> None:
        with self._lock:
            if self._ended is not None:
                self._add(self._ended, account, user, *alloc_gpus_cpus(allocation), end - start)

    @staticmethod
    def _add(totals, account: str | None, user: str, gpus: int, cpus: int, seconds: float) -> None:
        t = totals.setdefault((account or "", user), [0.0, 0.0])
        t[0] += gpus * max(seconds, 0.0)
        t[1] += cpus * max(seconds, 0.0)

    def totals(self, session, now: float, running: Iterable[Running]) -> dict[tuple[str, str], list[float]]:
        """Each (account, user)'s GPU- and CPU-seconds: the ended runs' and the ``running``
        jobs' so far (server/running.py's index: decoding every running job's allocation at
        each scrape held the interpreter from every request for as long)."""
        with self._lock:
            if self._ended is None:
                loaded: dict[tuple[str, str], list[float]] = {}
                q = select(JobRow.spec["account"].as_string(), JobRow.user, JobRow.allocation, JobRow.start_time,
                           JobRow.end_time).where(JobRow.start_time.is_not(None), JobRow.end_time.is_not(None),
                                                  JobRow.allocation.is_not(None))
                for account, user, alloc, start, end in session.execute(q):
                    self._add(loaded, account, user, *alloc_gpus_cpus(alloc), end - start)
                self._ended = loaded
            out = {k: list(v) for k, v in self._ended.items()}
        for job in running:
            self._add(out, job.account, job.user, job.gpus, job.cpus, now - (job.start or now))
        return out


class ClusterCollector:
    """State metrics, read from the store in one session when Prometheus scrapes."""

    def __init__(self, server, usage: AccountUsage) -> None:
        self.server = server
        self.usage = usage

    def describe(self):
        return []  # collected only when scraped: registering must not read the store

    def collect(self):
        s = self.server
        now = s.clock()
        with s.sessions() as session:
            yield from self._jobs(session)
            yield from self._resources(session, now)
            yield from self._usage(session, now)
            yield from self._deployments(session)
        yield CounterMetricFamily("shoal_agent_reports_stored", "Agents' reports that stored something "
                                  "(runs' ends, pods, GPU health, clean-ups done).", value=s.reports.stored)
        yield CounterMetricFamily("shoal_agent_report_commits", "The transactions those reports were stored in "
                                  "(group commit: reports that arrive together share one).", value=s.reports.commits)
        info = GaugeMetricFamily("shoal_build_info", "The server's version.", labels=["version"])
        info.add_metric([__version__], 1)
        yield info

    def _jobs(self, session):
        account, qos = JobRow.spec["account"].as_string(), JobRow.spec["qos"].as_string()
        rows = session.execute(
            select(JobRow.state, JobRow.partition, account, qos, JobRow.kind, JobRow.reason, JobRow.held,
                   func.count()).where(JobRow.state.in_((JobState.PENDING.value, JobState.RUNNING.value)))
            .group_by(JobRow.state, JobRow.partition, account, qos, JobRow.kind, JobRow.reason, JobRow.held))
        jobs: dict[tuple, int] = defaultdict(int)
        pending: dict[tuple, int] = defaultdict(int)
        for state, partition, acct, q, kind, reason, held, n in rows:
            jobs[(state.lower(), partition, acct or "", q or "normal", kind)] += n
            if state == JobState.PENDING.value:
                pending[(partition, _reason(reason, held))] += n
        g = GaugeMetricFamily("shoal_jobs", "Pending and running jobs (pods too: kind=\"pod\").",
                              labels=["state", "partition", "account", "qos", "kind"])
        for key, n in sorted(jobs.items()):
            g.add_metric(list(key), n)
        yield g
        g = GaugeMetricFamily("shoal_pending_jobs", "Pending jobs by the reason squeue gives.",
                              labels=["partition", "reason"])
        for key, n in sorted(pending.items()):
            g.add_metric(list(key), n)
        yield g

    def _resources(self, session, now: float):
        s = self.server
        nodes = list(session.execute(select(NodeRow.name, NodeRow.state, NodeRow.cpus, NodeRow.memory_mb,
                                            NodeRow.gpus, NodeRow.last_heartbeat)))
        # The running jobs' holdings, kept summed by node (server/running.py, as sinfo takes
        # them): decoding every running job's allocation at each scrape (8,000 with 1,000 full
        # nodes) held the interpreter from every request for as long.
        _, held = s.running.use(session)
        holds = [(name, cpus, memory_mb, gpus) for name, (cpus, memory_mb, gpus, _) in held.items()]
        for node, cpus, mem, gpus in session.execute(select(CleanupRow.node, CleanupRow.cpus,
                                                            CleanupRow.memory_mb, CleanupRow.gpus)):
            holds.append((node, cpus, mem, len(gpus or ())))
        use = node_use(((n, st, c, m, g) for n, st, c, m, g, _ in nodes), holds)
        names = {"gpus": ("gpus", "GPUs"), "cpus": ("cpus", "CPUs"), "memory": ("memory_bytes", "Memory")}
        for resource, (suffix, what) in names.items():
            g = GaugeMetricFamily(f"shoal_node_{suffix}", f"{what} of each node: allocated, idle or drained "
                                  "(free on a DRAIN or DOWN node); their sum is the node's total.",
                                  labels=["node", "state"])
            for name, u in sorted(use.items()):
                for state, v in u.split(resource).items():
                    g.add_metric([name, state], v)
            yield g
        by_partition = partition_use(use, s.partitions)
        for resource, (suffix, what) in names.items():
            g = GaugeMetricFamily(f"shoal_partition_{suffix}", f"{what} of each partition's nodes: allocated, "
                                  "idle or drained.", labels=["partition", "state"])
            for part, sums in sorted(by_partition.items()):
                for state, v in sums[resource].items():
                    g.add_metric([part, state], v)
            yield g
        g = GaugeMetricFamily("shoal_node_state", "Each node's state (1 for its current one).",
                              labels=["node", "state", "gpu_model"])
        for name, u in sorted(use.items()):
            g.add_metric([name, u.state.lower(), u.gpu_model], 1)
        yield g
        timeout = s.config.nodes.heartbeat_timeout_s
        lag = GaugeMetricFamily("shoal_node_heartbeat_age_seconds", "Since the node's agent last reported.",
                                labels=["node"])
        connected = 0
        for name, state, *_, stored in sorted(nodes):
            beat = s.heartbeats.latest(name, stored)
            lag.add_metric([name], max(now - beat, 0.0))
            connected += state != NodeState.DOWN.value and now - beat < timeout
        yield lag
        yield GaugeMetricFamily("shoal_agents_connected", "Agents heard from within the heartbeat timeout.",
                                value=connected)

    def _usage(self, session, now: float):
        totals = self.usage.totals(session, now, self.server.running.all(session))
        gpu = CounterMetricFamily("shoal_account_gpu_seconds", "GPU-seconds used by each account and user "
                                  "(ended runs and running jobs so far): fair-share's raw usage.",
                                  labels=["account", "user"])
        cpu = CounterMetricFamily("shoal_account_cpu_seconds", "CPU-seconds used by each account and user.",
                                  labels=["account", "user"])
        for (account, user), (g, c) in sorted(totals.items()):
            gpu.add_metric([account, user], g)
            cpu.add_metric([account, user], c)
        yield gpu
        yield cpu

    def _deployments(self, session):
        spec = GaugeMetricFamily("shoal_deployment_spec_replicas", "Replicas each Deployment asks for.",
                                 labels=["namespace", "deployment"])
        ready = GaugeMetricFamily("shoal_deployment_status_replicas_ready", "Each Deployment's ready replicas.",
                                  labels=["namespace", "deployment"])
        desired = GaugeMetricFamily("shoal_hpa_status_desired_replicas",
                                    "Replicas each HorizontalPodAutoscaler last decided on.",
                                    labels=["namespace", "horizontalpodautoscaler"])
        rows = session.execute(select(ObjectRow.kind, ObjectRow.namespace, ObjectRow.name, ObjectRow.body,
                                      ObjectRow.status).where(ObjectRow.kind.in_(
                                          ("Deployment", "HorizontalPodAutoscaler"))))
        for kind, ns, name, body, status in rows:
            if kind == "Deployment":
                spec.add_metric([ns, name], int((body.get("spec") or {}).get("replicas", 1)))
                ready.add_metric([ns, name], int((status or {}).get("readyReplicas") or 0))
            elif (status or {}).get("desiredReplicas") is not None:
                desired.add_metric([ns, name], int(status["desiredReplicas"]))
        yield spec
        yield ready
        yield desired


def _reason(reason: str, held: bool) -> str:
    """squeue's REASON for a pending job (a held one's is JobHeldUser whatever is stored)."""
    if held and reason in ("None", ""):
        return "JobHeldUser"
    return (reason or "None").split(",")[0]

