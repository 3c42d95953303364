"""The control loops: scheduling passes, preemption, time limits, --signal warnings and node heartbeats.

Level-triggered: each pass reads the store, decides with the pure policy in shoal.sched,
and applies the plan in one short transaction that re-checks every row it changes
(version column), so a pass is safe to run again at any time and a restart loses nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
import dataclasses
from dataclasses import dataclass
from operator import attrgetter

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.model.resources import Allocation
from shoal.model.snapshot import PendingJob, Plan, Start
from shoal.sched import cycle
from shoal.sched.placement import Headroom, PlacementCache, check_feasible, headroom
from shoal.sched.schedule import schedule, waits_behind, waits_settled
from shoal.server import jobs as jobsvc
from shoal.server.kube.pods import POD
from shoal.server.loop import KickedLoop
from shoal.server.snapshot import JobRowCache, NodeInfoCache
from shoal.store.changes import ChangeCount, note_changes
from shoal.store.models import CleanupRow, JobRow, NodeRow

log = logging.getLogger("shoal.controller")


_UNSAID = object()  # a job the kept rows do not know as pending: its reason is new whatever it is


@dataclass(frozen=True)
class Quiet:
    """What a pass read, for telling whether the next would plan the same: the count of
    commits (every server's) to what a snapshot reads, the server's settings it took (the
    scheduler's, partitions, accounts, QOS, topology), and until when time alone changes
    nothing (``cycle.quiet_until``, at most ``idle_pass_s``, and after a quick pass, until
    the next full one is due)."""

    changes: int
    settings: tuple
    until: float


class Controller(KickedLoop):
    name = "scheduler"

    def __init__(self, server) -> None:
        super().__init__()
        self.server = server
        self._warned: set[str] = set()  # runs whose --signal warning was sent
        self.passes = 0
        self._last_full = float("-inf")  # when the last full backfill pass ran
        self._last_pass_s = 0.0
        self._rows = JobRowCache()  # live job rows kept between passes
        # The nodes kept between passes until a node row changes (heartbeats do not change them);
        # made at the first pass, once the server's change counts are.
        self._nodes: NodeInfoCache | None = None
        self._placement = PlacementCache()  # the free state kept between passes (this thread's)
        # Why the loop was woken since its last step: a change that needs a pass (wake), or
        # only new submissions (submitted), which need one only if one of them may start.
        self._pass_asked = False
        self._submit_asked = False
        self._headroom: Headroom | None = None  # what the last pass left free
        self._settled: dict = {}  # the jobs it settled behind a reservation (Plan.settled)
        self._stopped: tuple | None = None  # where it stopped, a partial quick pass (Plan.stopped)
        self._seen_id = 0  # the newest job that pass saw, or judged since unable to start
        self._last_run = float("-inf")  # when the last pass ran
        self._last_checks = float("-inf")  # when heartbeats, time limits and grace were last checked
        # Submission streams (see submitted): monotonic times of the last submission and of
        # the last step that was not deferred; whether the last two submissions were a stream.
        self._last_submit = float("-inf")
        self._last_step = float("-inf")
        self._streaming = False
        self._defer_s = 0.0  # how long the loop rests before looking again (0: not deferring)
        # Periodic passes are skipped while nothing a pass reads has changed (watch_inputs).
        self._inputs: ChangeCount | None = None
        self._quiet: Quiet | None = None
        self.skipped = 0

    def watch_rows(self, changes: ChangeCount) -> None:
        """Keep the job rows between passes by the changes this process commits (a pass then
        reads only those). Given before the server takes any request: a transaction already
        under way when the count is made would not be counted, and its jobs never read."""
        self._rows = JobRowCache(changes)

    def watch_inputs(self, changes: ChangeCount) -> None:
        """Skip a periodic pass while no commit (this server's, or another's heard on the
        change feed) has written what a
        snapshot reads (``changes``: jobs, clean-ups, nodes, reservations, partitions,
        accounting) since the last pass, the server's settings are the same and time has
        opened nothing (``Quiet``): with 90,000 jobs queued on a full cluster, each such pass
        took 0.8 s of the server's time a second to plan what the last one had. Slurm's main
        scheduler, too, runs on events and otherwise every ``sched_interval`` (60 s): the
        pass still runs every ``idle_pass_s``. Not for a wake-up that asked for a pass."""
        self._inputs = changes

    def interval_s(self) -> float:
        return self.server.config.scheduler.interval_s

    def wake(self) -> None:
        self._pass_asked = True
        self.server.hub.touch()
        super().wake()

    def submitted(self, alone: bool = True) -> None:
        """Jobs were queued. A pass follows at once if one of them may start now; else the
        next periodic pass (``interval_s``) gives them their reasons, as Slurm's does: with a
        full cluster and a long queue, a pass per submission was most of the server's time.

        Submissions closer together than ``stream_gap_s``, each made ``alone`` (no other
        submission in flight), are a stream: one submitter's sbatch loop, waiting for each
        answer before the next call. The stream goes on while its submissions come closer
        together than ``stream_pause_s``: on a busy machine a loop has hiccups of tens of
        milliseconds, and each one ended it, starting the jobs queued so far in the middle
        of the loop. While it lasts, passes wait for it to pause, at most ``stream_defer_s``
        after the last one (``stream_wait``), and then start its jobs in one batch; a pass,
        and starting, watching and ending its jobs, would otherwise take the server's time
        between every two submissions, and the loop would go at the rate jobs run rather
        than the rate they are taken. Submissions from several submitters at once keep the
        server busy anyway, and their jobs start as they come, alongside."""
        now = time.monotonic()
        config = self.server.config.scheduler
        since = now - self._last_submit
        self._streaming = alone and (since < config.stream_gap_s or (self._streaming and since < _pause_s(config)))
        self._last_submit = now
        self._submit_asked = True
        self.server.hub.touch()
        super().wake()

    def step(self) -> None:
        t0 = time.perf_counter()
        config = self.server.config.scheduler
        now = time.monotonic()
        wait = stream_wait(now, self._last_submit if self._streaming else float("-inf"), self._last_step,
                           _pause_s(config), config.stream_defer_s)
        if wait > 0:
            self._defer_s = wait
            self.kick.set()  # look again after resting ``wait`` (rest_s); what asked is kept
            return
        self._defer_s = 0.0
        self._last_step = now
        # Woken by the interval, or by another server's relay, neither flag is set: a pass,
        # unless nothing it would read has changed.
        only_submits = self._submit_asked and not self._pass_asked
        periodic = not self._submit_asked and not self._pass_asked
        self._pass_asked = self._submit_asked = False
        if only_submits and self._none_may_start():
            self._last_pass_s = 0.0
            return
        self._last_run = self.server.clock()
        self.run_pass(periodic)
        self._last_pass_s = time.perf_counter() - t0

    def _none_may_start(self) -> bool:
        """Whether no job queued since the last pass can start (nothing has ended since: an
        end wakes the loop for a pass): each needs more on a node than that pass left free on
        any (``Headroom``), or, after a full EASY backfill pass with another full one next,
        would wait as one like it waited in that pass (``waits_settled``), or, after a partial
        quick pass with another quick one next, comes after the job where it stopped
        (``waits_behind``): on a full cluster
        the GPUs kept free for a reserved job fit most submissions, which still cannot start.
        A job is judged once: those judged since the pass are not read again. Preemption may
        make room for any job, so with a preempting QOS every submission gets its pass. (On
        PostgreSQL a lower id may commit after a higher one was judged: that job waits for
        the periodic pass, at most ``interval_s``.)"""
        s = self.server
        room = self._headroom
        if room is None or s.clock() - self._last_run >= self.interval_s() or any(q.preempt for q in s.qos):
            return False
        full_next = cycle.full_pass_due(s.sched_config, s.clock(), self._last_full)
        settled, stopped = (self._settled, None) if full_next else ({}, self._stopped)
        with s.sessions() as session:
            fresh = session.execute(select(*_QUEUED).where(
                JobRow.id > self._seen_id, JobRow.state == JobState.PENDING.value,
                JobRow.held.is_(False)).order_by(JobRow.id))
            for row in fresh:
                request = jobsvc.request_from_json(row.request)
                if room.may_fit(request) and (row.kind == POD or not (
                        waits_settled(settled, job := _queued(row, request)) or waits_behind(stopped, job))):
                    return False
                self._seen_id = row.id
        return True

    def rest_s(self) -> float:
        if self._defer_s > 0:
            return self._defer_s
        # As long as the pass took (at most one interval): under a stream of submissions,
        # each waking the loop, passes over a long queue take at most half of the server's
        # time, and the API keeps the rest; a short queue's pass takes milliseconds, so a
        # job still starts milliseconds after it was submitted.
        return min(self._last_pass_s, self.interval_s())

    def active(self) -> bool:
        return self.server.leader.is_leader

    def run_pass(self, periodic: bool = False) -> None:
        """The clock's checks when due, then a pass (``periodic``: none if ``_unchanged``)."""
        now = self.server.clock()
        touched: set[str] = set()
        # The clock's checks once an interval: a pass for a start or an end need not scan
        # the running jobs for time limits and grace, nor the nodes for heartbeats, again.
        if now - self._last_checks >= self.interval_s() or now < self._last_checks:
            self._last_checks = now
            touched |= self._check_heartbeats(now)
            touched |= self._enforce_time_limits(now)
            touched |= self._end_preemption_grace(now)
        if periodic and self._unchanged(now):
            self.skipped += 1
            self.server.metrics.passes_skipped.inc()
            if touched:
                self.server.hub.bump(touched)
            return
        for _attempt in range(3):
            try:
                touched |= self._schedule(now)
                break
            except StaleDataError:
                now = self.server.clock()
                self._rows.stale()
        self.passes += 1
        if touched:
            self.server.hub.bump(touched)

    def _unchanged(self, now: float) -> bool:
        """Whether a pass now would read what the last pass read (``Quiet``)."""
        quiet, inputs = self._quiet, self._inputs
        return (quiet is not None and inputs is not None and inputs.enabled and inputs.value == quiet.changes
                and now < quiet.until and self._settings() == quiet.settings)

    def _settings(self) -> tuple:
        s = self.server
        return (s.sched_config, s.partitions, s.accounts, s.qos, s.topology)

    # -------------------------------------------------------------- scheduling

    def _schedule(self, now: float) -> set[str]:
        s = self.server
        t0 = time.perf_counter()
        self._headroom, self._settled, self._stopped = None, {}, None  # unknown until this pass's plan is applied
        self._quiet = None  # known again once this pass's plan is applied
        read = None
        if self._inputs is not None:
            self._inputs.take()  # only the count is used: its keys are dropped
            read = Quiet(self._inputs.value, self._settings(), float("inf"))  # before the snapshot reads
        with s.sessions() as session:
            if session.scalar(select(JobRow.id).where(JobRow.state == JobState.PENDING.value).limit(1)) is None:
                return set()  # nothing to start (a job's end with an empty queue): no snapshot
            if self._nodes is None:
                self._nodes = NodeInfoCache(s.node_changes, check_feasible)
            snap = s.snapshot(session, now, cache=self._rows, nodes=self._nodes.nodes(session))
        seen = max(max(map(_ID, snap.pending), default=0), max(map(_ID, snap.active), default=0))  # in C: 100,000 jobs
        if not snap.pending:
            self._headroom, self._seen_id = headroom(snap, cache=self._placement), seen
            return set()
        # Full backfill passes at most every bf_interval_s; quick ones (in queue order up to
        # the first job that cannot start, which delays no reservation) in between. Only a
        # full pass plans start times, so only a full pass updates them.
        config = s.sched_config
        full = cycle.full_pass_due(config, now, self._last_full)
        plan = schedule(snap, cycle.pass_config(config, full), self._placement)
        if full:
            self._last_full = now
        quiet = None
        if read is not None:  # a quick pass plans what the last did until a full one is due
            due = float("inf") if full else self._last_full + config.bf_interval_s
            quiet = dataclasses.replace(read, until=min(cycle.quiet_until(snap), now + s.config.scheduler.idle_pass_s,
                                                        due))
        reasons = {**plan.reasons, **plan.never}
        signals: list[tuple[str, str, int, str]] = []
        before = self._inputs.value if self._inputs is not None else None  # the count before this pass's commit
        with s.sessions() as session, session.begin():
            s.leader.fence(session)
            victims = {v for p in plan.preemptions for v in p.victim_ids}
            preemptors = {p.preemptor_id for p in plan.preemptions}
            # Whole rows only for the jobs this pass starts or preempts for; the reasons it
            # changes are written without loading theirs (write_reasons).
            changed = self._changed_reasons(reasons, plan.estimates if full else None)
            starts = self._kept_starts(plan.starts)
            written = start_kept(session, starts, now)  # before the rows below are read: they see it
            ids = list(victims | preemptors)
            rows = {r.id: r for r in session.scalars(select(JobRow).where(JobRow.id.in_(ids)))} if ids else {}
            touched = {node for _, st in starts for node in st.allocation.node_names}
            for jid in changed & rows.keys():  # a preemptor's row, loaded above
                row = rows[jid]
                if row.state != JobState.PENDING.value:
                    continue
                if row.reason != reasons[jid]:
                    row.reason = reasons[jid]
                # Compared first: an unchanged estimate must not rewrite the row every pass.
                if full and row.expected_start != plan.estimates.get(jid):
                    row.expected_start = plan.estimates.get(jid)
            reasons_written = write_reasons(session, self._rows, {jid: (reasons[jid], plan.estimates.get(jid))
                                                                  for jid in changed - rows.keys()}, full)
            for preemption in plan.preemptions:
                touched |= self._preempt(session, rows, preemption, now, signals)
        started = started_rows(starts, written)
        self._rows.kept([*rows.values(), *started])  # committed: the next pass need not read them back
        for jid, version, values in reasons_written:
            self._rows.written(jid, version, values)
        for row in started:
            s.metrics.run_started(row, now)
        s.metrics.scheduled(full, time.perf_counter() - t0, len(started), plan.tested, len(snap.pending))
        for node, key, signum, target in signals:  # only once the preemption is committed
            s.hub.signal(node, key, signum, target)
        self._headroom, self._seen_id = headroom(snap, [st.allocation for st in plan.starts], self._placement), seen
        self._settled, self._stopped = plan.settled, plan.stopped
        # Only once the plan is applied: a failed apply is planned again.
        self._quiet = self._past_own_commit(quiet, before, plan, bool(started or reasons_written))
        return touched

    def _past_own_commit(self, quiet: Quiet | None, before: int | None, plan: Plan, wrote: bool) -> Quiet | None:
        """``quiet`` with this pass's own commit counted as read, when nothing else was
        committed since the pass read the store: the next pass would plan what this one did
        (its starts running, its reasons written), so a periodic pass need not run for it. Not
        after a preemption: the victims' ends, in that commit or to come, free what the
        preemptor waits for. Not when the pass wrote nothing (``wrote``): it made no commit,
        and a count moved by one is someone else's. Any other commit, before or after this
        one, leaves the count beyond and the next periodic pass runs."""
        if quiet is None or before is None or plan.preemptions or not wrote or quiet.changes != before:
            return quiet
        after = self._inputs.value  # type: ignore[union-attr]
        return dataclasses.replace(quiet, changes=after) if after == before + 1 else quiet

    def _kept_starts(self, starts: list[Start]) -> list[tuple[JobRow, Start]]:
        """The plan's starts, each with its job's row as the snapshot read it."""
        out = []
        for st in starts:
            row = self._rows.row(st.job_id)
            if row is None or row.state != JobState.PENDING.value or row.held:
                continue  # not startable as the snapshot read it (never planned so)
            out.append((row, st))
        return out

    def _changed_reasons(self, reasons: dict[int, str], estimates: dict[int, float] | None) -> set[int]:
        """The pending jobs whose reason (or, in a full pass, start estimate) the plan changes,
        judged by the rows the snapshot read (their version was current then; a row changed
        since is re-read by the apply and re-checked there). A job not pending there has changed."""
        said, starts = self._rows.said_reason, self._rows.said_start
        changed = {jid for jid, reason in reasons.items() if said.get(jid, _UNSAID) != reason}
        if estimates is not None:  # and those whose estimate moved, came or went
            changed.update(jid for jid, start in estimates.items() if starts.get(jid) != start and jid in reasons)
            changed.update(jid for jid in starts if jid not in estimates and jid in reasons)
        return changed

    # -------------------------------------------------------------- preemption

    def _preempt(self, session, rows: dict[int, JobRow], preemption, now: float,
                 signals: list[tuple[str, str, int, str]]) -> set[str]:
        """Mark a plan's victims preempted and signal them (--signal), or end them at once
        when they have no grace. Skipped whole if anything changed since the snapshot."""
        s = self.server
        preemptor = rows.get(preemption.preemptor_id)
        victims = [rows.get(v) for v in preemption.victim_ids]
        if preemptor is None or preemptor.state != JobState.PENDING.value or preemptor.held:
            return set()
        if any(v is None or v.state != JobState.RUNNING.value or v.preempted_at is not None
               for v in victims):
            return set()  # a victim ended or is going already: the next pass plans again
        touched: set[str] = set()
        cap = s.config.scheduler.preempt_grace_s
        for v in victims:
            log.info("job %s preempts job %s (%s)", preemptor.id, v.id, v.spec.get("qos") or "normal")
            s.metrics.preempted(session, v)
            v.preempted_at, v.preemptor_id = now, preemptor.id
            if jobsvc.preemption_grace_s(v, cap) > 0:
                signals.extend(self._signal_targets(v))
            else:
                jobsvc.end_preempted(session, v, now, s.qos_table)
                touched.update(Allocation.from_json(v.allocation).node_names)
        return touched

    def _end_preemption_grace(self, now: float) -> set[str]:
        """Preempted jobs whose grace is over: requeue or cancel them, as their QOS says."""
        s = self.server
        cap = s.config.scheduler.preempt_grace_s
        touched: set[str] = set()
        with s.sessions() as session, session.begin():
            s.leader.fence(session)
            for row in session.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value,
                                                           JobRow.preempted_at.is_not(None))):
                if now >= row.preempted_at + jobsvc.preemption_grace_s(row, cap):
                    touched.update(Allocation.from_json(row.allocation).node_names)
                    jobsvc.end_preempted(session, row, now, s.qos_table)
        return touched

    @staticmethod
    def _signal_targets(row: JobRow) -> list[tuple[str, str, int, str]]:
        """Where a job's --signal goes: (node, run key, signal, target); B: the batch shell alone."""
        sig = row.spec["signal"]
        key = jobsvc.job_run_key(row.id, row.restart_count)
        if sig["batch_only"]:
            return [(row.batch_host, key, sig["signal"], "batch_shell")] if row.batch_host else []
        return [(node, key, sig["signal"], "steps")
                for node in Allocation.from_json(row.allocation).node_names]

    # -------------------------------------------------------------- time limits

    def _enforce_time_limits(self, now: float) -> set[str]:
        s = self.server
        touched: set[str] = set()
        with s.sessions() as session, session.begin():
            s.leader.fence(session)
            running = session.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value,
                                                           JobRow.time_limit_s.is_not(None)))
            for row in running:
                end = (row.start_time or now) + row.time_limit_s
                sig = row.spec.get("signal")
                key = jobsvc.job_run_key(row.id, row.restart_count)
                if sig and now >= end - sig["time"] and key not in self._warned:
                    self._warned.add(key)
                    for target in self._signal_targets(row):
                        s.hub.signal(*target)
                if now >= end:
                    jobsvc.finish(session, row, JobState.TIMEOUT, now, reason="TimeLimit")
                    touched.update(Allocation.from_json(row.allocation).node_names)
        return touched

    # -------------------------------------------------------------- node lifecycle

    def _check_heartbeats(self, now: float) -> set[str]:
        s = self.server
        timeout = s.config.nodes.heartbeat_timeout_s
        elected = s.leader.elected_at
        if elected is not None and now - elected < timeout:
            return set()  # a new leader, or a server just started, gives every node a full timeout first
        s.heartbeats.flush()  # the reports this server heard, stored before it judges anyone silent
        with s.sessions() as session, session.begin():
            s.leader.fence(session)
            late = list(session.scalars(select(NodeRow).where(
                NodeRow.state != NodeState.DOWN.value, NodeRow.last_heartbeat < now - timeout)))
            if not late:
                return set()
            for node in late:
                log.warning("node %s not responding for %.0fs: DOWN", node.name, now - node.last_heartbeat)
                node.state = NodeState.DOWN.value
                node.reason = "Not responding"
                node.reason_time = now
            return self.fail_nodes_jobs(session, frozenset(node.name for node in late), now, silent=True)

    def fail_node_jobs(self, session, node: str, now: float, *,
                       only: Callable[[JobRow], bool] | None = None, silent: bool = False) -> set[str]:
        """A node is gone: its jobs end NODE_FAIL, or go back to the queue when they asked for --requeue.

        ``only`` narrows it to some of the node's jobs (those on a lost GPU, the runs a fenced
        agent stopped); the node is then alive, so their processes are cleaned up as usual.
        ``silent``: the node stopped answering, so a run may have ended by itself unseen; each
        job keeps which run it gave up (``lost_run``) for the node to correct when it is back.
        """
        return self.fail_nodes_jobs(session, frozenset({node}), now, only=only, silent=silent)

    def fail_nodes_jobs(self, session, nodes: frozenset[str], now: float, *,
                        only: Callable[[JobRow], bool] | None = None, silent: bool = False) -> set[str]:
        """fail_node_jobs for several nodes at once: a wave of silent nodes costs one read of
        the running jobs' allocations, not one per node, and loads only the jobs on them."""
        touched: set[str] = set()
        skip = nodes if only is None else frozenset()
        if only is None:  # on the connection, its jobs noted: through the session it would count as any job's
            cleanups = CleanupRow.__table__
            gone = session.connection().execute(delete(cleanups).where(cleanups.c.node.in_(nodes))
                                                .returning(cleanups.c.job_id)).scalars().all()
            note_changes(session, CleanupRow, gone)
        on = [jid for jid, allocation in session.execute(select(JobRow.id, JobRow.allocation).where(
              JobRow.state == JobState.RUNNING.value))
              if allocation and not nodes.isdisjoint(Allocation.from_json(allocation).node_names)]
        for i in range(0, len(on), 500):  # a bounded IN (...)
            for row in session.scalars(select(JobRow).where(JobRow.id.in_(on[i:i + 500]),
                                                            JobRow.state == JobState.RUNNING.value)
                                       .order_by(JobRow.id)):
                if only is not None and not only(row):
                    continue
                names = Allocation.from_json(row.allocation).node_names
                if silent and row.batch_host in nodes:
                    row.lost_run = {"run": row.restart_count, "node": row.batch_host, "start_time": row.start_time,
                                    "allocation": row.allocation, "time": now}
                if row.requeue:
                    jobsvc.requeue(session, row, now, via=JobState.NODE_FAIL, reason="BeginTime", skip_nodes=skip)
                else:
                    jobsvc.finish(session, row, JobState.NODE_FAIL, now, reason="NodeFail", skip_nodes=skip)
                touched.update(n for n in names if n not in skip)
        return touched


