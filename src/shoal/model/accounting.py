"""Accounting types policy reads: the account tree (Slurm's associations), QOS, usage records.

Plain frozen data, no behaviour beyond validation of shape: fair-share and QOS policy live in
``shoal.sched``. Names follow sacctmgr (Shares, MaxWall, MaxTRESPerUser, GrpTRES, GrpJobs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ROOT = "root"
DEFAULT_QOS = "normal"

PreemptMode = Literal["cancel", "requeue", "off"]  # off: never preempted


@dataclass(frozen=True)
class UserShare:
    """A user's association with an account, and its raw shares of that account."""

    name: str
    shares: int = 1


@dataclass(frozen=True)
class Account:
    """One node of the account tree. ``parent`` None: directly under ``root``."""

    name: str
    parent: str | None = None
    shares: int = 1
    users: tuple[UserShare, ...] = ()


@dataclass(frozen=True)
class QOS:
    """A quality of service: a priority and the limits jobs submitted to it must respect.

    None means no limit. ``grp_gpus`` and ``grp_jobs`` bound each account's running jobs in
    this QOS (reasons ``AssocGrpGRES`` / ``AssocGrpJobsLimit``). ``preempt``: the QOS whose
    running jobs this QOS's jobs may preempt; ``preempt_mode``: what happens to this QOS's jobs
    when they are preempted (``shoal.sched.preempt`` acts on both).
    """

    name: str
    priority: int = 0
    max_wall_s: int | None = None
    max_gpus_per_user: int | None = None
    max_jobs_per_user: int | None = None
    max_submit_per_user: int | None = None
    grp_gpus: int | None = None
    grp_jobs: int | None = None
    preempt: tuple[str, ...] = ()
    preempt_mode: PreemptMode = "cancel"


@dataclass(frozen=True)
class UsageRecord:
    """One run that held resources: from ``start`` to ``end`` (None: still running)."""

    user: str
    account: str | None
    gpus: int
    cpus: int
    start: float
    end: float | None = None
