"""The app tokens of the running instances (``app_tokens``: the sha256 of each, never the token,
with the instance, its app and owner, and the shell that holds it), so that a pod's calls are
its app's on every shell of the database (`atrium.state.apptokens`).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "app_tokens",
        sa.Column("hash", sa.Text, nullable=False),
        sa.Column("instance_id", sa.Text, nullable=False),
        sa.Column("app_id", sa.Text, nullable=False),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("shell", sa.Text, nullable=False),
        sa.Column("issued_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_app_tokens")),
    )
    op.create_index(op.f("ix_app_tokens_shell"), "app_tokens", ["shell"])


def downgrade() -> None:
    op.drop_table("app_tokens")
