"""One scheduling pass: ``schedule(snapshot, config) -> Plan``, a pure function.

The server's scheduler loop, ``sbatch --test-only`` and the simulator call it unchanged.
Jobs are visited in queue order (priority, submit time, id); each passes the gates of
``queue`` (held, begin time, dependencies, partition, QOS limits), the array throttle, then
placement. With ``config.priority == "multifactor"`` the priorities are computed here from
the snapshot (``shoal.sched.priority``), as of ``snapshot.now``; ``"basic"`` uses each job's
own.
A start is committed to the pass's free state at once, so no GPU is handed out twice.

Policies:

* ``fifo`` (Slurm's sched/builtin): once a job cannot start for want of resources, every
  later job in a partition sharing nodes with its partition waits with reason ``Priority``.
* ``backfill`` (EASY): the first job that cannot start gets a reservation: the earliest time
  at which it fits once running jobs end by their time limits, on the nodes it would then
  get. A later job may start now only if it ends (by its own time limit) by that time, or
  uses on the reserved nodes nothing the reserved job needs there. When no such time exists
  (some holder has no time limit, or the job only fits once DOWN nodes return) the reserved
  job's candidate nodes are closed to every later job. One reservation per group of
  overlapping partitions; later blocked jobs in the group wait with ``Priority``.

A job that could not run even on an empty cluster of the UP nodes blocks nobody: it waits
with ``ReqNodeNotAvail`` (it needs DOWN or DRAIN nodes) or ``BadConstraints`` (it needs
nodes the partition does not have).

Preemption (``shoal.sched.preempt``, with ``config.preemption``): a job that would wait with
``Resources`` may name running jobs to stop in ``plan.preemptions``; it still waits with
``Resources`` (and its backfill reservation) until they are gone. Jobs that preempted others
are visited first, so what is freed for them goes to them.

Advance reservations (``shoal.sched.reservations``) narrow the nodes a job may use before
placement; with ``snapshot.topology``, multi-node gangs go under the fewest switches
(``shoal.sched.topology``).

Gangs (``PendingJob.gang``: the pods of a Job admitted all-or-nothing, as Kueue and Volcano
admit them): the pending members of a gang start in the same pass or none does. A pass that
would start only some is run again without the gang (its members wait with ``WaitingForGang``),
so what they would have held goes to the jobs behind them.

Every pending job ends up in exactly one of ``plan.starts``, ``plan.reasons``, ``plan.never``,
but in a partial pass (``SchedConfig.partial``: the quick pass between full backfill passes),
which stops once every node is held back for a blocked job: the jobs after it are in none.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from shoal.model.node import NodeState
from shoal.model.resources import Allocation, ResourceRequest
from shoal.model.snapshot import Partition, PendingJob, Plan, Snapshot, Start
from shoal.sched import queue as q
from shoal.sched.backfill import Booking, Ends, Horizon, Shadow, earliest_start
from shoal.sched.config import SchedConfig
from shoal.sched.placement import (
    ClusterState,
    Demand,
    Placement,
    PlacementCache,
    ReservedShare,
    empty_state,
    place,
    running_ends,
)
from shoal.sched.podfit import PodFit
from shoal.sched.preempt import Preempter, claimants_first
from shoal.sched.priority import job_priorities, priority_map
from shoal.sched.reservations import ReservationPolicy

_FAILURES_KEPT = 32  # per class of demand: enough for the few shapes a queue really has


@dataclass
class Reservation:
    """Backfill's promise to one blocked job. ``start`` None: no time could be promised."""

    job_id: int
    partition_nodes: frozenset[str]
    start: float | None
    shares: dict[str, ReservedShare] = field(default_factory=dict)
    end: float | None = None  # the reserved job's end by its time limit (None: never)
    allocation: Allocation | None = None  # what it was promised at ``start``

    def binds(self, end: float | None) -> bool:
        """Whether a job ending at ``end`` (None: never) must respect this reservation."""
        return self.start is None or end is None or end > self.start


