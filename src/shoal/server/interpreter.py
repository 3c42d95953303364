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
"""

from __future__ import annotations

import gc
import sys

SWITCH_INTERVAL_S = 0.001
"""How long a thread runs before one that waits for the GIL may take it (CPython: 5 ms)."""

GC_THRESHOLDS = (10_000, 10, 10)
"""Allocations (less deallocations) between young collections; young collections per middle
one; middle ones per full one (a full one also waits until the oldest generation has grown
by a quarter). A young collection then scans at most 10,000 objects, a middle one 100,000."""


def set_for_server() -> None:
    """Apply the settings above to this process (the server's, before it serves)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)
