"""srun's steps inside an allocation, and interactive allocations ended by their client."""

from __future__ import annotations

from shoal.server import jobcontrol
from shoal.server.endpoints import Table
from shoal.server.deps import Caller, ServerDep, SessionDep
from shoal.server.schemas import InteractiveComplete, StepComplete, StepCreate

table = Table(prefix="/shoal/v1/jobs/{job_id}")
router = table.router


@table.post("/steps", status_code=201)
def create_step(job_id: int, body: StepCreate, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.create_step(server, s, job_id, body, p)


@table.post("/steps/{step_id}/complete")
def complete_step(job_id: int, step_id: int, body: StepComplete, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.complete_step(server, s, job_id, step_id, body, p)


@table.post("/complete")
def complete_interactive(job_id: int, body: InteractiveComplete, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.complete_interactive(server, s, job_id, body, p)