def schedule(snapshot: Snapshot, config: SchedConfig = SchedConfig(),
             cache: PlacementCache | None = None) -> Plan:
    """Decide which pending jobs start now, and why each of the others waits. ``cache``: the
    caller's own, kept between its passes (speed only: the plan is the same without it)."""
    plan = _Pass(snapshot, config, cache).run()
    if not pending_has(snapshot, "gang"):
        return plan
    waiting: dict[int, str | None] = {}  # members of gangs held back, and why (``_gang_reasons``)
    for _ in range(MAX_GANG_PASSES):
        partial = partial_gangs(snapshot.pending, plan)
        if not partial:
            break
        waiting.update(_gang_reasons(snapshot.pending, plan, config, lambda gang: gang in partial))
        rest = tuple(job for job in snapshot.pending if job.id not in waiting)
        plan = _Pass(dataclasses.replace(snapshot, pending=rest), config, cache).run()
    else:  # still partial after the bound: start none of the gangs this pass
        waiting.update(_gang_reasons(snapshot.pending, plan, config, lambda gang: True))
        started = [st for st in plan.starts if st.job_id not in waiting]
        plan = dataclasses.replace(plan, starts=started, stopped=None)  # what the gangs' starts held is free
    plan.reasons.update({job_id: reason for job_id, reason in waiting.items()
                         if reason is not None and job_id not in plan.never})
    return plan


def _gang_reasons(pending: tuple[PendingJob, ...], plan: Plan, config: SchedConfig,
                  held: Callable[[str | None], bool]) -> dict[int, str | None]:
    """Why each member of the gangs ``held`` back waits: a member that could not start says why;
    one that could waits for the others (WaitingForGang); one a partial pass stopped before
    (``SchedConfig.partial``) is None: it keeps the reason an earlier pass gave it, as the rest
    of the queue after that pass's stop does."""
    started = {st.job_id for st in plan.starts}
    out: dict[int, str | None] = {}
    for job in pending:
        if job.gang and held(job.gang):
            reason = plan.reasons.get(job.id)
            if reason is None and (job.id in started or not config.partial):
                reason = q.GANG
            out[job.id] = reason
    return out


MAX_GANG_PASSES = 4  # passes again without the gangs that would start in part


def pending_has(snapshot: Snapshot, kind: str) -> bool:
    """Whether some pending job is a ``kind`` ("pod", "gang" or "preemptor"): the snapshot says
    so when its maker kept count (``Snapshot.pending_kinds``, the server's row cache), else
    every pending job is asked (in C, map: about 3 ms with 92,000 pending)."""
    kinds = snapshot.pending_kinds
    return kind in kinds if kinds is not None else any_is(snapshot.pending, kind)


def any_is(pending: tuple[PendingJob, ...], kind: str) -> bool:
    """Whether some of ``pending`` is a ``kind``, asked of each job (in C: map, not a generator)."""
    return any(map(attrgetter(kind), pending))


def waits_settled(settled: Mapping[tuple[ResourceRequest, str, int | None], tuple], job: PendingJob) -> bool:
    """Whether ``job``, queued after the full EASY backfill pass that made ``settled``
    (``Plan.settled``), would wait in the next pass, if nothing has started, ended or
    changed since but jobs queued as this one: a job with its request, partition, time
    limit and rank (``queue.rank``) waited behind a reservation in that pass. Ranked the
    same and queued later, this one comes after it; up to there the next pass meets the
    same jobs, free resources and reservations (those queued since all wait, taking
    nothing), so that one waits again, settling the three, and this one takes its reason
    (``_Pass.consider``). A server asks this of each submission on a full cluster, so that
    one that cannot start costs no pass over the whole queue."""
    return job.pod is None and not job.preemptor \
        and settled.get((job.request, job.partition, job.time_limit_s)) == q.rank(job)


def waits_behind(stopped: tuple[float, float, int] | None, job: PendingJob) -> bool:
    """Whether ``job``, queued after the partial pass that stopped at ``stopped``
    (``Plan.stopped``, set with priority/basic only), would wait in the next partial pass, if
    nothing has started, ended or changed since but jobs queued: it comes after the job where
    that pass stopped, every node held back by then, so that pass stops there again, before it.
    A server asks this of each submission between full backfill passes, as it asks
    ``waits_settled`` before one."""
    return stopped is not None and job.pod is None and not job.preemptor and q.order_key(job) > stopped


def partial_gangs(pending: tuple[PendingJob, ...], plan: Plan) -> set[str]:
    """The gangs some, but not all, of whose pending members the plan starts."""
    started = {st.job_id for st in plan.starts}
    members: dict[str, list[bool]] = {}
    for job in pending:
        if job.gang:
            members.setdefault(job.gang, []).append(job.id in started)
    return {gang for gang, starts in members.items() if any(starts) and not all(starts)}


