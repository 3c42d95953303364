"""Backfill's look-ahead: the earliest time a blocked job fits (Slurm's backfill "shadow").

Running jobs end by their time limits; reservations already made in the pass (conservative
backfill) hold their nodes from their start to their end. ``earliest_start`` sweeps those
times in order on one copy of the pass's free resources, releasing each running job as its
end passes, and at each time tries the job on what is free for the whole of its run: every
reservation overlapping ``[t, t + limit)`` is laid over the free resources for the try, so
a job reserved after another never needs what the earlier one was promised.

The work is bounded the way Slurm's is: ``window_end`` (bf_window) stops the sweep, and
``resolution_s`` (bf_resolution) rounds ends up so that ends close together are one step.
A step is tried only when enough nodes have the GPUs free (cheapest check first).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

from shoal.model.resources import Allocation
from shoal.model.snapshot import Partition
from shoal.sched.placement import ClusterState, Demand, ReservedShare, place


@dataclass(frozen=True)
class Booking:
    """A reservation's hold on the future: ``allocation`` from ``start`` to ``end``
    (None: the reserved job has no time limit, so it holds them for good)."""

    start: float
    end: float | None
    allocation: Allocation


@dataclass(frozen=True)
class Shadow:
    """Where and when a blocked job fits, and what a job still running then may use on
    each of its nodes without delaying it."""

    start: float
    allocation: Allocation
    shares: dict[str, ReservedShare]


@dataclass
class Ends:
    """Running jobs (and the pass's starts) by end time, kept sorted as the pass adds some.

    Items are (end, tie-break, allocation); the order among equal ends does not matter,
    since the look-ahead releases all of them before it tries the job again."""

    items: list[tuple[float, int, Allocation]] = field(default_factory=list)
    added: int = 0

    @classmethod
    def running(cls, ends: Sequence[tuple[float, int, Allocation]], now: float) -> "Ends":
        """From running jobs' sorted (start + limit, job id, allocation): those past their
        limit end ``now`` (they are still there, so they end at the earliest now)."""
        past = bisect_left(ends, (now,))
        items = [(now, jid, allocation) for _, jid, allocation in ends[:past]]
        items += ends[past:]
        return cls(items)

    def add(self, end: float, allocation: Allocation) -> None:
        self.added += 1  # negative: never equal to a running job's id
        insort(self.items, (end, -self.added, allocation))


class Horizon(Enum):
    """``earliest_start``'s answer for a job that fits only after the window's end."""

    BEYOND = "beyond bf_window"


def earliest_start(
    d: Demand,
    partition: Partition,
    state: ClusterState,
    ends: Ends,
    bookings: Sequence[Booking],
    *,
    now: float,
    limit_s: int | None,
    window_end: float | None = None,
    resolution_s: int = 0,
) -> Shadow | Horizon | None:
    """The first time from ``now`` at which ``d`` fits for its whole run.

    ``state``: the free resources now (not changed). Returns a ``Shadow``; None when no
    time is ever found (some holder never ends, or the job needs nodes that are not UP);
    ``Horizon.BEYOND`` when the job would fit only after ``window_end``.
    """
    def bucket(t: float) -> float:
        return t if resolution_s <= 0 else math.ceil(t / resolution_s) * resolution_s

    work = state.copy()
    items = ends.items
    i, n = 0, len(items)
    booking_ends = sorted({b.end for b in bookings if b.end is not None})
    t = now
    while True:
        if window_end is not None and t > window_end:
            return Horizon.BEYOND
        while i < n and bucket(items[i][0]) <= t:
            work.release(items[i][2])
            i += 1
        if work.fitting_nodes(d.gpus) >= d.nodes:
            run_end = math.inf if limit_s is None else t + limit_s
            over = [b.allocation for b in bookings
                    if b.start < run_end and (b.end is None or b.end > t)]
            saved = work.overlay(over) if over else []
            allocation = place(d, work, "now", partition=partition).allocation
            if allocation is not None:
                shares = {
                    name: ReservedShare(
                        cpus=work.by_name[name].cpus_free - alloc.cpus,
                        mem_mb=work.by_name[name].mem_free - alloc.memory_mb,
                        gpus=frozenset(alloc.gpus),
                        whole=allocation.exclusive,
                    )
                    for name, alloc in allocation.nodes
                }
                return Shadow(t, allocation, shares)
            work.undo(saved)
        later = [bucket(items[i][0])] if i < n else []
        later += [e for e in booking_ends if e > t][:1]
        if not later:
            return None
        t = max(t, min(later))
