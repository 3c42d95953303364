"""Scheduling policy: pure functions over a Snapshot, returning a Plan. Imports only model."""

from shoal.sched.config import SchedConfig, SchedConfigError
from shoal.sched.placement import (
    ClusterState,
    Demand,
    Placement,
    PlacementCache,
    check_feasible,
    natural_key,
    place,
)
from shoal.sched.queue import queue_order
from shoal.sched.schedule import schedule

__all__ = [
    "ClusterState",
    "Demand",
    "Placement",
    "PlacementCache",
    "SchedConfig",
    "SchedConfigError",
    "check_feasible",
    "natural_key",
    "place",
    "queue_order",
    "schedule",
]
