"""Build the scheduler's immutable Snapshot from the store."""

from __future__ import annotations

import threading

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, aliased
from sqlalchemy.orm.attributes import set_committed_value

from shoal.model.accounting import QOS, Account, UsageRecord
from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.model.reservation import AdvanceReservation
from shoal.model.resources import GPU, Allocation, NodeAllocation
from shoal.model.snapshot import ActiveJob, Dependency, JobRecord, NodeInfo, PendingJob, Snapshot
from shoal.server.jobs import ACTIVE, request_from_json
from shoal.server.kube.pods import POD, gang_of, terms_of
from shoal.model.topology import Topology
from shoal.sched import cycle
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
    """Every node's NodeInfo as submissions check them, and what ``check`` (placement's
    check_feasible) said of requests on them, kept until a commit of this process changes a
    node row (``changes``: a ChangeCount watching NodeRow). Each sbatch read every node and
    placed its job on an empty copy of the cluster; in a submission loop the nodes are the
    same every time. A disabled count (several servers on one store) keeps nothing."""

    def __init__(self, changes, check) -> None:
        self.changes = changes
        self.check = check
        # (count, nodes, verdicts on them), replaced whole; each thread's verdicts go with the
        # nodes its last nodes() gave it, so a verdict on nodes read before a change is never
        # kept for the nodes after it.
        self._kept: tuple[int | None, list[NodeInfo], dict] = (None, [], {})
        self._mine = threading.local()

    def nodes(self, session: Session) -> list[NodeInfo]:
        at = self.changes.value  # noted before the read: a commit racing it moves the count again
        kept = self._kept
        if not self.changes.enabled or at != kept[0]:
            kept = (at, list(read_nodes(session)), {})
            self._kept = kept
        self._mine.verdicts = kept[2]
        return kept[1]

    def feasible(self, request, partition, members: list[NodeInfo], *, time_limit_s: int | None) -> str | None:
        """``check``'s verdict; ``members`` are the partition's nodes from this thread's last ``nodes()``."""
        verdicts = getattr(self._mine, "verdicts", None)
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


