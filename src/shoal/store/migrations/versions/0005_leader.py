"""leader: the term (fencing token) of the servers' elected leader; secrets shared by the servers

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("term", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
    )
    op.create_table(
        "secrets",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("secrets")
    op.drop_table("leader")
