"""Alembic environment: run against the connection the server hands over (or a URL for the CLI)."""

from alembic import context
from sqlalchemy import create_engine

from shoal.store.models import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    conn = config.attributes.get("connection")
    if conn is None:
        engine = create_engine(config.get_main_option("sqlalchemy.url"))
        with engine.begin() as conn:
            _configure_and_run(conn)
    else:
        _configure_and_run(conn)


def _configure_and_run(conn) -> None:
    context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run()
