"""What sprio and sshare show: the scheduler's own priority and fair-share numbers, as JSON.

Both are computed from a Snapshot with the same pure functions a scheduling pass uses, so
what the commands explain is what the scheduler decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.model.snapshot import Snapshot
from shoal.sched.config import SchedConfig
from shoal.sched.fairshare import share_view
from shoal.sched.priority import fairshare_state, job_priorities
from shoal.server.joblist import parse_job_ids

if TYPE_CHECKING:
    from shoal.server.core import Server


def weights_json(config: SchedConfig) -> dict:
    mf = config.multifactor
    return {"type": config.priority, "site": 0, "age": mf.weight_age, "fairshare": mf.weight_fairshare,
            "jobsize": mf.weight_jobsize, "partition": mf.weight_partition, "qos": mf.weight_qos,
            "max_age_s": mf.max_age_s, "decay_half_life_s": mf.decay_half_life_s,
            "favor_small": mf.favor_small, "usage_tres": mf.usage_tres}


def priorities_json(snapshot: Snapshot, config: SchedConfig, job_ids: set[int] | None = None,
                    users: set[str] | None = None) -> dict:
    """GET /shoal/v1/priority: each pending job's priority and its weighted and normalised factors."""
    breakdowns = job_priorities(snapshot, config.multifactor)
    fs = fairshare_state(snapshot, config.multifactor)
    jobs = []
    for job in snapshot.pending:
        if job_ids and job.id not in job_ids and job.array_job_id not in job_ids:
            continue
        if users and job.user not in users:
            continue
        b = breakdowns[job.id]
        assoc = fs.association(job.user, job.account)
        jobs.append({
            "job_id": job.id, "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
            "user": job.user, "account": assoc[0] if assoc else job.account, "qos": job.qos or "normal",
            "partition": job.partition, "priority": b.total, "site": 0, "age": b.age,
            "fairshare": b.fairshare, "jobsize": b.jobsize, "partition_priority": b.partition,
            "qos_priority": b.qos, "nice": b.nice,
            "factors": {"age": b.factors.age, "fairshare": b.factors.fairshare,
                        "jobsize": b.factors.jobsize, "partition": b.factors.partition,
                        "qos": b.factors.qos},
        })
    jobs.sort(key=lambda j: j["job_id"])
    return {"weights": weights_json(config), "jobs": jobs}


def shares_json(snapshot: Snapshot, config: SchedConfig) -> dict:
    """GET /shoal/v1/shares: sshare's rows, root first, depth first."""
    fs = fairshare_state(snapshot, config.multifactor)
    rows = [{"account": r.account, "user": r.user, "depth": r.depth, "raw_shares": r.raw_shares,
             "norm_shares": r.norm_shares, "raw_usage": r.raw_usage, "norm_usage": r.norm_usage,
             "effective_usage": r.effective_usage, "fairshare": r.fairshare}
            for r in share_view(fs.tree, fs.usage)]
    return {"weights": weights_json(config), "shares": rows}


def priorities(server: Server, job_id: list[str], user: str | None) -> dict:
    """sprio's answer, from a snapshot with usage as a scheduling pass takes it."""
    ids, _arrays = parse_job_ids(job_id)
    with server.sessions() as s:
        snap = server.snapshot(s, server.clock(), usage=True)
    return priorities_json(snap, server.sched_config, set(ids) or None, set(user.split(",")) if user else None)


def shares(server: Server) -> dict:
    """sshare's answer, from a snapshot with usage as a scheduling pass takes it."""
    with server.sessions() as s:
        snap = server.snapshot(s, server.clock(), usage=True)
    return shares_json(snap, server.sched_config)
