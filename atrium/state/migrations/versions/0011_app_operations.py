"""``app_operations``: which operation holds an app's operation lock among the shells, so that a
shell refused that lock (an advisory lock) names the operation in its ``busy`` answer.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "app_operations",
        sa.Column("app_id", sa.Text, nullable=False),
        sa.Column("operation", sa.Text, nullable=False),
        sa.Column("shell", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("app_id", name=op.f("pk_app_operations")),
    )


def downgrade() -> None:
    op.drop_table("app_operations")
