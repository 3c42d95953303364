"""/shoal/v1/jobs: sbatch, squeue, scontrol show/hold/release/requeue/update job, scancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Query
from fastapi.responses import JSONResponse, Response

from shoal.server import jobcontrol, joblist, listing
from shoal.server.endpoints import Table
from shoal.server.deps import Caller, ServerDep, SessionDep, SubmissionsDep, Writer
from shoal.server.schemas import BulkCancelRequest, CancelRequest, JobSubmit, JobUpdate

table = Table(prefix="/shoal/v1/jobs")
router = table.router


@table.post("", status_code=201, local=True)
def submit(body: JobSubmit, p: Writer, submissions: SubmissionsDep):
    return submissions.submit(body, p)


@table.post("/test", local=True)
def test_only(body: JobSubmit, p: Writer, submissions: SubmissionsDep):
    """sbatch --test-only: validate exactly as a submit would, plan it, and roll it back."""
    return submissions.test_only(body, p)


@table.get("", fast=True, local=True)
def list_jobs(server: ServerDep, p: Caller, job_id: Annotated[list[str], Query()] = [],  # noqa: B006
              user: str | None = None, partition: str | None = None,
              state: Annotated[list[str], Query()] = [], name: str | None = None, all: bool = False,  # noqa: B006
              since: Annotated[float | None, Query(allow_inf_nan=False)] = None, view: str | None = None,
              form: str | None = None, collapse: bool = False,
              accept_encoding: Annotated[str | None, Header()] = None):
    """squeue's and scontrol's listings (docs/API.md): ``form=rows`` and gzip for long queues."""
    shape = joblist.check_form(form, view)
    jobs = joblist.list_jobs(server, job_id, user, partition, state, name, all, since, view, viewer=p,
                             collapse=collapse)
    return joblist.Listing(jobs, server.queue if joblist.from_queue_view(server, job_id, all, view) else None,
                           shape, listing.accepts_gzip(accept_encoding))


@table.post("/cancel", local=True)
def bulk_cancel(body: BulkCancelRequest, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.bulk_cancel(server, s, body, p)


@table.get("/{job_id}")
def get_job(job_id: int, p: Caller, server: ServerDep, s: SessionDep):
    return JSONResponse(joblist.get_job(server, s, job_id, p))


@table.get("/{job_id}/script")
def get_job_script(job_id: int, p: Caller, s: SessionDep):
    """``scontrol write batch_script``: the script's bytes exactly as submitted, for its
    owner (or the job itself) and operators, as slurmctld gives it."""
    script, digest = joblist.job_script(s, job_id, p)
    return Response(script.encode("utf-8", "surrogateescape"), media_type="application/octet-stream",
                    headers={"X-Shoal-Script-SHA256": digest} if digest else None)


@table.get("/{job_id}/output")
async def get_output(job_id: int, p: Caller, server: ServerDep,
                     size: Annotated[int, Query(ge=0, le=65536)] = 16384):
    """The end of a batch job's standard output file, read by its batch host's agent."""
    out = await joblist.job_output(server, job_id, p, size)
    return Response(out, media_type="text/plain; charset=utf-8")


@table.get("/{job_id}/gpu-usage")
def get_gpu_usage(job_id: int, p: Caller, server: ServerDep, s: SessionDep):
    """The job's GPU use (its current run's): the summary sacct reads, and each node's points."""
    return joblist.gpu_usage(server, s, job_id, p)


@table.get("/{job_id}/usage")
async def get_usage(job_id: int, p: Caller, server: ServerDep):
    """What a running job's steps have used so far (sstat), read from their cgroups by the
    agents of the job's nodes; each step's figures are listed per node."""
    return await joblist.job_usage(server, job_id, p)


@table.post("/{job_id}/cancel", local=True)
def cancel(job_id: str, p: Caller, server: ServerDep, s: SessionDep, body: CancelRequest | None = None):
    """Cancel or signal a job: `12` (with all its array tasks) or `12_3` (one task)."""
    return jobcontrol.cancel(server, s, job_id, body, p)


@table.post("/{job_id}/hold")
def hold(job_id: int, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.set_hold(server, s, job_id, p, True)


@table.post("/{job_id}/release")
def release(job_id: int, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.set_hold(server, s, job_id, p, False)


@table.post("/{job_id}/requeue")
def requeue(job_id: int, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.requeue(server, s, job_id, p)


@table.patch("/{job_id}")
def update(job_id: int, body: JobUpdate, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.update(server, s, job_id, body, p)
