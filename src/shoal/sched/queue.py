"""Which pending jobs may be considered at all, and in what order (kube's PreFilter phase).

Each gate is a small function ``(job, view) -> reason | None`` returning the Slurm reason
squeue shows. Dependencies follow Slurm:

* ``after``: every target has left PENDING (started, or ended without starting).
* ``afterany``: every target is terminal. ``afterok``: every target COMPLETED; one that
  ended any other way makes the dependency never satisfiable. ``afternotok``: the mirror.
* ``singleton``: no other job of the same user and name is running (or completing, or
  started earlier in this pass), and none with a lower job id is pending.
* A target id unknown to the snapshot can never be satisfied (sbatch refuses unknown ids at
  submit, so this only happens if records are lost): reason ``DependencyNeverSatisfied``.
* ``dependency_any`` (``?``): satisfied when any clause is, never when all are never.
  A clause naming several jobs (``afterok:1:2``) counts as one clause per job, as in Slurm.
* Dependencies are judged on the snapshot: a target started in this pass satisfies
  ``after`` on the next pass.

QOS limits (``shoal.sched.qos``) are the last gate; their counts include the starts planned
earlier in the same pass.
"""

from __future__ import annotations

import functools
from operator import attrgetter
from typing import Callable, Iterable, Literal, Mapping

from shoal.model.accounting import DEFAULT_QOS
from shoal.model.job import JobState
from shoal.model.snapshot import Dependency, PendingJob, Snapshot
from shoal.sched import qos as qoslimits
from shoal.sched.fairshare import AccountTree

DepStatus = Literal["satisfied", "waiting", "never"]

# Slurm reason names (squeue's REASON column).
HELD = "JobHeldUser"
BEGIN_TIME = "BeginTime"
DEPENDENCY = "Dependency"
DEPENDENCY_NEVER = "DependencyNeverSatisfied"
PARTITION_CONFIG = "PartitionConfig"
PARTITION_DOWN = "PartitionDown"
PARTITION_INACTIVE = "PartitionInactive"
PARTITION_NODE_LIMIT = "PartitionNodeLimit"
PARTITION_TIME_LIMIT = "PartitionTimeLimit"
ARRAY_TASK_LIMIT = "JobArrayTaskLimit"
RESOURCES = "Resources"
PRIORITY = "Priority"
REQ_NODE_NOT_AVAIL = "ReqNodeNotAvail"
BAD_CONSTRAINTS = "BadConstraints"
GANG = "WaitingForGang"  # a gang member that could start, held back: not all of its gang can


_ID = attrgetter("id")
_SUBMIT = attrgetter("submit_time")
_PRIORITY = attrgetter("priority")


def queue_order(pending: Iterable[PendingJob],
                priorities: Mapping[int, int] | None = None, ordered: bool = False) -> list[PendingJob]:
    """Priority first (higher wins), then earlier submit_time, then lower id.

    ``priorities``: job id -> priority computed for this pass (multifactor); without it,
    each job's own ``priority``. ``ordered``: ``pending`` is in this order by the jobs' own
    priorities already (``Snapshot.in_queue_order``), so without ``priorities`` it is kept as it is.
    """
    if ordered and priorities is None:
        # Three sorts of 92,000 jobs already in order still took 16 ms a pass, each one C call
        # holding the GIL: the largest part of a quick pass that looks at a few jobs.
        return list(pending)
    # Three stable sorts, each on one number (a reverse sort keeps ties in order): the same
    # order as the key (-priority, submit_time, id). A tuple key allocated a tuple per job
    # and compared them element by element: 35 to 70 ms with 92,000 jobs pending, in one C
    # call that never lets another thread run, and the tuples set off the young collections
    # of the cyclic collector inside it (90 ms with them); on numbers, and on a queue that
    # is already nearly in order, each sort is one linear run: 14 ms.
    by_submit = sorted(sorted(pending, key=_ID), key=_SUBMIT)
    if priorities is None:
        return sorted(by_submit, key=_PRIORITY, reverse=True)
    return sorted(by_submit, key=lambda j: priorities.get(j.id, j.priority), reverse=True)


