"""Group commit: writes that arrive while one transaction commits share the next one.

A commit waits for the disk (SQLite ``synchronous=FULL``, PostgreSQL's WAL flush), and
the writer lock is held meanwhile, so submissions made at once would each wait for every
other's flush. Here the first caller commits what is queued, callers arriving meanwhile
queue up, and the next of them commits them all in one transaction: one flush for many
jobs. Nobody is answered before the transaction holding their write has committed, so an
acknowledged job is as durable as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session


class _Pending:
    __slots__ = ("work", "value", "error", "done")

    def __init__(self, work: Callable[[Session], Any]) -> None:
        self.work = work
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = False

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class GroupCommit:
    """Run ``work(session)`` functions in shared transactions, committed before each returns.

    ``refusals`` are the exceptions a work function raises *before it writes anything*
    (validation, permission): they fail that caller alone and the others still commit.
    Anything else aborts the shared transaction, and each of its works is then run again
    in a transaction of its own, so one bad write fails only its caller. A failed commit
    itself is never retried: its outcome is unknown, and every caller in it gets the error.
    """

    def __init__(self, sessions: Callable[[], Session], refusals: tuple[type[Exception], ...],
                 max_batch: int = 256) -> None:
        self.sessions = sessions
        self.refusals = refusals
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._queue: list[_Pending] = []
        self._committing = False
        self.commits = 0  # transactions committed, and the works stored in them (metrics)
        self.stored = 0

    def run(self, work: Callable[[Session], Any]) -> Any:
        item = _Pending(work)
        with self._cond:
            self._queue.append(item)
        while True:
            with self._cond:
                while not item.done and self._committing:
                    self._cond.wait()
                if item.done:
                    return item.result()
                self._committing = True  # this caller commits the queue (its own work in it)
                batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
            try:
                self._commit(batch)
            finally:
                with self._cond:
                    for pending in batch:
                        pending.done = True
                    self._committing = False
                    self._cond.notify_all()

    def _commit(self, batch: list[_Pending]) -> None:
        with self.sessions() as s:
            try:
                s.begin()
                for pending in batch:
                    try:
                        pending.value = pending.work(s)
                    except self.refusals as e:
                        pending.error = e
                s.flush()
            except Exception as e:  # a write failed before the commit: nothing is stored
                s.rollback()
                if len(batch) == 1:
                    batch[0].value, batch[0].error = None, e
                    return
                for pending in batch:
                    self._alone(pending)
                return
            try:
                s.commit()
                self.commits += 1
                self.stored += sum(1 for pending in batch if pending.error is None)
            except Exception as e:
                # The commit's outcome is unknown (a connection lost during COMMIT may have
                # committed): running the works again could store each job twice, so every
                # caller gets the error, and none is told its job was stored.
                for pending in batch:
                    if not isinstance(pending.error, self.refusals):
                        pending.value, pending.error = None, e

    def _alone(self, pending: _Pending) -> None:
        pending.value = pending.error = None
        try:
            with self.sessions() as s, s.begin():
                pending.value = pending.work(s)
            self.commits += 1
            self.stored += 1
        except Exception as e:
            pending.value, pending.error = None, e


class InFlight:
    """Counts the callers inside ``with`` at once; each is given how many others were inside
    when it entered (the scheduler tells one submitter's stream from several at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0

    def __enter__(self) -> int:
        with self._lock:
            others = self._inside
            self._inside += 1
        return others

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._inside -= 1
