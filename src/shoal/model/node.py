"""Node states: what the administrator and health checks set, and what sinfo derives."""

from __future__ import annotations

import enum


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
