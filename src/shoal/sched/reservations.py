"""Advance reservations in a pass (Slurm's reservation logic, as one small policy).

* A job naming a reservation waits with reason ``Reservation`` until it starts, and with
  ``ReservationDeleted`` once it is gone or over; while it is active the job may use only
  its nodes (within the job's partition).
* An active reservation's nodes run only the jobs that name it: every other job is kept off
  them, and for backfill and fifo its reach is the rest of its partition.
* A FUTURE reservation's nodes are open to a job only if it ends, by its time limit,
  no later than the reservation starts; a job without a time limit cannot use them. This is
  how backfill honours a maintenance window.
* A job kept from nodes it would otherwise get now waits with
  ``ReqNodeNotAvail, Reserved for maintenance`` when a MAINT reservation holds them, else
  ``Resources``, and holds nothing back for later jobs.

Who may name a reservation (its users and accounts) is checked at submit; a pass trusts it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from shoal.model.snapshot import PendingJob, Snapshot

if TYPE_CHECKING:
    from shoal.sched.placement import Demand

RESERVATION = "Reservation"
RESERVATION_DELETED = "ReservationDeleted"
RESERVED_FOR_MAINTENANCE = "ReqNodeNotAvail, Reserved for maintenance"
RESOURCES = "Resources"


class ReservationPolicy:
    """The reservations of one snapshot, and the nodes each job must keep off, cached."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.now = snapshot.now
        self.live = tuple(r for r in snapshot.reservations if not r.ended(self.now))
        self.by_name = {r.name: r for r in self.live}
        self.future = tuple(r for r in self.live if not r.active(self.now))
        self._reach: dict[tuple, tuple[frozenset[str], bool]] = {}
        self._closed: dict[tuple, tuple[frozenset[str], bool]] = {}
        self._narrowed: dict[tuple, "Demand"] = {}

    def __bool__(self) -> bool:
        return bool(self.live)

    def gate(self, job: PendingJob) -> str | None:
        """Why a job naming a reservation cannot be considered yet (None: it can)."""
        if job.reservation is None:
            return None
        resv = self.by_name.get(job.reservation)
        if resv is None:
            return RESERVATION_DELETED
        return None if resv.active(self.now) else RESERVATION

    def reach(self, job: PendingJob, pnodes: frozenset[str]) -> tuple[frozenset[str], bool]:
        """The nodes of ``pnodes`` that active reservations leave to ``job`` (only its own
        reservation's when it names one), and whether a MAINT reservation took any."""
        key = (job.reservation, pnodes)
        found = self._reach.get(key)
        if found is None:
            own = self.by_name.get(job.reservation) if job.reservation else None
            reach = pnodes.intersection(own.nodes) if own is not None else pnodes
            maint = False
            for r in self.live:
                if r is own or not r.active(self.now):
                    continue
                held = reach.intersection(r.nodes)
                if held:
                    maint = maint or r.maint
                    reach = reach - held
            found = self._reach[key] = (reach if reach != pnodes else pnodes, maint)
        return found

    def closed(self, job: PendingJob, pnodes: frozenset[str], end: float | None
               ) -> tuple[frozenset[str], bool]:
        """The nodes of ``pnodes`` that ``job`` (ending at ``end``; None: never) may not use
        now, and whether a MAINT reservation holds any it would otherwise get."""
        binding = tuple(i for i, r in enumerate(self.future)
                        if r.name != job.reservation and (end is None or end > r.start))
        key = (job.reservation, binding, pnodes)
        found = self._closed.get(key)
        if found is None:
            reach, maint = self.reach(job, pnodes)
            shut = set(pnodes - reach)
            for i in binding:
                r = self.future[i]
                held = reach.intersection(r.nodes)
                if held - shut:
                    maint = maint or r.maint
                shut |= held
            found = self._closed[key] = (frozenset(shut), maint)
        return found

    def narrow(self, d: "Demand", closed: frozenset[str]) -> "Demand":
        """``d`` kept off the ``closed`` nodes (an exclude, so placement's caches key on it)."""
        key = (d, closed)
        found = self._narrowed.get(key)
        if found is None:
            found = self._narrowed[key] = replace(d, exclude=d.exclude | closed)
        return found

    @staticmethod
    def reason(maint: bool) -> str:
        """The reason of a job that would start now but for a reservation's nodes."""
        return RESERVED_FOR_MAINTENANCE if maint else RESOURCES
