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

Preemption (``plan.preemptions``) is carried out as the server does: each victim is marked
preempted (never chosen again) and runs on for its grace, ``min(--signal @secs,
scheduler.preempt_grace_s)`` (0 without a signal), then is requeued (same id and submit
time, restart count + 1, its whole recorded duration again: Slurm restarts from scratch) or
ends PREEMPTED, as its QOS's ``preempt_mode`` says; trace jobs count as batch jobs that may
be requeued. The preemptor goes first (``PendingJob.preemptor``) from then until it starts.

Fair-share: every run is a ``UsageRecord`` (running ones open-ended), passed in the
snapshots of ``priority=multifactor`` passes, so usage accrues and decays in virtual time.
"""

from __future__ import annotations

import bisect
import heapq
from itertools import islice
from operator import itemgetter
import time as _time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from shoal.model.accounting import DEFAULT_QOS, UsageRecord
from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.model.snapshot import ActiveJob, PendingJob, Snapshot
from shoal.sched import PlacementCache, SchedConfig, check_feasible, cycle, schedule
from shoal.sched.preempt import outcome as preempt_outcome
from shoal.sched.qos import qos_table
from shoal.sched.queue import PRIORITY, RESOURCES
from shoal.sim.cluster import SimCluster
from shoal.sim.trace import TraceJob
from shoal.sim.workload import Workload

_JOB_ID = itemgetter(2)  # of a queue-order key (-priority, submit, id)

# Order of event kinds within one timestamp.
_END, _RECOVER, _FAIL, _TICK = 0, 1, 2, 3  # _TICK: a full backfill pass falls due

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
    preempted: int = 0  # times it was a preemption victim


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
                 progress: Progress | None = None, progress_every: int = 2000,
                 qos_map: dict[str, str] | None = None, signal_s: float | None = None) -> None:
        self.cluster = cluster
        self.config = config
        self.placement = PlacementCache()  # kept between passes: the nodes are one tuple throughout
        self.quick = config.quick()  # the pass between full backfill passes
        self.label = label or config.policy
        self.trace = sorted(jobs, key=lambda j: (j.submit, j.id))
        self.requeue = requeue
        self.progress = progress
        self.progress_every = progress_every
        self.workload = Workload(cluster, exact_limits=exact_limits, qos_map=qos_map or {})
        self.qos = qos_table(cluster.qos)
        # A victim's grace, as the server's preemption_grace_s: the --signal's @secs (every
        # job as if submitted with it), at most GraceTime; 0 without a signal.
        self.grace = cycle.preemption_grace_s(signal_s, cluster.preempt_grace_s)
        self.claimants: set[int] = set()  # pending jobs that jobs were preempted for
        self.usage: list[UsageRecord] = []  # ended runs, for fair-share (multifactor only)
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
        # Pending jobs in queue order (basic priority): (-priority, submit, id), with entries
        # of jobs no longer pending skipped and dropped lazily.
        self.order: list[tuple[int, float, int]] = []
        self.free = {n.name: [len(n.gpus), n.cpus, n.memory_mb] for n in cluster.nodes}
        self.last_full = -float("inf")
        self.tick_at: float | None = None
        self.changed = False  # since the last full pass: jobs arrived or resources freed
        self.freed = False  # since the last pass
        self.arrived: list[PendingJob] = []  # since the last pass
        self.blocker: PendingJob | None = None  # the last pass's first job waiting for Resources
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
                    self.freed = self.changed = True
                    self.blocker = None
                elif kind == _FAIL:
                    self._fail(t, payload)  # type: ignore[arg-type]
                    self.blocker = None
                else:
                    self.tick_at = None
            while i < n and trace[i].submit == t:
                self._submit(trace[i])
                i += 1
            if self.pending:
                self._maybe_schedule(t)
            batches += 1
            if self.progress is not None and batches % self.progress_every == 0:
                self.progress(t, self.finished, n)
        for job_id in self.pending:
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
        self._queue(pj)

    def _queue(self, pj: PendingJob) -> None:
        self.pending[pj.id] = pj
        key = (-pj.priority, pj.submit_time, pj.id)
        at = bisect.bisect_left(self.order, key)
        if at == len(self.order) or self.order[at] != key:  # a requeued job may still be there
            self.order.insert(at, key)
        self.arrived.append(pj)
        self.changed = True

    # --- when to schedule -----------------------------------------------------------------

    def _maybe_schedule(self, t: float) -> None:
        """Run a pass when it could change something, as Slurm triggers its schedulers: with
        backfill and ``bf_interval_s``, a full pass at most that often while anything changed
        and quick passes (``SchedConfig.quick``) in between; with fifo every pass is a quick
        one. A quick pass that is bound to start nothing is skipped."""
        c = self.config
        if c.policy == "backfill" and c.bf_interval_s > 0:
            if self.changed and cycle.full_pass_due(c, t, self.last_full):
                self._schedule(t, c)
                self.last_full = t
                self.changed = False
                return
            if self.changed and self.tick_at is None:
                self.tick_at = self.last_full + c.bf_interval_s
                self._push(self.tick_at, _TICK, None)
            quick = self.quick
        elif c.policy == "fifo":
            quick = c
        else:
            self._schedule(t, c)
            return
        if self._quick_may_start():
            self._schedule(t, quick)
        else:
            for pj in self.arrived:
                self.outcomes[pj.id].reason = PRIORITY
            self.arrived = []

    def _quick_may_start(self) -> bool:
        """False only when a quick pass (queue order, stopping at the first job that does not
        fit) surely starts nothing: the last pass's first blocked job still cannot fit on
        what is free (by counts, a necessary condition) and every job that arrived since
        comes after it in queue order. Only on one partition, where that job blocks all."""
        b = self.blocker
        if b is None or len(self.cluster.partitions) != 1:
            return True
        key = (-b.priority, b.submit_time, b.id)
        if any((-j.priority, j.submit_time, j.id) < key for j in self.arrived):
            return True
        if not self.freed:
            return False
        r = b.request
        gpus, cpus, mem = r.gpus_per_node, r.cpus_per_node, r.mem_per_node_mb
        fitting = 0
        for name, (g, c, m) in self.free.items():
            if g >= gpus and c >= cpus and m >= mem and self.nodes[name].state is NodeState.UP:
                fitting += 1
                if fitting >= r.nodes:
                    return True
        self.freed = False  # checked: what was freed does not let it start
        return False

    def _snapshot_queue(self, depth: int | None) -> tuple[PendingJob, ...]:
        """The pending jobs a pass of that depth can reach: with basic priority, the first
        ``depth`` in queue order per partition (no job further back is tested, and a job
        that is not tested only waits with Priority); else all of them."""
        order, pending = self.order, self.pending
        if len(order) > 2 * len(pending) + 64:
            order[:] = [k for k in order if k[2] in pending]
        if depth is None or self.config.priority != "basic":
            return tuple(pending[k[2]] for k in order if k[2] in pending)
        parts = len(self.cluster.partitions)
        if parts == 1:  # the first ``depth`` pending, in C: no per-partition count
            out = list(islice(filter(None, map(pending.get, map(_JOB_ID, order))), depth))
        else:
            out = self._first_per_partition(depth, parts)
        gone = 0
        while gone < len(order) and order[gone][2] not in pending:
            gone += 1
        del order[:gone]
        return tuple(out)

    def _first_per_partition(self, depth: int, parts: int) -> list[PendingJob]:
        order, pending = self.order, self.pending
        taken: dict[str, int] = {}
        out: list[PendingJob] = []
        full = 0
        for k in order:
            pj = pending.get(k[2])
            if pj is None:
                continue
            n = taken.get(pj.partition, 0)
            if n < depth:
                out.append(pj)
                taken[pj.partition] = n + 1
                if n + 1 == depth:
                    full += 1
                    if full == parts:
                        break
        return out

    def _schedule(self, t: float, config: SchedConfig) -> None:
        pending = self._snapshot_queue(config.depth)
        pending = cycle.mark_preemptors(pending, self.claimants, self.pending)
        snap = Snapshot(now=t, nodes=self.node_tuple, partitions=self.cluster.partitions,
                        pending=pending, active=tuple(self.active.values()),
                        accounts=self.cluster.accounts, qos=self.cluster.qos,
                        usage=self._usage(t) if config.priority == "multifactor" else ())
        plan = schedule(snap, config, self.placement)
        self.passes += 1
        self.freed = False
        self.arrived = []
        self.blocker = None
        for start in plan.starts:
            pj = self.pending.pop(start.job_id)
            self._hold(start.allocation, -1)
            out = self.outcomes[pj.id]
            active = ActiveJob(id=pj.id, user=pj.user, name=pj.name, partition=pj.partition,
                               allocation=start.allocation, start_time=t,
                               time_limit_s=pj.time_limit_s, account=pj.account, qos=pj.qos)
            self.claimants.discard(pj.id)
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
            self.claimants.discard(job_id)
        for preemption in plan.preemptions:
            self._preempt(t, preemption.preemptor_id, preemption.victim_ids)
        blocked = [job_id for job_id, reason in plan.reasons.items() if reason == RESOURCES]
        for job_id, reason in plan.reasons.items():
            self.outcomes[job_id].reason = reason
        if blocked:
            self.blocker = min((self.pending[j] for j in blocked),
                               key=lambda j: (-j.priority, j.submit_time, j.id))

    def _usage(self, t: float) -> tuple[UsageRecord, ...]:
        """Fair-share usage: ended runs (older than 30 half-lives dropped, as the server
        drops them) and the running ones up to now."""
        horizon = cycle.usage_horizon(t, self.config.multifactor.decay_half_life_s)
        if horizon is not None and self.usage and self.usage[0].end < horizon:  # type: ignore[operator]
            self.usage = [r for r in self.usage if r.end >= horizon]  # type: ignore[operator]
        running = [UsageRecord(a.user, a.account, self.outcomes[a.id].gpus, self.outcomes[a.id].cpus,
                               a.start_time) for a in self.active.values()]
        return (*self.usage, *running)

    def _preempt(self, t: float, preemptor: int, victims: Sequence[int]) -> None:
        """Apply one of the plan's preemptions: the victims run on for their grace, then
        ``_release`` requeues or cancels them (their end is an _END event in state PREEMPTED)."""
        if preemptor not in self.pending or any(
                v not in self.active or self.active[v].preempted_by is not None for v in victims):
            return  # as the server skips a preemption that no longer holds
        self.claimants.add(preemptor)
        for v in victims:
            self.active[v] = replace(self.active[v], preempted_by=preemptor)
            self._push(t + self.grace, _END, (v, self.run_no[v], JobState.PREEMPTED))

    def _hold(self, allocation, sign: int) -> None:
        """Keep the free GPUs, CPUs and memory per node (``_quick_may_start``'s counts)."""
        for name, alloc in allocation.nodes:
            free = self.free[name]
            free[0] += sign * len(alloc.gpus)
            free[1] += sign * alloc.cpus
            free[2] += sign * alloc.memory_mb

    def _end(self, t: float, job_id: int, run: int, state: JobState) -> None:
        if self.run_no.get(job_id) != run or job_id not in self.active:
            return  # that run was already ended by a node failure
        self._release(t, job_id, state)

    def _release(self, t: float, job_id: int, state: JobState) -> None:
        self._hold(self.active.pop(job_id).allocation, +1)
        self.freed = self.changed = True
        out = self.outcomes[job_id]
        assert out.start is not None
        self.runs.append(Run(job_id, out.start, t, out.gpus, out.cpus))
        job = self.traced[job_id]
        if self.config.priority == "multifactor":
            self.usage.append(UsageRecord(out.user, job.account or None, out.gpus, out.cpus,
                                          out.start, t))
        if state is JobState.PREEMPTED:
            out.preempted += 1
            self.blocker = None  # freed for a preemptor: the next pass must run
            pj = self.workload.pending(job)
            if preempt_outcome(self.qos.get(pj.qos or DEFAULT_QOS), requeueable=True) == "requeue":
                out.requeues += 1
                self._queue(pj)
                return
        if state is JobState.NODE_FAIL and self.requeue:
            out.requeues += 1
            self._queue(self.workload.pending(job))
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
