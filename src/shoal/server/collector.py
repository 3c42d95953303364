"""Python's cyclic garbage collector, set for a server that keeps its queue in memory.

A collection stops every thread. With CPython's default thresholds (700, 10, 10) the
objects of the requests in flight at each young collection were promoted, so under a
submission storm the oldest generation grew by a quarter every few seconds and was
collected whole (every object the server keeps: 0.2 to 0.35 s of CPU with 20,000 jobs
queued): most submissions slower than 100 ms had waited for one (docs/SCALE.md).
Collecting the youngest generation after 10,000 allocations instead of 700 lets a
request's objects die of their reference counts before a collection sees them.
"""

from __future__ import annotations

import gc

THRESHOLDS = (10_000, 10, 10)
"""Allocations (less deallocations) between young collections; young collections per middle
one; middle ones per full one (a full one also waits until the oldest generation has grown
by a quarter). A young collection then scans at most 10,000 objects, a middle one 100,000."""


def set_for_server() -> None:
    """Apply THRESHOLDS to this process (the server's, before it serves)."""
    gc.set_threshold(*THRESHOLDS)