_JOBS = JobRow.__table__
_START = (update(_JOBS)
          .where(_JOBS.c.id == bindparam("b_id"), _JOBS.c.version == bindparam("b_version"),
                 _JOBS.c.state == JobState.PENDING.value, _JOBS.c.held.is_(False))
          .values(state=JobState.RUNNING.value, allocation=bindparam("b_allocation", type_=JobRow.allocation.type),
                  batch_host=bindparam("b_host"), start_time=bindparam("b_now"), reason="None",
                  expected_start=None, preempted_at=None, preemptor_id=None,  # a requeued victim's preemption is over
                  version=_JOBS.c.version + 1))
"""A start, written only if the row is still the version the snapshot read, pending and not held."""


_ID = attrgetter("id")

_QUEUED = (JobRow.id, JobRow.user, JobRow.partition, JobRow.request, JobRow.submit_time, JobRow.time_limit_s,
           JobRow.priority, JobRow.kind, JobRow.spec["account"].label("account"), JobRow.spec["qos"].label("qos"),
           JobRow.spec["nice"].label("nice"))
"""What ``_none_may_start`` reads of a job queued since the last pass (not its script)."""


def _queued(row, request) -> PendingJob:
    """A job (not a pod: a pod never waits settled) queued since the last pass, as far as
    ``waits_settled`` and ``waits_behind`` read it: ``pending_job``'s fields, not its script."""
    return PendingJob(id=row.id, user=row.user, name="", partition=row.partition, request=request,
                      submit_time=row.submit_time, time_limit_s=row.time_limit_s, priority=row.priority,
                      account=row.account, qos=row.qos, nice=int(row.nice or 0))


