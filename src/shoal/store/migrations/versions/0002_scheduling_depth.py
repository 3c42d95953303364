"""scheduling depth: planned starts, preemption, reservations

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("expected_start", sa.Float(), nullable=True))
        batch.add_column(sa.Column("preempted_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("preemptor_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("reservation", sa.String(length=64), nullable=True))
    op.create_table(
        "reservations",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("start_time", sa.Float(), nullable=False),
        sa.Column("end_time", sa.Float(), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("users", sa.JSON(), nullable=False),
        sa.Column("accounts", sa.JSON(), nullable=False),
        sa.Column("flags", sa.JSON(), nullable=False),
        sa.Column("partition", sa.String(length=64), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("reservations")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("reservation")
        batch.drop_column("preemptor_id")
        batch.drop_column("preempted_at")
        batch.drop_column("expected_start")
