"""The server's stall watcher (``shoal server --stall-log``): a stall over the threshold gets
every thread's stack, taken while it lasted, and a line of its own that ``logged`` reads back."""

import random
import time

from shoal.server import stalls


def hold_the_interpreter(values: list[float]) -> float:
    """Sort in C, which keeps the GIL throughout: no other thread of the process runs."""
    began = time.monotonic()
    values.sort()
    return time.monotonic() - began


def test_a_stall_is_logged_with_the_stack_that_held_it(tmp_path):
    log = tmp_path / "stalls.log"
    watch = stalls.StallWatch(str(log), threshold_s=0.05, tick_s=0.005)
    values = [random.random() for _ in range(1_500_000)]
    watch.start()
    try:
        time.sleep(0.05)
        before = time.time()
        held = hold_the_interpreter(values)
        time.sleep(0.05)
    finally:
        watch.stop()
    assert held > 0.1, "the sort was too quick to make a stall on this machine"
    text = log.read_text()
    found = stalls.logged(text)
    assert len(found) == watch.stalls >= 1
    began, took = max(found, key=lambda s: s[1])
    assert took >= held - 0.06 and before - 0.01 <= began <= before + 0.06
    dump = text.partition("Timeout (")[2]
    assert 'in hold_the_interpreter' in dump.split("\nstall ")[0]


def test_stopping_the_watcher_leaves_the_collector_alone(tmp_path):
    """Its collector callback goes with it: left behind, every collection would write to a
    closed file."""
    import gc

    watch = stalls.StallWatch(str(tmp_path / "stalls.log"), threshold_s=0.0, tick_s=0.005)
    watch.start()
    gc.collect()
    watch.stop()
    assert watch._on_gc not in gc.callbacks and not watch._thread.is_alive()
    gc.collect()
    assert "gc generation 2:" in (tmp_path / "stalls.log").read_text()
