"""jobs: the run a silent node took with it (so the node, when back, can say how it really
ended) and the administrator's comment, where corrections of such runs are written

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("lost_run", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("admin_comment", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("admin_comment")
        batch.drop_column("lost_run")
