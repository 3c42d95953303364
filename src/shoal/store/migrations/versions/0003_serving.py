"""serving: Kubernetes-style objects and events, pods as jobs, node taints

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("kind", sa.String(length=8), nullable=False, server_default="batch"))
        batch.add_column(sa.Column("namespace", sa.String(length=63), nullable=True))
        batch.add_column(sa.Column("owner_uid", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("pod_status", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("deleting_at", sa.Float(), nullable=True))
        batch.create_index("ix_jobs_kind", ["kind"])
        batch.create_index("ix_jobs_owner_uid", ["owner_uid"])
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("taints", sa.JSON(), nullable=False, server_default="[]"))
    op.create_table(
        "objects",
        sa.Column("uid", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("status", sa.JSON(), nullable=False),
        sa.Column("owner_uid", sa.String(length=40), nullable=True),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("uid"),
        sa.UniqueConstraint("kind", "namespace", "name"),
    )
    op.create_index("ix_objects_kind", "objects", ["kind"])
    op.create_index("ix_objects_owner_uid", "objects", ["owner_uid"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_time", sa.Float(), nullable=False),
        sa.Column("last_time", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_events_namespace", "events", ["namespace"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("objects")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("taints")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_owner_uid")
        batch.drop_index("ix_jobs_kind")
        for col in ("deleting_at", "pod_status", "owner_uid", "namespace", "kind"):
            batch.drop_column(col)
