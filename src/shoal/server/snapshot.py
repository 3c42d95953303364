"""Build the scheduler's immutable Snapshot from the store."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, aliased
from sqlalchemy.orm.attributes import set_committed_value

from shoal.model.accounting import QOS, Account, UsageRecord
from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.model.reservation import AdvanceReservation
from shoal.model.resources import GPU, Allocation, NodeAllocation, ResourceRequest
from shoal.model.snapshot import ActiveJob, Dependency, JobRecord, NodeInfo, PendingJob, Snapshot
from shoal.server.jobs import ACTIVE, request_from_json
from shoal.server.kube.pods import POD, gang_of, terms_of
from shoal.model.topology import Topology
from shoal.sched import cycle
from shoal.sched.queue import order_key, queue_order
from shoal.sched.schedule import any_is
from shoal.store.changes import ALL, ChangeCount
from shoal.store.models import CleanupRow, JobRow, NodeRow, ReservationRow


NODE_INFO = (NodeRow.name, NodeRow.state, NodeRow.cpus, NodeRow.memory_mb, NodeRow.gpus, NodeRow.features,
             NodeRow.labels, NodeRow.taints)
"""The columns node_info reads: selected alone, not as whole rows, each pass."""


def node_info(row) -> NodeInfo:
    """A NodeRow, or a row of the NODE_INFO columns, as the scheduler's NodeInfo."""
    return NodeInfo(
        name=row.name,
        state=NodeState(row.state),
        cpus=row.cpus,
        memory_mb=row.memory_mb,
        gpus=tuple(GPU(**g) for g in row.gpus),
        features=frozenset(row.features),
        labels=dict(row.labels),
        taints=tuple((t["key"], t.get("value") or "", t["effect"]) for t in row.taints or ()),
    )


def read_nodes(session: Session) -> tuple[NodeInfo, ...]:
    """Every node's NodeInfo, by name, from the NODE_INFO columns alone."""
    return tuple(node_info(n) for n in session.execute(select(*NODE_INFO).order_by(NodeRow.name)))


class NodeInfoCache:
    """Every node's NodeInfo as submissions and passes see them, each partition's members,
    and what ``check`` (placement's check_feasible) said of requests on them, kept until a
    commit changes a node row (``changes``: a ChangeCount watching NodeRow). Each sbatch read
    every node and placed its job on an empty copy of the cluster; in a submission loop the
    nodes are the same every time. ``nodes()`` gives the same tuple until a change: the
    scheduler's placement cache keeps its free-resource state and sorted nodes by that
    tuple's identity. A disabled count keeps nothing."""

    def __init__(self, changes, check) -> None:
        self.changes = changes
        self.check = check
        # (count, nodes, verdicts on them, members by partition), replaced whole; each
        # thread's verdicts and members go with the nodes its last nodes() gave it, so
        # nothing made from nodes read before a change is kept for the nodes after it.
        self._kept: tuple[int | None, tuple[NodeInfo, ...], dict, dict] = (None, (), {}, {})
        self._mine = threading.local()

    def nodes(self, session: Session) -> tuple[NodeInfo, ...]:
        at = self.changes.value  # noted before the read: a commit racing it moves the count again
        kept = self._kept
        if not self.changes.enabled or at != kept[0]:
            kept = (at, read_nodes(session), {}, {})
            self._kept = kept
        self._mine.kept = kept
        return kept[1]

    def members(self, partition) -> list[NodeInfo]:
        """``partition``'s nodes among this thread's last ``nodes()`` (5,000 names matched per
        sbatch otherwise)."""
        _, nodes, _, by_partition = self._mine.kept
        members = by_partition.get(partition.nodes)
        if members is None:
            names = set(partition.nodes)
            members = by_partition[partition.nodes] = [n for n in nodes if n.name in names]
        return members

    def feasible(self, request, partition, members: list[NodeInfo], *, time_limit_s: int | None) -> str | None:
        """``check``'s verdict; ``members`` are the partition's nodes from this thread's last ``nodes()``."""
        kept = getattr(self._mine, "kept", None)
        verdicts = kept[2] if kept is not None else None
        key = (request, partition, time_limit_s)
        try:
            if verdicts is not None and key in verdicts:
                return verdicts[key]
        except TypeError:  # an unhashable field: not kept
            verdicts = None
        verdict = self.check(request, partition, members, time_limit_s=time_limit_s)
        if verdicts is not None:
            verdicts[key] = verdict
        return verdict


