"""Persistence: SQLAlchemy models, Alembic migrations, and the engine set-up for SQLite and PostgreSQL."""
