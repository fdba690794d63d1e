"""The key of the database (``state_key``, one row, random at this upgrade): what names the
things its shells share outside it, the data claims of a Kubernetes namespace
(`atrium.state.key`). And ``instances.used_at``: when another shell last sent the instance a
data request (a headless provider serves every shell's, and its idle time counts them all).

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
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("used_at", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("used_at")
    op.drop_table("state_key")