def pending_job(row: JobRow, requests: MutableMapping[ResourceRequest, ResourceRequest] | None = None) -> PendingJob:
    """``requests``: equal requests made one object (an array's tasks: a pass then sizes and
    settles them once, by identity)."""
    spec = row.spec
    request = request_from_json(row.request)
    if requests is not None:
        request = requests.setdefault(request, request)
    return PendingJob(
        id=row.id,
        user=row.user,
        name=row.name,
        partition=row.partition,
        request=request,
        submit_time=row.submit_time,
        time_limit_s=row.time_limit_s,
        priority=row.priority,
        held=row.held,
        begin_time=row.begin_time,
        dependencies=tuple(Dependency(d["kind"], tuple(d["job_ids"])) for d in spec.get("dependencies", ())),
        dependency_any=bool(spec.get("dependency_any")),
        array_job_id=row.array_job_id,
        array_task_id=row.array_task_id,
        array_throttle=row.array_throttle,
        account=spec.get("account"),
        qos=spec.get("qos"),
        nice=int(spec.get("nice") or 0),
        reservation=row.reservation,
        pod=terms_of(row) if row.kind == POD else None,
        gang=gang_of(row) if row.kind == POD else None,
    )


def active_job(row: JobRow) -> ActiveJob:
    return ActiveJob(
        id=row.id, user=row.user, name=row.name, partition=row.partition,
        allocation=Allocation.from_json(row.allocation), start_time=row.start_time or 0.0,
        time_limit_s=row.time_limit_s, array_job_id=row.array_job_id,
        account=row.spec.get("account"), qos=row.spec.get("qos"),
        preempted_by=row.preemptor_id if row.preempted_at is not None else None,
        pod=terms_of(row) if row.kind == POD else None,
    )


def cleanup_jobs(rows: list[CleanupRow], jobs_by_id: dict[int, JobRow]) -> list[ActiveJob]:
    """Completing runs still hold their resources: one ActiveJob per (job, run)."""
    grouped: dict[tuple[int, int], list[CleanupRow]] = {}
    for r in rows:
        grouped.setdefault((r.job_id, r.run), []).append(r)
    out = []
    for (job_id, _run), parts in grouped.items():
        job = jobs_by_id.get(job_id)
        alloc = Allocation(
            nodes=tuple((p.node, NodeAllocation(p.cpus, p.memory_mb, tuple(p.gpus))) for p in parts),
            exclusive=parts[0].exclusive,
        )
        out.append(ActiveJob(
            id=job_id, user=job.user if job else "", name=job.name if job else "",
            partition=job.partition if job else "", allocation=alloc, start_time=parts[0].since,
            time_limit_s=0, array_job_id=job.array_job_id if job else None,
            account=job.spec.get("account") if job else None, qos=job.spec.get("qos") if job else None,
            completing=True, preempted_by=job.preemptor_id if job else None,
            pod=terms_of(job) if job is not None and job.kind == POD else None,
        ))
    return out


def advance_reservation(row: ReservationRow) -> AdvanceReservation:
    return AdvanceReservation(
        name=row.name, start=row.start_time, end=row.end_time, nodes=tuple(row.nodes),
        users=frozenset(row.users), accounts=frozenset(row.accounts), flags=frozenset(row.flags),
        partition=row.partition,
    )


def reservations(session: Session, now: float) -> tuple[AdvanceReservation, ...]:
    """Reservations not yet ended, by name."""
    rows = session.scalars(select(ReservationRow).where(ReservationRow.end_time > now)
                           .order_by(ReservationRow.name))
    return tuple(advance_reservation(r) for r in rows)


