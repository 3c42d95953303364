"""Job states as Slurm names them, and the one table of legal transitions."""

from __future__ import annotations

import enum

MAX_SCRIPT_BYTES = 4 * 1024 * 1024
"""The largest batch script accepted: slurmctld's default max_script_size (4 MiB)."""


def script_too_large(size: int) -> str:
    """slurmctld's answer to a script over max_script_size, with the sizes that explain it."""
    return (f"Pathname of a file, directory or other parameter too long (the batch script is {size} bytes; "
            f"at most {MAX_SCRIPT_BYTES} are accepted)")


def script_sha256(data: bytes) -> str:
    """The hex SHA-256 of a batch script's bytes: sbatch sends it, the server checks and
    stores it, the agent checks the file it runs against it."""
    try:
        from _sha256 import sha256  # CPython's own: ~0.3 ms to import where hashlib's OpenSSL costs ~3 ms
    except ImportError:
        from hashlib import sha256
    return sha256(data).hexdigest()


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


# What a node that comes back may correct (docs/FENCING.md): the server's guess that a run
# was lost with its silent node (NODE_FAIL, or PENDING again after a --requeue) becomes how the
# run really ended. Kept apart from _TRANSITIONS, which no other change may take.
_CORRECTIONS: dict[JobState, frozenset[JobState]] = {
    JobState.NODE_FAIL: frozenset({JobState.COMPLETED, JobState.FAILED}),
    JobState.PENDING: frozenset({JobState.COMPLETED, JobState.FAILED}),
}


class LateExit(str, enum.Enum):
    """What the exit of a run that the server gave up with its silent node does, reported
    when the node is back (docs/FENCING.md has the table)."""

    IGNORE = "ignore"  # not that run, or the fence (or the agent, at the server's word) ended it
    CORRECT = "correct"  # NODE_FAIL: the job ends as the run really ended
    TAKE_BACK = "take back"  # requeued, not started again: out of the queue, ended as the run ended
    NOTE = "note"  # requeued and started again: the new run stands; AdminComment says what happened


def late_exit(state: JobState, restart_count: int, lost_run: dict | None, node: str, run: int,
              ended_by_itself: bool) -> LateExit:
    """Decide what a late exit of run ``run`` on ``node`` does to a job now in ``state``, whose
    run the server gave up when ``node`` fell silent (``lost_run``, None: none was)."""
    if lost_run is None or lost_run["run"] != run or lost_run["node"] != node or not ended_by_itself:
        return LateExit.IGNORE
    if state is JobState.NODE_FAIL and restart_count == run:
        return LateExit.CORRECT
    if state is JobState.PENDING and restart_count == run + 1:
        return LateExit.TAKE_BACK
    return LateExit.NOTE


def check_correction(current: JobState, new: JobState) -> JobState:
    if new not in _CORRECTIONS.get(current, frozenset()):
        raise IllegalTransition(f"job cannot be corrected from {current.value} to {new.value}")
    return new


def exit_code_text(exit_code: int | None, signal: int | None) -> str:
    """Slurm's ExitCode column: 'rc:signal'."""
    return f"{exit_code or 0}:{signal or 0}"
