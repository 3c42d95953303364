"""A control loop's thread: run a step when woken, and at least every interval."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from shoal.store.lease import NotLeader

log = logging.getLogger("shoal.server")


class KickedLoop:
    """Subclasses give ``name``, ``interval_s()`` and ``step()``. A failing step is logged and
    the loop goes on: the next step retries, the loops being level-triggered.

    ``active()`` says whether this server should run the loop at all (the cluster's leader
    runs the controllers); an inactive loop's wake-ups go to ``relay``, which tells the
    leader."""

    name = "loop"

    def __init__(self) -> None:
        self.kick = threading.Event()
        self.relay: Callable[[str], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def interval_s(self) -> float:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def active(self) -> bool:
        return True

    def rest_s(self) -> float:
        """How long to wait after a step before the next, however soon it is asked for:
        wake-ups meanwhile are coalesced into one step. 0: none."""
        return 0.0

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
        if self.relay is not None and not self.active():
            self.relay(self.name)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.kick.wait(timeout=self.interval_s())
            self.kick.clear()
            if self._stop.is_set():
                break
            if not self.active():
                continue
            try:
                self.step()
            except NotLeader as e:  # deposed during the step: its transaction was refused
                log.warning("%s step refused: %s", self.name, e)
            except Exception:  # a bad step must not kill the loop; the next one retries
                log.exception("%s step failed", self.name)
                time.sleep(0.2)
            rest = self.rest_s()
            if rest > 0:
                self._stop.wait(rest)
