"""The knobs of one scheduling pass, named after the Slurm parameters they mirror."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Policy = Literal["fifo", "backfill"]
PriorityType = Literal["basic", "multifactor"]
UsageTres = Literal["gpu", "cpu"]

DAY_S = 86400


class SchedConfigError(ValueError):
    """A scheduler setting that cannot be used as given."""


@dataclass(frozen=True)
class Multifactor:
    """priority/multifactor's knobs, named after slurm.conf's Priority* parameters.

    Weights are integers, as in Slurm (PriorityWeightAge, ...; all 0 by default, so every
    job's priority is 1 and the queue stays in submit order until an administrator sets
    them). ``max_age_s``: PriorityMaxAge (7 days). ``decay_half_life_s``:
    PriorityDecayHalfLife (7 days; 0 means usage never decays). ``favor_small``:
    PriorityFavorSmall. ``usage_tres``: what fair-share charges, GPU- or CPU-seconds.
    """

    weight_age: int = 0
    weight_fairshare: int = 0
    weight_jobsize: int = 0
    weight_partition: int = 0
    weight_qos: int = 0
    max_age_s: int = 7 * DAY_S
    decay_half_life_s: int = 7 * DAY_S
    favor_small: bool = False
    usage_tres: UsageTres = "gpu"

    def __post_init__(self) -> None:
        for name in ("weight_age", "weight_fairshare", "weight_jobsize", "weight_partition",
                     "weight_qos", "decay_half_life_s"):
            if getattr(self, name) < 0:
                raise SchedConfigError(f"{name} must be 0 or more, not {getattr(self, name)}")
        if self.max_age_s <= 0:
            raise SchedConfigError(f"max_age_s must be more than 0, not {self.max_age_s}")
        if self.usage_tres not in ("gpu", "cpu"):
            raise SchedConfigError(f"usage_tres must be 'gpu' or 'cpu', not {self.usage_tres!r}")


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
    ``priority``: ``"basic"`` (Slurm's priority/basic) orders by each job's stored priority,
    then submit time; ``"multifactor"`` computes every pending job's priority in the pass
    from the snapshot with ``multifactor``'s weights (``shoal.sched.priority``).
    """

    policy: Policy = "backfill"
    max_jobs_per_pass: int | None = None
    kill_invalid_depend: bool = False
    priority: PriorityType = "basic"
    multifactor: Multifactor = Multifactor()

    def __post_init__(self) -> None:
        if self.policy not in ("fifo", "backfill"):
            raise SchedConfigError(
                f"unknown scheduling policy {self.policy!r}: use 'fifo' or 'backfill'"
            )
        if self.priority not in ("basic", "multifactor"):
            raise SchedConfigError(
                f"unknown priority type {self.priority!r}: use 'basic' or 'multifactor'"
            )
        if self.max_jobs_per_pass is not None and self.max_jobs_per_pass < 0:
            raise SchedConfigError(
                f"max_jobs_per_pass must be 0 or more, not {self.max_jobs_per_pass}"
            )
