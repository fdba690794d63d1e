"""The bootstrap admin's token shared by the shells of one database (``bootstrap_tokens``: its
sha256 and link key, never the token; `atrium.users.bootstrap`).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bootstrap_tokens",
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("hash", sa.Text, nullable=False),
        sa.Column("link_key", sa.Text, nullable=False),
        sa.Column("set_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_bootstrap_tokens")),
    )


def downgrade() -> None:
    op.drop_table("bootstrap_tokens")
