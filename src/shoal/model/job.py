"""Job states as Slurm names them, and the one table of legal transitions."""

from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"

    @property
    def short(self) -> str:
        """The two-letter code squeue prints in its ST column."""
        return _SHORT[self]

    @property
    def terminal(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


_SHORT = {
    JobState.PENDING: "PD",
    JobState.RUNNING: "R",
    JobState.COMPLETED: "CD",
    JobState.FAILED: "F",
    JobState.CANCELLED: "CA",
    JobState.TIMEOUT: "TO",
    JobState.NODE_FAIL: "NF",
    JobState.PREEMPTED: "PR",
    JobState.OUT_OF_MEMORY: "OOM",
}

TERMINAL_STATES = frozenset(s for s in JobState if s.terminal)

# Which state may follow which. PENDING is reachable again from RUNNING and from
# NODE_FAIL/PREEMPTED for requeue; terminal states otherwise stay terminal.
_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMEOUT,
            JobState.NODE_FAIL,
            JobState.PREEMPTED,
            JobState.OUT_OF_MEMORY,
            JobState.PENDING,
        }
    ),
    JobState.NODE_FAIL: frozenset({JobState.PENDING}),
    JobState.PREEMPTED: frozenset({JobState.PENDING}),
}


class IllegalTransition(ValueError):
    """A state change that the job state machine does not allow."""


def can_transition(current: JobState, new: JobState) -> bool:
    return new in _TRANSITIONS.get(current, frozenset())


def check_transition(current: JobState, new: JobState) -> JobState:
    if not can_transition(current, new):
        raise IllegalTransition(f"job cannot go from {current.value} to {new.value}")
    return new


# Slurm's SIG_OOM (253), as its ExitCode column shows it: 253 & 0x7f, so "0:125".
OOM_SIGNAL = 125


def run_end(exit_code: int, signal: int, oom_kills: int = 0) -> tuple[JobState, int, int]:
    """How a batch run ended (state, exit code, signal) from its script's exit and the OOM kills
    in its cgroup: any OOM kill makes it OUT_OF_MEMORY with ExitCode 0:125, as Slurm's
    task/cgroup reports it, whatever the script's own exit."""
    if oom_kills:
        return JobState.OUT_OF_MEMORY, 0, OOM_SIGNAL
    ok = exit_code == 0 and not signal
    return (JobState.COMPLETED if ok else JobState.FAILED), exit_code, signal


def exit_code_text(exit_code: int | None, signal: int | None) -> str:
    """Slurm's ExitCode column: 'rc:signal'."""
    return f"{exit_code or 0}:{signal or 0}"
