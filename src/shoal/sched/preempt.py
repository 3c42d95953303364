"""Preemption, as Slurm's PreemptType=preempt/qos: whom a blocked job may stop, and the fewest.

Who may preempt whom: a job whose QOS lists the running job's QOS under ``preempt``, unless
that QOS says ``preempt_mode: off``. A job already being preempted (``ActiveJob.preempted_by``)
is never chosen again, and completing jobs are not chosen at all (they are going anyway).

Choosing victims for a job that placement could not fit (``select_victims``):

1. Candidates: running, preemptible jobs holding something on the nodes of the job's partition
   that it does not exclude.
2. If the job would not fit even with every candidate gone, nobody is preempted: no victim is
   ever chosen that does not help.
3. Cost: the GPU-seconds each candidate has run so far, which a requeue throws away (then
   CPU-seconds; equal costs take the youngest first, as Slurm does). The shortest prefix of
   the candidates in cost order after which the job fits is found by bisection (fitting only
   gets easier as more go).
4. Prune: each chosen victim, costliest first, is spared if the job still fits without it, so
   every victim left is needed.

Victims are whole jobs: a gang's allocation is released on all its nodes together. A
preemptor's own victims still in their grace time or completing count as released, so a
preemptor waiting for them chooses no more unless they no longer suffice. Victims chosen for
one job in a pass are not offered to another.

What a victim's QOS says (``outcome``): ``requeue`` puts it back in the queue when it may be
requeued (a batch job submitted with --requeue; Slurm's JobRequeue=0); anything else ends it
PREEMPTED, as Slurm's cancel mode does.
"""

from __future__ import annotations

from typing import Iterable, Literal, Mapping, Sequence

from shoal.model.accounting import DEFAULT_QOS, QOS
from shoal.model.resources import Allocation
from shoal.model.snapshot import ActiveJob, NodeInfo, Partition, PendingJob, Preemption, Snapshot
from shoal.sched.placement import ClusterState, Demand, PlacementCache, place
from shoal.sched.qos import qos_table

Outcome = Literal["requeue", "cancel"]


def may_preempt(preemptor_qos: str | None, victim_qos: str | None, table: Mapping[str, QOS]) -> bool:
    """Whether a job of ``preemptor_qos`` may preempt a running job of ``victim_qos``."""
    mine = table.get(preemptor_qos or DEFAULT_QOS)
    theirs = table.get(victim_qos or DEFAULT_QOS)
    return (mine is not None and theirs is not None and theirs.name in mine.preempt
            and theirs.preempt_mode != "off")


def outcome(victim_qos: QOS | None, requeueable: bool) -> Outcome:
    """What preemption does to a victim: requeue it, or cancel it (it ends PREEMPTED)."""
    mode = victim_qos.preempt_mode if victim_qos is not None else "cancel"
    return "requeue" if mode == "requeue" and requeueable else "cancel"


def cost(job: ActiveJob, now: float) -> tuple[float, float, float, int]:
    """Sort key of a candidate victim: work lost first (GPU-, then CPU-seconds), youngest first."""
    ran = max(now - job.start_time, 0.0)
    gpus = sum(len(a.gpus) for _, a in job.allocation.nodes)
    cpus = sum(a.cpus for _, a in job.allocation.nodes)
    return (gpus * ran, cpus * ran, -job.start_time, -job.id)


def select_victims(d: Demand, partition: Partition, nodes: Sequence[NodeInfo],
                   holding: Sequence[Allocation], candidates: Sequence[ActiveJob],
                   now: float, cache: PlacementCache | None = None) -> tuple[ActiveJob, ...] | None:
    """The fewest-cost set of ``candidates`` whose going lets ``d`` fit, every one of them
    needed; ``()`` when it fits already, None when even all of them would not be enough.
    ``holding``: what everything else holds (it stays)."""

    def fits(kept: Iterable[ActiveJob]) -> bool:
        state = ClusterState(nodes, [*holding, *(c.allocation for c in kept)], cache)
        return place(d, state, "now", partition=partition).ok

    ordered = sorted(candidates, key=lambda c: cost(c, now))
    if fits(ordered):
        return ()
    if not fits(()):
        return None
    lo, hi = 1, len(ordered)  # the fewest of the cheapest to take so that d fits
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(ordered[mid:]):
            hi = mid
        else:
            lo = mid + 1
    chosen = ordered[:lo]
    spared = ordered[lo:]
    for victim in sorted(chosen, key=lambda c: cost(c, now), reverse=True):
        if fits([*spared, victim]):
            chosen.remove(victim)
            spared.append(victim)
    return tuple(sorted(chosen, key=lambda c: c.id))


def claimants_first(order: list[PendingJob], preemptors: bool) -> list[PendingJob]:
    """The queue with preemptors whose victims were stopped for them first (in queue order),
    so the resources freed for them are not taken by a job ahead of them, or by a requeued victim.
    ``preemptors``: whether the queue holds any (``schedule.pending_has``)."""
    if not preemptors:
        return order
    return [j for j in order if j.preemptor] + [j for j in order if not j.preemptor]


class Preempter:
    """One pass's preemption step (kube-scheduler's PostFilter): built per pass, asked per
    blocked job."""

    def __init__(self, snapshot: Snapshot, enabled: bool = True, cache: PlacementCache | None = None) -> None:
        self.now = snapshot.now
        self.cache = cache
        self.nodes = snapshot.nodes
        self.active = snapshot.active
        self.table = qos_table(snapshot.qos)
        self.enabled = enabled and any(q.preempt for q in self.table.values())
        self.taken: set[int] = set()  # victims chosen in this pass

    def preempt(self, job: PendingJob, d: Demand, partition: Partition,
                started: Iterable[Allocation] = ()) -> Preemption | None:
        """The victims to stop so ``job`` fits, or None (it may not preempt, it need not, or
        preempting would not help). ``started``: allocations of starts planned in this pass."""
        if not self.enabled:
            return None
        mine = self.table.get(job.qos or DEFAULT_QOS)
        if mine is None or not mine.preempt:
            return None
        usable = frozenset(partition.nodes) - d.exclude
        holding: list[Allocation] = list(started)
        candidates: list[ActiveJob] = []
        for a in self.active:
            if a.preempted_by == job.id:
                continue  # already going for this job: as good as free
            if (not a.completing and a.preempted_by is None and a.id not in self.taken
                    and may_preempt(job.qos, a.qos, self.table)
                    and not usable.isdisjoint(a.allocation.node_names)):
                candidates.append(a)
            else:
                holding.append(a.allocation)
        victims = select_victims(d, partition, self.nodes, holding, candidates, self.now, self.cache)
        if not victims:
            return None
        self.taken.update(v.id for v in victims)
        lost = sum(cost(v, self.now)[0] for v in victims)
        return Preemption(job.id, tuple(v.id for v in victims), lost)
