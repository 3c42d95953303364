"""A thread that keeps what this process keeps in memory from its own commits (squeue's view,
the running jobs' index) up to date as those commits come, as the Kubernetes API server's
watch cache follows etcd, so that requests find it current instead of bringing it up to date
themselves: after a storm of 50,000 submissions, the first squeue read and encoded the new
jobs, and the first sinfo re-read them all to find none running, while 20 clients waited.
A request still syncs whatever the follower has not seen yet, so every answer is current.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("shoal.server")

FOLLOW_S = 0.2
"""How often the follower looks for commits it has not seen (each sync costs nothing then)."""


class Follower:
    def __init__(self, syncs: list[Callable[[], None]], interval_s: float = FOLLOW_S) -> None:
        self.syncs, self.interval_s = syncs, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for sync in self.syncs:
                try:
                    sync()
                except Exception:
                    log.exception("could not bring a view kept in memory up to date (a request will try again)")