def claimants(session: Session) -> set[int]:
    """The pending jobs that other jobs were preempted for (a victim keeps its
    ``preemptor_id`` until it starts again): the pass flags them, to serve them first."""
    victim = aliased(JobRow)
    return set(session.scalars(
        select(JobRow.id).join(victim, victim.preemptor_id == JobRow.id)
        .where(JobRow.state == JobState.PENDING.value).distinct()))


LIVE = ACTIVE  # pending or running: the rows a pass reads


def job_record(row: JobRow) -> JobRecord:
    return JobRecord(id=row.id, state=JobState(row.state), user=row.user, name=row.name, exit_code=row.exit_code,
                     start_time=row.start_time)


@dataclass(frozen=True)
class LiveJobs:
    """What a snapshot takes from the live (pending and running) job rows: ``rows`` by id
    (read them, never write them), the pending jobs' views (in the queue's order from a
    JobRowCache, in id order from ``of``) and the running jobs' in id order, every live
    job's record (a map the snapshot may keep), and the ids the pending jobs depend on."""

    rows: Mapping[int, JobRow]
    pending: tuple[PendingJob, ...]
    active: tuple[ActiveJob, ...]
    records: dict[int, JobRecord]
    wanted: frozenset[int]

    @classmethod
    def of(cls, rows: Iterable[JobRow]) -> LiveJobs:
        """Made afresh from ``rows`` (live, in id order)."""
        by_id = {r.id: r for r in rows}
        pending = tuple(pending_job(r) for r in by_id.values() if r.state == JobState.PENDING.value)
        return cls(rows=by_id, pending=pending,
                   active=tuple(active_job(r) for r in by_id.values() if r.state == JobState.RUNNING.value),
                   records={jid: job_record(r) for jid, r in by_id.items()}, wanted=_wanted(pending))


def _wanted(pending: Iterable[PendingJob]) -> frozenset[int]:
    """The jobs ``pending`` depend on."""
    return frozenset(jid for p in pending for d in p.dependencies for jid in d.job_ids)


class _ById:
    """Values kept by job id in id order as they come and go, so that a pass takes them as
    a tuple at C speed (``values``) instead of a Python loop over every live job. Ids come
    mostly in order (new jobs have higher ones); one that does not (a requeued job) has
    them sorted again at the next ``values``.

    With ``key`` and ``order`` (a value's place, and the values of a collection in order of
    it): kept in that order instead, by the same rule: a new value's key is mostly the
    highest (pending jobs: ``queue.order_key``, new jobs coming last), and a value whose key
    changed, or a new one that is not the highest, has them put in order again."""

    def __init__(self, key: Callable[[Any], tuple] | None = None,
                 order: Callable[[Iterable[Any]], list] | None = None) -> None:
        self._by_id: dict[int, Any] = {}
        self._key, self._order = key, order
        self._in_order = True
        self._values: tuple | None = ()  # None: changed since the last values()

    def put(self, jid: int, value) -> None:
        by_id, key = self._by_id, self._key
        if self._in_order and by_id:
            if key is None:
                self._in_order = jid in by_id or jid > next(reversed(by_id))
            elif jid in by_id:
                self._in_order = key(by_id[jid]) == key(value)
            else:
                self._in_order = key(value) > key(by_id[next(reversed(by_id))])
        by_id[jid] = value
        self._values = None

    def drop(self, jid: int) -> None:
        if self._by_id.pop(jid, None) is not None:
            self._values = None

    def values(self) -> tuple:
        if self._values is None:
            if not self._in_order:
                if self._order is None:
                    self._by_id = dict(sorted(self._by_id.items()))
                else:
                    self._by_id = {v.id: v for v in self._order(self._by_id.values())}
                self._in_order = True
            self._values = tuple(self._by_id.values())
        return self._values


