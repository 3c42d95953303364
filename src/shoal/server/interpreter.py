"""The interpreter's settings for the server: its threads share one GIL, and its cyclic
garbage collector stops them all.

- **The switch interval is 1 ms, not 5.** A scheduling pass is pure Python and gives the
  GIL up only when made to; a submission's commit gives it up at each SQLite call (a
  statement, a row, the flush) and waits for it back each time, and while a pass runs a
  thread that asks for the GIL waits one interval or more: a commit of a few statements
  took tens of milliseconds, and the submitters queued behind it. 1 ms made the storm's
  submission p99 fall from about 115 to 75 ms (four pairs of runs, alternated) at the same
  server CPU per request (docs/SCALE.md).
- **The young generation is collected after 10,000 allocations, not 700.** With CPython's
  defaults the objects of the requests in flight at each young collection were promoted, so
  under a submission storm the oldest generation grew by a quarter every few seconds and was
  collected whole (every object the server keeps: 0.2 to 0.35 s of CPU with 20,000 jobs
  queued, every thread stopped); now a request's objects die of their reference counts
  before a collection sees them.
- **What survives a full collection is frozen** (``gc.freeze``): the queue, its rows kept for
  the scheduler and squeue, the nodes, are long-lived, and each full collection walked them
  all: 1.7 million objects with 100,000 jobs queued, 0.6 to 1 s with every thread stopped
  (every request's p99 under load was that pause). Right after a full collection nothing it
  could free is left, so what it kept is moved out of the collector's sight; the next full
  collection walks only what came since (11 ms there). Frozen objects are still freed by their
  reference counts; only a cycle among them that becomes garbage waits: once every
  ``FULL_SWEEP_S`` they are unfrozen, so one full collection walks them all and frees it.
- **What a middle collection keeps is frozen too once the process has grown** by
  ``GROWTH_FREEZE_MB`` (its peak resident size) since the last freeze. A submission storm or a
  queue filled by 92,000 jobs builds a million or more long-lived objects (the rows kept for
  the scheduler and squeue); frozen only at the next full collection, that collection walked
  them first: 0.4 to 0.5 s with every thread stopped, two to four times in each run of
  ``bench/bench_htc.py`` (the stall log's count), one of them in the reads (squeue's p99
  567 ms). Frozen as they come, no full collection walks them. A cycle among what is frozen
  then that becomes garbage waits for the sweep, as above (between the sweep and the full
  collection after it, no middle collection freezes); the rule freezes only as often as the
  process grows by that much, so what it freezes of the requests in flight stays small.
"""

from __future__ import annotations

import gc
import resource
import sys
import time

SWITCH_INTERVAL_S = 0.001
"""How long a thread runs before one that waits for the GIL may take it (CPython: 5 ms)."""

GC_THRESHOLDS = (10_000, 10, 10)
"""Allocations (less deallocations) between young collections; young collections per middle
one; middle ones per full one (a full one also waits until the oldest generation has grown
by a quarter). A young collection then scans at most 10,000 objects, a middle one 100,000."""


FULL_SWEEP_S = 3600.0
"""How often the frozen objects are given back to the collector for one full collection."""

GROWTH_FREEZE_MB = 64
"""The growth of the process's peak resident size after which a middle collection freezes."""


def peak_rss_mb() -> float:
    """The process's peak resident size so far (one system call)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class Freezer:
    """The collector's callback that freezes what a full collection kept, and what a middle
    one kept once the process has grown (see above)."""

    def __init__(self, sweep_s: float = FULL_SWEEP_S, clock=time.monotonic,
                 growth_mb: float = GROWTH_FREEZE_MB, peak_mb=peak_rss_mb) -> None:
        self.sweep_s, self.clock = sweep_s, clock
        self.growth_mb, self.peak_mb = growth_mb, peak_mb
        self.swept = clock()
        self.frozen_at_mb = peak_mb()
        self.sweeping = False  # given back: no middle collection freezes before the full one walks them

    def __call__(self, phase: str, info: dict) -> None:
        if phase != "stop" or info["generation"] == 0:
            return
        if info["generation"] == 1:
            peak = self.peak_mb()
            if not self.sweeping and peak - self.frozen_at_mb >= self.growth_mb:
                gc.freeze()
                self.frozen_at_mb = peak
            return
        now = self.clock()
        if now - self.swept >= self.sweep_s:
            gc.unfreeze()  # the next full collection walks every object again
            self.swept, self.sweeping = now, True
        else:
            gc.freeze()
            self.frozen_at_mb, self.sweeping = self.peak_mb(), False


freezer = Freezer()


def set_for_server() -> None:
    """Apply the settings above to this process (the server's, before it serves)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)
    if freezer not in gc.callbacks:
        gc.callbacks.append(freezer)
