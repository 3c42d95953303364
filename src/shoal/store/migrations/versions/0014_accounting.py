"""accounting: accounts, users and QOS as sacctmgr changed them, over the cluster file's

Revision ID: 0014
Revises: 0013
"""
import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounting",
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("updated", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("accounting")
