"""Agents' heartbeats, kept in memory and written to the store together.

A thousand agents reporting every five seconds made two hundred write transactions a
second (each a disk flush on SQLite) that changed nothing but a node's ``last_heartbeat``,
and every one of them moved the node rows' change count, so the caches of node rows
(submissions' feasibility, the scheduler's nodes) were never kept. A report that carries
nothing to store (no exits, no pods, no GPU problem, no clean-up to drop, a node that is
not DOWN for its silence) now only notes the time here; ``flush`` writes every node's last
report in one statement, as a plain UPDATE that bumps no version and no change count,
every ``flush_s`` and before the leader looks for silent nodes. A reader of
``last_heartbeat`` takes ``latest`` over the stored one. Several servers sharing a store
(HA) each flush what they heard, well within the heartbeat timeout (``flush_s`` is at most a
quarter of it), so the leader sees every node alive that is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import String, bindparam, column, select, table, type_coerce, update
from sqlalchemy.orm import Session, sessionmaker

from shoal.model.node import NodeState
from shoal.server.jobs import job_run_key
from shoal.store.changes import ChangeCount
from shoal.store.models import CleanupRow, NodeRow

log = logging.getLogger("shoal.heartbeats")

REBUILD_S = 1.0
"""At most this often, what only_a_heartbeat keeps for every node is read again whole."""

_NODES = table(NodeRow.__tablename__, column("name"), column("last_heartbeat"))
_WRITE = (update(_NODES).where(_NODES.c.name == bindparam("node"), _NODES.c.last_heartbeat < bindparam("seen"))
          .values(last_heartbeat=bindparam("seen")))


_QUIET = (select(NodeRow.__table__.c.state, NodeRow.__table__.c.reason,
                 type_coerce(NodeRow.__table__.c.gpu_health, String), CleanupRow.job_id, CleanupRow.run)
          .select_from(NodeRow.__table__.outerjoin(CleanupRow, CleanupRow.node == NodeRow.name))
          .where(NodeRow.name == bindparam("node")))
"""only_a_heartbeat's one query; the GPU problems as their stored text ("[]": none), not decoded
(psycopg decodes JSON itself: there an empty list)."""


class Heartbeats:
    def __init__(self, sessions: sessionmaker[Session], flush_s: float, node_changes: ChangeCount | None = None,
                 job_changes: ChangeCount | None = None, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.sessions = sessions
        self.flush_s = flush_s
        self._monotonic = monotonic
        self._rebuilt = float("-inf")  # when what is kept was last read whole (monotonic)
        # What only_a_heartbeat reads, for every node at once, kept until a commit of this
        # process changes a node row (node_changes) or a clean-up (job_changes): an idle
        # cluster's heartbeats then read nothing. Off (read per report) without the counts.
        self._node_changes, self._job_changes = node_changes, job_changes
        self._quiet: tuple[int | None, frozenset[str]] = (None, frozenset())  # nodes a report may leave be
        self._cleanups: tuple[int | None, dict[str, list[str]]] = (None, {})  # node -> its clean-ups' run keys
        self._lock = threading.Lock()
        self._unwritten: dict[str, float] = {}  # node -> its last report's time, not yet stored
        self._latest: dict[str, float] = {}  # node -> its last report's time, stored or not
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.flushes = 0
        self._statement: tuple[str, tuple[str, bool, tuple[str, ...]]] | None = None  # (dialect, _compiled)

    def seen(self, node: str, now: float) -> None:
        """The node's agent reported at ``now``."""
        with self._lock:
            if now > self._latest.get(node, float("-inf")):
                self._unwritten[node] = self._latest[node] = now

    def only_a_heartbeat(self, node: str, alive: list[str], has_news: bool) -> bool:
        """only_a_heartbeat (below), from what is kept while the change counts stand still."""
        known = self.known(node, alive, has_news)
        if known is not None:
            return known
        nodes, jobs = self._node_changes, self._job_changes
        if nodes is None or jobs is None or not (nodes.enabled and jobs.enabled):
            with self.sessions() as s:
                return only_a_heartbeat(s, node, alive, has_news)
        stale = self._quiet[0] != nodes.value or self._cleanups[0] != jobs.value
        if stale and self._monotonic() - self._rebuilt < REBUILD_S:
            # The counts move on every commit (a registration storm, a busy run): the node's
            # own row and clean-ups (one small query) until the next rebuild, not every node's
            # row per report.
            with self.sessions() as s:
                return only_a_heartbeat(s, node, alive, has_news)
        if stale:
            self._rebuilt = self._monotonic()
        at = nodes.value  # noted before the read: a commit racing it moves the count again
        if self._quiet[0] != at:
            with self.sessions() as s:
                self._quiet = (at, frozenset(name for name, state, reason, gpu_health in s.execute(
                    select(NodeRow.name, NodeRow.state, NodeRow.reason, NodeRow.gpu_health))
                    if not gpu_health and not (state == NodeState.DOWN.value and reason == "Not responding")))
        at = jobs.value
        if self._cleanups[0] != at:
            by_node: dict[str, list[str]] = {}
            with self.sessions() as s:
                for name, job_id, run in s.execute(select(CleanupRow.node, CleanupRow.job_id, CleanupRow.run)):
                    by_node.setdefault(name, []).append(job_run_key(job_id, run))
            self._cleanups = (at, by_node)
        return self._verdict(self._quiet[1], self._cleanups[1], node, alive)

    def known(self, node: str, alive: list[str], has_news: bool) -> bool | None:
        """only_a_heartbeat without reading the store: None when what is kept is out of date
        (or not kept: the counts disabled), so the caller must ask in a thread."""
        if has_news:
            return False
        nodes, jobs = self._node_changes, self._job_changes
        if nodes is None or jobs is None or not (nodes.enabled and jobs.enabled):
            return None
        quiet, cleanups = self._quiet, self._cleanups
        if quiet[0] != nodes.value or cleanups[0] != jobs.value:
            return None
        return self._verdict(quiet[1], cleanups[1], node, alive)

    @staticmethod
    def _verdict(quiet: frozenset[str], cleanups: dict[str, list[str]], node: str, alive: list[str]) -> bool:
        if node not in quiet:
            return False
        mine = cleanups.get(node)
        if not mine:
            return True
        live = set(alive)
        return all(key in live for key in mine)

    def latest(self, node: str, stored: float) -> float:
        """The node's last report: ``stored`` (its row's ``last_heartbeat``) or a later one heard here."""
        return max(stored, self._latest.get(node, stored))

    def flush(self) -> int:
        """Write the reports heard since the last flush (one statement); how many nodes."""
        with self._lock:
            batch, self._unwritten = self._unwritten, {}
        if not batch:
            return 0
        try:
            with self.sessions() as s, s.begin():
                # The connection's own execute: the ORM's events (the change counts) do not see
                # it, and no version moves, so no plan or update of the node rows conflicts with it.
                conn = s.connection()
                sql, positional, order = self._compiled(conn.dialect)
                rows = [{"node": n, "seen": t} for n, t in batch.items()]
                # As the driver's own statement: SQLAlchemy's per-row parameter processing of an
                # executemany was most of a flush (5,000 nodes: 10% of an idle server's time).
                conn.exec_driver_sql(sql, [tuple(r[k] for k in order) for r in rows] if positional else rows)
        except Exception:
            with self._lock:  # kept for the next flush, unless a later report replaced it
                for n, t in batch.items():
                    self._unwritten.setdefault(n, t)
            raise
        self.flushes += 1
        return len(batch)

    def _compiled(self, dialect) -> tuple[str, bool, tuple[str, ...]]:
        """_WRITE in the driver's own SQL and parameter style (compiled once per dialect)."""
        if self._statement is None or self._statement[0] != dialect.name:
            c = _WRITE.compile(dialect=dialect)
            self._statement = (dialect.name, (str(c), c.positional, tuple(c.positiontup or ())))
        return self._statement[1]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.flush()
        except Exception:  # the store may be gone already: the next start gives every node a full timeout
            log.warning("could not store the last heartbeats at shutdown", exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
            except Exception:  # the store is out of reach: try again at the next flush
                log.warning("storing heartbeats failed (will retry)", exc_info=True)


def only_a_heartbeat(session: Session, node: str, alive: list[str], has_news: bool) -> bool:
    """Whether an agent's report has nothing to store but its time: ``has_news`` (exits,
    pods, GPU problems) false, the node known and not DOWN for its silence, no GPU problem
    left to clear, and every clean-up of the node still alive there (read, not written)."""
    if has_news:
        return False
    rows = session.execute(_QUIET, {"node": node}).all()  # the node, and a row per clean-up (one query)
    if not rows:
        return False
    state, reason, gpu_health = rows[0][:3]
    if (gpu_health and gpu_health != "[]") or (state == NodeState.DOWN.value and reason == "Not responding"):
        return False
    live = set(alive)
    return all(job_run_key(job_id, run) in live for *_, job_id, run in rows if job_id is not None)
