"""Reading jobs: squeue's and scontrol's listings, one job, its script, output and usage.

PrivateData=jobs limits who sees what (``private_jobs``); squeue's default call is
answered from the queue view kept in memory (server/queueview.py), the rest from the store,
both through one definition of squeue's filters (``JobFilter``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi.responses import Response
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from shoal.model.arrays import format_array
from shoal.model.job import JobState
from shoal.model.resources import Allocation
from shoal.server import fastpath, gpuacct
from shoal.server import jobs as jobsvc
from shoal.server import listing
from shoal.server.auth import Principal
from shoal.server.endpoints import Reply
from shoal.server.kube.logs import AgentEndpoint
from shoal.store.models import CleanupRow, JobRow, NodeRow, StepRow

if TYPE_CHECKING:
    from shoal.server.core import Server
    from shoal.server.queueview import QueueView


def parse_job_ids(values: list[str]) -> tuple[list[int], list[tuple[int, int]]]:
    """``12,13_4``: plain ids (a whole array's with them) and (array, task) pairs."""
    ids: list[int] = []
    arrays: list[tuple[int, int]] = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                if "_" in part:
                    a, _, t = part.partition("_")
                    arrays.append((int(a), int(t)))
                else:
                    ids.append(int(part))
            except ValueError:
                raise jobsvc.JobError(f"Invalid job id specified: {part}") from None
    return ids, arrays


def ids_condition(ids: list[int], arrays: list[tuple[int, int]]):
    """The SQL condition for parse_job_ids' answer: the jobs named, array tasks with them."""
    conds = [JobRow.id.in_(ids) | JobRow.array_job_id.in_(ids)] if ids else []
    conds += [(JobRow.array_job_id == a) & (JobRow.array_task_id == t) for a, t in arrays]
    return or_(*conds)


def long_state(s: str) -> str:
    short = {st.short: st.value for st in JobState}
    return short.get(s.upper(), s.upper())


@dataclass(frozen=True)
class JobFilter:
    """squeue's filters, defined once: as SQL conditions for the store (``conditions``) and as
    a test of the queue view's dicts kept in memory (``admits``). Each of ``sets`` keeps the
    jobs whose column is one of its values; ``since`` those not ended before it; ``owner``
    (PrivateData=jobs) a caller's own jobs, as (column, value)."""

    sets: tuple[tuple[str, frozenset[str]], ...] = ()
    since: float | None = None
    owner: tuple[str, object] | None = None

    @classmethod
    def of(cls, user: str | None = None, partition: str | None = None, state: list[str] | tuple[str, ...] = (),
           name: str | None = None, since: float | None = None, owner: Principal | None = None) -> JobFilter:
        """From the API's parameters (comma-separated lists; states in either case)."""
        sets = [(column, frozenset(values)) for column, values in (
            ("user", user.split(",") if user else None), ("partition", partition.split(",") if partition else None),
            ("state", [x.upper() for x in state] if state else None), ("name", name.split(",") if name else None))
            if values is not None]
        return cls(tuple(sets), since, None if owner is None else owner_key(owner))

    def conditions(self) -> list:
        out = [getattr(JobRow, column).in_(sorted(values)) for column, values in self.sets]
        if self.since is not None:
            out.append(JobRow.end_time.is_(None) | (JobRow.end_time >= self.since))
        if self.owner is not None:
            out.append(getattr(JobRow, self.owner[0]) == self.owner[1])
        return out

    def admits(self, job: dict) -> bool:
        for column, values in self.sets:
            if job[_KEYS[column]] not in values:
                return False
        return ((self.since is None or job["end_time"] is None or job["end_time"] >= self.since)
                and (self.owner is None or job[_KEYS[self.owner[0]]] == self.owner[1]))

    @property
    def admits_all(self) -> bool:
        return not self.sets and self.since is None and self.owner is None

    def select(self, jobs: list[dict]) -> list[dict]:
        """The queue view's jobs this filter admits."""
        if self.admits_all:
            return jobs
        return [j for j in jobs if self.admits(j)]


_KEYS = {"id": "job_id", "user": "user", "partition": "partition", "state": "state", "name": "name"}
"""JobRow's columns the filters read, by their keys in the queue view's dicts."""


def owner_key(p: Principal) -> tuple[str, object]:
    """What makes a job the caller's own: the job itself for a job's credential, else its user."""
    return ("id", p.job_id) if p.role == "job" else ("user", p.user)


def private_jobs(server: Server, p: Principal):
    """With PrivateData=jobs, the condition limiting a caller to its own jobs (None: sees all)."""
    if not _private(server, p):
        return None
    column, value = owner_key(p)
    return getattr(JobRow, column) == value


def _private(server: Server, p: Principal) -> bool:
    return "jobs" in server.config.auth.private_data and not p.is_operator


def from_queue_view(server: Server, job_id: list[str], all: bool, view: str | None) -> bool:
    """Whether list_jobs answers from squeue's view kept in memory."""
    return view == "queue" and not job_id and not all and server.queue.available


def list_jobs(server: Server, job_id: list[str], user: str | None = None, partition: str | None = None,
              state: list[str] | tuple[str, ...] = (), name: str | None = None, all: bool = False,
              since: float | None = None, view: str | None = None, *, viewer: Principal,
              collapse: bool = False) -> list[dict]:
    """Jobs as docs/API.md's Job objects, or with ``view=queue`` only the keys squeue's
    default table reads (jobsvc.QUEUE_VIEW), read from their columns alone; with ``collapse``
    each array's pending tasks merged into one, as squeue shows them (``listing.collapse``)."""
    if view not in (None, "queue"):
        raise jobsvc.JobError(f"unknown view {view!r} (expected queue)")
    wanted = JobFilter.of(user, partition, state, name, since, viewer if _private(server, viewer) else None)
    if from_queue_view(server, job_id, all, view):
        # squeue's default call, in users' loops: from the view kept in memory.
        if collapse and wanted.admits_all:
            return server.queue.collapsed_jobs()
        jobs = wanted.select(server.queue.jobs())
        return listing.collapse(jobs) if collapse else jobs
    found = _read_jobs(server, job_id, all, view, wanted)
    return listing.collapse(found) if collapse else found


def _read_jobs(server: Server, job_id: list[str], all: bool, view: str | None, wanted: JobFilter) -> list[dict]:
    with server.sessions() as s:
        q = select(JobRow) if view is None else select(*jobsvc.QUEUE_VIEW.values())
        ids, arrays = parse_job_ids(job_id)
        if ids or arrays:
            q = q.where(ids_condition(ids, arrays))
        elif not all:
            q = q.where(jobsvc.listed(s))
        q = q.where(*wanted.conditions())
        if view == "queue":
            return jobsvc.queue_view(s, list(s.execute(q.order_by(JobRow.id)).all()))
        rows = list(s.scalars(q.order_by(JobRow.id)))
        return jobs_json(s, rows)


def check_form(form: str | None, view: str | None) -> str:
    """The listing's form (``listing.FORMS``); rows (plain or packed) are for the queue view's few keys."""
    if form is None:
        return "jobs"
    if form not in listing.FORMS:
        raise jobsvc.JobError(f"unknown form {form!r} (expected one of {', '.join(listing.FORMS)})")
    if form != "jobs" and view != "queue":
        raise jobsvc.JobError(f"form={form} lists the queue view's columns: ask with view=queue")
    return form


class Listing(Reply):
    """A job listing: the commands in process take its dicts; HTTP gets its encoding in ``form``,
    gzipped when the client accepts it, from the queue view's kept answers when it came from
    there (``queue``)."""

    def __init__(self, jobs: list[dict], queue: QueueView | None, form: str = "jobs", gzip: bool = False) -> None:
        self.jobs, self.queue, self.form, self.gzip = jobs, queue, form, gzip

    def data(self) -> dict:
        return {"jobs": self.jobs}

    def response(self) -> Response:
        if self.queue is not None:
            return listing.encoded_response(self.queue.encoded(self.jobs, self.form, self.gzip), self.gzip)
        return listing.response(listing.encode(self.jobs, self.form), self.gzip)


def job(s: Session, job_id: int) -> JobRow:
    """The job, or Slurm's words for an unknown id (404)."""
    row = s.get(JobRow, job_id)
    if row is None:
        raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)
    return row


