"""The server's stall watcher (``shoal server --stall-log``): a stall over the threshold gets a
line of its own, which ``logged`` reads back, and the stack of the thread that held the
interpreter; and it is safe in a process whose threads come and go."""

import gc
import random
import subprocess
import sys
import textwrap
import time

from shoal.server import stalls


def hold_the_interpreter(values: list[float]) -> float:
    """Sort in C, which keeps the GIL throughout (no other thread of the process runs), then
    go on a moment in this function, as the caller of a long C call does."""
    began = time.monotonic()
    values.sort()
    held = time.monotonic() - began
    time.sleep(0.05)
    return held


def test_a_stall_is_logged_with_the_stack_that_held_it(tmp_path):
    log = tmp_path / "stalls.log"
    watch = stalls.StallWatch(str(log), threshold_s=0.05, tick_s=0.005)
    values = [random.random() for _ in range(1_500_000)]
    watch.start()
    try:
        time.sleep(0.05)
        before = time.time()
        held = hold_the_interpreter(values)
    finally:
        watch.stop()
    assert held > 0.1, "the sort was too quick to make a stall on this machine"
    text = log.read_text()
    found = stalls.logged(text)
    assert len(found) == watch.stalls >= 1
    began, took = max(found, key=lambda s: s[1])
    assert took >= held - 0.06 and before - 0.01 <= began <= before + 0.06
    after = text.split("\nstall ")[found.index((began, took)) + 1]
    assert "in hold_the_interpreter" in after.partition("\nstall ")[0]


def test_stopping_the_watcher_leaves_the_collector_alone(tmp_path):
    """Its collector callback goes with it: left behind, every collection would write to a
    closed file."""
    watch = stalls.StallWatch(str(tmp_path / "stalls.log"), threshold_s=0.0, tick_s=0.005)
    watch.start()
    gc.collect()
    watch.stop()
    assert watch._on_gc not in gc.callbacks and not watch._thread.is_alive()
    gc.collect()
    assert "gc generation 2:" in (tmp_path / "stalls.log").read_text()


def test_threads_that_come_and_go_while_stalls_are_written_do_not_crash_the_process(tmp_path):
    """The server's worker threads come and go. faulthandler's watchdog, which wrote the
    stacks during the stall, crashed such a process within seconds (a segmentation fault)."""
    program = textwrap.dedent(f"""
        import random, threading, time
        from shoal.server.stalls import StallWatch
        watch = StallWatch({str(tmp_path / "stalls.log")!r}, threshold_s=0.003, tick_s=0.001)
        watch.start()
        stop = time.monotonic() + 3

        def sort():
            while time.monotonic() < stop:
                values = [random.random() for _ in range(100_000)]
                values.sort()

        def come_and_go():
            while time.monotonic() < stop:
                t = threading.Thread(target=sum, args=(range(10_000),))
                t.start()
                t.join()

        threads = [threading.Thread(target=f) for f in (sort, sort, come_and_go, come_and_go)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        watch.stop()
        print(watch.stalls)
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 0, "the test made no stall to write"
