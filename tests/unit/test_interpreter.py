"""The server's interpreter settings: a thread that gives the GIL up for a moment (a
submission's commit, at each SQLite call) gets it back within a millisecond or so while a
scheduling pass computes, and a request's short-lived objects die before a collection sees
them, so a submission storm does not set off the full collections that stop the server for
a third of a second (docs/SCALE.md)."""

import gc
import statistics
import sys
import threading
import time

import pytest

from shoal.server import interpreter


@pytest.fixture
def settings():
    before = gc.get_threshold(), sys.getswitchinterval()
    yield
    gc.set_threshold(*before[0])
    sys.setswitchinterval(before[1])


def gil_regained_ms() -> float:
    """Median time a thread takes to get the GIL back after a blocking call (sleep(0)) while
    another thread runs pure Python, as a pass does."""
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
            time.sleep(0)  # gives the GIL up, as sqlite3 does around each call
            waits.append(1000 * (time.perf_counter() - t))
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