def pending_job(row: JobRow) -> PendingJob:
    spec = row.spec
    return PendingJob(
        id=row.id,
        user=row.user,
        name=row.name,
        partition=row.partition,
        request=request_from_json(row.request),
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


def mark_preemptors(session: Session, pending: tuple[PendingJob, ...]) -> tuple[PendingJob, ...]:
    """Flag the pending jobs that other jobs were preempted for (a victim keeps its
    ``preemptor_id`` until it starts again), so the pass serves them first."""
    victim = aliased(JobRow)
    claimants = set(session.scalars(
        select(JobRow.id).join(victim, victim.preemptor_id == JobRow.id)
        .where(JobRow.state == JobState.PENDING.value).distinct()))
    return cycle.mark_preemptors(pending, claimants)


LIVE = ACTIVE  # pending or running: the rows a pass reads


def job_record(row: JobRow) -> JobRecord:
    return JobRecord(id=row.id, state=JobState(row.state), user=row.user, name=row.name, exit_code=row.exit_code,
                     start_time=row.start_time)


class JobRowCache:
    """The controller's live job rows and their PendingJob views, kept between passes by id
    and version: a pass reads whole rows (and decodes their JSON) only for jobs that changed
    since the one before, which with 10,000 queued jobs was nearly all of a pass's time.

    Every write of a job row bumps its version (the optimistic-concurrency column), so a
    row whose version is unchanged is unchanged. Only passes that read committed rows may
    use it (the controller's), never a transaction that is rolled back (``--test-only``).

    With ``changes`` (the job rows this process's commits changed), a pass reads only the
    versions of the jobs changed since the one before: with 50,000 jobs queued, reading
    every live job's id and version was a quarter of each pass. Without it (several servers
    on one store), or after a bulk statement (``ALL``), every live job's version is read.
    """

    def __init__(self, changes: ChangeCount | None = None) -> None:
        self._rows: dict[int, tuple[int, JobRow, PendingJob | None]] = {}
        self._records: dict[int, tuple[int, JobRecord]] = {}
        self._active: dict[int, tuple[int, ActiveJob]] = {}
        self._changes = changes
        self._synced = False  # _rows is every live job as of the changes taken so far

    def record(self, row: JobRow) -> JobRecord:
        """``job_record(row)``, made once per version of the row."""
        kept = self._records.get(row.id)
        if kept is None or kept[0] != row.version:
            kept = self._records[row.id] = (row.version, job_record(row))
        return kept[1]

    def active(self, row: JobRow) -> ActiveJob:
        """``active_job(row)``, made once per version of the running row."""
        kept = self._active.get(row.id)
        if kept is None or kept[0] != row.version:
            kept = self._active[row.id] = (row.version, active_job(row))
        return kept[1]

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
                    self._rows[r.id] = (r.version, r, pending_job(r) if r.state == JobState.PENDING.value else None)
            else:
                self._rows.pop(r.id, None)

    def written(self, job_id: int, version: int, values: dict) -> None:
        """A pending row's ``values`` (columns) the caller has just committed with a Core
        UPDATE that moved its version from ``version`` to the next: the kept row made to
        match, so the next ``read`` need not read it back. Its PendingJob view holds none of
        the columns written (reasons, estimates) and is kept."""
        kept = self._rows.get(job_id)
        if kept is None or kept[0] != version:
            return
        row = kept[1]
        for name, value in values.items():
            set_committed_value(row, name, value)
        set_committed_value(row, "version", version + 1)
        self._rows[job_id] = (version + 1, row, kept[2])

    def read(self, session: Session) -> tuple[list[JobRow], tuple[PendingJob, ...]]:
        """Live (pending and running) rows by id, and the pending ones' views."""
        changes = self._changes
        counted = changes is not None and changes.enabled
        keys = changes.take() if counted else {ALL}  # taken before reading: later commits are read next time
        if counted and self._synced and ALL not in keys:
            self._refresh(session, sorted(keys))
        else:
            self._reload(session)
            self._synced = counted
        rows = self._rows
        if max(len(self._records), len(self._active)) > 2 * len(rows) + 1000:  # ended jobs', now and then
            self._records = {jid: kept for jid, kept in self._records.items() if jid in rows}
            self._active = {jid: kept for jid, kept in self._active.items() if jid in rows}
        live = sorted(rows)
        return ([rows[jid][1] for jid in live],
                tuple(rows[jid][2] for jid in live if rows[jid][2] is not None))

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
                    rows.pop(jid, None)
                elif rows.get(jid, (None,))[0] != versions[jid]:
                    stale.append(jid)
                    rows.pop(jid, None)
            if stale:
                for r in session.scalars(select(JobRow).where(JobRow.id.in_(stale))):
                    if r.state in LIVE:  # PostgreSQL: it may have ended between the two reads
                        rows[r.id] = (r.version, r, pending_job(r) if r.state == JobState.PENDING.value else None)

    def _reload(self, session: Session) -> None:
        """Every live job's version read, and the rows whose version moved."""
        versions = session.execute(select(JobRow.id, JobRow.version).where(JobRow.state.in_(LIVE))
                                   .order_by(JobRow.id)).all()
        stale = [jid for jid, version in versions if self._rows.get(jid, (None,))[0] != version]
        if len(stale) > len(versions) // 2:
            fetched = session.scalars(select(JobRow).where(JobRow.state.in_(LIVE)))
        else:
            fetched = (r for i in range(0, len(stale), 500)
                       for r in session.scalars(select(JobRow).where(JobRow.id.in_(stale[i:i + 500]))))
        rows = {jid: self._rows[jid] for jid, _ in versions if jid in self._rows}
        for r in fetched:
            if r.state in LIVE:  # PostgreSQL: it may have ended between the two reads
                rows[r.id] = (r.version, r, pending_job(r) if r.state == JobState.PENDING.value else None)
        self._rows = rows


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
        live, pending = cache.read(session)
    else:
        live = list(session.scalars(select(JobRow).where(JobRow.state.in_(LIVE)).order_by(JobRow.id)))
        pending = tuple(pending_job(j) for j in live if j.state == JobState.PENDING.value)
    if pending and any(q.preempt for q in qos):
        pending = mark_preemptors(session, pending)
    running = [j for j in live if j.state == JobState.RUNNING.value]
    cleanups = list(session.scalars(select(CleanupRow)))
    by_id = {j.id: j for j in live}
    missing = {c.job_id for c in cleanups} - by_id.keys()
    wanted = {jid for p in pending for d in p.dependencies for jid in d.job_ids}
    fetch = (missing | wanted) - by_id.keys()
    extra = {j.id: j for j in session.scalars(select(JobRow).where(JobRow.id.in_(fetch)))} if fetch else {}
    all_rows = {**extra, **by_id}
    active_of = cache.active if cache is not None else active_job
    active = tuple([active_of(j) for j in running] + cleanup_jobs(cleanups, all_rows))
    record = cache.record if cache is not None else job_record
    records = {jid: record(r) for jid, r in all_rows.items()
               if jid in wanted or r.state == JobState.RUNNING.value or r.state == JobState.PENDING.value}
    usage = usage_records(session, now, usage_half_life_s) if usage_half_life_s is not None else ()
    return Snapshot(now=now, nodes=nodes, partitions=tuple(partitions), pending=pending, active=active,
                    jobs=records, accounts=accounts, usage=usage, qos=qos,
                    reservations=reservations(session, now), topology=topology)
