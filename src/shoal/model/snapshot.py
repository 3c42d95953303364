"""The immutable view of the cluster that scheduling policy reads, and the Plan it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from shoal.model.accounting import QOS, Account, UsageRecord
from shoal.model.dependency import Dependency  # noqa: F401  (re-exported: the snapshot's clause type)
from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.model.reservation import AdvanceReservation
from shoal.model.resources import GPU, Allocation, ResourceRequest
from shoal.model.topology import Topology


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    default: bool = False
    default_time_s: int | None = None  # None: unlimited
    max_time_s: int | None = None  # None: unlimited
    max_nodes: int | None = None
    state: str = "UP"
    priority_job_factor: int = 1  # PriorityJobFactor: the partition term of multifactor priority


@dataclass(frozen=True)
class PodTerms:
    """What a pod asks of its node beyond resources: the Kubernetes scheduling terms of its
    spec, as plain data (``affinity`` and ``tolerations`` as the manifest writes them).

    ``key`` identifies the static terms (node selector, node affinity, tolerations) so a pass
    evaluates them once per distinct set; the server builds it."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: Mapping = field(default_factory=dict)
    tolerations: tuple[Mapping, ...] = ()
    ports: tuple[int, ...] = ()  # containerPorts: pods use the node's network
    key: str = ""

    def __hash__(self) -> int:
        return hash((self.namespace, self.key, self.ports, tuple(sorted(self.labels.items()))))


@dataclass(frozen=True)
class NodeInfo:
    """A node's capacity and what sets it apart. Free resources are derived from allocations."""

    name: str
    state: NodeState
    cpus: int
    memory_mb: int
    gpus: tuple[GPU, ...] = ()
    features: frozenset[str] = frozenset()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect): pods must tolerate them


@dataclass(frozen=True)
class PendingJob:
    id: int
    user: str
    name: str
    partition: str
    request: ResourceRequest
    submit_time: float
    time_limit_s: int | None = None
    priority: int = 0  # higher first; ties by submit_time, then id
    held: bool = False
    begin_time: float | None = None
    dependencies: tuple[Dependency, ...] = ()
    dependency_any: bool = False  # clauses joined by '?' (any) instead of ',' (all)
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_throttle: int | None = None  # the %N of --array
    account: str | None = None  # None: the user's default account
    qos: str | None = None  # None: the default QOS, ``normal``
    nice: int = 0  # subtracted from the multifactor priority
    preemptor: bool = False  # jobs were preempted for it: it goes first until it starts
    reservation: str | None = None  # --reservation: the advance reservation it runs in
    pod: PodTerms | None = None  # a serving pod: node selection by labels, taints, affinity
    gang: str | None = None  # pending jobs with one gang key start together in one pass, or none does


@dataclass(frozen=True)
class ActiveJob:
    """A job holding resources: running, or completing (its processes not yet gone)."""

    id: int
    user: str
    name: str
    partition: str
    allocation: Allocation
    start_time: float
    time_limit_s: int | None = None
    array_job_id: int | None = None
    account: str | None = None
    qos: str | None = None
    completing: bool = False  # ended, processes not yet gone: holds resources, not QOS limits
    preempted_by: int | None = None  # being preempted for that pending job: never a victim again
    pod: PodTerms | None = None  # a serving pod: what other pods' affinity and ports see


@dataclass(frozen=True)
class JobRecord:
    """What dependencies need to know of any job: its state and when it started."""

    id: int
    state: JobState
    user: str = ""
    name: str = ""
    exit_code: int | None = None
    start_time: float | None = None


@dataclass(frozen=True)
class Snapshot:
    now: float
    nodes: tuple[NodeInfo, ...]
    partitions: tuple[Partition, ...]
    pending: tuple[PendingJob, ...]
    active: tuple[ActiveJob, ...]
    jobs: Mapping[int, JobRecord] = field(default_factory=dict)  # for dependencies
    accounts: tuple[Account, ...] = ()  # the account tree (empty: no fair-share tree)
    usage: tuple[UsageRecord, ...] = ()  # runs that count towards fair-share usage
    qos: tuple[QOS, ...] = ()  # empty: only the default QOS, with no limits
    reservations: tuple[AdvanceReservation, ...] = ()  # advance reservations not yet ended
    topology: Topology | None = None  # the switch tree (None: placement ignores the network)
    # ``pending`` is in ``queue_order``'s order by the jobs' own priorities (the server's row
    # cache keeps it so): a pass with priority/basic need not sort it again.
    in_queue_order: bool = False
    # Which of "pod", "gang" and "preemptor" (PendingJob's fields) some pending job is: a kind
    # not named is no pending job's, so a pass need not ask each job (``schedule.pending_has``).
    # None: not known (the pass asks every job).
    pending_kinds: frozenset[str] | None = None


@dataclass(frozen=True)
class Start:
    job_id: int
    allocation: Allocation


@dataclass(frozen=True)
class Preemption:
    """Stop ``victim_ids`` (whole jobs) so that ``preemptor_id`` fits once their resources are
    free. ``gpu_seconds_lost``: the victims' GPU-seconds of work so far, what a requeue throws away."""

    preemptor_id: int
    victim_ids: tuple[int, ...]
    gpu_seconds_lost: float = 0.0


@dataclass
class Plan:
    """What one scheduling pass decided: jobs to start now, and why the rest wait."""

    starts: list[Start] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)  # pending job id -> Slurm reason
    never: dict[int, str] = field(default_factory=dict)  # can never run: job id -> reason
    # Backfill's planned start time (reservation start) of blocked jobs: job id -> time.
    estimates: dict[int, float] = field(default_factory=dict)
    preemptions: list[Preemption] = field(default_factory=list)  # victims to stop for a blocked job
    tested: int = 0  # pending jobs the pass tested for a start (sdiag's depth)
    # EASY backfill's jobs settled behind a reservation (``schedule.waits_settled``): by
    # (request, partition, own time limit), the queue rank of the first that waited so.
    settled: dict[tuple[ResourceRequest, str, int | None], tuple] = field(default_factory=dict)
    # A partial pass that stopped (``SchedConfig.partial``) with priority/basic: the queue key
    # (``queue.order_key``) of the last job it looked at; None: it looked at every job, or not so.
    stopped: tuple[float, float, int] | None = None