class JobRowCache:
    """The controller's live job rows and what a snapshot makes of them (their PendingJob,
    ActiveJob and JobRecord views), kept between passes by id and version: a pass reads
    whole rows (and decodes their JSON) only for jobs that changed since the one before,
    which with 10,000 queued jobs was nearly all of a pass's time; and it changes the
    views only for those, so that with 40,000 live jobs a pass no longer remakes each
    job's record (17% of the scheduler's time) and lists.

    Every write of a job row bumps its version (the optimistic-concurrency column), so a
    row whose version is unchanged is unchanged. Only passes that read committed rows may
    use it (the controller's), never a transaction that is rolled back (``--test-only``).

    With ``changes`` (the job rows the servers' commits changed), a pass reads only the
    versions of the jobs changed since the one before: with 50,000 jobs queued, reading
    every live job's id and version was a quarter of each pass. Without it, after a bulk
    statement (``ALL``) or a stale plan (``stale``), every live job's version is read.
    """

    def __init__(self, changes: ChangeCount | None = None) -> None:
        self._rows: dict[int, tuple[int, JobRow]] = {}  # live rows by id, with the version they were kept at
        self._plain: dict[int, JobRow] = {}  # the same rows alone (LiveJobs.rows)
        self._pending = _ById(order_key, queue_order)  # PendingJob views in the queue's order (in_queue_order)
        self._active = _ById()  # ActiveJob views of the running rows
        self._pods: set[int] = set()  # the pending pods' ids (pending_kinds)
        self._gangs: set[int] = set()  # the pending gang members' ids
        self._records: dict[int, JobRecord] = {}
        self._records_view: dict[int, JobRecord] | None = None  # the copy the last read handed out
        self._deps: dict[int, frozenset[int]] = {}  # the jobs each pending job depends on (if any)
        # Each pending row's reason, and its start estimate where it has one, as plain values:
        # a pass compares every pending job's new reason with it (90,000 ORM attribute reads
        # were a tenth of a pass; a tuple of both per job, compared, 11 ms of a full pass).
        self.said_reason: dict[int, str | None] = {}
        self.said_start: dict[int, float] = {}
        # One object per distinct request among the pending jobs (while some job holds it).
        self._requests: MutableMapping[ResourceRequest, ResourceRequest] = weakref.WeakValueDictionary()
        self._changes = changes
        self._synced = False  # _rows is every live job as of the changes taken so far

    def row(self, job_id: int) -> JobRow | None:
        """The row as the last ``read`` found it (detached: read its columns, never write them)."""
        kept = self._rows.get(job_id)
        return None if kept is None else kept[1]

    def kept(self, rows) -> None:
        """Rows the caller has just committed (their version column already the new one):
        kept as they are, so the next ``read`` need not read them back. A pass that starts
        a few hundred jobs had the next one read each of them again."""
        for r in rows:
            if r.state in LIVE:
                kept = self._rows.get(r.id)
                if kept is None or kept[0] != r.version:
                    self._put(r)
            else:
                self._drop(r.id)

    def written(self, job_id: int, version: int, values: dict) -> None:
        """A pending row's ``values`` (columns) the caller has just committed with a Core
        UPDATE that moved its version from ``version`` to the next: the kept row made to
        match, so the next ``read`` need not read it back. Its views (PendingJob, JobRecord) hold
        none of the columns written (reasons, estimates) and are kept."""
        kept = self._rows.get(job_id)
        if kept is None or kept[0] != version:
            return
        row = kept[1]
        for name, value in values.items():
            set_committed_value(row, name, value)
        set_committed_value(row, "version", version + 1)
        self._rows[job_id] = (version + 1, row)
        if job_id in self.said_reason:
            self._said(job_id, row)

    def stale(self) -> None:
        """A plan made from these rows found one changed (StaleDataError): the next read reads
        every live job's version, not only those whose keys came (another server's commit may
        be a moment behind its keys' notification)."""
        self._synced = False

    @property
    def pending_kinds(self) -> frozenset[str]:
        """Which of "pod" and "gang" some pending row of the last ``read`` is (``Snapshot.pending_kinds``)."""
        return frozenset(kind for kind, ids in (("pod", self._pods), ("gang", self._gangs)) if ids)

    def read(self, session: Session) -> LiveJobs:
        """Live (pending and running) rows as of now, and what a snapshot makes of them."""
        changes = self._changes
        counted = changes is not None and changes.enabled
        # Taken before reading (later commits are read next time), given back if the read fails.
        with changes.taken() if counted else nullcontext({ALL}) as keys:
            if counted and self._synced and ALL not in keys:
                self._refresh(session, sorted(keys))
            else:
                self._reload(session)
                self._synced = counted
        if self._records_view is None:  # a copy: the snapshot holds it while the next pass changes ours
            self._records_view = dict(self._records)
        return LiveJobs(rows=self._plain, pending=self._pending.values(), active=self._active.values(),
                        records=self._records_view, wanted=frozenset().union(*self._deps.values()))

    def _put(self, row: JobRow) -> None:
        """Keep a live row and its views."""
        jid = row.id
        self._rows[jid] = (row.version, row)
        self._plain[jid] = row
        self._records[jid] = job_record(row)
        self._records_view = None
        if row.state == JobState.PENDING.value:
            self._said(jid, row)
            pending = pending_job(row, self._requests)
            self._pending.put(jid, pending)
            (self._pods.add if pending.pod is not None else self._pods.discard)(jid)
            (self._gangs.add if pending.gang else self._gangs.discard)(jid)
            self._active.drop(jid)
            deps = _wanted((pending,))
            if deps:
                self._deps[jid] = deps
            else:
                self._deps.pop(jid, None)
        else:
            self._unsaid(jid)
            self._active.put(jid, active_job(row))
            self._pending.drop(jid)
            self._pods.discard(jid)
            self._gangs.discard(jid)
            self._deps.pop(jid, None)

    def _said(self, jid: int, row: JobRow) -> None:
        self.said_reason[jid] = row.reason
        if row.expected_start is None:
            self.said_start.pop(jid, None)
        else:
            self.said_start[jid] = row.expected_start

    def _unsaid(self, jid: int) -> None:
        self.said_reason.pop(jid, None)
        self.said_start.pop(jid, None)

    def _drop(self, jid: int) -> None:
        """Forget a job no longer live."""
        if self._rows.pop(jid, None) is not None:
            del self._plain[jid], self._records[jid]
            self._unsaid(jid)
            self._records_view = None
            self._pending.drop(jid)
            self._active.drop(jid)
            self._deps.pop(jid, None)
            self._pods.discard(jid)
            self._gangs.discard(jid)

    def _refresh(self, session: Session, ids: list[int]) -> None:
        """Bring the changed jobs ``ids`` up to date: dropped if no longer live, read whole if
        their version moved (a row this controller committed and kept has not)."""
        rows = self._rows
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            versions = dict(session.execute(select(JobRow.id, JobRow.version).where(
                JobRow.id.in_(chunk), JobRow.state.in_(LIVE))).all())
            stale = []
            for jid in chunk:
                if jid not in versions:
                    self._drop(jid)
                elif rows.get(jid, (None,))[0] != versions[jid]:
                    stale.append(jid)
            if stale:
                self._fetch(session, stale)

    def _reload(self, session: Session) -> None:
        """Every live job's version read, and the rows whose version moved."""
        versions = dict(session.execute(select(JobRow.id, JobRow.version).where(JobRow.state.in_(LIVE))).all())
        for jid in self._rows.keys() - versions.keys():
            self._drop(jid)
        stale = [jid for jid, version in versions.items() if self._rows.get(jid, (None,))[0] != version]
        if len(stale) > len(versions) // 2:
            fetched = set()
            for r in session.scalars(select(JobRow).where(JobRow.state.in_(LIVE))):
                self._put(r)
                fetched.add(r.id)
            for jid in self._rows.keys() - fetched:  # PostgreSQL: ended between the two reads
                self._drop(jid)
        elif stale:
            self._fetch(session, stale)

    def _fetch(self, session: Session, ids: list[int]) -> None:
        """Read the rows ``ids`` whole and keep them, or drop those no longer live."""
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            live = set()
            for r in session.scalars(select(JobRow).where(JobRow.id.in_(chunk))):
                if r.state in LIVE:  # PostgreSQL: it may have ended between the two reads
                    self._put(r)
                    live.add(r.id)
            for jid in chunk:
                if jid not in live:
                    self._drop(jid)


