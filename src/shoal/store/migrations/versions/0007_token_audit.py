"""tokens: who created each one and when it expires (listing and revoking tokens)

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("created_by", sa.String(64), nullable=True))
        batch.add_column(sa.Column("expires", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("expires")
        batch.drop_column("created_by")
