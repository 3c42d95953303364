"""The control loops: scheduling passes, time limits, --signal warnings and node heartbeats.

Level-triggered: each pass reads the store, decides with the pure policy in shoal.sched,
and applies the plan in one short transaction that re-checks every row it changes
(version column), so a pass is safe to run again at any time and a restart loses nothing.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import delete, select
from sqlalchemy.orm.exc import StaleDataError

from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.model.resources import Allocation
from shoal.sched.schedule import schedule
from shoal.server import jobs as jobsvc
from shoal.store.models import CleanupRow, JobRow, NodeRow

log = logging.getLogger("shoal.controller")


class Controller:
    def __init__(self, server) -> None:
        self.server = server
        self.kick = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()  # runs whose --signal warning was sent
        self.passes = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.kick.set()
        if self._thread:
            self._thread.join(timeout=10)

    def wake(self) -> None:
        self.kick.set()

    def _run(self) -> None:
        interval = self.server.config.scheduler.interval_s
        while not self._stop.is_set():
            self.kick.wait(timeout=interval)
            self.kick.clear()
            if self._stop.is_set():
                break
            try:
                self.run_pass()
            except Exception:  # a bad pass must not kill the loop; the next one retries
                log.exception("scheduling pass failed")
                time.sleep(0.2)

    def run_pass(self) -> None:
        now = self.server.clock()
        touched: set[str] = set()
        touched |= self._check_heartbeats(now)
        touched |= self._enforce_time_limits(now)
        for _attempt in range(3):
            try:
                touched |= self._schedule(now)
                break
            except StaleDataError:
                now = self.server.clock()
        self.passes += 1
        if touched:
            self.server.hub.bump(touched)

    # -------------------------------------------------------------- scheduling

    def _schedule(self, now: float) -> set[str]:
        s = self.server
        with s.sessions() as session:
            snap = s.snapshot(session, now)
        if not snap.pending:
            return set()
        plan = schedule(snap, s.sched_config)
        reasons = {**plan.reasons, **plan.never}
        with s.sessions() as session, session.begin():
            ids = list({st.job_id for st in plan.starts} | reasons.keys())
            rows = {r.id: r for r in session.scalars(select(JobRow).where(JobRow.id.in_(ids)))} if ids else {}
            touched: set[str] = set()
            for st in plan.starts:
                row = rows.get(st.job_id)
                if row is None or row.state != JobState.PENDING.value or row.held:
                    continue  # cancelled or held since the snapshot: the next pass sees it
                row.state = JobState.RUNNING.value
                row.allocation = st.allocation.to_json()
                row.batch_host = st.allocation.node_names[0]
                row.start_time = now
                row.reason = "None"
                touched.update(st.allocation.node_names)
            for jid, reason in reasons.items():
                row = rows.get(jid)
                if row is not None and row.state == JobState.PENDING.value and row.reason != reason:
                    row.reason = reason
        return touched

    # -------------------------------------------------------------- time limits

    def _enforce_time_limits(self, now: float) -> set[str]:
        s = self.server
        touched: set[str] = set()
        with s.sessions() as session, session.begin():
            running = session.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value,
                                                           JobRow.time_limit_s.is_not(None)))
            for row in running:
                end = (row.start_time or now) + row.time_limit_s
                sig = row.spec.get("signal")
                key = jobsvc.job_run_key(row.id, row.restart_count)
                if sig and now >= end - sig["time"] and key not in self._warned:
                    self._warned.add(key)
                    for node in Allocation.from_json(row.allocation).node_names:
                        if sig["batch_only"] and node != row.batch_host:
                            continue
                        s.hub.signal(node, key, sig["signal"], "batch_shell" if sig["batch_only"] else "steps")
                if now >= end:
                    jobsvc.finish(session, row, JobState.TIMEOUT, now, reason="TimeLimit")
                    touched.update(Allocation.from_json(row.allocation).node_names)
        return touched

    # -------------------------------------------------------------- node lifecycle

    def _check_heartbeats(self, now: float) -> set[str]:
        s = self.server
        timeout = s.config.nodes.heartbeat_timeout_s
        with s.sessions() as session, session.begin():
            late = list(session.scalars(select(NodeRow).where(
                NodeRow.state != NodeState.DOWN.value, NodeRow.last_heartbeat < now - timeout)))
            if not late:
                return set()
            touched: set[str] = set()
            for node in late:
                log.warning("node %s not responding for %.0fs: DOWN", node.name, now - node.last_heartbeat)
                node.state = NodeState.DOWN.value
                node.reason = "Not responding"
                node.reason_time = now
                touched |= self.fail_node_jobs(session, node.name, now)
            return touched

    def fail_node_jobs(self, session, node: str, now: float) -> set[str]:
        """A node is gone: its jobs end NODE_FAIL, or go back to the queue when they asked for --requeue."""
        touched: set[str] = set()
        session.execute(delete(CleanupRow).where(CleanupRow.node == node))
        for row in session.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value)):
            names = Allocation.from_json(row.allocation).node_names
            if node not in names:
                continue
            if row.requeue:
                jobsvc.requeue(session, row, now, via=JobState.NODE_FAIL, reason="BeginTime",
                               skip_nodes=frozenset({node}))
            else:
                jobsvc.finish(session, row, JobState.NODE_FAIL, now, reason="NodeFail",
                              skip_nodes=frozenset({node}))
            touched.update(n for n in names if n != node)
        return touched