def get_job(server: Server, s: Session, job_id: int, p: Principal) -> dict:
    row = job(s, job_id)
    own = private_jobs(server, p)
    if own is not None and (row.id != p.job_id if p.role == "job" else row.user != p.user):
        raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)  # as Slurm hides it
    return jobs_json(s, [row])[0]


def job_script(s: Session, job_id: int, p: Principal) -> tuple[str, str | None]:
    """``scontrol write batch_script``: (the script as submitted, its SHA-256), for its owner
    (or the job itself) and operators, as slurmctld gives it."""
    row = job(s, job_id)
    if not p.is_operator and (row.id != p.job_id if p.role == "job" else row.user != p.user):
        raise jobsvc.JobError("Invalid user id: the batch script is its owner's", 403)
    script, digest = row.spec.get("script"), row.spec.get("script_sha256")
    if script is None:
        raise jobsvc.JobError("Job script not specified: an interactive job has no batch script", 404)
    return script, digest


def owned_job(server: Server, s: Session, job_id: int, p: Principal) -> JobRow:
    """The job, if the caller may read its output: those who may change it (as its script)."""
    row = job(s, job_id)
    if private_jobs(server, p) is not None and row.user != p.user and row.id != p.job_id:
        raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)
    try:
        jobsvc.check_owner(row, p)
    except jobsvc.JobError:
        raise jobsvc.JobError(f"Access/permission denied: job {row.id}'s output is shown only to "
                              "its owner and operators", 403) from None
    return row


