"""Leadership: whether this server is the cluster's active scheduler and controller.

Every server answers the API; only the leader runs scheduling passes, the serving
controllers and node time-outs. A follower polls the lease (``shoal.store.lease``) every
``poll_s`` and takes over when it is free. A leader confirms its lease on the same beat
and stops acting at once when it cannot: when the confirmation fails, when it has not
succeeded for ``grace_s`` (a hung connection), or when a fenced transaction finds a newer
term. The loops ask ``is_leader`` before each step and ``fence`` inside each transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from shoal.store.lease import NotLeader, PostgresLease, SingleServer, current_leader

if TYPE_CHECKING:
    from shoal.server.core import Server

log = logging.getLogger("shoal.leader")


class Leadership:
    def __init__(self, lease: SingleServer | PostgresLease, url: str, clock: Callable[[], float], *,
                 on_elected: Callable[[], None] = lambda: None, poll_s: float = 0.5,
                 grace_s: float = 5.0) -> None:
        self.lease = lease
        self.url = url
        self.clock = clock
        self.on_elected = on_elected
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.term: int | None = None
        # When this server began to lead (the clock's time). Nodes get a fresh heartbeat
        # timeout from then, as slurmctld gives them when a backup takes control (their
        # reports may have gone to the old leader) or when it starts again after an outage
        # (their reports went nowhere): no node is DOWN for the control plane's own silence.
        self.elected_at: float | None = None
        self._confirmed = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def shared(self) -> bool:
        return self.lease.shared

    @property
    def is_leader(self) -> bool:
        if self.term is None:
            return False
        return not self.lease.shared or time.monotonic() - self._confirmed < self.grace_s

    def fence(self, session) -> None:
        """Inside a transaction that acts for the cluster: raise NotLeader unless this
        server's term still leads (and step down if it does not)."""
        term = self.term
        if term is None or not self.is_leader:
            raise NotLeader("this server is not the leader")
        try:
            self.lease.fence(session, term)
        except NotLeader as e:
            self._step_down(str(e))
            raise

    def start(self) -> None:
        if not self.lease.shared:
            self.term, self.elected_at = 1, self.clock()
            self.on_elected()
            return
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self.term = None
            self.lease.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.term is None:
                try:
                    term = self.lease.acquire(self.url, self.clock())
                except Exception as e:
                    log.warning("leader election: cannot reach the database (%s); retrying", e)
                    term = None
                if term is not None and not self._stop.is_set():
                    with self._lock:
                        self.term, self.elected_at = term, self.clock()
                        self._confirmed = time.monotonic()
                    log.warning("this server (%s) is the leader now, term %d: scheduling and controllers "
                                "run here", self.url, term)
                    self.on_elected()
            elif self.lease.confirm():
                self._confirmed = time.monotonic()
            else:
                self._step_down("the connection holding the lease is gone")
            self._stop.wait(self.poll_s)

    def _step_down(self, why: str) -> None:
        with self._lock:
            if self.term is None:
                return
            log.error("this server (%s) is no longer the leader (term %d): %s; it stops scheduling at once",
                      self.url, self.term, why)
            self.term = None
            self.lease.release()


def leader_json(server: Server) -> dict:
    """Which server leads (schedules, runs the controllers) and what this one is (scontrol ping)."""
    lead = server.leader
    me = {"url": server.url, "role": "leader" if lead.is_leader else "follower", "term": lead.term}
    if not lead.shared:
        return {"shared_store": False, "leader": {"url": server.url, "term": lead.term, "since": None},
                "self": me}
    with server.sessions() as s:
        row = current_leader(s)
        known = {"url": row.holder, "term": row.term, "since": row.since} if row is not None else None
    return {"shared_store": True, "leader": known, "self": me}
