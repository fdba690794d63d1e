"""The key of the database (``state_key``, one row, random at this upgrade): what names the
things its shells share outside it, the data claims of a Kubernetes namespace
(`atrium.state.key`).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "state_key",
        sa.Column("id", sa.Integer, autoincrement=False, nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_state_key_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_state_key")),
    )
    op.bulk_insert(table, [{"id": 1, "key": secrets.token_hex(16)}])


def downgrade() -> None:
    op.drop_table("state_key")
