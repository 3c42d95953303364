"""Leader election among the servers that share one store, and the fence that goes with it.

PostgreSQL: the leader holds a session-level advisory lock on a connection of its own.
PostgreSQL releases it the moment that connection ends (the process died, or TCP
keepalives found the peer gone), so a follower that polls ``pg_try_advisory_lock`` takes
over within its poll interval. The new leader then bumps the term of the ``leader`` row:
the fencing token. Every transaction a leader commits for the cluster (a scheduling plan,
a controller round, a node timeout) first reads that row ``FOR SHARE`` (``fence``): while
it is open no new leader can bump the term, and once the term is bumped an old leader's
transaction finds a term that is not its own and rolls back.

SQLite serves one server, which is always the leader; nothing is checked.
"""

from __future__ import annotations

import secrets as _secrets

from sqlalchemy import select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from shoal.store.models import LeaderRow, SecretRow

LEADER_LOCK = 0x73686F616C0002  # "shoal" + 2 (engine.MIGRATION_LOCK is + 1)
# libpq and server-side TCP keepalives on the connections that hold the lock and carry the
# change feed: a peer that vanished without closing its socket is noticed in about 5 s.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 2, "keepalives_interval": 1, "keepalives_count": 3,
              "tcp_user_timeout": 5000, "connect_timeout": 3,
              "options": "-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3"}


class NotLeader(Exception):
    """This server does not hold the lease (or no longer does): it must not act for the cluster."""


def conninfo(engine: Engine) -> str:
    """A libpq connection string for the engine's PostgreSQL database (for psycopg directly)."""
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def connect(engine: Engine):
    """A psycopg connection outside the pool, in autocommit, with keepalives."""
    import psycopg

    return psycopg.connect(conninfo(engine), autocommit=True, **KEEPALIVES)


class SingleServer:
    """The lease of a store only one server uses (SQLite): always held, term 1."""

    shared = False

    def acquire(self, holder: str, now: float) -> int | None:
        return 1

    def confirm(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def fence(self, session: Session, term: int) -> None:
        pass


class PostgresLease:
    """An advisory lock held on a dedicated connection, and the term row it guards."""

    shared = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._conn = None

    def acquire(self, holder: str, now: float) -> int | None:
        """The new term when this server got the lock; None while another holds it.
        Connection errors propagate: the caller tries again."""
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.engine)
        conn = self._conn
        if not conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()[0]:
            return None
        try:
            with conn.transaction():
                # Waits for the old leader's fenced transactions to end; they are short.
                conn.execute("SET LOCAL lock_timeout = '10s'")
                return conn.execute(
                    "INSERT INTO leader (id, term, holder, since) VALUES (1, 1, %s, %s) "
                    "ON CONFLICT (id) DO UPDATE SET term = leader.term + 1, holder = EXCLUDED.holder, "
                    "since = EXCLUDED.since RETURNING term", (holder, now)).fetchone()[0]
        except Exception:
            self.release()
            raise

    def confirm(self) -> bool:
        """Whether the lock's connection is still alive (and so the lock still held)."""
        try:
            self._conn.execute("SELECT 1")
            return True
        except Exception:
            self.release()
            return False

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()  # ends the session: PostgreSQL releases the lock
            except Exception:
                pass

    def fence(self, session: Session, term: int) -> None:
        """Inside the caller's transaction: refuse it unless ``term`` still leads."""
        current = session.execute(text("SELECT term FROM leader WHERE id = 1 FOR SHARE")).scalar()
        if current != term:
            raise NotLeader(f"term {term} is over: term {current} leads now")


def lease_for(engine: Engine) -> SingleServer | PostgresLease:
    return PostgresLease(engine) if engine.dialect.name == "postgresql" else SingleServer()


def current_leader(session: Session) -> LeaderRow | None:
    return session.get(LeaderRow, 1)


def shared_secret(session: Session, name: str, local: bytes | None) -> bytes:
    """The store's secret ``name``: the one stored first wins (``local``, or a new one, when
    the store has none), so every server sharing the store signs with the same key."""
    row = session.scalar(select(SecretRow).where(SecretRow.name == name))
    if row is None:
        row = SecretRow(name=name, value=(local or _secrets.token_bytes(32)).hex())
        session.add(row)
        session.flush()
    return bytes.fromhex(row.value)
