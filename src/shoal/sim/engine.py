"""The discrete-event engine: virtual time, simulated nodes, and the real ``schedule()``.

Events (submit, job end, node failure, node recovery) are taken in time order; all events
at one timestamp form a batch (ends and recoveries first, so what they free is there for
the submits of the same second), and after each batch one scheduling pass runs over a
``Snapshot`` built exactly as the server builds one. ``plan.starts`` start at once and
run for their recorded duration, or until their time limit (TIMEOUT). A pass is skipped
only when no job is pending, when it could not start anything.

Submit-time rejection mirrors ``sbatch``: a job that ``check_feasible`` says could never
run in its partition, on its nodes as configured (DOWN ones count), is not queued (``JobOutcome.reason`` says why). A node failure ends
its jobs with NODE_FAIL, or puts them back in the queue with ``requeue`` (Slurm's
``--requeue``: same id and submit time).
"""

from __future__ import annotations

import heapq
import time as _time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.model.snapshot import ActiveJob, PendingJob, Snapshot
from shoal.sched import SchedConfig, check_feasible, schedule
from shoal.sim.cluster import SimCluster
from shoal.sim.trace import TraceJob
from shoal.sim.workload import Workload

# Order of event kinds within one timestamp.
_END, _RECOVER, _FAIL = 0, 1, 2

Progress = Callable[[float, int, int], None]  # (virtual now, jobs finished, jobs in all)


@dataclass(frozen=True)
class Failure:
    """Nodes that go DOWN at ``at`` (seconds of virtual time) for ``down_for`` (None: for good)."""

    nodes: tuple[str, ...]
    at: float
    down_for: float | None = None


@dataclass
class JobOutcome:
    """What became of one job. ``state`` None: never finished (still pending, or rejected)."""

    id: int
    name: str
    user: str
    account: str
    partition: str
    submit: float
    gpus: int
    cpus: int
    duration: float  # recorded run time
    time_limit_s: int | None
    first_start: float | None = None
    start: float | None = None
    end: float | None = None
    state: JobState | None = None
    reason: str | None = None  # why it was rejected, or its last pending reason
    requeues: int = 0


@dataclass(frozen=True)
class Run:
    """One stretch of a job holding resources (a requeued job has several)."""

    job_id: int
    start: float
    end: float
    gpus: int
    cpus: int


@dataclass
class SimResult:
    label: str
    config: SchedConfig
    cluster: SimCluster
    jobs: list[JobOutcome]
    runs: list[Run]
    passes: int = 0
    wall_s: float = 0.0
    last_submit: float = 0.0
    adjusted: dict[str, int] = field(default_factory=dict)  # workload mapping caps


