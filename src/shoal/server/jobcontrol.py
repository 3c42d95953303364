"""Changing jobs: submit (and --test-only), cancel and signal, hold and release, requeue,
update, srun's steps and interactive allocations' ends.

Each use case takes the caller's session and owns its transaction; once it commits it
tells those who act on the change (the agents' hub, the scheduler) and answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shoal.model.hostlist import compress
from shoal.model.job import JobState
from shoal.model.resources import Allocation
from shoal.model.timefmt import format_timestamp
from shoal.sched.placement import check_feasible
from shoal.sched.schedule import schedule
from shoal.server import jobs as jobsvc
from shoal.server import steps as stepsvc
from shoal.server.auth import Principal
from shoal.server.retry import retry_on_conflict
from shoal.server.groupcommit import GroupCommit, InFlight
from shoal.server.joblist import ids_condition, job, jobs_json, long_state, parse_job_ids
from shoal.server.schemas import (BulkCancelRequest, CancelRequest, InteractiveComplete, JobSubmit, JobUpdate,
                                  StepComplete, StepCreate)
from shoal.server.snapshot import NodeInfoCache
from shoal.store.models import JobRow, NodeRow, StepRow

if TYPE_CHECKING:
    from shoal.server.core import Server


class Submissions:
    """sbatch's submissions: validated against the nodes as last read (NodeInfoCache), and
    those made at once committed together (one disk flush), each answered only once its job
    is committed. jobsvc.submit refuses (JobError) before it writes anything."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.nodes = NodeInfoCache(server.node_changes, check_feasible)
        self.commits = GroupCommit(server.sessions, refusals=(jobsvc.JobError,))
        self.in_flight = InFlight()

    def _store(self, s: Session, p: Principal, body: JobSubmit, now: float) -> dict:
        """Validate and store a submission in the caller's transaction (submit and --test-only)."""
        server = self.server
        self.nodes.nodes(s)  # this thread's members and verdicts: of the nodes as last committed
        return jobsvc.submit(s, p, body, partitions=server.partitions, members=self.nodes.members, now=now,
                             max_array_size=server.config.scheduler.max_array_size,
                             def_mem_per_cpu_mb=server.config.scheduler.def_mem_per_cpu_mb,
                             feasible=self.nodes.feasible, accounts=server.account_tree, qos=server.qos_table)

    def submit(self, body: JobSubmit, p: Principal) -> dict:
        now = self.server.clock()
        with self.in_flight as others:
            out = self.commits.run(lambda s: self._store(s, p, body, now))
        if not body.hold:  # a held job cannot start: no pass for it
            self.server.controller.submitted(alone=not others)
        return out

    def test_only(self, body: JobSubmit, p: Principal) -> dict:
        """sbatch --test-only: validate exactly as a submit would, plan it, and roll it back."""
        server = self.server
        now = server.clock()
        with server.sessions() as s:
            s.begin()
            try:
                out = self._store(s, p, body, now)
                snap = server.snapshot(s, now)
                plan = schedule(snap, server.sched_config)
                row = job(s, out["job_id"])
                start = next((st for st in plan.starts if st.job_id == row.id), None)
                return {
                    "job_id": row.id, "partition": row.partition,
                    "start_time": format_timestamp(now) if start else "Unknown",
                    "reason": None if start else plan.reasons.get(row.id),
                    "nodelist": compress(start.allocation.node_names) if start else "",
                    "cpus": sum(a.cpus for _, a in start.allocation.nodes) if start else 0,
                }
            finally:
                s.rollback()


def after_change(server: Server, touched: set[str]) -> None:
    """A committed change to jobs: their nodes' agents hear of it, the scheduler runs."""
    if touched:
        server.hub.bump(touched)
    server.controller.wake()