class _Pass:
    """The cycle state of one pass (kube-scheduler's CycleState): built, run, dropped."""

    def __init__(self, snapshot: Snapshot, config: SchedConfig, cache: PlacementCache | None) -> None:
        self.snapshot = snapshot
        self.config = config
        self.cache = cache
        self.fifo = config.policy == "fifo"
        self.now = snapshot.now
        self.plan = Plan()
        self.state = ClusterState.from_snapshot(snapshot, cache)
        self.view = q.JobView(snapshot)
        self.partition_nodes = {p.name: frozenset(p.nodes) for p in snapshot.partitions}
        # This pass's starts that end, for backfill's look-ahead (``ends``, built on first use).
        self.started_ends: list[tuple[float, Allocation]] = []
        self._ends: Ends | None = None
        self.demands: dict[ResourceRequest, Demand] = {}
        self.demand_of: dict[int, Demand] = {}  # by id() of the request object
        self.failures: dict[tuple, list[tuple[int, int, int, int, bool]]] = {}
        self.failed: set[tuple] = set()  # (failures' key, shape) seen not to fit
        self.unrunnable_cache: dict[tuple, str | None] = {}
        self.blocked_nodes: set[str] = set()  # fifo
        self.all_blocked = False  # fifo: every node is in blocked_nodes (a partial pass stops)
        self.reservations: list[Reservation] = []  # backfill
        self.resv = ReservationPolicy(snapshot)  # advance reservations (scontrol)
        self.resv_live = bool(self.resv)  # read for every job: asked once
        self.tested = 0
        self.depth = config.depth
        # Jobs behind an EASY reservation: by (request, partition, own time limit), the reason
        # of one that waited with Priority behind it having been seen not to fit (``consider``).
        self.settled: dict[tuple[int, str, int | None], str] | None = (
            {} if config.policy == "backfill" and config.backfill == "easy" and not self.resv_live else None)
        self.preempter = Preempter(snapshot, config.preemption, cache)
        self.podfit = PodFit(snapshot) if pending_has(snapshot, "pod") else None
        self.priorities = (priority_map(job_priorities(snapshot, config.multifactor))
                           if config.priority == "multifactor" else None)

    @functools.cached_property
    def array_active(self) -> Counter[int]:
        """Running tasks per array (the throttle's count), read only when an array job comes."""
        return Counter(job.array_job_id for job in self.snapshot.active
                       if job.array_job_id is not None)

    @property
    def ends(self) -> Ends:
        """Who holds resources until when (running jobs with a limit, then this pass's starts)."""
        if self._ends is None:
            self._ends = Ends.running(running_ends(self.snapshot, self.cache), self.now)
            for end, allocation in self.started_ends:
                self._ends.add(end, allocation)
        return self._ends

    def run(self) -> Plan:
        reasons, never, kill = self.plan.reasons, self.plan.never, self.config.kill_invalid_depend
        settled, view, depth, consider = self.settled, self.view, self.depth, self.consider
        snapshot = self.snapshot
        order = q.queue_order(snapshot.pending, self.priorities, snapshot.in_queue_order)
        for job in claimants_first(order, pending_has(snapshot, "preemptor")):
            if settled is not None and (depth is None or self.tested < depth):
                # A job like one already settled behind a reservation (its request, partition
                # and limit), if usual (nothing of its own gates it: no hold, begin time,
                # dependency, QOS limit, reservation or array throttle): its partition's gates
                # passed for that one (they read only the partition, the request and the
                # limit) and it waits the same way (``consider``). With 90,000 such jobs,
                # judging each one's gates again was most of a pass; here, not even a call.
                reason = settled.get((id(job.request), job.partition, job.time_limit_s))
                if reason is not None and job.pod is None and job.reservation is None \
                        and job.array_throttle is None and not job.held and q.only_partition_gates(job, view):
                    self.tested += 1
                    reasons[job.id] = reason
                    continue
            reason = consider(job)
            if reason is None:
                continue
            if reason == q.DEPENDENCY_NEVER and kill:
                never[job.id] = reason
            else:
                reasons[job.id] = reason
            if self.all_blocked:  # a partial pass: no job after this one can start (``SchedConfig.partial``)
                if self.priorities is None and not job.preemptor:  # its place is its own key (waits_behind)
                    self.plan.stopped = q.order_key(job)
                break
        self.plan.tested = self.tested
        return self.plan

    def consider(self, job: PendingJob) -> str | None:
        """Start ``job`` (returning None) or say why it waits (a usual job settled behind a
        reservation has its reason from ``run``)."""
        reason = q.gate_reason(job, self.view) or self.resv.gate(job)
        if reason is not None:
            return reason
        part = self.view.partitions[job.partition]
        pnodes = self.partition_nodes[part.name]
        # What active advance reservations leave this job: blockers are judged on it.
        reach = self.resv.reach(job, pnodes)[0] if self.resv_live else pnodes
        if self.fifo and not self.blocked_nodes.isdisjoint(reach):
            return q.PRIORITY
        if job.array_job_id is not None and job.array_throttle is not None:
            if self.array_active[job.array_job_id] >= job.array_throttle:
                return q.ARRAY_TASK_LIMIT
        if self.depth is not None and self.tested >= self.depth:
            return q.PRIORITY
        self.tested += 1
        settled = self.settled
        if settled is not None and job.pod is None:
            # A job like one that already waits behind a reservation (same request, partition
            # and limit) waits the same way: what failed fails again (a pass only takes
            # resources), and in EASY backfill a group's reservation is its only one. With
            # 90,000 jobs queued behind a full cluster, this was most of a pass.
            same = (id(job.request), job.partition, job.time_limit_s)
            reason = settled.get(same)
            if reason is not None:
                return reason
        d = self.demand_of.get(id(job.request))  # the snapshot keeps every request alive
        if d is None:
            d = self.demands.get(job.request)
            if d is None:
                d = self.demands[job.request] = Demand.of(job.request)
            self.demand_of[id(job.request)] = d
        if job.pod is not None:
            kept_off = self.podfit.excluded(job.pod)
            if kept_off:
                d = dataclasses.replace(d, exclude=d.exclude | kept_off)
        if d.nodelist:
            unavailable = [
                name for name in d.nodelist
                if name not in pnodes or name not in self.state.by_name
                or self.state.by_name[name].info.state is not NodeState.UP
            ]
            if unavailable:
                return f"{q.REQ_NODE_NOT_AVAIL}, UnavailableNodes:{','.join(unavailable)}"
        limit = q.effective_time_limit(job, part.default_time_s, part.max_time_s)
        end = None if limit is None else self.now + limit
        whole = d  # the demand before advance reservations close nodes to it
        closed, maint = self.resv.closed(job, pnodes, end) if self.resv_live else (frozenset(), False)
        if closed:
            d = self.resv.narrow(d, closed)
        binding = [i for i, r in enumerate(self.reservations) if r.binds(end)
                   and not r.partition_nodes.isdisjoint(reach)]
        key = (part.name, d.static_key, tuple(binding))
        known = (key, d.shape)
        if known not in self.failed:  # a pass only takes resources: what failed fails again
            if not any(d.dominates(shape) for shape in self.failures.get(key, ())):
                placement = self.place_now(job, d, part, binding)
                if placement.allocation is not None:
                    self.start(job, placement.allocation, end, binding)
                    return None
                shapes = self.failures.setdefault(key, [])
                shapes.append(d.shape)
                del shapes[:-_FAILURES_KEPT]
            self.failed.add(known)
        if closed and job.reservation is None:
            # Kept off reserved nodes: it waits for the reservation, blocking nobody, if
            # those nodes are what it lacks; otherwise it waits like any other job.
            if place(whole, self.state, "now", partition=part,
                     reserved=[self.reservations[i].shares for i in binding]).ok:
                return self.resv.reason(maint)
        reason = self.blocked(job, d, part, reach, whole)
        if reason == q.PRIORITY and settled is not None and job.pod is None and not d.nodelist:
            settled[same] = reason
            self.plan.settled.setdefault((job.request, job.partition, job.time_limit_s), q.rank(job))
        return reason

    def place_now(self, job: PendingJob, d: Demand, part: Partition, binding: list[int]) -> Placement:
        """Placement now; a pod with preferences tries its best-scored nodes first."""
        reserved = [self.reservations[i].shares for i in binding]
        if job.pod is not None and self.podfit.has_preferences(job.pod):
            allowed = [n for n in self.partition_nodes[part.name] if n not in d.exclude]
            for worse in self.podfit.preferred_tiers(job.pod, allowed)[:-1]:
                tier = place(dataclasses.replace(d, exclude=d.exclude | worse), self.state, "now",
                             partition=part, reserved=reserved, topology=self.snapshot.topology)
                if tier.allocation is not None:
                    return tier
        return place(d, self.state, "now", partition=part, reserved=reserved, topology=self.snapshot.topology)

    def start(self, job: PendingJob, allocation: Allocation, end: float | None,
              binding: list[int]) -> None:
        if job.pod is not None:
            for name in allocation.node_names:
                self.podfit.started(name, job.pod)
        self.state.commit(allocation)
        self.plan.starts.append(Start(job.id, allocation))
        if end is not None and self.config.policy == "backfill":
            if self._ends is None:
                self.started_ends.append((end, allocation))
            else:
                self._ends.add(end, allocation)
        if job.array_job_id is not None:
            self.array_active[job.array_job_id] += 1
        self.view.started(job)
        for i in binding:
            shares = self.reservations[i].shares
            for name, alloc in allocation.nodes:
                share = shares.get(name)
                if share is not None:
                    share.cpus -= alloc.cpus
                    share.mem_mb -= alloc.memory_mb

    def blocked(self, job: PendingJob, d: Demand, part: Partition, pnodes: frozenset[str],
                whole: Demand | None = None) -> str:
        """The reason for a job that does not fit now; the first such job becomes a blocker.
        ``whole``: the demand before advance reservations narrowed it to ``d``."""
        if self.config.policy == "backfill" and self.config.backfill == "easy" and any(
            not r.partition_nodes.isdisjoint(pnodes) for r in self.reservations
        ):
            return q.PRIORITY
        why = self.unrunnable(whole or d, part)
        if why is not None:
            return why
        preemption = self.preempter.preempt(job, d, part, [s.allocation for s in self.plan.starts])
        if preemption is not None:
            self.plan.preemptions.append(preemption)
        if self.config.policy == "fifo":
            self.blocked_nodes |= pnodes
            self.all_blocked = self.config.partial and all(map(self.blocked_nodes.issuperset,
                                                               self.partition_nodes.values()))
        else:
            reservation = self.reserve(job, d, part, pnodes)
            if reservation is not None:
                self.reservations.append(reservation)
                if reservation.start is not None:
                    self.plan.estimates[job.id] = reservation.start
        return q.RESOURCES

    def unrunnable(self, d: Demand, part: Partition) -> str | None:
        """ReqNodeNotAvail / BadConstraints when ``d`` cannot fit even the empty UP nodes."""
        key = (part.name, d)
        if key not in self.unrunnable_cache:
            if place(d, self.empty(revived=False), "now", partition=part).ok:
                why = None
            else:
                fits = place(d, self.empty(revived=True), "now", partition=part).ok
                why = q.REQ_NODE_NOT_AVAIL if fits else q.BAD_CONSTRAINTS
            self.unrunnable_cache[key] = why
        return self.unrunnable_cache[key]

    def empty(self, revived: bool) -> ClusterState:
        """The nodes with nothing running: the UP ones, or all as if UP."""
        return empty_state(self.snapshot.nodes, self.snapshot.partitions, revived, self.cache)

    def reserve(self, job: PendingJob, d: Demand, part: Partition,
                pnodes: frozenset[str]) -> Reservation | None:
        """Earliest time ``d`` fits for its whole run as holders end, around the reservations
        made before it, and what it needs then (Slurm's shadow). None: only beyond bf_window."""
        c = self.config
        limit = q.effective_time_limit(job, part.default_time_s, part.max_time_s)
        bookings = [Booking(r.start, r.end, r.allocation) for r in self.reservations
                    if r.start is not None and r.allocation is not None
                    and not r.partition_nodes.isdisjoint(pnodes)]
        shadow = earliest_start(
            d, part, self.state, self.ends, bookings, now=self.now, limit_s=limit,
            window_end=None if c.bf_window_s is None else self.now + c.bf_window_s,
            resolution_s=c.bf_resolution_s)
        if shadow is Horizon.BEYOND:
            return None
        if isinstance(shadow, Shadow):
            end = None if limit is None else shadow.start + limit
            return Reservation(job.id, pnodes, shadow.start, shadow.shares, end, shadow.allocation)
        closed = {
            self.state.nodes[rank].info.name: ReservedShare(whole=True)
            for rank in self.state.candidates(d, part, "now")
        }
        return Reservation(job.id, pnodes, None, closed)
