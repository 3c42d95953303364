"""A watcher that writes down what held the server's interpreter whenever it stalled.

Every thread of the server shares one GIL, and the cyclic collector stops them all: a request
that waits for either waits for whatever holds it, and nothing in the request's own trace says
what that was. ``shoal server --stall-log FILE [--stall-ms MS]`` starts this watcher: a thread that sleeps a
tick over and over, and before each sleep asks ``faulthandler``'s watchdog (a C thread, which
needs no GIL) to dump every thread's Python stack into FILE unless the watcher is back within
the threshold. So when the watcher is kept out for longer, FILE gets the stacks as they were
during the stall (again every threshold while it lasts), and then one line when it ends::

    stall 0.412 s, 2026-12-08T01:02:03.456Z to 2026-12-08T01:02:03.868Z

A thread whose top frame is Python code, not a wait (``wait``, ``acquire``, ``select``), is
the one that held the interpreter. A stall the collector made is named on a line of its own
(``gc generation 2: 0.213 s, 1204 collected``) for every collection over half the threshold.
A stall with no Python thread busy is the machine's: the process was not given a CPU.

The watcher costs a wake-up a tick (100 a second): it is off unless asked for.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import threading
import time
from datetime import datetime, timezone
from typing import IO

THRESHOLD_S = 0.1
"""A wait of the watcher this much longer than its tick is a stall."""

TICK_S = 0.01
"""How long the watcher sleeps between its checks."""

log = logging.getLogger("shoal.server.stalls")


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class StallWatch:
    """The watcher thread and the collector's callback, writing to one file (see above)."""

    def __init__(self, path: str, threshold_s: float = THRESHOLD_S, tick_s: float = TICK_S) -> None:
        self.path, self.threshold_s, self.tick_s = path, threshold_s, tick_s
        self.out: IO[str] | None = None
        self.stalls = 0
        self._stop = threading.Event()
        self._gc_started = 0.0
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def start(self) -> None:
        self.out = open(self.path, "a", buffering=1, encoding="utf-8")
        gc.callbacks.append(self._on_gc)
        self._thread.start()
        log.info("writing the stacks of every stall over %.0f ms to %s", self.threshold_s * 1000, self.path)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self.out:
            self.out.close()

    def _write(self, line: str) -> None:
        assert self.out is not None
        self.out.write(line + "\n")

    def _run(self) -> None:
        assert self.out is not None
        self._write(f"watching from {_stamp(time.time())}: stalls over {self.threshold_s:.3f} s")
        while not self._stop.is_set():
            self.out.flush()
            # The watchdog writes to the file's descriptor itself: it can run while this
            # thread waits for the GIL, and it is cancelled below once this thread is back.
            faulthandler.dump_traceback_later(self.threshold_s + self.tick_s, repeat=True, file=self.out)
            began, wall = time.monotonic(), time.time()
            self._stop.wait(self.tick_s)
            faulthandler.cancel_dump_traceback_later()
            late = time.monotonic() - began - self.tick_s
            if late >= self.threshold_s:
                self.stalls += 1
                self._write(f"stall {late:.3f} s, {_stamp(wall + self.tick_s)} to {_stamp(time.time())}")

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.monotonic()
            return
        took = time.monotonic() - self._gc_started
        if took >= self.threshold_s / 2 and self.out is not None:
            self._write(f"gc generation {info['generation']}: {took:.3f} s, {info['collected']} collected, "
                        f"ended {_stamp(time.time())}")


def logged(text: str) -> list[tuple[float, float]]:
    """The stalls a log of this watcher names: when each began (a Unix time) and how long it
    lasted (seconds), in order."""
    out = []
    for line in text.splitlines():
        if line.startswith("stall "):
            took, _, rest = line[len("stall "):].partition(" s, ")
            began = datetime.fromisoformat(rest.partition(" to ")[0].replace("Z", "+00:00")).timestamp()
            out.append((began, float(took)))
    return out


def started(path: str | None, threshold_s: float = THRESHOLD_S) -> StallWatch | None:
    """The watcher writing to ``path``, started; None without one."""
    if not path:
        return None
    watch = StallWatch(os.path.abspath(path), threshold_s)
    watch.start()
    return watch
