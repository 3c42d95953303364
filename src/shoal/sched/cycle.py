"""The scheduling cycle around ``schedule()``: whether a pass is a full one, which pending
jobs go first as preemptors, how long a preemption's victim runs on, and which ended runs
still weigh in fair-share. Pure functions: the server's controller (server/controller.py,
server/snapshot.py) and the simulator (sim/engine.py) call the same ones, so the two cannot
drift apart."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from shoal.model.snapshot import PendingJob, Snapshot
from shoal.sched.config import SchedConfig

USAGE_HALF_LIVES = 30
"""Runs that ended more than this many half-lives ago weigh under 2^-30: not read at all."""


def full_pass_due(config: SchedConfig, now: float, last_full: float) -> bool:
    """Whether this pass is a full one: always but with backfill, which runs a full pass
    (planning start times) at most every ``bf_interval_s`` and quick passes in between."""
    return config.policy != "backfill" or config.bf_interval_s <= 0 or now - last_full >= config.bf_interval_s


def quiet_until(snapshot: Snapshot) -> float:
    """Until when time alone leaves a pass over ``snapshot`` with the same plan (``inf``: for
    ever): the first begin time of a pending job, or start or end of an advance reservation,
    still to come. For a caller that skips passes while nothing they read has changed.
    (A multifactor priority's age and fair-share move with time too, but only reorder jobs
    that the pass found could not start; such a caller still runs a pass now and then.)"""
    now = snapshot.now
    times = [job.begin_time for job in snapshot.pending if job.begin_time is not None and job.begin_time > now]
    times += [t for r in snapshot.reservations for t in (r.start, r.end) if t > now]
    return min(times, default=float("inf"))


def pass_config(config: SchedConfig, full: bool) -> SchedConfig:
    """The configuration a pass runs with: the quick one (queue order, up to the first job
    that cannot start) between full passes."""
    return config if full else config.quick()


def mark_preemptors(pending: tuple[PendingJob, ...], claimants: Collection[int],
                    pool: Mapping[int, PendingJob] | None = None) -> tuple[PendingJob, ...]:
    """The pass's queue with the jobs that jobs were preempted for (``claimants``) flagged,
    so the pass serves them first; with ``pool``, the pending jobs by id, a claimant the
    queue left out (a pass of limited depth) is put in front."""
    if not claimants:
        return pending
    there = {p.id for p in pending}
    extra = [pool[j] for j in sorted(claimants) if j not in there and j in pool] if pool is not None else []
    return tuple(dataclasses.replace(p, preemptor=True) if p.id in claimants else p for p in (*extra, *pending))


def preemption_grace_s(signal_s: float | None, cap_s: float) -> float:
    """How long a preempted job runs on after its --signal: the signal's @secs, at most
    ``cap_s`` (GraceTime); 0 when it asked for no signal (SIGTERM, then SIGKILL after KillWait)."""
    return min(float(signal_s), cap_s) if signal_s else 0.0


def usage_horizon(now: float, half_life_s: float) -> float | None:
    """The end time before which a run no longer counts in fair-share (None: all count,
    usage never decays)."""
    return now - USAGE_HALF_LIVES * half_life_s if half_life_s > 0 else None
