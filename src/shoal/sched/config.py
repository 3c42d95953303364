"""The knobs of one scheduling pass, named after the Slurm parameters they mirror."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Policy = Literal["fifo", "backfill"]


class SchedConfigError(ValueError):
    """A scheduler setting that cannot be used as given."""


@dataclass(frozen=True)
class SchedConfig:
    """How a pass orders, limits and protects the queue.

    ``policy``: ``"fifo"`` is Slurm's sched/builtin (a job that cannot start holds back
    every later job in its partition); ``"backfill"`` is EASY backfill (the first blocked
    job gets a reservation, later jobs start only if they cannot delay it).
    ``max_jobs_per_pass``: the most jobs one pass tries to place (Slurm's
    ``default_queue_depth`` / ``bf_max_job_test``); the rest wait with reason ``Priority``.
    ``kill_invalid_depend``: cancel jobs whose dependency can never be satisfied
    (``SchedulerParameters=kill_invalid_depend``); otherwise they stay pending with reason
    ``DependencyNeverSatisfied``, Slurm's default.
    """

    policy: Policy = "backfill"
    max_jobs_per_pass: int | None = None
    kill_invalid_depend: bool = False

    def __post_init__(self) -> None:
        if self.policy not in ("fifo", "backfill"):
            raise SchedConfigError(
                f"unknown scheduling policy {self.policy!r}: use 'fifo' or 'backfill'"
            )
        if self.max_jobs_per_pass is not None and self.max_jobs_per_pass < 0:
            raise SchedConfigError(
                f"max_jobs_per_pass must be 0 or more, not {self.max_jobs_per_pass}"
            )
