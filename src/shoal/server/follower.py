"""A thread that keeps what this process keeps in memory from its own commits (squeue's view,
the running jobs' index) up to date as those commits come, as the Kubernetes API server's
watch cache follows etcd, so that requests find it current instead of bringing it up to date
themselves: after a storm of 50,000 submissions, the first squeue read and encoded the new
jobs, and the first sinfo re-read them all to find none running, while 20 clients waited.
A request still syncs whatever the follower has not seen yet, so every answer is current.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.server.loop import KickedLoop

log = logging.getLogger("shoal.server")

FOLLOW_S = 0.2
"""How often the follower looks for commits it has not seen (each sync costs nothing then)."""


class Follower(KickedLoop):
    name = "follower"

    def __init__(self, syncs: list[Callable[[], None]], interval_s: float = FOLLOW_S) -> None:
        super().__init__()
        self.syncs, self._interval_s = syncs, interval_s

    def interval_s(self) -> float:
        return self._interval_s

    def step(self) -> None:
        for sync in self.syncs:  # each on its own: one that fails does not hold up the others
            try:
                sync()
            except Exception:
                log.exception("could not bring a view kept in memory up to date (a request will try again)")
