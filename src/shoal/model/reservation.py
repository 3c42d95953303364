"""Advance reservations (Slurm's ``scontrol create reservation``): nodes held for a time
window, for named users and accounts, or for maintenance. No I/O."""

from __future__ import annotations

from dataclasses import dataclass

MAINT = "MAINT"
IGNORE_JOBS = "IGNORE_JOBS"
FLAGS = (MAINT, IGNORE_JOBS)


@dataclass(frozen=True)
class AdvanceReservation:
    """Nodes held from ``start`` until ``end`` (epoch seconds) for the jobs that name it.

    A job may use it when its user is in ``users`` or its account in ``accounts``.
    """

    name: str
    start: float
    end: float
    nodes: tuple[str, ...]
    users: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    partition: str | None = None

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def ended(self, now: float) -> bool:
        return now >= self.end

    @property
    def maint(self) -> bool:
        return MAINT in self.flags

    def permits(self, user: str, account: str | None) -> bool:
        return user in self.users or (account is not None and account in self.accounts)