@retry_on_conflict
def bulk_cancel(server: Server, s: Session, body: BulkCancelRequest, p: Principal) -> dict:
    """scancel with filters: the active jobs matching all of them (a user's own without ids)."""
    now = server.clock()
    sig = jobsvc.parse_signal(body.signal)
    done, touched = [], set()
    with s.begin():
        q = select(JobRow).where(JobRow.state.in_(jobsvc.ACTIVE))
        if body.job_ids:
            q = q.where(ids_condition(*parse_job_ids(body.job_ids)))
        if body.user:
            q = q.where(JobRow.user == body.user)
        if body.partition:
            q = q.where(JobRow.partition == body.partition)
        if body.states:
            q = q.where(JobRow.state.in_([long_state(x) for x in body.states]))
        if body.name:
            q = q.where(JobRow.name == body.name)
        if body.qos:
            q = q.where(func.coalesce(JobRow.spec["qos"].as_string(), jobsvc.DEFAULT_QOS) == body.qos)
        if body.account:
            q = q.where(JobRow.spec["account"].as_string() == body.account)
        if not p.is_operator and not body.job_ids:
            q = q.where(JobRow.user == p.user)
        for row in s.scalars(q):
            touched |= _cancel_one(server, s, row, p, sig, _target(body), now)
            done.append(row.id)
    after_change(server, touched)
    return {"jobs": done}


@retry_on_conflict
def cancel(server: Server, s: Session, job_id: str, body: CancelRequest | None, p: Principal) -> dict:
    """Cancel or signal a job: `12` (with all its array tasks) or `12_3` (one task)."""
    body = body or CancelRequest()
    now = server.clock()
    sig = jobsvc.parse_signal(body.signal)
    ids, arrays = parse_job_ids([job_id])
    with s.begin():
        if arrays:
            aid, tid = arrays[0]
            where = (JobRow.array_job_id == aid) & (JobRow.array_task_id == tid)
        else:
            where = (JobRow.id == ids[0]) | (JobRow.array_job_id == ids[0])
        rows = list(s.scalars(select(JobRow).where(where)))
        if not rows:
            raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)
        live = [r for r in rows if not JobState(r.state).terminal]
        if not live:
            for r in rows:
                jobsvc.check_owner(r, p)
            raise jobsvc.JobError(f"Job/step already completing or completed: {job_id}", 409)
        touched: set[str] = set()
        for row in live:
            touched |= _cancel_one(server, s, row, p, sig, _target(body), now)
    after_change(server, touched)
    return {"jobs": [r.id for r in live]}


def _target(body: CancelRequest) -> str:
    return "full" if body.full else "batch" if body.batch else "steps"


def _cancel_one(server: Server, s: Session, row: JobRow, p: Principal, sig: int | None, target: str,
                now: float) -> set[str]:
    jobsvc.check_owner(row, p)
    names = Allocation.from_json(row.allocation).node_names if row.allocation else ()
    if sig is not None and sig != 9:
        if row.state != JobState.RUNNING.value:
            raise jobsvc.JobError(f"job {row.id} is not running, so it cannot be signalled", 409)
        key = jobsvc.job_run_key(row.id, row.restart_count)
        for node in names:
            if target != "steps" and node != row.batch_host and target != "full":
                continue
            server.hub.signal(node, key, sig, target)
        return set()
    jobsvc.cancel(s, row, p, now)
    return set(names)


@retry_on_conflict
def set_hold(server: Server, s: Session, job_id: int, p: Principal, held: bool) -> dict:
    """scontrol hold/release: a pending job (or array's pending tasks) held or released."""
    with s.begin():
        rows = list(s.scalars(select(JobRow).where((JobRow.id == job_id) | (JobRow.array_job_id == job_id))))
        if not rows:
            raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)
        for r in rows:  # someone else's job is refused as such, whatever its state
            jobsvc.check_owner(r, p)
        pending = [r for r in rows if r.state == JobState.PENDING.value]
        if not pending:
            raise jobsvc.JobError(f"Job is no longer pending execution: {job_id}", 409)
        for r in pending:
            r.held = held
            r.reason = "JobHeldUser" if held else "None"
    server.controller.wake()
    return {"jobs": [r.id for r in pending]}


@retry_on_conflict
def requeue(server: Server, s: Session, job_id: int, p: Principal) -> dict:
    now = server.clock()
    with s.begin():
        row = job(s, job_id)
        jobsvc.check_owner(row, p)
        if row.state != JobState.RUNNING.value:
            raise jobsvc.JobError(f"Job {job_id} is not running: only running jobs can be requeued", 409)
        names = Allocation.from_json(row.allocation).node_names
        jobsvc.requeue(s, row, now, via=JobState.PREEMPTED, reason="BeginTime")
        row.begin_time = now
    after_change(server, set(names))
    return {"jobs": [job_id]}


