"""Node states: what the administrator and health checks set, and what sinfo derives."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class NodeState(str, enum.Enum):
    """The stored state. IDLE/MIXED/ALLOCATED are derived from allocations, not stored."""

    UP = "UP"
    DOWN = "DOWN"  # heartbeat lost or set by an administrator
    DRAIN = "DRAIN"  # takes no new work; running work finishes


def display_state(state: NodeState, used_cpus: int, total_cpus: int, used_gpus: int,
                  total_gpus: int, has_jobs: bool) -> str:
    """sinfo's state word: idle, mix, alloc, drain, drng, down."""
    if state is NodeState.DOWN:
        return "down"
    if state is NodeState.DRAIN:
        return "drng" if has_jobs else "drain"
    if not has_jobs:
        return "idle"
    full = used_cpus >= total_cpus or (total_gpus and used_gpus >= total_gpus)
    return "alloc" if full else "mix"


# The clock error a fence allows for: the node measures its lease and the server its timeout,
# each on its own clock (rates differ by well under 1%, NTP slews at most 0.05%), plus how late
# a supervisor may be woken and its kill take effect on a busy node.
FENCE_SKEW_FIXED_S = 0.25
FENCE_SKEW_RATE = 0.01


@dataclass(frozen=True)
class FenceTiming:
    """A node's lease and its fence (docs/FENCING.md): silent for ``lease_s`` after its last
    accepted report was sent, the node's supervisors TERM their runs, KILL them ``grace_s``
    later, reading the lease every ``check_s``; all of it, with ``skew_s`` to spare, before
    the server's heartbeat timeout restarts the work elsewhere."""

    lease_s: float
    grace_s: float
    check_s: float
    skew_s: float


def fence_timing(heartbeat_timeout_s: float, kill_wait_s: float) -> FenceTiming:
    """Split the server's heartbeat timeout T into lease + check + grace + skew = T.

    The grace is KillWait, at most T/6, so most of T stays lease; the check period 1 s, at
    most T/20 (short timeouts are for tests)."""
    t = heartbeat_timeout_s
    check = min(1.0, t / 20)
    grace = min(kill_wait_s, t / 6)
    skew = FENCE_SKEW_FIXED_S + FENCE_SKEW_RATE * t
    return FenceTiming(lease_s=t - check - grace - skew, grace_s=grace, check_s=check, skew_s=skew)