def usage_records(session: Session, now: float, half_life_s: float) -> tuple[UsageRecord, ...]:
    """Every run that counts towards fair-share, in one query of small columns (not the spec)."""
    q = select(JobRow.user, JobRow.spec["account"].as_string(), JobRow.allocation,
               JobRow.start_time, JobRow.end_time).where(JobRow.start_time.is_not(None),
                                                          JobRow.allocation.is_not(None))
    if (horizon := cycle.usage_horizon(now, half_life_s)) is not None:
        q = q.where(or_(JobRow.end_time.is_(None), JobRow.end_time >= horizon))
    out = []
    for user, account, alloc, start, end in session.execute(q):
        nodes = (alloc or {}).get("nodes") or ()
        out.append(UsageRecord(user=user, account=account, gpus=sum(len(n["gpus"]) for n in nodes),
                               cpus=sum(n["cpus"] for n in nodes), start=start, end=end))
    return tuple(out)


def _other_jobs(session: Session, ids: set[int]) -> dict[int, JobRow]:
    """Rows of jobs that are not live but that a snapshot needs: those still completing
    (clean-ups) and those pending jobs depend on."""
    return {j.id: j for j in session.scalars(select(JobRow).where(JobRow.id.in_(ids)))} if ids else {}


def kinds_of(pending: tuple[PendingJob, ...]) -> frozenset[str]:
    """Which of "pod" and "gang" some of ``pending`` is (what a JobRowCache keeps as they come)."""
    return frozenset(kind for kind in ("pod", "gang") if any_is(pending, kind))


