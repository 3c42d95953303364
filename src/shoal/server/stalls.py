"""A watcher that writes down what held the server's interpreter whenever it stalled.

Every thread of the server shares one GIL, and the cyclic collector stops them all: a request
that waits for either waits for whatever holds it, and nothing in the request's own trace says
what that was. ``shoal server --stall-log FILE [--stall-ms MS]`` starts this watcher: a thread
that sleeps a tick over and over and notes when it woke late. A wake-up later than the
threshold is a stall; FILE gets a line for it and every other thread's stack as it is the
moment the watcher runs again::

    stall 0.412 s, 2026-12-08T01:02:03.456Z to 2026-12-08T01:02:03.868Z
      thread 140243 (ThreadPoolExecutor-0_3):
        File ".../shoal/server/snapshot.py", line 454, in _fetch
        ...

A thread holds the GIL through a long C call (a sort, a JSON encoding, a statement) and
gives it up once the call returns: the watcher then runs within the switch interval, while
that thread is still in the function that made the call, so its stack names it. A stall the
collector made is named on a line of its own (``gc generation 2: 0.213 s, 1204 collected``)
for every collection over half the threshold. A stall with every thread waiting was the
machine's: the process was not given a CPU.

Why not the stacks during the stall: faulthandler's watchdog (a C thread, which needs no
GIL) can write them, but it walks the threads without the interpreter's lock, and a thread
that ends meanwhile (the server's worker threads come and go) crashed the process: a
segmentation fault in a 30-second stress test, and once in a benchmark's server.

The watcher costs a wake-up a tick (100 a second): it is off unless asked for.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
import traceback
from collections import deque
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
        self._collections: deque[str] = deque()  # the collector's lines, written by the watcher
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def start(self) -> None:
        self.out = open(self.path, "a", encoding="utf-8")
        gc.callbacks.append(self._on_gc)
        self._thread.start()
        log.info("writing the stacks of every stall over %.0f ms to %s", self.threshold_s * 1000, self.path)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._stop.set()
        self._thread.join()  # it writes the collections' last lines
        if self.out:
            self.out.close()

    def _run(self) -> None:
        assert self.out is not None
        self.out.write(f"watching from {_stamp(time.time())}: stalls over {self.threshold_s:.3f} s\n")
        self.out.flush()
        while not self._stop.is_set():
            began, wall = time.monotonic(), time.time()
            self._stop.wait(self.tick_s)
            late = time.monotonic() - began - self.tick_s
            if late >= self.threshold_s:
                stacks = sys._current_frames()  # first: the thread that held the GIL is still where it did
                self.stalls += 1
                self._write_collections()
                self.out.write(f"stall {late:.3f} s, {_stamp(wall + self.tick_s)} to {_stamp(time.time())}\n")
                self._write_stacks(stacks)
                self.out.flush()
            elif self._collections:
                self._write_collections()
                self.out.flush()
        self._write_collections()

    def _write_collections(self) -> None:
        assert self.out is not None
        while self._collections:
            self.out.write(self._collections.popleft())

    def _write_stacks(self, stacks: dict) -> None:
        assert self.out is not None
        names = {t.ident: t.name for t in threading.enumerate()}
        me = threading.get_ident()
        for ident, frame in stacks.items():
            if ident != me:
                self.out.write(f"  thread {ident} ({names.get(ident, '?')}):\n")
                self.out.writelines("    " + line.replace("\n  ", "\n    ")
                                    for line in traceback.format_stack(frame))

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.monotonic()
            return
        took = time.monotonic() - self._gc_started
        if took >= self.threshold_s / 2:
            # Written by the watcher: only its thread writes the file (a text file is not safe
            # to write from two threads, and a collection may come inside the watcher's write).
            self._collections.append(f"gc generation {info['generation']}: {took:.3f} s, "
                                     f"{info['collected']} collected, ended {_stamp(time.time())}\n")


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
