"""Engine set-up and schema migration for the embedded SQLite default and PostgreSQL."""

from __future__ import annotations

import os

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = os.path.join(os.path.dirname(__file__), "migrations")
MIGRATION_LOCK = 0x73686F616C0001  # PostgreSQL advisory lock keys: "shoal" + 1 migrations, + 2 leader


def make_engine(url: str) -> Engine:
    """Create the engine. SQLite gets WAL and a busy timeout so API threads and the scheduler share it."""
    if url.startswith("sqlite"):
        # A pool as large as the API's thread pool: past it, every request opened (and set up) a
        # connection. An in-memory database has one connection of its own (SQLAlchemy's choice).
        in_memory = url in ("sqlite://", "sqlite:///:memory:") or "mode=memory" in url
        pool = {} if in_memory else {"pool_size": 16, "max_overflow": 48}
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **pool)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk before the API acknowledges it (a job survives a crash).
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # As many connections as the fast path's worker threads (``server/fastpath.py``, 40), which
    # make most requests: two servers (HA) then hold at most 2 x (40 + the leader's lock and the
    # change feed's two) = 86 of PostgreSQL's default max_connections of 100.
    return create_engine(url, pool_pre_ping=True, pool_size=16, max_overflow=24)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # Servers sharing the database start together: one migrates, the others wait and
            # then find the schema at head (PostgreSQL's DDL is transactional).
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