def build(session: Session, partitions, now: float, *, accounts: tuple[Account, ...] = (),
          qos: tuple[QOS, ...] = (), usage_half_life_s: float | None = None,
          topology: Topology | None = None, cache: JobRowCache | None = None,
          nodes: tuple[NodeInfo, ...] | None = None) -> Snapshot:
    """The Snapshot as of ``now``. ``usage_half_life_s`` None: no fair-share usage is read.
    ``cache``: job rows kept from the last pass, for the controller's passes; ``nodes``: the
    nodes as a NodeInfoCache keeps them (None: read now)."""
    if nodes is None:
        nodes = read_nodes(session)
    if cache is not None:
        live = cache.read(session)
    else:
        live = LiveJobs.of(session.scalars(select(JobRow).where(JobRow.state.in_(LIVE)).order_by(JobRow.id)))
    # In the queue's order by the jobs' own priorities: the cache keeps them so, a fresh read sorts them.
    pending = live.pending if cache is not None else tuple(queue_order(live.pending))
    preemptors = claimants(session) if pending and any(q.preempt for q in qos) else set()
    pending = cycle.mark_preemptors(pending, preemptors)
    kinds = (cache.pending_kinds if cache is not None else kinds_of(pending)) | ({"preemptor"} if preemptors else set())
    cleanups = list(session.scalars(select(CleanupRow)))
    extra = _other_jobs(session, ({c.job_id for c in cleanups} | live.wanted) - live.rows.keys())
    owners = {c.job_id: live.rows.get(c.job_id) or extra.get(c.job_id) for c in cleanups}
    active = live.active + tuple(cleanup_jobs(cleanups, owners))
    records = live.records
    more = {jid: job_record(r) for jid, r in extra.items()
            if jid in live.wanted or r.state in (JobState.RUNNING.value, JobState.PENDING.value)}
    if more:
        records = {**records, **more}
    usage = usage_records(session, now, usage_half_life_s) if usage_half_life_s is not None else ()
    return Snapshot(now=now, nodes=nodes, partitions=tuple(partitions), pending=pending, active=active,
                    jobs=records, accounts=accounts, usage=usage, qos=qos,
                    reservations=reservations(session, now), topology=topology, in_queue_order=True,
                    pending_kinds=kinds)
