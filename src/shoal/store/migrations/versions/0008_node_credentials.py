"""nodes: the generation of each node's credential (revoking it bumps this), and whether the
node's agent serves HTTPS with a certificate from the cluster CA

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("credential_gen", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("tls", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("tls")
        batch.drop_column("credential_gen")
