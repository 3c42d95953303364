"""priority/multifactor: a job's priority as a weighted sum of factors in [0, 1], as Slurm does.

``priority = PriorityWeightAge * age + PriorityWeightFairshare * fairshare
+ PriorityWeightJobSize * jobsize + PriorityWeightPartition * partition
+ PriorityWeightQOS * qos - nice``, truncated to an integer and never below 1 (Slurm keeps
0 for held jobs). The factors:

* age: ``min(now - eligible, PriorityMaxAge) / PriorityMaxAge``, eligible being the later of
  submit time and begin time (0 before that);
* fairshare: the classic fair-share factor of the job's (account, user) association
  (``shoal.sched.fairshare``); with no account tree configured every user is directly under
  root with one share; a job whose association the tree lacks gets 0;
* jobsize: the job's GPUs as a fraction of the cluster's GPUs (CPUs when the cluster has no
  GPUs), capped at 1; with PriorityFavorSmall, one minus that;
* partition: the partition's PriorityJobFactor over the largest of any partition;
* qos: the QOS's priority over the largest of any QOS (0 when every QOS has priority 0).

``job_priorities`` returns a ``PriorityBreakdown`` per pending job so sprio can explain it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from shoal.model.accounting import DEFAULT_QOS
from shoal.model.snapshot import PendingJob, Snapshot
from shoal.sched.config import Multifactor
from shoal.sched.fairshare import (
    AccountTree,
    Association,
    Usage,
    charged,
    decayed_usage,
    fairshare_factors,
)
from shoal.sched.qos import qos_table


@dataclass(frozen=True)
class PriorityFactors:
    """The normalised factors, each in [0, 1] (sprio --norm)."""

    age: float = 0.0
    fairshare: float = 0.0
    jobsize: float = 0.0
    partition: float = 0.0
    qos: float = 0.0


@dataclass(frozen=True)
class PriorityBreakdown:
    """A job's priority and its weighted terms (sprio's columns)."""

    total: int
    age: float
    fairshare: float
    jobsize: float
    partition: float
    qos: float
    nice: int = 0
    factors: PriorityFactors = PriorityFactors()


def age_factor(job: PendingJob, now: float, max_age_s: float) -> float:
    eligible = max(job.submit_time, job.begin_time or job.submit_time)
    return min(max(now - eligible, 0.0), max_age_s) / max_age_s


def jobsize_factor(job: PendingJob, cluster_gpus: int, cluster_cpus: int, favor_small: bool) -> float:
    if cluster_gpus > 0:
        size = min(job.request.total_gpus / cluster_gpus, 1.0)
    elif cluster_cpus > 0:
        size = min(job.request.cpus_per_node * job.request.nodes / cluster_cpus, 1.0)
    else:
        size = 0.0
    return 1.0 - size if favor_small else size


def _ratio(value: float, largest: float) -> float:
    return min(max(value / largest, 0.0), 1.0) if largest > 0 else 0.0


def total_priority(terms: float, nice: int) -> int:
    """Slurm's integer priority: the sum truncated, less nice, at least 1."""
    return max(1, math.floor(terms - nice + 1e-9))


@dataclass(frozen=True)
class FairshareState:
    """The tree policy uses and every association's charged usage and factor."""

    tree: AccountTree
    usage: dict[Association, float]
    factors: dict[Association, float]
    flat: bool  # no tree configured: every user directly under root, accounts ignored

    def association(self, user: str, account: str | None) -> Association | None:
        return self.tree.association(user, None if self.flat else account)


def fairshare_state(snapshot: Snapshot, config: Multifactor) -> FairshareState:
    """Fair-share as of ``snapshot.now``: the same numbers for the scheduler, sprio and sshare."""
    tree = AccountTree(snapshot.accounts)
    records = snapshot.usage
    flat = tree.empty
    if flat:
        tree = AccountTree.flat([j.user for j in snapshot.pending] + [r.user for r in records])
    usage = decayed_usage(records, snapshot.now, config.decay_half_life_s)
    if flat:
        merged: dict[tuple[str | None, str], Usage] = {}
        for (_account, user), u in usage.items():
            old = merged.get((None, user), Usage())
            merged[(None, user)] = Usage(old.gpu_seconds + u.gpu_seconds, old.cpu_seconds + u.cpu_seconds)
        usage = merged
    billed = charged(tree, usage, config.usage_tres)
    return FairshareState(tree, billed, fairshare_factors(tree, billed), flat)


def job_priorities(snapshot: Snapshot, config: Multifactor) -> dict[int, PriorityBreakdown]:
    """Every pending job's multifactor priority, as of ``snapshot.now``."""
    fs = fairshare_state(snapshot, config)
    cluster_gpus = sum(len(n.gpus) for n in snapshot.nodes)
    cluster_cpus = sum(n.cpus for n in snapshot.nodes)
    part_factor = {p.name: p.priority_job_factor for p in snapshot.partitions}
    max_part = max(part_factor.values(), default=0)
    qos = qos_table(snapshot.qos)
    max_qos = max((q.priority for q in qos.values()), default=0)
    out: dict[int, PriorityBreakdown] = {}
    for job in snapshot.pending:
        assoc = fs.association(job.user, job.account)
        job_qos = qos.get(job.qos or DEFAULT_QOS)
        f = PriorityFactors(
            age=age_factor(job, snapshot.now, config.max_age_s),
            fairshare=fs.factors.get(assoc, 0.0) if assoc is not None else 0.0,
            jobsize=jobsize_factor(job, cluster_gpus, cluster_cpus, config.favor_small),
            partition=_ratio(part_factor.get(job.partition, 0), max_part),
            qos=_ratio(job_qos.priority if job_qos else 0, max_qos),
        )
        terms = (config.weight_age * f.age, config.weight_fairshare * f.fairshare,
                 config.weight_jobsize * f.jobsize, config.weight_partition * f.partition,
                 config.weight_qos * f.qos)
        out[job.id] = PriorityBreakdown(total_priority(sum(terms), job.nice), *terms,
                                        nice=job.nice, factors=f)
    return out


def priority_map(breakdowns: Mapping[int, PriorityBreakdown]) -> dict[int, int]:
    return {job_id: b.total for job_id, b in breakdowns.items()}