async def job_output(server: Server, job_id: int, p: Principal, size: int) -> bytes:
    """The end of a batch job's standard output file, read by its batch host's agent."""
    def locate():
        with server.sessions() as s:
            row = owned_job(server, s, job_id, p)
            path = jobsvc.to_json(row)["stdout"]
            node = s.get(NodeRow, row.batch_host) if row.batch_host else None
            if node is None or not path:
                raise jobsvc.JobError(f"job {job_id} has no output yet (it has not started)", 404)
            return AgentEndpoint.of(node), path, row.user

    agent, path, user = await fastpath.in_thread(locate)
    return b"".join([chunk async for chunk in server.logs.job_output(agent, path=path, user=user, size=size)])


async def job_usage(server: Server, job_id: int, p: Principal) -> dict:
    """What a running job's steps have used so far (sstat), read from their cgroups by the
    agents of the job's nodes; each step's figures are listed per node."""
    def locate():
        with server.sessions() as s:
            row = job(s, job_id)
            if private_jobs(server, p) is not None and row.user != p.user and row.id != p.job_id:
                raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)
            if row.state != JobState.RUNNING.value or not row.allocation:
                return "", [], [], None
            rows = s.scalars(select(StepRow).where(StepRow.job_id == row.id)).all()
            steps = [st for st in jobsvc.to_json(row, steps=rows)["steps"] if st["state"] == "RUNNING"]
            nodes = [s.get(NodeRow, n) for n in Allocation.from_json(row.allocation).node_names]
            key = jobsvc.job_run_key(row.id, row.restart_count)
            gpu = gpuacct.summaries(s, [row]).get(row.id)
            return key, [AgentEndpoint.of(n) for n in nodes if n is not None], steps, gpu

    key, agents, steps, gpu = await fastpath.in_thread(locate)

    async def ask(agent: AgentEndpoint) -> dict:
        return json.loads(b"".join([chunk async for chunk in server.logs.job_usage(agent, key=key)]))

    # A node whose agent is out of reach (or whose run has just ended) adds no figures.
    found: dict[str, list[dict]] = {}
    for reply in await asyncio.gather(*(ask(a) for a in agents), return_exceptions=True):
        if isinstance(reply, BaseException):
            continue
        for step, usage in (reply.get("steps") or {}).items():
            found.setdefault(step, []).append({"node": reply["node"], **usage})
    return {"job_id": job_id, "running": bool(agents), "gpu_usage": gpu,
            "steps": [{"step_id": st["step_id"], "nodelist": st["nodelist"], "nodes": found.get(st["step_id"], [])}
                      for st in steps]}


def gpu_usage(server: Server, s: Session, job_id: int, p: Principal) -> dict:
    """The job's GPU use (its current run's): the summary sacct reads, and each node's points."""
    row = job(s, job_id)
    if private_jobs(server, p) is not None and row.user != p.user and row.id != p.job_id:
        raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)
    return gpuacct.detail(s, row)


def jobs_json(s: Session, rows: list[JobRow]) -> list[dict]:
    """Jobs as docs/API.md's Job objects: with their steps, and pending array tasks'
    array_spec so squeue can collapse them."""
    if not rows:
        return []
    # A job pending since its submission has never run: it has no steps or clean-ups to look
    # for (the two queries were half of `scontrol show job`'s time on a pending job).
    ids = [r.id for r in rows if r.restart_count or r.state != JobState.PENDING.value]
    steps: dict[int, list[StepRow]] = {}
    completing: set[int] = set()
    if ids:
        for st in s.scalars(select(StepRow).where(StepRow.job_id.in_(ids)).order_by(StepRow.step_id)):
            steps.setdefault(st.job_id, []).append(st)
        completing = set(s.scalars(select(CleanupRow.job_id).where(CleanupRow.job_id.in_(ids))))
    gpu = gpuacct.summaries(s, rows)
    out = [jobsvc.to_json(r, steps=steps.get(r.id, []), completing=r.id in completing, gpu_usage=gpu.get(r.id))
           for r in rows]
    arrays: dict[int, list[dict]] = {}
    for j in out:
        if j["array_job_id"] is not None:
            arrays.setdefault(j["array_job_id"], []).append(j)
    for members in arrays.values():
        pend = [m["array_task_id"] for m in members if m["state"] == "PENDING"]
        spec = format_array(pend, members[0]["array_throttle"]) if pend else None
        for m in members:
            m["array_spec"] = spec
    return out