def start_kept(session: Session, starts: list[tuple[JobRow, Start]], now: float) -> list[dict]:
    """Start jobs from the rows the snapshot read, in one statement that checks each row's
    version, instead of loading them whole again (their JSON decoded: a fifth of a pass with
    40,000 jobs queued). If any row moved since the snapshot (a job cancelled, held or
    updated) this raises StaleDataError, as the ORM does, and the pass is planned again from
    a fresh snapshot (run_pass): a plan made from an old row is never applied to a new one.
    Returns what each start wrote (for ``started_rows``)."""
    params = [{"b_id": row.id, "b_version": row.version, "b_allocation": st.allocation.to_json(),
               "b_host": st.allocation.node_names[0], "b_now": now} for row, st in starts]
    if not params:
        return params
    done = _rows_written(session, _START, params)
    if done != len(params):
        raise StaleDataError(f"{len(params) - done} of {len(params)} jobs to start changed since the snapshot")
    note_changes(session, JobRow, [p["b_id"] for p in params])
    return params


def started_rows(starts: list[tuple[JobRow, Start]], written: list[dict]) -> list[JobRow]:
    """The kept rows made what ``start_kept`` wrote, once it is committed (they are detached:
    nothing flushes them; the cache keeps them as the store now has them)."""
    for (row, _), values in zip(starts, written, strict=True):
        row.state = JobState.RUNNING.value
        row.allocation, row.batch_host, row.start_time = values["b_allocation"], values["b_host"], values["b_now"]
        row.reason, row.expected_start, row.preempted_at, row.preemptor_id = "None", None, None, None
        row.version += 1
    return [row for row, _ in starts]


