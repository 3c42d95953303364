"""A control loop's thread: run a step when woken, and at least every interval."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("shoal.server")


class KickedLoop:
    """Subclasses give ``name``, ``interval_s()`` and ``step()``. A failing step is logged and
    the loop goes on: the next step retries, the loops being level-triggered."""

    name = "loop"

    def __init__(self) -> None:
        self.kick = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def interval_s(self) -> float:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.kick.set()
        if self._thread:
            self._thread.join(timeout=10)

    def wake(self) -> None:
        self.kick.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.kick.wait(timeout=self.interval_s())
            self.kick.clear()
            if self._stop.is_set():
                break
            try:
                self.step()
            except Exception:  # a bad step must not kill the loop; the next one retries
                log.exception("%s step failed", self.name)
                time.sleep(0.2)
