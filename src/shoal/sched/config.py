"""The knobs of one scheduling pass, named after the Slurm parameters they mirror."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Policy = Literal["fifo", "backfill"]
Backfill = Literal["easy", "conservative"]
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
    ``preemption``: PreemptType=preempt/qos (``shoal.sched.preempt``): a job blocked for
    resources may preempt running jobs of the QOS its own QOS lists under ``preempt``. It
    does nothing until some QOS lists one; False is preempt/none.

    Backfill (``policy="backfill"``; the names are SchedulerParameters' ``bf_*``):
    ``backfill``: ``"easy"`` reserves for the first blocked job of each group of overlapping
    partitions only; ``"conservative"`` reserves for every blocked job tested, each later
    job (started or reserved) fitting around all earlier reservations, so none is delayed.
    ``bf_max_job_test``: the most jobs a backfill pass tests (starts or reserves); the rest
    wait with ``Priority`` (None: all). ``bf_window_s``: how far ahead reservations are
    planned; a job that cannot start within it gets none (None: no limit).
    ``bf_resolution_s``: running jobs' ends are rounded up to this many seconds, so the
    look-ahead visits fewer distinct times (0: exact). ``bf_interval_s``: for callers that
    run passes often (the server's scheduler loop, the simulator): a full backfill pass at
    most this often, quick passes in between (``quick()``); 0: every pass is full.
    ``partial``: set on the quick pass (``quick()``), Slurm's main scheduler. Once every node
    is held back for a job that cannot start, no later job can start, and the pass stops:
    the jobs after it keep the reasons an earlier pass gave them, as Slurm leaves the queue
    past ``default_queue_depth`` (and one whose dependency can never be satisfied is
    cancelled, with ``kill_invalid_depend``, by the next pass that reaches it). On a full
    cluster with 90,000 jobs queued, a quick pass for a job's end gave each of them its
    reason again; now it looks at the few it starts.
    """

    policy: Policy = "backfill"
    max_jobs_per_pass: int | None = None
    kill_invalid_depend: bool = False
    priority: PriorityType = "basic"
    multifactor: Multifactor = Multifactor()
    preemption: bool = True
    backfill: Backfill = "easy"
    bf_max_job_test: int | None = None
    bf_window_s: int | None = None
    bf_resolution_s: int = 0
    bf_interval_s: float = 0.0
    partial: bool = False

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
        if self.backfill not in ("easy", "conservative"):
            raise SchedConfigError(
                f"unknown backfill mode {self.backfill!r}: use 'easy' or 'conservative'"
            )
        for name in ("bf_max_job_test", "bf_window_s"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SchedConfigError(f"{name} must be 1 or more (or unset), not {value}")
        for name in ("bf_resolution_s", "bf_interval_s"):
            if getattr(self, name) < 0:
                raise SchedConfigError(f"{name} must be 0 or more, not {getattr(self, name)}")

    @property
    def depth(self) -> int | None:
        """The most jobs one pass tests: max_jobs_per_pass, and bf_max_job_test in backfill."""
        limits = [self.max_jobs_per_pass]
        if self.policy == "backfill":
            limits.append(self.bf_max_job_test)
        given = [n for n in limits if n is not None]
        return min(given) if given else None

    def quick(self) -> "SchedConfig":
        """The pass run between full backfill passes (Slurm's main scheduler): jobs start in
        queue order up to the first that cannot, so no reservation is delayed; once nothing
        more can start, the rest keep their reasons (``partial``)."""
        return replace(self, policy="fifo", partial=True)
