"""The server's interpreter settings: a thread that gives the GIL up for a moment (a
submission's commit, at each SQLite call) gets it back within a millisecond or so while a
scheduling pass computes, and a request's short-lived objects die before a collection sees
them, so a submission storm does not set off the full collections that stop the server for
a third of a second (docs/SCALE.md); what a full collection keeps is frozen, so the next one
walks only what came since, not every job kept in memory."""

import gc
import statistics
import sys
import threading
import time
import weakref

import pytest

from shoal.server import interpreter


@pytest.fixture
def settings():
    before = gc.get_threshold(), sys.getswitchinterval(), list(gc.callbacks)
    yield
    gc.set_threshold(*before[0])
    sys.setswitchinterval(before[1])
    gc.callbacks[:] = before[2]
    gc.unfreeze()


def gil_regained_ms() -> float:
    """Median time a thread takes to get the GIL back after a blocking call of 1 ms while
    another thread runs pure Python, as a pass does. The call lasts long enough for the other
    thread to wake and take the GIL (with sleep(0) the sleeper often took it back first on a
    busy machine, and the default's whole interval was not seen)."""
    stop = threading.Event()

    def a_pass() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    spinner = threading.Thread(target=a_pass)
    spinner.start()
    try:
        waits = []
        for _ in range(21):
            t = time.perf_counter()
            time.sleep(0.001)  # gives the GIL up, as sqlite3 does around each call
            waits.append(1000 * (time.perf_counter() - t) - 1)
    finally:
        stop.set()
        spinner.join()
    return statistics.median(waits)


def test_a_commit_gets_the_gil_back_within_a_few_ms_while_a_pass_runs(settings):
    sys.setswitchinterval(0.005)  # CPython's default: the wait is a whole interval
    assert gil_regained_ms() >= 4.5
    interpreter.set_for_server()
    assert gil_regained_ms() < 4


def test_a_burst_of_request_objects_triggers_no_collection_in_the_server(settings):
    interpreter.set_for_server()
    gc.collect()  # the young generation's count starts from nothing
    young_before = gc.get_stats()[0]["collections"]
    in_flight = [[i] for i in range(5_000)]  # what 20 submissions in flight hold, say
    assert gc.get_stats()[0]["collections"] == young_before
    del in_flight


def test_the_same_burst_is_collected_under_pythons_defaults(settings):
    gc.set_threshold(700, 10, 10)
    gc.collect()
    young_before = gc.get_stats()[0]["collections"]
    in_flight = [[i] for i in range(5_000)]
    assert gc.get_stats()[0]["collections"] > young_before
    del in_flight


class Node:
    """An object that can be in a reference cycle and be watched (weakref) for being freed."""

    def __init__(self) -> None:
        self.other: object = self


def test_what_a_full_collection_keeps_is_frozen_and_the_next_walks_only_what_came_since(settings):
    interpreter.set_for_server()
    interpreter.set_for_server()  # once is enough: one callback
    assert gc.callbacks.count(interpreter.freezer) == 1
    kept = [[i] for i in range(200_000)]  # the long-lived rows a deep queue keeps
    gc.collect()
    assert gc.get_freeze_count() >= 200_000
    assert len(gc.get_objects(generation=2)) < 10_000, "the oldest generation holds only what came since"
    cycle = weakref.ref(Node())  # garbage made after the freeze is collected as before
    gc.collect()
    assert cycle() is None
    del kept


def test_a_frozen_cycle_is_freed_by_the_full_collection_after_the_sweep_is_due(settings):
    now = [0.0]
    freezer = interpreter.Freezer(sweep_s=3600, clock=lambda: now[0])
    gc.callbacks.append(freezer)
    node = Node()
    gone = weakref.ref(node)
    gc.collect()  # node is alive: frozen with the rest
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert gone() is not None, "a frozen cycle waits for the sweep"
    now[0] = 3600.0
    gc.collect()  # the sweep is due: this one gives the frozen back (freeing nothing yet)
    assert gc.get_freeze_count() == 0
    gc.collect()  # the next walks them all, frees the cycle, and freezes the rest again
    assert gone() is None and gc.get_freeze_count() > 0


def test_a_middle_collection_freezes_what_it_kept_once_the_process_has_grown(settings):
    """A storm or a filled queue: what a middle collection keeps is frozen once the peak
    resident size has grown by ``growth_mb`` since the last freeze, not left for a full
    collection to walk; below that, nothing is frozen."""
    peak = [1000.0]
    freezer = interpreter.Freezer(growth_mb=64, peak_mb=lambda: peak[0])
    gc.callbacks.append(freezer)
    kept = [[i] for i in range(50_000)]
    peak[0] = 1050.0
    gc.collect(1)
    assert gc.get_freeze_count() == 0, "grown by less than growth_mb: nothing frozen"
    peak[0] = 1070.0
    gc.collect(1)
    assert gc.get_freeze_count() >= 50_000
    assert len(gc.get_objects(generation=2)) < 10_000, "what it kept is out of the full collections' sight"
    gc.unfreeze()
    more = [[i] for i in range(50_000)]
    gc.collect(1)
    assert gc.get_freeze_count() == 0, "not grown since the last freeze"
    del kept, more


def test_the_sweep_is_not_undone_by_a_middle_collection_of_a_grown_process(settings):
    """Once the sweep gave the frozen back, the full collection after it must walk them: a
    middle collection before it freezes nothing, however much the process has grown."""
    now, peak = [0.0], [1000.0]
    freezer = interpreter.Freezer(sweep_s=3600, clock=lambda: now[0], growth_mb=64, peak_mb=lambda: peak[0])
    gc.callbacks.append(freezer)
    node = Node()
    gone = weakref.ref(node)
    gc.collect()
    del node
    now[0] = 3600.0
    gc.collect()  # the sweep is due: the frozen are given back
    peak[0] = 2000.0
    gc.collect(1)
    assert gc.get_freeze_count() == 0, "a middle collection during the sweep froze them again"
    gc.collect()
    assert gone() is None and gc.get_freeze_count() > 0
    peak[0] = 2100.0
    gc.collect(1)  # after the sweep, growth freezes again
    assert freezer.frozen_at_mb == 2100.0
