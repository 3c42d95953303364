"""srun's steps inside an allocation, and interactive allocations ended by their client."""

from __future__ import annotations

from fastapi import APIRouter

from shoal.server import jobcontrol
from shoal.server.deps import Caller, ServerDep, SessionDep
from shoal.server.schemas import InteractiveComplete, StepComplete, StepCreate

router = APIRouter(prefix="/shoal/v1/jobs/{job_id}")


@router.post("/steps", status_code=201)
def create_step(job_id: int, body: StepCreate, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.create_step(server, s, job_id, body, p)


@router.post("/steps/{step_id}/complete")
def complete_step(job_id: int, step_id: int, body: StepComplete, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.complete_step(server, s, job_id, step_id, body, p)


@router.post("/complete")
def complete_interactive(job_id: int, body: InteractiveComplete, p: Caller, server: ServerDep, s: SessionDep):
    return jobcontrol.complete_interactive(server, s, job_id, body, p)
