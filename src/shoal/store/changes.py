"""A count of committed changes to some tables, kept by this process's sessions.

Read-mostly answers (``squeue``'s queue view, polled in tight loops by users' scripts) are
cached under the count they were computed at: the same count, the same rows. The count
goes up *after* a commit that wrote one of the watched tables, so a reader that saw the
new count also sees the new rows; a reader that raced a commit caches its answer under
the old count, which nobody asks for again.

It sees only this process's writes: with several servers on one store (HA), the others'
commits are invisible, and ``enabled`` is False so nothing is cached.
"""

from __future__ import annotations

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

_DIRTY = "shoal.changed"


class ChangeCount:
    def __init__(self, sessions: sessionmaker[Session], tables: tuple[type, ...], enabled: bool = True) -> None:
        self.value = 0
        self.enabled = enabled
        self._tables = tables
        self._names = {t.__table__.name for t in tables}
        event.listen(sessions, "after_flush", self._flushed)
        event.listen(sessions, "do_orm_execute", self._executed)
        event.listen(sessions, "after_commit", self._committed)
        event.listen(sessions, "after_soft_rollback", self._rolled_back)

    def _flushed(self, session: Session, _context) -> None:
        if not session.info.get(_DIRTY) and any(
                isinstance(obj, self._tables) for objs in (session.new, session.dirty, session.deleted)
                for obj in objs):
            session.info[_DIRTY] = True

    def _executed(self, state) -> None:
        # UPDATE and DELETE statements run through the session (not the unit of work).
        if (state.is_update or state.is_delete) and any(
                getattr(m, "local_table", None) is not None and m.local_table.name in self._names
                for m in state.all_mappers):
            state.session.info[_DIRTY] = True

    def _committed(self, session: Session) -> None:
        if session.info.pop(_DIRTY, False):
            self.value += 1

    def _rolled_back(self, session: Session, _previous) -> None:
        session.info.pop(_DIRTY, None)