class Simulator:
    """One replay of a trace on a cluster under one SchedConfig."""

    def __init__(self, cluster: SimCluster, jobs: Sequence[TraceJob], config: SchedConfig,
                 *, label: str | None = None, failures: Iterable[Failure] = (),
                 requeue: bool = False, exact_limits: bool = False,
                 progress: Progress | None = None, progress_every: int = 2000) -> None:
        self.cluster = cluster
        self.config = config
        self.label = label or config.policy
        self.trace = sorted(jobs, key=lambda j: (j.submit, j.id))
        self.requeue = requeue
        self.progress = progress
        self.progress_every = progress_every
        self.workload = Workload(cluster, exact_limits=exact_limits)
        self.nodes = {n.name: n for n in cluster.nodes}
        self.node_tuple = tuple(cluster.nodes)
        self.partitions = {p.name: p for p in cluster.partitions}
        self.pending: dict[int, PendingJob] = {}
        self.active: dict[int, ActiveJob] = {}
        self.outcomes: dict[int, JobOutcome] = {}
        self.traced: dict[int, TraceJob] = {}
        self.runs: list[Run] = []
        self.run_no: dict[int, int] = {}
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.finished = 0
        self.passes = 0
        self.feasible: dict[tuple, str | None] = {}
        for f in failures:
            unknown = [n for n in f.nodes if n not in self.nodes]
            if unknown:
                raise ValueError(f"--fail names nodes the cluster does not have: {', '.join(unknown)}")
            self._push(f.at, _FAIL, f)

    def _push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def run(self) -> SimResult:
        began = _time.perf_counter()
        trace, events = self.trace, self.events
        i, n = 0, len(trace)
        inf = float("inf")
        batches = 0
        while i < n or events:
            t = min(trace[i].submit if i < n else inf, events[0][0] if events else inf)
            while events and events[0][0] == t:
                _, kind, _, payload = heapq.heappop(events)
                if kind == _END:
                    self._end(t, *payload)  # type: ignore[misc]
                elif kind == _RECOVER:
                    self._set_state(payload, NodeState.UP)  # type: ignore[arg-type]
                else:
                    self._fail(t, payload)  # type: ignore[arg-type]
            while i < n and trace[i].submit == t:
                self._submit(trace[i])
                i += 1
            if self.pending:
                self._schedule(t)
            batches += 1
            if self.progress is not None and batches % self.progress_every == 0:
                self.progress(t, self.finished, n)
        for job_id, job in self.pending.items():
            self.outcomes[job_id].reason = self.outcomes[job_id].reason or "never started"
        if self.progress is not None:
            self.progress(t if n else 0.0, self.finished, n)
        return SimResult(
            label=self.label, config=self.config, cluster=self.cluster,
            jobs=[self.outcomes[j.id] for j in trace], runs=self.runs, passes=self.passes,
            wall_s=_time.perf_counter() - began,
            last_submit=trace[-1].submit if trace else 0.0,
            adjusted=dict(self.workload.capped),
        )

    # --- events ---------------------------------------------------------------------------

    def _submit(self, job: TraceJob) -> None:
        pj = self.workload.pending(job)
        r = pj.request
        self.traced[job.id] = job
        out = JobOutcome(
            id=job.id, name=job.name, user=pj.user, account=job.account or pj.user,
            partition=pj.partition, submit=job.submit, gpus=r.total_gpus,
            cpus=r.cpus_per_node * r.nodes, duration=job.duration, time_limit_s=pj.time_limit_s,
        )
        self.outcomes[job.id] = out
        part = self.partitions[pj.partition]
        # Keyed by shape, not by limit (limits vary per job); over MaxTime is its own answer.
        over = (pj.time_limit_s is not None and part.max_time_s is not None
                and pj.time_limit_s > part.max_time_s)
        key = (pj.partition, r, over)
        if key not in self.feasible:
            # Against the nodes as configured: a node that is DOWN now will be back.
            self.feasible[key] = check_feasible(r, part, self.cluster.nodes,
                                                time_limit_s=pj.time_limit_s)
        why = self.feasible[key]
        if why is not None:
            out.reason = f"rejected at submit: {why}"
            self.finished += 1
            return
        self.pending[job.id] = pj

    def _schedule(self, t: float) -> None:
        snap = Snapshot(now=t, nodes=self.node_tuple, partitions=self.cluster.partitions,
                        pending=tuple(self.pending.values()), active=tuple(self.active.values()))
        plan = schedule(snap, self.config)
        self.passes += 1
        for start in plan.starts:
            pj = self.pending.pop(start.job_id)
            out = self.outcomes[pj.id]
            active = ActiveJob(id=pj.id, user=pj.user, name=pj.name, partition=pj.partition,
                               allocation=start.allocation, start_time=t,
                               time_limit_s=pj.time_limit_s)
            self.active[pj.id] = active
            if out.first_start is None:
                out.first_start = t
            out.start = t
            out.reason = None
            run = self.run_no[pj.id] = self.run_no.get(pj.id, 0) + 1
            duration = self.traced[pj.id].duration
            limit = pj.time_limit_s
            if limit is not None and duration > limit:
                self._push(t + limit, _END, (pj.id, run, JobState.TIMEOUT))
            else:
                self._push(t + duration, _END, (pj.id, run, self.traced[pj.id].state))
        for job_id, reason in plan.never.items():
            self.pending.pop(job_id, None)
            self.outcomes[job_id].reason = reason
            self.outcomes[job_id].state = JobState.CANCELLED
            self.outcomes[job_id].end = t
            self.finished += 1
        for job_id, reason in plan.reasons.items():
            self.outcomes[job_id].reason = reason

    def _end(self, t: float, job_id: int, run: int, state: JobState) -> None:
        if self.run_no.get(job_id) != run or job_id not in self.active:
            return  # that run was already ended by a node failure
        self._release(t, job_id, state)

    def _release(self, t: float, job_id: int, state: JobState) -> None:
        del self.active[job_id]
        out = self.outcomes[job_id]
        assert out.start is not None
        self.runs.append(Run(job_id, out.start, t, out.gpus, out.cpus))
        if state is JobState.NODE_FAIL and self.requeue:
            out.requeues += 1
            job = self.traced[job_id]
            self.pending[job_id] = self.workload.pending(job)
            return
        out.end = t
        out.state = state
        self.finished += 1

    def _fail(self, t: float, failure: Failure) -> None:
        down = set(failure.nodes)
        for name in failure.nodes:
            self._set_state(name, NodeState.DOWN)
        hit = [jid for jid, a in self.active.items()
               if not down.isdisjoint(a.allocation.node_names)]
        for jid in hit:
            self._release(t, jid, JobState.NODE_FAIL)
        if failure.down_for is not None:
            for name in failure.nodes:
                self._push(t + failure.down_for, _RECOVER, name)

    def _set_state(self, name: str, state: NodeState) -> None:
        self.nodes[name] = replace(self.nodes[name], state=state)
        self.node_tuple = tuple(self.nodes.values())


def simulate(cluster: SimCluster, jobs: Sequence[TraceJob], config: SchedConfig = SchedConfig(),
             **kw) -> SimResult:
    """Replay ``jobs`` on ``cluster`` under ``config``; see Simulator for the options."""
    return Simulator(cluster, jobs, config, **kw).run()
