"""Tables. Jobs and nodes carry a ``version`` column for optimistic concurrency."""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class TokenRow(Base):
    """An API token, stored only as its SHA-256 hash; its public id is the hash's first
    characters (``auth.token_id``), so the token itself is never needed to name it."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(64), index=True)
    role: Mapped[str] = mapped_column(String(16))  # admin | operator | user | read-only | join
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created: Mapped[float] = mapped_column(Float)
    description: Mapped[str | None] = mapped_column(String(200), nullable=True)
    groups: Mapped[list] = mapped_column(JSON, default=list)  # role bindings may name groups
    created_by: Mapped[str | None] = mapped_column(String(64), nullable=True)  # None: made by the server
    expires: Mapped[float | None] = mapped_column(Float, nullable=True)  # epoch seconds; None: never


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))  # NodeState
    reason: Mapped[str | None] = mapped_column(String(255), nullable=True)
    reason_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    cpus: Mapped[int] = mapped_column(Integer)
    memory_mb: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[list] = mapped_column(JSON, default=list)
    labels: Mapped[dict] = mapped_column(JSON, default=dict)
    features: Mapped[list] = mapped_column(JSON, default=list)
    # Kubernetes-style taints [{key, value, effect}]: pods must tolerate them (batch jobs
    # ignore them: partitions fence training). Set by `shoal taint node` or the agent config.
    taints: Mapped[list] = mapped_column(JSON, default=list)
    # The lasting GPU problems the agent last reported (lost GPUs, uncorrected ECC), as
    # schemas.GPUProblem dicts: while any is left the node is not resumed.
    gpu_health: Mapped[list] = mapped_column(JSON, default=list)
    # The container images in the node's cache, as its agent last reported them:
    # [{names: [reference, id], sizeBytes, lastUsed}], most recently used first.
    images: Mapped[list] = mapped_column(JSON, default=list, server_default="[]")
    registered_at: Mapped[float] = mapped_column(Float)
    last_heartbeat: Mapped[float] = mapped_column(Float)
    boot_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Mixed into the node's agent credential and step key; revoking them bumps it, so the
    # agent holding the old ones is refused until it joins again with a join token.
    credential_gen: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The agent serves HTTPS with a certificate the cluster CA issued it at registration.
    tls: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    version: Mapped[int] = mapped_column(Integer, default=1)

    __mapper_args__ = {"version_id_col": version}


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    array_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    array_task_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_throttle: Mapped[int | None] = mapped_column(Integer, nullable=True)
    name: Mapped[str] = mapped_column(String(255))
    user: Mapped[str] = mapped_column(String(64), index=True)
    partition: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(String(64), default="None")
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    interactive: Mapped[bool] = mapped_column(Boolean, default=False)
    requeue: Mapped[bool] = mapped_column(Boolean, default=False)
    restart_count: Mapped[int] = mapped_column(Integer, default=0)
    priority: Mapped[int] = mapped_column(Integer, default=1)
    submit_time: Mapped[float] = mapped_column(Float)
    begin_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_limit_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    request: Mapped[dict] = mapped_column(JSON)  # normalised ResourceRequest fields
    spec: Mapped[dict] = mapped_column(JSON)  # script, argv, environment, output patterns, signal...
    workdir: Mapped[str] = mapped_column(Text)
    dependency: Mapped[str | None] = mapped_column(Text, nullable=True)
    allocation: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    batch_host: Mapped[str | None] = mapped_column(String(64), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    signal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    comment: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The run a silent node took with it ({run, node, start_time, allocation, time}), until the
    # node says how it really ended; and Slurm's AdminComment, where that correction is told.
    lost_run: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    admin_comment: Mapped[str | None] = mapped_column(Text, nullable=True)
    # What the batch run used, from its cgroup, as its agent reported at its exit ({run, max_rss_kb,
    # cpu_s, user_cpu_s, system_cpu_s}): sacct's MaxRSS and TotalCPU on the ID.batch line.
    usage: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # Backfill's planned start for a pending job (squeue --start); None when unknown.
    expected_start: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Preemption in progress: when the victim was signalled, and for which job.
    preempted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    preemptor_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reservation: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Serving: a Pod is a job of kind "pod" (one node, never a batch script). Its manifest is
    # in spec["pod"]; the agent's last PodStatus in pod_status; deleting_at starts its drain.
    kind: Mapped[str] = mapped_column(String(8), default="batch", index=True)
    namespace: Mapped[str | None] = mapped_column(String(63), nullable=True)
    owner_uid: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    pod_status: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    deleting_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    version: Mapped[int] = mapped_column(Integer, default=1)

    # SQLAlchemy adds "AND version = :old" to every UPDATE and raises StaleDataError
    # when another writer got there first: optimistic concurrency on every engine alike.
    __mapper_args__ = {"version_id_col": version}


class StepRow(Base):
    """A job step launched by srun. The batch step is derived from the job itself."""

    __tablename__ = "steps"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run: Mapped[int] = mapped_column(Integer, default=0)
    name: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16))
    ntasks: Mapped[int] = mapped_column(Integer)
    nodelist: Mapped[str] = mapped_column(Text)
    start_time: Mapped[float] = mapped_column(Float)
    end_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    signal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # What the step used on each of its nodes, from its cgroup there, as each agent reported at
    # the step's end: {node: {max_rss_kb, cpu_s, user_cpu_s, system_cpu_s}}.
    usage: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class JobGPUUsageRow(Base):
    """What one run of a job did with its GPUs on one node, folded from that node's heartbeats
    (shoal.model.gpuusage): sacct's and sstat's gres/gpuutil, gres/gpumem and energy, kept
    after the job ends. One row per node, written only by that node's reports, so the nodes
    of a multi-node job never contend, and the job's own row is never touched."""

    __tablename__ = "job_gpu_usage"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    run: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(64), primary_key=True)
    record: Mapped[dict] = mapped_column(JSON)
    # The record's utilisation-weighted GPU-seconds, as a column: the console sums it per account.
    busy_s: Mapped[float] = mapped_column(Float, default=0.0)


