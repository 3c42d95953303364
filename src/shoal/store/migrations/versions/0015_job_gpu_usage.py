"""job_gpu_usage: what each run of a job did with its GPUs on each node (sacct's gres/gpuutil,
gres/gpumem and energy), folded from the agents' heartbeats

Revision ID: 0015
Revises: 0014
"""
import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_gpu_usage",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("run", sa.Integer(), primary_key=True),
        sa.Column("node", sa.String(64), primary_key=True),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("busy_s", sa.Float(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("job_gpu_usage")