def order_key(job: PendingJob, priority: int | None = None) -> tuple[float, float, int]:
    """Where ``job`` stands in ``queue_order`` (lower first), with ``priority`` as the pass
    computed it (multifactor), or else its own."""
    return (-(job.priority if priority is None else priority), job.submit_time, job.id)


def rank(job: PendingJob) -> tuple:
    """What places a job in the queue besides its request, partition and age: two jobs with
    the same of all of these keep their submission order under either priority. ``basic``
    reads ``priority``; ``multifactor`` reads fair share (user, account), QOS, nice, job
    size (the request) and partition, and age, which only grows with it."""
    return (job.user, job.account, job.qos, job.nice, job.priority)


def effective_time_limit(job: PendingJob, default_time_s: int | None,
                         max_time_s: int | None) -> int | None:
    """The limit a job runs under: its own, else the partition's DefaultTime, else MaxTime."""
    if job.time_limit_s is not None:
        return job.time_limit_s
    return default_time_s if default_time_s is not None else max_time_s


class JobView:
    """What the gates read: job states by id and who holds which (user, name).

    Built once a pass over up to every job of the snapshot; what only some gates need
    (states for dependencies, names for singleton, QOS counts for limits) is computed the
    first time a job asks, so a queue without dependencies or QOS limits never pays for it.
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self.now = snapshot.now
        self.partitions = {p.name: p for p in snapshot.partitions}
        self._snapshot = snapshot
        self._started: list[PendingJob] = []  # starts planned so far in this pass
        self.qos = qoslimits.qos_table(snapshot.qos)
        # QOS names with no limit a pending job can hit: their jobs skip the QOS gate.
        self.unlimited_qos = frozenset(name for name, q in self.qos.items() if not qoslimits.has_limits(q))

    @functools.cached_property
    def states(self) -> dict[int, JobState]:
        snapshot = self._snapshot
        states: dict[int, JobState] = {job_id: rec.state for job_id, rec in snapshot.jobs.items()}
        for job in snapshot.active:
            states.setdefault(job.id, JobState.RUNNING)
        for job in snapshot.pending:
            states[job.id] = JobState.PENDING
        return states

    @functools.cached_property
    def running_names(self) -> dict[tuple[str, str], set[int]]:
        snapshot = self._snapshot
        names: dict[tuple[str, str], set[int]] = {}
        for job in snapshot.active:
            names.setdefault((job.user, job.name), set()).add(job.id)
        for job_id, rec in snapshot.jobs.items():
            if rec.state is JobState.RUNNING and rec.name:
                names.setdefault((rec.user, rec.name), set()).add(job_id)
        for job in self._started:
            names.setdefault((job.user, job.name), set()).add(job.id)
        return names

    @functools.cached_property
    def lowest_pending(self) -> dict[tuple[str, str], list[int]]:
        """The two lowest ids per (user, name) answer "is any other one lower than mine?"."""
        lowest: dict[tuple[str, str], list[int]] = {}
        for job in self._snapshot.pending:
            key = (job.user, job.name)
            ids = lowest.get(key)
            if ids is None:
                lowest[key] = [job.id]
            elif len(ids) < 2 or job.id < ids[1]:
                ids.append(job.id)
                ids.sort()
                del ids[2:]
        return lowest

    @functools.cached_property
    def qos_counts(self) -> qoslimits.QOSCounts:
        snapshot = self._snapshot
        counts = qoslimits.QOSCounts(snapshot.active, AccountTree(snapshot.accounts).default_account)
        for job in self._started:
            counts.add(job.qos, job.user, job.account, job.request.total_gpus)
        return counts

    def started(self, job: PendingJob) -> None:
        """Record a start planned in this pass (singleton and QOS limits now count it)."""
        self._started.append(job)
        if "running_names" in self.__dict__:
            self.running_names.setdefault((job.user, job.name), set()).add(job.id)
        if "qos_counts" in self.__dict__:
            self.qos_counts.add(job.qos, job.user, job.account, job.request.total_gpus)

    def _singleton(self, job: PendingJob) -> DepStatus:
        key = (job.user, job.name)
        if self.running_names.get(key, set()) - {job.id}:
            return "waiting"
        if any(other < job.id for other in self.lowest_pending.get(key, ())):
            return "waiting"
        return "satisfied"

    def _term(self, kind: str, target: int) -> DepStatus:
        state = self.states.get(target)
        if state is None:
            return "never"
        if kind == "after":
            return "waiting" if state is JobState.PENDING else "satisfied"
        if not state.terminal:
            return "waiting"
        if kind == "afterany":
            return "satisfied"
        if kind == "afterok":
            return "satisfied" if state is JobState.COMPLETED else "never"
        if kind == "afternotok":
            return "never" if state is JobState.COMPLETED else "satisfied"
        return "never"  # a kind the server should have rejected at submit

    def dependency_status(self, job: PendingJob) -> DepStatus:
        terms: list[DepStatus] = []
        for dep in job.dependencies:
            terms.extend(self._clause(job, dep))
        if not terms:
            return "satisfied"
        if job.dependency_any:
            if "satisfied" in terms:
                return "satisfied"
            return "never" if all(t == "never" for t in terms) else "waiting"
        if "never" in terms:
            return "never"
        return "satisfied" if all(t == "satisfied" for t in terms) else "waiting"

    def _clause(self, job: PendingJob, dep: Dependency) -> list[DepStatus]:
        if dep.kind == "singleton":
            return [self._singleton(job)]
        return [self._term(dep.kind, target) for target in dep.job_ids] or ["never"]


Gate = Callable[[PendingJob, JobView], "str | None"]


def held(job: PendingJob, view: JobView) -> str | None:
    return HELD if job.held else None


def begin_time(job: PendingJob, view: JobView) -> str | None:
    return BEGIN_TIME if job.begin_time is not None and job.begin_time > view.now else None


def dependencies(job: PendingJob, view: JobView) -> str | None:
    if not job.dependencies:
        return None
    status = view.dependency_status(job)
    if status == "waiting":
        return DEPENDENCY
    return DEPENDENCY_NEVER if status == "never" else None


def partition_state(job: PendingJob, view: JobView) -> str | None:
    part = view.partitions.get(job.partition)
    if part is None:
        return PARTITION_CONFIG
    if part.state == "DOWN":
        return PARTITION_DOWN
    if part.state == "INACTIVE":
        return PARTITION_INACTIVE
    return None  # UP, or DRAIN: queued jobs still run


def partition_limits(job: PendingJob, view: JobView) -> str | None:
    part = view.partitions[job.partition]
    if part.max_nodes is not None:
        request = job.request
        gang = max(request.nodes, len(set(request.nodelist))) if request.nodelist else request.nodes
        if gang > part.max_nodes:
            return PARTITION_NODE_LIMIT
    if part.max_time_s is not None:
        limit = effective_time_limit(job, part.default_time_s, part.max_time_s)
        if limit is not None and limit > part.max_time_s:
            return PARTITION_TIME_LIMIT
    return None


def qos_limits(job: PendingJob, view: JobView) -> str | None:
    if (job.qos or DEFAULT_QOS) in view.unlimited_qos:
        return None
    part = view.partitions[job.partition]
    limit = effective_time_limit(job, part.default_time_s, part.max_time_s)
    return qoslimits.limit_reason(job, view.qos, view.qos_counts, limit, job.request.total_gpus)


# In the order Slurm reports them: a held job says JobHeldUser whatever else is true.
GATES: tuple[Gate, ...] = (held, begin_time, dependencies, partition_state, partition_limits,
                           qos_limits)
_AFTER_HELD = GATES[1:]  # gate_reason answers held, the first, inline


def only_partition_gates(job: PendingJob, view: JobView) -> bool:
    """Whether, of the gates after ``held``, only the partition's can stop ``job`` (the usual
    job: begin_time, dependencies and qos_limits have nothing to say). Those read only its
    partition, request and time limit."""
    return job.begin_time is None and not job.dependencies and (job.qos or DEFAULT_QOS) in view.unlimited_qos


def gate_reason(job: PendingJob, view: JobView) -> str | None:
    """The first gate that keeps ``job`` from being considered, or None."""
    if job.held:
        return HELD
    if only_partition_gates(job, view):
        return partition_state(job, view) or partition_limits(job, view)
    for gate in _AFTER_HELD:
        reason = gate(job, view)
        if reason is not None:
            return reason
    return None
