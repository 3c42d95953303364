"""partitions: what scontrol update PartitionName= changed, over the cluster file's partitions

Revision ID: 0011
Revises: 0010
"""
import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "partitions",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("changes", sa.JSON(), nullable=False),
        sa.Column("updated", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("partitions")
