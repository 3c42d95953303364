"""QOS limits: which pending jobs a QOS holds back, with the reason Slurm names.

Checked in this order, the first that applies being the job's reason:

* ``InvalidQOS``: the job names a QOS the configuration no longer has;
* ``QOSMaxWallDurationPerJobLimit``: its time limit (or unlimited) exceeds MaxWall;
* ``QOSMaxGRESPerUser``: the user's running GPUs in the QOS plus the job's exceed
  MaxTRESPerUser=gres/gpu;
* ``QOSMaxJobsPerUserLimit``: the user already runs MaxJobsPerUser jobs in the QOS;
* ``AssocGrpGRES`` / ``AssocGrpJobsLimit``: the job's account already runs ``grp_gpus``
  GPUs / ``grp_jobs`` jobs in the QOS (the QOS's GrpTRES and GrpJobs, applied to each
  account: Slurm's association limits, set per QOS here).

Counts are of running jobs (not completing ones) and grow as a pass plans starts.
MaxSubmitJobsPerUser is enforced at submit (``max_submit_error``), as in Slurm.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

from shoal.model.accounting import DEFAULT_QOS, QOS
from shoal.model.snapshot import ActiveJob, PendingJob

INVALID_QOS = "InvalidQOS"
QOS_MAX_WALL = "QOSMaxWallDurationPerJobLimit"
QOS_MAX_GRES_PER_USER = "QOSMaxGRESPerUser"
QOS_MAX_JOBS_PER_USER = "QOSMaxJobsPerUserLimit"
ASSOC_GRP_GRES = "AssocGrpGRES"
ASSOC_GRP_JOBS = "AssocGrpJobsLimit"


def qos_table(qos: Iterable[QOS]) -> dict[str, QOS]:
    """QOS by name; ``normal`` (no limits, priority 0) is always there unless redefined."""
    table = {DEFAULT_QOS: QOS(DEFAULT_QOS)}
    for q in qos:
        table[q.name] = q
    return table


class QOSCounts:
    """Running jobs and GPUs per (QOS, user) and per (QOS, account), updated as a pass starts jobs."""

    def __init__(self, active: Iterable[ActiveJob], default_account: Mapping[str, str]) -> None:
        self.default_account = default_account
        self.user_jobs: Counter[tuple[str, str]] = Counter()
        self.user_gpus: Counter[tuple[str, str]] = Counter()
        self.account_jobs: Counter[tuple[str, str | None]] = Counter()
        self.account_gpus: Counter[tuple[str, str | None]] = Counter()
        for job in active:
            if not job.completing:
                gpus = sum(len(a.gpus) for _, a in job.allocation.nodes)
                self.add(job.qos, job.user, job.account, gpus)

    def account_of(self, user: str, account: str | None) -> str | None:
        return account if account is not None else self.default_account.get(user)

    def add(self, qos: str | None, user: str, account: str | None, gpus: int) -> None:
        q = qos or DEFAULT_QOS
        acct = self.account_of(user, account)
        self.user_jobs[(q, user)] += 1
        self.user_gpus[(q, user)] += gpus
        self.account_jobs[(q, acct)] += 1
        self.account_gpus[(q, acct)] += gpus


def has_limits(qos: QOS) -> bool:
    """Whether ``limit_reason`` can ever hold back a job of ``qos``."""
    return any(limit is not None for limit in (qos.max_wall_s, qos.max_gpus_per_user,
                                               qos.max_jobs_per_user, qos.grp_gpus, qos.grp_jobs))


def limit_reason(job: PendingJob, table: Mapping[str, QOS], counts: QOSCounts,
                 time_limit_s: int | None, gpus: int) -> str | None:
    """Why ``job``'s QOS holds it back now, or None. ``time_limit_s``: the limit it runs under."""
    qos = table.get(job.qos or DEFAULT_QOS)
    if qos is None:
        return INVALID_QOS
    if qos.max_wall_s is not None and (time_limit_s is None or time_limit_s > qos.max_wall_s):
        return QOS_MAX_WALL
    user = (qos.name, job.user)
    if qos.max_gpus_per_user is not None and counts.user_gpus[user] + gpus > qos.max_gpus_per_user:
        return QOS_MAX_GRES_PER_USER
    if qos.max_jobs_per_user is not None and counts.user_jobs[user] >= qos.max_jobs_per_user:
        return QOS_MAX_JOBS_PER_USER
    account = (qos.name, counts.account_of(job.user, job.account))
    if qos.grp_gpus is not None and counts.account_gpus[account] + gpus > qos.grp_gpus:
        return ASSOC_GRP_GRES
    if qos.grp_jobs is not None and counts.account_jobs[account] >= qos.grp_jobs:
        return ASSOC_GRP_JOBS
    return None


def max_submit_error(qos: QOS, user: str, queued: int, adding: int) -> str | None:
    """The submit-time refusal for MaxSubmitJobsPerUser: ``queued`` pending+running jobs already."""
    limit = qos.max_submit_per_user
    if limit is None or queued + adding <= limit:
        return None
    return (f"Job violates accounting/QOS policy (job submit limit, user's size and/or time limits): "
            f"QOS {qos.name} allows {user} at most {limit} pending and running jobs "
            f"(MaxSubmitJobsPerUser); {queued} already queued, this submission adds {adding}")
