"""HTTP routes. Thin: parse, authorise, call a service inside one transaction, answer."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from contextlib import asynccontextmanager
from urllib.parse import parse_qs, unquote

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm.exc import StaleDataError

from shoal import __version__
from shoal.model.arrays import format_array
from shoal.model.hostlist import compress
from shoal.model.job import JobState, LateExit, run_end
from shoal.model.node import NodeState, display_state
from shoal.model.gpu import gpu_gres
from shoal.model.resources import GPU, Allocation
from shoal.sched.placement import check_feasible
from shoal.server import commands, console, fastpath
from shoal.server import metrics as metricsmod
from shoal.server import jobs as jobsvc
from shoal.server import nodes as nodesvc
from shoal.server import accounting as acctsvc
from shoal.server import partitions as partsvc
from shoal.server import reports as reportsvc
from shoal.server import priority as priosvc
from shoal.server import reservations as resvsvc
from shoal.server import steps as stepsvc
from shoal.server import tokens
from shoal.server.auth import AuthError, Principal, agent_credential, node_step_key
from shoal.server.core import Server
from shoal.server.groupcommit import GroupCommit, InFlight
from shoal.server.kube import api as kube_api
from shoal.server.kube import service as kubesvc
from shoal.server.kube.logs import AgentEndpoint
from shoal.server.kube.objects import ObjectError
from shoal.server.kubeapi import routes as kubeapi_routes
from shoal.server.limits import guard
from shoal.server.schemas import (AccountingChange, AgentRegister, AgentReport, BulkCancelRequest, CancelRequest,
                                  InteractiveComplete, JobSubmit, JobUpdate, NodeUpdate,
                                  PartitionUpdate, ReservationCreate, ReservationUpdate, StepComplete, StepCreate)
from shoal.model.timefmt import format_timestamp
from shoal.sched.schedule import schedule
from shoal.server.snapshot import NodeInfoCache
from shoal.server.work import node_work
from shoal.store.lease import current_leader
from shoal.store.models import CleanupRow, JobRow, NodeRow, StepRow

CONFLICT_RETRIES = 5


def retry_on_conflict(route):
    """Run a write route again when its transaction lost an optimistic-concurrency race.

    The scheduler updates pending jobs' reasons and starts jobs concurrently with users'
    requests; a request that loses such a race was rolled back whole, so running it again
    is safe, and the user never sees the conflict unless it persists.
    """
    @functools.wraps(route)
    def wrapper(*args, **kwargs):
        for attempt in range(CONFLICT_RETRIES):
            try:
                return route(*args, **kwargs)
            except StaleDataError:
                if attempt == CONFLICT_RETRIES - 1:
                    raise
                time.sleep(0.005 * (attempt + 1))

    return wrapper


def create_app(server: Server) -> fastpath.FastPaths:
    """The API: FastAPI's app behind the fast routes (server/fastpath.py)."""

    @asynccontextmanager
    async def lifespan(app):
        server.hub.loop = asyncio.get_running_loop()
        server.start()
        yield
        server.stop()

    app = FastAPI(title="Shoal", version=__version__, lifespan=lifespan)
    app.state.server = server
    guard(app)

    @app.exception_handler(AuthError)
    async def _auth_error(request, exc: AuthError):
        if kubeapi_routes.is_kube_path(request.url.path):  # kubectl reads a Status
            reason = "Unauthorized" if exc.status == 401 else "Forbidden"
            return JSONResponse(kubeapi_routes.status(exc.message, exc.status, reason), status_code=exc.status)
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(jobsvc.JobError)
    async def _job_error(request, exc: jobsvc.JobError):
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(ObjectError)
    async def _object_error(request, exc: ObjectError):
        return JSONResponse({"detail": exc.message, "reason": exc.reason}, status_code=exc.status)

    @app.exception_handler(StaleDataError)
    async def _conflict(request, exc: StaleDataError):
        # Optimistic concurrency: someone else changed the same row first. Safe to retry.
        message = "the object was changed concurrently; retry the request"
        if kubeapi_routes.is_kube_path(request.url.path):
            return JSONResponse(kubeapi_routes.status(message, 409, "Conflict"), status_code=409)
        return JSONResponse({"detail": message}, status_code=409)

    # Async: a synchronous dependency costs a thread hand-off per request, and these only
    # read the token cache (a miss is one indexed lookup, then cached).
    async def principal(request: Request, authorization: str | None = Header(default=None),
                        x_shoal_job_token: str | None = Header(default=None),
                        x_shoal_user: str | None = Header(default=None)) -> Principal:
        if authorization is None and x_shoal_job_token is None:
            # The console's pages send the token as its cookie (server/console), with their header:
            # read only here, so the commands' and agents' requests parse no cookies.
            authorization = console.cookie_credential(None, request.cookies.get(console.COOKIE),
                                                      request.headers.get(console.HEADER))
        return server.auth.resolve(authorization, x_shoal_job_token, x_shoal_user)

    async def admin(p: Principal = Depends(principal)) -> Principal:
        if not p.is_admin:
            raise AuthError(403, "Access/permission denied: this needs an admin token")
        return p

    async def operator(p: Principal = Depends(principal)) -> Principal:
        if not p.is_operator:
            raise AuthError(403, "Access/permission denied: this needs an operator or admin token")
        return p

    def may_change(p: Principal) -> Principal:
        if not p.may_change:
            raise AuthError(403, "Access/permission denied: a read-only token cannot do this"
                            if p.role == "read-only" else
                            "Access/permission denied: a job or node credential cannot do this")
        return p

    async def user_or_admin(p: Principal = Depends(principal)) -> Principal:
        return may_change(p)

    app.include_router(kube_api.router(server, principal, admin, retry_on_conflict))
    app.include_router(tokens.router(server, principal, admin))

    # ------------------------------------------------------------------ health

    @app.get("/healthz")
    def healthz():
        return {"ok": True, "version": __version__}

    @app.get("/metrics")
    def metrics(p: Principal = Depends(principal)):
        """Prometheus' scrape (docs/METRICS.md): any token may read it, as any may read squeue."""
        return Response(server.metrics.exposition(), media_type=metricsmod.CONTENT_TYPE_LATEST)

    @app.get("/shoal/v1/leader")
    def leader(p: Principal = Depends(principal)):
        """Which server leads (schedules, runs the controllers) and what this one is (scontrol ping)."""
        lead = server.leader
        me = {"url": server.url, "role": "leader" if lead.is_leader else "follower", "term": lead.term}
        if not lead.shared:
            return {"shared_store": False, "leader": {"url": server.url, "term": lead.term, "since": None},
                    "self": me}
        with server.sessions() as s:
            row = current_leader(s)
            known = {"url": row.holder, "term": row.term, "since": row.since} if row is not None else None
        return {"shared_store": True, "leader": known, "self": me}

    # ------------------------------------------------------------------ jobs

    def _submit(s, p: Principal, body: JobSubmit, now: float) -> dict:
        """Validate and store a submission in the caller's transaction (submit and --test-only)."""
        return jobsvc.submit(s, p, body, partitions=server.partitions, nodes=submit_nodes.nodes(s), now=now,
                             max_array_size=server.config.scheduler.max_array_size,
                             def_mem_per_cpu_mb=server.config.scheduler.def_mem_per_cpu_mb,
                             feasible=submit_nodes.feasible, accounts=server.account_tree, qos=server.qos_table)

    submit_nodes = NodeInfoCache(server.node_changes, check_feasible)

    # Submissions made at once share a commit (one disk flush); each is answered only once
    # its job is committed. jobsvc.submit refuses (JobError) before it writes anything.
    submits = GroupCommit(server.sessions, refusals=(jobsvc.JobError,))

    submitting = InFlight()

    @app.post("/shoal/v1/jobs", status_code=201)
    def submit(body: JobSubmit, p: Principal = Depends(user_or_admin)):
        now = server.clock()
        with submitting as others:
            out = submits.run(lambda s: _submit(s, p, body, now))
        if not body.hold:  # a held job cannot start: no pass for it
            server.controller.submitted(alone=not others)
        return out

    @app.post("/shoal/v1/jobs/test")
    def test_only(body: JobSubmit, p: Principal = Depends(user_or_admin)):
        """sbatch --test-only: validate exactly as a submit would, plan it, and roll it back."""
        now = server.clock()
        with server.sessions() as s:
            s.begin()
            try:
                out = _submit(s, p, body, now)
                snap = server.snapshot(s, now)
                plan = schedule(snap, server.sched_config)
                row = s.get(JobRow, out["job_id"])
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

    @app.get("/shoal/v1/jobs")
    def list_jobs(job_id: list[str] = Query(default=[]), user: str | None = None,
                  partition: str | None = None, state: list[str] = Query(default=[]),
                  name: str | None = None, all: bool = False,
                  since: float | None = Query(default=None, allow_inf_nan=False),
                  view: str | None = None, p: Principal = Depends(principal)):
        jobs = _list_jobs(job_id, user, partition, state, name, all, since, view, viewer=p)
        if _from_queue_view(job_id, all, view):
            return Response(server.queue.encoded(jobs), media_type="application/json")
        return JSONResponse({"jobs": jobs})  # already plain JSON: skip re-encoding

    def _from_queue_view(job_id: list[str], all: bool, view: str | None) -> bool:
        """Whether _list_jobs answers from squeue's view kept in memory."""
        return view == "queue" and not job_id and not all and server.queue.available

    def _private_jobs(p: Principal):
        """With PrivateData=jobs, the condition limiting a caller to its own jobs (None: sees all)."""
        if "jobs" not in server.config.auth.private_data or p.is_operator:
            return None
        return JobRow.id == p.job_id if p.role == "job" else JobRow.user == p.user

    def _list_jobs(job_id: list[str], user: str | None = None, partition: str | None = None,
                   state: list[str] = (), name: str | None = None, all: bool = False,
                   since: float | None = None, view: str | None = None, *,
                   viewer: Principal) -> list[dict]:
        """Jobs as docs/API.md's Job objects, or with ``view=queue`` only the keys squeue's
        default table reads (jobsvc.QUEUE_VIEW), read from their columns alone."""
        if view not in (None, "queue"):
            raise jobsvc.JobError(f"unknown view {view!r} (expected queue)")
        own = _private_jobs(viewer)
        if _from_queue_view(job_id, all, view):
            # squeue's default call, in users' loops: from the view kept in memory.
            return _queue_listing(server.queue.jobs(), user, partition, state, name, since,
                                  None if own is None else viewer)
        with server.sessions() as s:
            q = select(JobRow) if view is None else select(*jobsvc.QUEUE_VIEW.values())
            if own is not None:
                q = q.where(own)
            ids, arrays = _parse_job_ids(job_id)
            if ids or arrays:
                conds = []
                if ids:
                    conds.append(JobRow.id.in_(ids) | JobRow.array_job_id.in_(ids))
                for aid, tid in arrays:
                    conds.append((JobRow.array_job_id == aid) & (JobRow.array_task_id == tid))
                from sqlalchemy import or_

                q = q.where(or_(*conds))
            elif not all:
                q = q.where(jobsvc.listed(s))
            if user:
                q = q.where(JobRow.user.in_(user.split(",")))
            if partition:
                q = q.where(JobRow.partition.in_(partition.split(",")))
            if state:
                q = q.where(JobRow.state.in_([x.upper() for x in state]))
            if name:
                q = q.where(JobRow.name.in_(name.split(",")))
            if since is not None:
                q = q.where((JobRow.end_time.is_(None)) | (JobRow.end_time >= since))
            if view == "queue":
                return jobsvc.queue_view(s, s.execute(q.order_by(JobRow.id)).all())
            rows = list(s.scalars(q.order_by(JobRow.id)))
            return _jobs_json(s, rows)

    @app.get("/shoal/v1/jobs/{job_id}")
    def get_job(job_id: int, p: Principal = Depends(principal)):
        with server.sessions() as s:
            row = _job(s, job_id)
            own = _private_jobs(p)
            if own is not None and (row.id != p.job_id if p.role == "job" else row.user != p.user):
                raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)  # as Slurm hides it
            return JSONResponse(_jobs_json(s, [row])[0])

    @app.get("/shoal/v1/jobs/{job_id}/script")
    def get_job_script(job_id: int, p: Principal = Depends(principal)):
        """``scontrol write batch_script``: the script's bytes exactly as submitted, for its
        owner (or the job itself) and operators, as slurmctld gives it."""
        with server.sessions() as s:
            row = _job(s, job_id)
            if not p.is_operator and (row.id != p.job_id if p.role == "job" else row.user != p.user):
                raise jobsvc.JobError("Invalid user id: the batch script is its owner's", 403)
            script, digest = row.spec.get("script"), row.spec.get("script_sha256")
        if script is None:
            raise jobsvc.JobError("Job script not specified: an interactive job has no batch script", 404)
        return Response(script.encode("utf-8", "surrogateescape"), media_type="application/octet-stream",
                        headers={"X-Shoal-Script-SHA256": digest} if digest else None)

    def _owned_job(s, job_id: int, p: Principal) -> JobRow:
        """The job, if the caller may read its output: those who may change it (as its script)."""
        row = _job(s, job_id)
        if _private_jobs(p) is not None and row.user != p.user and row.id != p.job_id:
            raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)
        try:
            jobsvc.check_owner(row, p)
        except jobsvc.JobError:
            raise jobsvc.JobError(f"Access/permission denied: job {row.id}'s output is shown only to "
                                  "its owner and operators", 403) from None
        return row

    @app.get("/shoal/v1/jobs/{job_id}/output")
    async def get_output(job_id: int, size: int = Query(default=16384, ge=0, le=65536),
                         p: Principal = Depends(principal)):
        """The end of a batch job's standard output file, read by its batch host's agent."""
        def locate():
            with server.sessions() as s:
                row = _owned_job(s, job_id, p)
                path = jobsvc.to_json(row)["stdout"]
                node = s.get(NodeRow, row.batch_host) if row.batch_host else None
                if node is None or not path:
                    raise jobsvc.JobError(f"job {job_id} has no output yet (it has not started)", 404)
                return AgentEndpoint.of(node), path, row.user

        agent, path, user = await fastpath.in_thread(locate)
        out = b"".join([chunk async for chunk in server.logs.job_output(agent, path=path, user=user, size=size)])
        return Response(out, media_type="text/plain; charset=utf-8")

    @app.get("/shoal/v1/jobs/{job_id}/usage")
    async def get_usage(job_id: int, p: Principal = Depends(principal)):
        """What a running job's steps have used so far (sstat), read from their cgroups by the
        agents of the job's nodes; each step's figures are listed per node."""
        def locate():
            with server.sessions() as s:
                row = _job(s, job_id)
                if _private_jobs(p) is not None and row.user != p.user and row.id != p.job_id:
                    raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)
                if row.state != JobState.RUNNING.value or not row.allocation:
                    return "", [], []
                rows = s.scalars(select(StepRow).where(StepRow.job_id == row.id)).all()
                steps = [st for st in jobsvc.to_json(row, steps=rows)["steps"] if st["state"] == "RUNNING"]
                nodes = [s.get(NodeRow, n) for n in Allocation.from_json(row.allocation).node_names]
                key = jobsvc.job_run_key(row.id, row.restart_count)
                return key, [AgentEndpoint.of(n) for n in nodes if n is not None], steps

        key, agents, steps = await fastpath.in_thread(locate)

        async def ask(agent: AgentEndpoint) -> dict:
            return json.loads(b"".join([chunk async for chunk in server.logs.job_usage(agent, key=key)]))

        # A node whose agent is out of reach (or whose run has just ended) adds no figures.
        found: dict[str, list[dict]] = {}
        for reply in await asyncio.gather(*(ask(a) for a in agents), return_exceptions=True):
            if isinstance(reply, BaseException):
                continue
            for step, usage in (reply.get("steps") or {}).items():
                found.setdefault(step, []).append({"node": reply["node"], **usage})
        return {"job_id": job_id, "running": bool(agents),
                "steps": [{"step_id": st["step_id"], "nodelist": st["nodelist"], "nodes": found.get(st["step_id"], [])}
                          for st in steps]}

    @app.post("/shoal/v1/jobs/cancel")
    @retry_on_conflict
    def bulk_cancel(body: BulkCancelRequest, p: Principal = Depends(principal)):
        now = server.clock()
        sig = jobsvc.parse_signal(body.signal)
        done, touched = [], set()
        with server.sessions() as s, s.begin():
            q = select(JobRow).where(JobRow.state.in_(jobsvc.ACTIVE))
            ids, arrays = _parse_job_ids(body.job_ids)
            if body.job_ids:
                from sqlalchemy import or_

                conds = [JobRow.id.in_(ids) | JobRow.array_job_id.in_(ids)] if ids else []
                conds += [(JobRow.array_job_id == a) & (JobRow.array_task_id == t) for a, t in arrays]
                q = q.where(or_(*conds))
            if body.user:
                q = q.where(JobRow.user == body.user)
            if body.partition:
                q = q.where(JobRow.partition == body.partition)
            if body.states:
                q = q.where(JobRow.state.in_([_long_state(x) for x in body.states]))
            if body.name:
                q = q.where(JobRow.name == body.name)
            if body.qos:
                from sqlalchemy import func

                q = q.where(func.coalesce(JobRow.spec["qos"].as_string(), jobsvc.DEFAULT_QOS) == body.qos)
            if body.account:
                q = q.where(JobRow.spec["account"].as_string() == body.account)
            if not p.is_operator and not body.job_ids:
                q = q.where(JobRow.user == p.user)
            for row in s.scalars(q):
                touched |= _cancel_one(s, row, p, sig, _target(body), now)
                done.append(row.id)
        _after_change(touched)
        return {"jobs": done}

    @app.post("/shoal/v1/jobs/{job_id}/cancel")
    @retry_on_conflict
    def cancel(job_id: str, body: CancelRequest | None = None, p: Principal = Depends(principal)):
        """Cancel or signal a job: `12` (with all its array tasks) or `12_3` (one task)."""
        body = body or CancelRequest()
        now = server.clock()
        sig = jobsvc.parse_signal(body.signal)
        ids, arrays = _parse_job_ids([job_id])
        with server.sessions() as s, s.begin():
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
                touched |= _cancel_one(s, row, p, sig, _target(body), now)
        _after_change(touched)
        return {"jobs": [r.id for r in live]}

    def _target(body: CancelRequest) -> str:
        return "full" if body.full else "batch" if body.batch else "steps"

    def _cancel_one(s, row: JobRow, p: Principal, sig: int | None, target: str, now: float) -> set[str]:
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

    def _after_change(touched: set[str]) -> None:
        if touched:
            server.hub.bump(touched)
        server.controller.wake()

    @app.post("/shoal/v1/jobs/{job_id}/hold")
    @retry_on_conflict
    def hold(job_id: int, p: Principal = Depends(principal)):
        return _set_hold(job_id, p, True)

    @app.post("/shoal/v1/jobs/{job_id}/release")
    @retry_on_conflict
    def release(job_id: int, p: Principal = Depends(principal)):
        return _set_hold(job_id, p, False)

    def _set_hold(job_id: int, p: Principal, held: bool):
        with server.sessions() as s, s.begin():
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

    @app.post("/shoal/v1/jobs/{job_id}/requeue")
    @retry_on_conflict
    def requeue(job_id: int, p: Principal = Depends(principal)):
        now = server.clock()
        with server.sessions() as s, s.begin():
            row = _job(s, job_id)
            jobsvc.check_owner(row, p)
            if row.state != JobState.RUNNING.value:
                raise jobsvc.JobError(f"Job {job_id} is not running: only running jobs can be requeued", 409)
            names = Allocation.from_json(row.allocation).node_names
            jobsvc.requeue(s, row, now, via=JobState.PREEMPTED, reason="BeginTime")
            row.begin_time = now
        _after_change(set(names))
        return {"jobs": [job_id]}

    @app.patch("/shoal/v1/jobs/{job_id}")
    @retry_on_conflict
    def update(job_id: int, body: JobUpdate, p: Principal = Depends(principal)):
        with server.sessions() as s, s.begin():
            row = _job(s, job_id)
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
            out = _jobs_json(s, [row])[0]
        server.controller.wake()
        return out

    # ------------------------------------------------------------------ steps (srun)

    @app.post("/shoal/v1/jobs/{job_id}/steps", status_code=201)
    @retry_on_conflict
    def create_step(job_id: int, body: StepCreate, p: Principal = Depends(principal)):
        with server.sessions() as s, s.begin():
            row = _job(s, job_id)
            jobsvc.check_owner(row, p)
            nodes = {n.name: n for n in s.scalars(select(NodeRow))}
            return stepsvc.create_step(s, server, row, body, nodes, server.clock())

    @app.post("/shoal/v1/jobs/{job_id}/steps/{step_id}/complete")
    @retry_on_conflict
    def complete_step(job_id: int, step_id: int, body: StepComplete, p: Principal = Depends(principal)):
        with server.sessions() as s, s.begin():
            row = _job(s, job_id)
            jobsvc.check_owner(row, p)
            step = s.get(StepRow, (job_id, step_id))
            if step is None:
                raise jobsvc.JobError(f"no step {job_id}.{step_id}", 404)
            stepsvc.complete_step(step, body.exit_code, body.signal, server.clock())
            if body.reason:
                row.reason = body.reason[:64]  # the job's Reason in sacct and scontrol, kept at its end
        return {"ok": True}

    @app.post("/shoal/v1/jobs/{job_id}/complete")
    @retry_on_conflict
    def complete_interactive(job_id: int, body: InteractiveComplete, p: Principal = Depends(principal)):
        now = server.clock()
        with server.sessions() as s, s.begin():
            row = _job(s, job_id)
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
        _after_change(set(names))
        return {"ok": True}

    # ------------------------------------------------------------------ nodes and partitions

    @app.get("/shoal/v1/nodes")
    def list_nodes(p: Principal = Depends(principal)):
        with server.sessions() as s:
            return JSONResponse({"nodes": _nodes_json(s, list(s.scalars(select(NodeRow).order_by(NodeRow.name))))})

    @app.get("/shoal/v1/nodes/{name}")
    def get_node(name: str, p: Principal = Depends(principal)):
        with server.sessions() as s:
            row = s.get(NodeRow, name)
            if row is None:
                raise jobsvc.JobError(f"Invalid node name specified: {name}", 404)
            return _nodes_json(s, [row])[0]

    @app.patch("/shoal/v1/nodes/{name}")
    @retry_on_conflict
    def update_node(name: str, body: NodeUpdate, p: Principal = Depends(operator)):
        now = server.clock()
        touched: set[str] = set()
        with server.sessions() as s, s.begin():
            row = s.get(NodeRow, name)
            if row is None:
                raise jobsvc.JobError(f"Invalid node name specified: {name}", 404)
            if body.state in ("DRAIN", "DOWN") and not body.reason:
                raise jobsvc.JobError(f"a reason is required to set node {name} to {body.state}")
            if body.state == "DRAIN":
                row.state, row.reason, row.reason_time = NodeState.DRAIN.value, body.reason, now
            elif body.state == "DOWN":
                row.state, row.reason, row.reason_time = NodeState.DOWN.value, body.reason, now
                touched = server.controller.fail_node_jobs(s, name, now)
            elif body.state in ("RESUME", "UP", "IDLE"):
                if row.state == NodeState.DOWN.value and now - row.last_heartbeat > server.config.nodes.heartbeat_timeout_s:
                    raise jobsvc.JobError(f"node {name} is not responding; it returns when its agent does", 409)
                if (refusal := nodesvc.resume_refusal(row)) is not None:
                    raise jobsvc.JobError(refusal, 409)
                row.state, row.reason, row.reason_time = NodeState.UP.value, None, None
            elif body.reason is not None:
                row.reason = body.reason
            if body.taints is not None:
                row.taints = [t.model_dump(exclude_defaults=False) for t in body.taints]
            if body.labels is not None:
                labels = dict(row.labels)
                for k, v in body.labels.items():
                    if v is None:
                        labels.pop(k, None)
                    else:
                        labels[k] = v
                row.labels = labels
            out = _nodes_json(s, [row])[0]
        if body.taints is not None or body.labels is not None:
            server.kube.wake()
        _after_change(touched | {name})
        return out

    @app.get("/shoal/v1/partitions")
    def list_partitions(p: Principal = Depends(principal)):
        return {"partitions": [
            {"name": pt.name, "nodes": compress(pt.nodes) if pt.nodes else "", "node_names": list(pt.nodes),
             "default": pt.default, "default_time_s": pt.default_time_s, "max_time_s": pt.max_time_s,
             "max_nodes": pt.max_nodes, "state": pt.state, "priority_job_factor": pt.priority_job_factor}
            for pt in server.partitions
        ]}

    @app.patch("/shoal/v1/partitions/{name}")
    def update_partition(name: str, body: PartitionUpdate, p: Principal = Depends(admin)):
        changes = body.model_dump(exclude_unset=True)
        for key in ("state", "default", "priority_job_factor", "nodes"):  # these have no "unlimited"
            if key in changes and changes[key] is None:
                raise jobsvc.JobError(f"{key} may not be null")
        with server.sessions() as s, s.begin():
            known = set(s.scalars(select(NodeRow.name)))
            stored = partsvc.update(s, server.partitions, name, changes, known, server.clock())
        server.refresh_partitions()
        _after_change(set())
        return {"name": name, "changes": stored}

    # ------------------------------------------------------------------ accounting (sacctmgr)

    @app.get("/shoal/v1/accounting")
    def get_accounting(p: Principal = Depends(principal)):
        return server.accounting.public(server.config.cluster_name)

    @app.post("/shoal/v1/accounting")
    def change_accounting(body: AccountingChange, p: Principal = Depends(operator)):
        with server.sessions() as s, s.begin():
            lines = acctsvc.apply(s, server.accounting, body.model_dump(), server.config.cluster_name, server.clock())
        server.refresh_accounting()
        server.controller.wake()
        return {"lines": lines}

    # ------------------------------------------------------------------ sdiag and sreport

    @app.get("/shoal/v1/diag")
    def get_diag(p: Principal = Depends(principal)):
        with server.sessions() as s:
            return reportsvc.diag(s, server.metrics, server.clock())

    @app.get("/shoal/v1/usage")
    def usage_report(start: float, end: float, p: Principal = Depends(principal)):
        if end <= start:
            raise jobsvc.JobError("the period is empty: end must be after start")
        with server.sessions() as s:
            return reportsvc.usage(s, start, end)

    # ------------------------------------------------------------------ reservations

    @app.get("/shoal/v1/reservations")
    def list_reservations(p: Principal = Depends(principal)):
        with server.sessions() as s:
            return {"reservations": resvsvc.list_json(s, server.clock())}

    @app.get("/shoal/v1/reservations/{name}")
    def get_reservation(name: str, p: Principal = Depends(principal)):
        with server.sessions() as s:
            return resvsvc.get_json(s, name, server.clock())

    @app.post("/shoal/v1/reservations", status_code=201)
    @retry_on_conflict
    def create_reservation(body: ReservationCreate, p: Principal = Depends(operator)):
        with server.sessions() as s, s.begin():
            out = resvsvc.create(s, body, creator=p.user, partitions=server.partitions, now=server.clock())
        server.controller.wake()
        return out

    @app.patch("/shoal/v1/reservations/{name}")
    @retry_on_conflict
    def update_reservation(name: str, body: ReservationUpdate, p: Principal = Depends(operator)):
        with server.sessions() as s, s.begin():
            out = resvsvc.update(s, name, body, partitions=server.partitions, now=server.clock())
        server.controller.wake()
        return out

    @app.delete("/shoal/v1/reservations/{name}")
    @retry_on_conflict
    def delete_reservation(name: str, p: Principal = Depends(operator)):
        with server.sessions() as s, s.begin():
            resvsvc.delete(s, name, server.clock())
        server.controller.wake()
        return {"ok": True}

    # ------------------------------------------------------------------ priority and fair-share

    @app.get("/shoal/v1/priority")
    def priority(job_id: list[str] = Query(default=[]), user: str | None = None,
                 p: Principal = Depends(principal)):
        """sprio: pending jobs' multifactor priorities, computed as the scheduler computes them."""
        ids, _arrays = _parse_job_ids(job_id)
        with server.sessions() as s:
            snap = server.snapshot(s, server.clock(), usage=True)
        return priosvc.priorities_json(snap, server.sched_config, set(ids) or None,
                                       set(user.split(",")) if user else None)

    @app.get("/shoal/v1/shares")
    def shares(p: Principal = Depends(principal)):
        """sshare: the account tree with shares, decayed usage and fair-share factors."""
        with server.sessions() as s:
            snap = server.snapshot(s, server.clock(), usage=True)
        out = priosvc.shares_json(snap, server.sched_config)
        out["user"] = p.user
        return out

    # ------------------------------------------------------------------ identity (tokens: server/tokens.py)

    @app.get("/shoal/v1/config")
    def slurm_config(p: Principal = Depends(principal)):
        """The settings ``scontrol show config`` prints, under Slurm's names (docs/API.md)."""
        return {"config": jobsvc.slurm_config(server.config)}

    @app.get("/shoal/v1/whoami")
    def whoami(p: Principal = Depends(principal)):
        return {"user": p.user, "role": p.role, "groups": list(p.groups), "job_id": p.job_id}

    # ------------------------------------------------------------------ agents

    @app.post("/shoal/v1/agents/register")
    @retry_on_conflict
    def register(body: AgentRegister, authorization: str | None = Header(default=None)):
        p = server.auth.resolve(authorization, None, None)
        if p.role != "join":
            raise AuthError(403, "registering a node needs the cluster's join token")
        try:
            certificate = server.ca.issue_agent(body.name, body.address, body.csr) if body.csr else None
        except ValueError as e:  # tls.TLSError: not a valid CSR
            raise jobsvc.JobError(str(e), 400) from None
        now = server.clock()
        with server.sessions() as s, s.begin():
            row = s.get(NodeRow, body.name)
            gpus = [g.model_dump() for g in body.gpus]
            if row is None:
                row = NodeRow(name=body.name, state=NodeState.UP.value, registered_at=now,
                              taints=[t.model_dump() for t in body.taints])
                s.add(row)
            elif row.state == NodeState.DOWN.value and row.reason == "Not responding":
                row.state, row.reason, row.reason_time = NodeState.UP.value, None, None
            row.address, row.port, row.cpus, row.memory_mb = body.address, body.port, body.cpus, body.memory_mb
            row.gpus, row.labels, row.features = gpus, body.labels, body.features
            row.boot_time, row.last_heartbeat = body.boot_time, now
            row.tls = certificate is not None
            ended = {r.id: r for r in s.scalars(select(JobRow).where(
                JobRow.id.in_({ev.job_id for ev in body.events})))} if body.events else {}
            exits: set[str] = set()
            for ev in body.events:
                exits |= _agent_exit(s, ended.get(ev.job_id), body.name, ev, now)
            generation = row.credential_gen or 0
            fenced = nodesvc.fail_fenced_runs(s, server.controller, body.name, body.fenced, now) \
                if body.fenced else set()
        server.forget_address(body.name)
        server.hub.bump([body.name, *fenced, *exits])
        server.controller.wake()
        if fenced:
            server.kube.wake()
        fence = server.config.nodes.fence
        return {
            "credential": agent_credential(server.secret, body.name, generation),
            "step_key": node_step_key(server.secret, body.name, generation),
            **({"certificate": certificate, "ca": server.ca.pem()} if certificate else {}),
            "epoch": server.hub.epoch,
            "heartbeat_interval_s": server.config.nodes.heartbeat_interval_s,
            # The agent's lease: silent this long, its supervisors stop its work themselves
            # (fencing), TERM then KILL after fence_grace_s, all before the heartbeat timeout
            # ends and the server restarts that work elsewhere; null: never (docs/FENCING.md).
            "lease_s": fence.lease_s if server.config.nodes.fencing else None,
            "fence_grace_s": fence.grace_s,
            "fence_check_s": fence.check_s,
            "kill_wait_s": server.config.nodes.kill_wait_s,
            "containers": server.config.containers.model_dump(),
        }

    @app.get("/shoal/v1/agents/{node}/work")
    async def work(node: str, epoch: str | None = None, gen: int | None = None,
                   wait: float = Query(default=0, ge=0, le=60),
                   authorization: str | None = Header(default=None)):
        return Response(await agent_work(node, epoch, gen, wait, authorization), media_type="application/json")

    async def agent_work(node: str, epoch: str | None, gen: int | None, wait: float,
                         authorization: str | None) -> bytes:
        server.auth.verify_agent(authorization, node)
        if wait:
            await server.hub.wait(node, epoch, gen, wait)
        current = server.hub.generation(node)

        def build():
            with server.sessions() as s:
                return node_work(s, server, node, current)

        return await fastpath.in_thread(build)

    @app.post("/shoal/v1/agents/{node}/report")
    def report(node: str, body: AgentReport, authorization: str | None = Header(default=None)):
        return agent_report(node, body, authorization)

    @retry_on_conflict
    def agent_report(node: str, body: AgentReport, authorization: str | None) -> dict:
        server.auth.verify_agent(authorization, node)
        now = server.clock()
        touched: set[str] = set()
        with server.sessions() as s, s.begin():
            row = s.get(NodeRow, node)
            if row is None:
                raise jobsvc.JobError(f"node {node} is not registered", 404)
            row.last_heartbeat = now
            if row.state == NodeState.DOWN.value and row.reason == "Not responding":
                row.state, row.reason, row.reason_time = NodeState.UP.value, None, None
            # The jobs read in one query, not one (and a flush of the last one's end) each.
            ended = {r.id: r for r in s.scalars(select(JobRow).where(
                JobRow.id.in_({ev.job_id for ev in body.events})))} if body.events else {}
            for ev in body.events:
                touched |= _agent_exit(s, ended.get(ev.job_id), node, ev, now)
            touched |= nodesvc.apply_gpu_health(s, server.controller, row,
                                                [g.model_dump() for g in body.gpu_health], now)
            routes_changed = kubesvc.pod_reports(s, node, body.pods, now)
            alive = set(body.alive)
            for c in list(s.scalars(select(CleanupRow).where(CleanupRow.node == node))):
                if jobsvc.job_run_key(c.job_id, c.run) not in alive:
                    s.delete(c)
                    touched.add(node)
        if body.gpu_util or body.pod_cpu:
            server.record_metrics({"agent": node}, {"gpu_util": body.gpu_util, "pod_cpu": body.pod_cpu}, now)
        if touched:
            server.hub.bump(touched)
            server.controller.wake()
        if routes_changed or body.pods:  # batch jobs' ends are the scheduler's alone
            server.kube.wake()
        if routes_changed or touched:
            server.hub.bump([kube_api.ROUTES_KEY])
        return {"ok": True}

    def _agent_exit(s, row: JobRow | None, node: str, ev, now: float) -> set[str]:
        if row is None:
            return set()
        if row.lost_run is not None:  # its node fell silent and came back: how did the run end?
            outcome = nodesvc.late_exit_of_lost_run(row, node, ev.run, ev.exit_code or 0, ev.signal or 0,
                                                    ev.time or now, not (ev.fenced or ev.killed))
            if outcome is not LateExit.IGNORE:
                return {node}
        if row.restart_count != ev.run or row.batch_host != node:
            return set()  # a report about an old run: already handled
        if ev.max_rss_kb is not None:  # what the run used, whichever way it ended
            row.usage = {"run": ev.run, "max_rss_kb": ev.max_rss_kb, "cpu_s": ev.cpu_s,
                         "user_cpu_s": ev.user_cpu_s, "system_cpu_s": ev.system_cpu_s}
        names = set(Allocation.from_json(row.allocation).node_names) if row.allocation else set()
        if ev.fenced and row.state == JobState.RUNNING.value:  # stopped at its lease's end, as on a node failure
            return server.controller.fail_node_jobs(s, node, now, only=lambda r: r.id == row.id) | names
        if row.state != JobState.RUNNING.value:
            if row.exit_code is None:
                row.exit_code, row.signal = ev.exit_code or 0, ev.signal or 0
            return names
        if row.preempted_at is not None:  # it exited in its grace (checkpointed, say): still preempted
            jobsvc.end_preempted(s, row, ev.time or now, server.qos_table,
                                 exit_code=ev.exit_code or 0, signal=ev.signal or 0)
            return names
        state, exit_code, sig = run_end(ev.exit_code or 0, ev.signal or 0, ev.oom_kills)
        # A step's own reason (a container that could not start) says more than the exit code.
        plain = row.reason in (None, "None")
        jobsvc.finish(s, row, state, ev.time or now, exit_code=exit_code, signal=sig,
                      reason=ev.reason[:64] if ev.reason else  # the reason column's width
                      "NonZeroExitCode" if state is JobState.FAILED and exit_code and not sig and plain else None)
        return names

    # ------------------------------------------------------------------ helpers

    def _job(s, job_id: int) -> JobRow:
        row = s.get(JobRow, job_id)
        if row is None:
            raise jobsvc.JobError(f"Invalid job id specified: {job_id}", 404)
        return row

    def _jobs_json(s, rows: list[JobRow]) -> list[dict]:
        if not rows:
            return []
        ids = [r.id for r in rows]
        steps: dict[int, list[StepRow]] = {}
        for st in s.scalars(select(StepRow).where(StepRow.job_id.in_(ids)).order_by(StepRow.step_id)):
            steps.setdefault(st.job_id, []).append(st)
        completing = set(s.scalars(select(CleanupRow.job_id).where(CleanupRow.job_id.in_(ids))))
        out = [jobsvc.to_json(r, steps=steps.get(r.id, []), completing=r.id in completing) for r in rows]
        # pending array tasks: let squeue collapse them
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

    def _nodes_json(s, rows: list[NodeRow]) -> list[dict]:
        # The running jobs' allocations alone: whole rows (their scripts) cost most of sinfo.
        running = s.execute(select(JobRow.id, JobRow.allocation).where(JobRow.state == JobState.RUNNING.value))
        cleanups = list(s.scalars(select(CleanupRow)))
        use: dict[str, list] = {r.name: [0, 0, 0, []] for r in rows}
        for jid, allocation in running:
            for n in (allocation or {"nodes": []})["nodes"]:
                if n["name"] in use:
                    u = use[n["name"]]
                    u[0] += n["cpus"]; u[1] += n["memory_mb"]; u[2] += len(n["gpus"]); u[3].append(jid)
        for c in cleanups:
            if c.node in use:
                u = use[c.node]
                u[0] += c.cpus; u[1] += c.memory_mb; u[2] += len(c.gpus)
                if c.job_id not in u[3]:
                    u[3].append(c.job_id)
        maint = resvsvc.maint_nodes(s, server.clock())
        parts_of = {}
        for pt in server.partitions:
            for n in pt.nodes:
                parts_of.setdefault(n, []).append(pt.name)
        out = []
        for r in rows:
            cpus, mem, gpus, jobs = use[r.name]
            state = NodeState(r.state)
            out.append({
                "name": r.name, "address": r.address, "port": r.port, "state": r.state,
                "display_state": "maint" if r.name in maint and state is NodeState.UP
                else display_state(state, cpus, r.cpus, gpus, len(r.gpus), bool(jobs)),
                "reason": r.reason, "reason_time": r.reason_time, "gpu_health": r.gpu_health or [],
                "cpus": r.cpus, "cpus_alloc": cpus, "memory_mb": r.memory_mb, "memory_alloc_mb": mem,
                "gpus": r.gpus, "gpus_alloc": gpus, "gres": gpu_gres(tuple(GPU(**g) for g in r.gpus)),
                "labels": r.labels, "taints": r.taints or [], "features": r.features,
                "partitions": parts_of.get(r.name, []),
                "last_heartbeat": r.last_heartbeat, "boot_time": r.boot_time, "registered_at": r.registered_at,
                "jobs": sorted(jobs),
            })
        return out

    command_routes = commands.LocalRoutes(
        submit=lambda body, p: submit(JobSubmit.model_validate(body), may_change(p)),
        test_only=lambda body, p: test_only(JobSubmit.model_validate(body), may_change(p)),
        list_jobs=lambda params, p: {"jobs": _list_jobs(
            params.get("job_id") or [], params.get("user"), params.get("partition"), name=params.get("name"),
            all=params.get("all") == "true", view=params.get("view"), viewer=p)},
        bulk_cancel=lambda body, p: bulk_cancel(BulkCancelRequest.model_validate(body), p),
        cancel=lambda job_id, body, p: cancel(job_id, CancelRequest.model_validate(body), p),
    )
    app.include_router(commands.router(command_routes, server.auth.resolve))
    app.include_router(console.router(server, nodes_json=_nodes_json, private_jobs=_private_jobs))
    app.include_router(kubeapi_routes.router(server, principal, _nodes_json, retry_on_conflict))

    # The requests every job costs, answered without FastAPI's layers (shoal.server.fastpath).
    fast = fastpath.Routes()

    async def fast_command(scope, match, headers, body):
        return await commands.answer(command_routes, server.auth.resolve, match["name"], body, headers)

    async def fast_work(scope, match, headers, body):
        query = parse_qs(scope["query_string"].decode("latin-1"))
        try:
            gen = int(query["gen"][-1]) if "gen" in query else None
            wait = float(query["wait"][-1]) if "wait" in query else 0.0
        except ValueError:
            return None
        if not 0 <= wait <= 60:
            return None  # the app's 422
        epoch = query["epoch"][-1] if "epoch" in query else None
        return 200, fastpath.JSON, await agent_work(unquote(match["node"]), epoch, gen, wait,
                                                    headers.get("authorization"))

    async def fast_report(scope, match, headers, body):
        try:
            report = AgentReport.model_validate_json(body)
        except ValidationError:
            return None  # the app's 422
        return fastpath.json_answer(await fastpath.in_thread(agent_report, unquote(match["node"]), report,
                                                            headers.get("authorization")))

    fast.add("POST", r"/shoal/v1/commands/(?P<name>[^/]+)", fast_command)
    fast.add("GET", r"/shoal/v1/agents/(?P<node>[^/]+)/work", fast_work)
    fast.add("POST", r"/shoal/v1/agents/(?P<node>[^/]+)/report", fast_report)
    # In front of the whole app, FastAPI's own middlewares included (error pages, body limit):
    # these requests do not pass through them (an error escaping a fast route is uvicorn's 500).
    return fastpath.FastPaths(app, routes=fast, observe=server.metrics.observe_request)


def _queue_listing(jobs: list[dict], user: str | None, partition: str | None, state: list[str],
                   name: str | None, since: float | None, only: Principal | None) -> list[dict]:
    """_list_jobs' filters over queue-view dicts (``only``: PrivateData limits the caller to
    its own jobs)."""
    users = set(user.split(",")) if user else None
    parts = set(partition.split(",")) if partition else None
    states = {x.upper() for x in state} if state else None
    names = set(name.split(",")) if name else None
    return [j for j in jobs
            if (users is None or j["user"] in users) and (parts is None or j["partition"] in parts)
            and (states is None or j["state"] in states) and (names is None or j["name"] in names)
            and (since is None or j["end_time"] is None or j["end_time"] >= since)
            and (only is None or (j["job_id"] == only.job_id if only.role == "job" else j["user"] == only.user))]


def _parse_job_ids(values: list[str]) -> tuple[list[int], list[tuple[int, int]]]:
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


def _long_state(s: str) -> str:
    short = {st.short: st.value for st in JobState}
    return short.get(s.upper(), s.upper())