def _rows_written(session: Session, statement, params: list[dict]) -> int:
    """``statement`` (a versioned UPDATE) run once per ``params`` as one executemany in
    ``session``'s transaction; how many rows it wrote."""
    conn = session.connection()
    if conn.dialect.supports_sane_multi_rowcount:
        return conn.execute(statement, params).rowcount
    return sum(conn.execute(statement, p).rowcount for p in params)  # a driver that does not count an executemany's


_AS_SEEN = (_JOBS.c.id == bindparam("job_id")) & (_JOBS.c.version == bindparam("seen")) & (
    _JOBS.c.state == JobState.PENDING.value)
_WRITE_REASON = update(_JOBS).where(_AS_SEEN).values(reason=bindparam("new_reason"), version=_JOBS.c.version + 1)
_WRITE_REASON_ESTIMATE = update(_JOBS).where(_AS_SEEN).values(
    reason=bindparam("new_reason"), expected_start=bindparam("new_start"), version=_JOBS.c.version + 1)


def write_reasons(session: Session, cache: JobRowCache, jobs: dict[int, tuple[str, float | None]],
                  full: bool) -> list[tuple[int, int, dict]]:
    """Write pending jobs' new reasons (and, in a ``full`` pass, start estimates), ``jobs``:
    id -> (reason, estimate), in ``session``'s transaction, as one executemany of a versioned
    UPDATE. Loading each row whole and flushing one ORM UPDATE per row, with 50,000 jobs
    queued, held the store's writer lock (SQLite's one writer) while submissions waited,
    and on PostgreSQL made a deep queue crawl.

    A row is written only if it is still pending at the version the pass's snapshot read
    (``cache``): one cancelled, held or changed since keeps what it has, and the next pass
    sees it. Every write bumps the version and is recorded for the change counts, so the
    queue view and the caches read it. Returned, for ``cache.written`` once committed (the
    next pass need not read them back): (id, version seen, values) of every row, when every
    one was written; none when some were not (which is unknown: the next pass re-reads them)."""
    writes: list[dict] = []
    for jid, (reason, estimate) in jobs.items():
        row = cache.row(jid)
        if row is not None:
            writes.append({"job_id": jid, "seen": row.version, "new_reason": reason, "new_start": estimate})
    if not writes:
        return []
    done = _rows_written(session, _WRITE_REASON_ESTIMATE if full else _WRITE_REASON, writes)
    note_changes(session, JobRow, [w["job_id"] for w in writes])
    if done != len(writes):
        return []
    columns = ("reason", "expected_start") if full else ("reason",)
    return [(int(w["job_id"]), int(w["seen"]), dict(zip(columns, (w["new_reason"], w["new_start"]))))
            for w in writes]


def _pause_s(config) -> float:
    return max(config.stream_pause_s, config.stream_gap_s)


def stream_wait(now: float, stream_submit: float, last_step: float, pause_s: float, defer_s: float) -> float:
    """How long a pass should still wait for a stream of submissions to pause (0: run it now).

    ``stream_submit``: when the stream's latest submission came (``-inf``: no stream); the
    stream has paused once ``pause_s`` passed without one. The wait ends ``defer_s`` after the
    last pass (``last_step``) however long the stream lasts, so its jobs start in batches."""
    if defer_s <= 0 or now - stream_submit >= pause_s:
        return 0.0
    left = last_step + defer_s - now
    return min(stream_submit + pause_s - now, left) if left > 0 else 0.0