@retry_on_conflict
def update(server: Server, s: Session, job_id: int, body: JobUpdate, p: Principal) -> dict:
    """scontrol update job: time limit (raised by operators only), name, comment, the array's
    throttle, and while pending its partition and node count."""
    with s.begin():
        row = job(s, job_id)
        jobsvc.check_owner(row, p)
        if JobState(row.state).terminal:
            raise jobsvc.JobError(f"Job {job_id} has already finished", 409)
        if body.time_limit_s is not None:
            new = body.time_limit_s or None
            if not p.is_operator and (new is None or (row.time_limit_s is not None and new > row.time_limit_s)):
                raise jobsvc.JobError("Access/permission denied: only an operator or admin may raise "
                                      "a time limit", 403)
            row.time_limit_s = new
        if body.name is not None:
            row.name = body.name
        if body.comment is not None:
            row.comment = body.comment
        if body.array_throttle is not None:  # the whole array's limit, set on any of its tasks
            if row.array_job_id is None:
                raise jobsvc.JobError(f"Job {job_id} is not a job array: ArrayTaskThrottle needs one")
            tasks = s.scalars(select(JobRow).where(JobRow.array_job_id == row.array_job_id))
            for task in tasks:
                task.array_throttle = body.array_throttle or None
        if body.partition is not None or body.nodes is not None:
            if row.state != JobState.PENDING.value:
                raise jobsvc.JobError("Job is no longer pending execution: partition and node count "
                                      "can only change while pending", 409)
            if body.partition is not None:
                row.partition = jobsvc.pick_partition(server.partitions, body.partition).name
            if body.nodes is not None:
                row.request = {**row.request, "nodes": body.nodes,
                               "ntasks": max(row.request["ntasks"], body.nodes)}
        out = jobs_json(s, [row])[0]
    server.controller.wake()
    return out


@retry_on_conflict
def create_step(server: Server, s: Session, job_id: int, body: StepCreate, p: Principal) -> dict:
    """srun inside an allocation: a step laid out over the job's nodes."""
    with s.begin():
        row = job(s, job_id)
        jobsvc.check_owner(row, p)
        nodes = {n.name: n for n in s.scalars(select(NodeRow))}
        return stepsvc.create_step(s, server, row, body, nodes, server.clock())


@retry_on_conflict
def complete_step(server: Server, s: Session, job_id: int, step_id: int, body: StepComplete,
                  p: Principal) -> dict:
    with s.begin():
        row = job(s, job_id)
        jobsvc.check_owner(row, p)
        step = s.get(StepRow, (job_id, step_id))
        if step is None:
            raise jobsvc.JobError(f"no step {job_id}.{step_id}", 404)
        stepsvc.complete_step(step, body.exit_code, body.signal, server.clock())
        if body.reason:
            row.reason = body.reason[:64]  # the job's Reason in sacct and scontrol, kept at its end
    return {"ok": True}


@retry_on_conflict
def complete_interactive(server: Server, s: Session, job_id: int, body: InteractiveComplete,
                         p: Principal) -> dict:
    """srun's or salloc's allocation ended by its client (or given up while pending)."""
    now = server.clock()
    with s.begin():
        row = job(s, job_id)
        jobsvc.check_owner(row, p)
        if not row.interactive:
            raise jobsvc.JobError("only srun/salloc allocations are completed by their client", 409)
        names = Allocation.from_json(row.allocation).node_names if row.allocation else ()
        if row.state == JobState.RUNNING.value:
            state = JobState.COMPLETED if body.exit_code == 0 and body.signal == 0 else JobState.FAILED
            jobsvc.finish(s, row, state, now, exit_code=body.exit_code, signal=body.signal,
                          reason=body.reason[:64] if body.reason else None)
        elif row.state == JobState.PENDING.value:
            jobsvc.finish(s, row, JobState.CANCELLED, now)
    after_change(server, set(names))
    return {"ok": True}