class CleanupRow(Base):
    """Resources a finished run still holds on one node until its agent reports its processes gone.

    While any row exists for a job, squeue shows it COMPLETING (CG), and the scheduler
    counts these resources as used, so no GPU is handed out while a process may still hold it.
    """

    __tablename__ = "cleanups"

    job_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(64), primary_key=True)
    cpus: Mapped[int] = mapped_column(Integer)
    memory_mb: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[list] = mapped_column(JSON, default=list)
    exclusive: Mapped[bool] = mapped_column(Boolean, default=False)
    since: Mapped[float] = mapped_column(Float)
    signal: Mapped[str] = mapped_column(String(16), default="KILL")


class PartitionRow(Base):
    """What an administrator changed of a partition at run time (scontrol update PartitionName=):
    only the keys changed, laid over the cluster file's partition, kept across restarts and
    seen by every server sharing the store."""

    __tablename__ = "partitions"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    changes: Mapped[dict] = mapped_column(JSON, default=dict)  # Partition field -> value
    updated: Mapped[float] = mapped_column(Float)


class AccountingRow(Base):
    """An account, user (with its default account and admin level) or QOS as sacctmgr last left
    it: the whole record, or ``{"deleted": true}``, laid over the cluster file's (server/accounting.py)."""

    __tablename__ = "accounting"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # account, user or qos
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    record: Mapped[dict] = mapped_column(JSON, default=dict)
    updated: Mapped[float] = mapped_column(Float)


class ReservationRow(Base):
    """An advance reservation (scontrol create reservation): nodes held for users or maintenance."""

    __tablename__ = "reservations"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    start_time: Mapped[float] = mapped_column(Float)
    end_time: Mapped[float] = mapped_column(Float)
    nodes: Mapped[list] = mapped_column(JSON, default=list)
    users: Mapped[list] = mapped_column(JSON, default=list)
    accounts: Mapped[list] = mapped_column(JSON, default=list)
    flags: Mapped[list] = mapped_column(JSON, default=list)  # e.g. MAINT, IGNORE_JOBS
    partition: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_by: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer, default=1)

    __mapper_args__ = {"version_id_col": version}


class ObjectRow(Base):
    """A Kubernetes-style object (Deployment, ReplicaSet, Service, HPA, Namespace,
    PriorityClass): its manifest as applied (defaulted), and the status controllers write.

    ``version`` is the object's resourceVersion: every write bumps it, and a write based on
    an older read fails (optimistic concurrency, as for jobs). Pods are jobs, not objects."""

    __tablename__ = "objects"
    __table_args__ = (UniqueConstraint("kind", "namespace", "name"),)

    uid: Mapped[str] = mapped_column(String(40), primary_key=True)
    kind: Mapped[str] = mapped_column(String(40), index=True)
    namespace: Mapped[str] = mapped_column(String(63))  # "" for cluster-scoped kinds
    name: Mapped[str] = mapped_column(String(253))
    body: Mapped[dict] = mapped_column(JSON)  # apiVersion, kind, metadata, spec
    status: Mapped[dict] = mapped_column(JSON, default=dict)
    owner_uid: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    created: Mapped[float] = mapped_column(Float)
    version: Mapped[int] = mapped_column(Integer, default=1)

    __mapper_args__ = {"version_id_col": version}


class EventRow(Base):
    """An event about an object (kubectl get events): repeated ones are counted, not copied."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    namespace: Mapped[str] = mapped_column(String(63), index=True)
    kind: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(253))
    type: Mapped[str] = mapped_column(String(16))  # Normal | Warning
    reason: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(64))
    count: Mapped[int] = mapped_column(Integer, default=1)
    first_time: Mapped[float] = mapped_column(Float)
    last_time: Mapped[float] = mapped_column(Float)


class LeaderRow(Base):
    """Which server leads the servers sharing this store: one row (id 1).

    ``term`` is the fencing token: every server that becomes leader bumps it, and every plan
    a leader applies first checks, inside its own transaction, that the term is still its own
    (``shoal.store.lease.fence``), so a deposed leader's late write is refused."""

    __tablename__ = "leader"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    term: Mapped[int] = mapped_column(Integer)
    holder: Mapped[str] = mapped_column(String(255))  # the leader's advertised URL
    since: Mapped[float] = mapped_column(Float)


class SecretRow(Base):
    """Secrets every server sharing the store must agree on (the cluster key that signs agent
    and job credentials), so a second server needs no copied key file."""

    __tablename__ = "secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)  # hex
