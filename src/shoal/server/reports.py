"""sdiag's scheduler statistics and sreport's usage reports, from the store and the server's counters.

``usage_report`` is pure: the runs that held resources (UsageRecord), the cluster's capacity and a
period in, the seconds each user and account used within the period out.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shoal.model.accounting import UsageRecord
from shoal.model.job import JobState
from shoal.server.snapshot import usage_records
from shoal.store.models import JobRow, NodeRow

ENDED = {"completed": JobState.COMPLETED.value, "canceled": JobState.CANCELLED.value,
         "failed": JobState.FAILED.value}


def diag(session: Session, metrics, now: float) -> dict[str, Any]:
    """GET /shoal/v1/diag (sdiag): jobs submitted, started and ended since this server started,
    the queue now, and its scheduling passes."""
    since = metrics.since

    def count(*where) -> int:
        return session.scalar(select(func.count()).select_from(JobRow).where(*where)) or 0

    out: dict[str, Any] = {"now": now, "since": since,
                           "submitted": count(JobRow.submit_time >= since),
                           "started": count(JobRow.start_time >= since)}
    for key, state in ENDED.items():
        out[key] = count(JobRow.end_time >= since, JobRow.state == state)
    out["pending"] = count(JobRow.state == JobState.PENDING.value)
    out["running"] = count(JobRow.state == JobState.RUNNING.value)
    out["cycles"] = {kind: stats.public() for kind, stats in metrics.cycles.items()}
    out["requests"] = _requests(metrics.requests)
    return out


def _requests(histogram) -> list[dict[str, Any]]:
    """The API's requests by route since the start (sdiag's RPC statistics by message type)."""
    count: dict[str, float] = {}
    total: dict[str, float] = {}
    for family in histogram.collect():
        for sample in family.samples:
            route = f"{sample.labels.get('method', '')} {sample.labels.get('route', '')}"
            if sample.name.endswith("_count"):
                count[route] = count.get(route, 0) + sample.value
            elif sample.name.endswith("_sum"):
                total[route] = total.get(route, 0) + sample.value
    return [{"route": r, "count": int(n), "total_us": int(total.get(r, 0) * 1e6),
             "mean_us": int(total.get(r, 0) * 1e6 / n) if n else 0}
            for r, n in sorted(count.items(), key=lambda kv: -kv[1])]


def usage(session: Session, start: float, end: float) -> dict[str, Any]:
    """GET /shoal/v1/usage (sreport): usage_report over the store's runs and nodes."""
    nodes = session.execute(select(NodeRow.cpus, NodeRow.gpus)).all()
    capacity = {"cpu": sum(c for c, _ in nodes), "gres/gpu": sum(len(g or ()) for _, g in nodes)}
    return usage_report(usage_records(session, end, 0), capacity, start, end)


def usage_report(records: tuple[UsageRecord, ...], capacity: dict[str, int], start: float,
                 end: float) -> dict[str, Any]:
    """Resource-seconds (cpu, gres/gpu) of each (user, account) within [start, end), and the
    cluster's: allocated, and reported (its capacity over the period)."""
    users: dict[tuple[str, str], dict[str, float]] = {}
    total = {"cpu": 0.0, "gres/gpu": 0.0}
    for r in records:
        held = min(r.end if r.end is not None else end, end) - max(r.start, start)
        if held <= 0:
            continue
        row = users.setdefault((r.user, r.account or ""), {"cpu": 0.0, "gres/gpu": 0.0})
        for tres, n in (("cpu", r.cpus), ("gres/gpu", r.gpus)):
            row[tres] += n * held
            total[tres] += n * held
    return {"start": start, "end": end,
            "reported": {t: n * (end - start) for t, n in capacity.items()}, "allocated": total,
            "users": [{"user": u, "account": a, **used} for (u, a), used in sorted(users.items())]}
