"""Per-job GPU accounting: the GPU samples an agent reports with each heartbeat, attributed to
the run holding each GPU and folded into that run's per-node record (``job_gpu_usage``), in the
report's own transaction; and the records read back, summed per job, for the API, sacct, sstat
and the console (docs/METRICS.md, "Per-job GPU use").
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import func, select

from shoal.model import gpuusage
from shoal.model.job import JobState
from shoal.store.models import JobGPUUsageRow, JobRow

_CHUNK = 10_000  # ids per IN (...): SQLite takes at most 32,766 parameters a statement


def record(s, node: str, samples: Iterable, now: float) -> int:
    """Fold one report's samples (``job_id``, ``run``, ``gpu``, ``util``, ``mem_mib``,
    ``energy_mj``, ``power_w``) into the runs' records; a sample is kept only when the job's
    current run is running and holds that GPU on this node (an agent can account for nothing
    else). The number of samples kept."""
    by_run: dict[tuple[int, int], list] = {}
    for x in samples:
        by_run.setdefault((x.job_id, x.run), []).append(x)
    if not by_run:
        return 0
    # The few columns that say who holds what: never the spec (a script can be megabytes).
    q = select(JobRow.id, JobRow.restart_count, JobRow.state, JobRow.allocation).where(
        JobRow.id.in_({j for j, _ in by_run}))
    jobs = {job_id: (restarts, state, alloc) for job_id, restarts, state, alloc in s.execute(q)}
    kept = 0
    for (job_id, run), xs in by_run.items():
        restarts, state, alloc = jobs.get(job_id, (None, None, None))
        if restarts != run or state != JobState.RUNNING.value or not alloc:
            continue
        held = next((set(n["gpus"]) for n in alloc["nodes"] if n["name"] == node), set())
        gpus = [gpuusage.GPUSample(x.gpu, x.util, x.mem_mib, x.energy_mj, x.power_w) for x in xs if x.gpu in held]
        if not gpus:
            continue
        usage = s.get(JobGPUUsageRow, (job_id, run, node))
        if usage is None:
            usage = JobGPUUsageRow(job_id=job_id, run=run, node=node, record=None)
            s.add(usage)
        usage.record = gpuusage.fold(usage.record, now, gpus)  # a new dict: the JSON column sees it
        usage.busy_s = sum(g["busy_s"] for g in usage.record["gpus"].values())
        kept += len(gpus)
    return kept


def busy_hours(s, own=None) -> list[tuple[str | None, str, float]]:
    """Utilisation-weighted GPU-hours of every run, as (account the job named or None, user,
    hours), of the jobs ``own`` (a condition on JobRow, or None for all) selects."""
    account = JobRow.spec["account"].as_string()
    q = (select(account, JobRow.user, func.sum(JobGPUUsageRow.busy_s))
         .join(JobRow, JobRow.id == JobGPUUsageRow.job_id).group_by(account, JobRow.user))
    if own is not None:
        q = q.where(own)
    return [(acct, user, (busy or 0.0) / 3600) for acct, user, busy in s.execute(q)]


def _records(s, rows: Iterable[JobRow]) -> dict[int, list[tuple[str, dict]]]:
    """Each job's current run's (node, record) pairs."""
    runs = {r.id: r.restart_count for r in rows if r.start_time is not None}
    out: dict[int, list[tuple[str, dict]]] = {}
    if not runs:
        return out
    ids = list(runs)
    for i in range(0, len(ids), _CHUNK):
        q = select(JobGPUUsageRow.job_id, JobGPUUsageRow.run, JobGPUUsageRow.node, JobGPUUsageRow.record
                   ).where(JobGPUUsageRow.job_id.in_(ids[i:i + _CHUNK]))
        for job_id, run, node, rec in s.execute(q):
            if runs.get(job_id) == run:
                out.setdefault(job_id, []).append((node, rec))
    return out


def summaries(s, rows: Iterable[JobRow]) -> dict[int, dict]:
    """Each job's GPU use summed over its nodes (``gpuusage.summarise``), for those with samples."""
    rows = list(rows)
    out = {}
    for job_id, recs in _records(s, rows).items():
        summary = gpuusage.summarise(recs)
        if summary is not None:
            out[job_id] = summary
    return out


def detail(s, row: JobRow) -> dict:
    """``GET /shoal/v1/jobs/{id}/gpu-usage``: the job's summary, and each node's plot points."""
    recs = _records(s, [row]).get(row.id, [])
    return {"job_id": row.id, "run": row.restart_count, "summary": gpuusage.summarise(recs),
            "nodes": gpuusage.series(recs)}
