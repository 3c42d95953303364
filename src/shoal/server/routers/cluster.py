"""The cluster as a whole: health, Prometheus' metrics, leadership, Slurm's settings and who asks."""

from __future__ import annotations

from fastapi.responses import Response

from shoal import __version__
from shoal.server import jobs as jobsvc
from shoal.server import metrics as metricsmod
from shoal.server.endpoints import Table
from shoal.server.deps import Caller, ServerDep
from shoal.server.leader import leader_json

table = Table()
router = table.router


@table.get("/healthz")
def healthz():
    return {"ok": True, "version": __version__}


@table.get("/metrics")
def metrics(p: Caller, server: ServerDep):
    """Prometheus' scrape (docs/METRICS.md): any token may read it, as any may read squeue."""
    return Response(server.metrics.exposition(), media_type=metricsmod.CONTENT_TYPE_LATEST)


@table.get("/shoal/v1/leader")
def leader(p: Caller, server: ServerDep):
    """Which server leads (schedules, runs the controllers) and what this one is (scontrol ping)."""
    return leader_json(server)


@table.get("/shoal/v1/config")
def slurm_config(p: Caller, server: ServerDep):
    """The settings ``scontrol show config`` prints, under Slurm's names (docs/API.md)."""
    return {"config": jobsvc.slurm_config(server.config)}


@table.get("/shoal/v1/whoami")
def whoami(p: Caller):
    return {"user": p.user, "role": p.role, "groups": list(p.groups), "job_id": p.job_id}
