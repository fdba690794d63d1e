"""The event log (with its one-row id counter) and the key-value store.

Written by hand. The counter starts at the clock in microseconds, as the in-memory bus numbers its
events: ids stay increasing across the move from the bus to this table, so a client holding an id
from before resumes instead of waiting for the counter to catch up.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    counter = op.create_table(
        "event_counter",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.BigInteger, nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_event_counter_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event_counter")),
    )
    op.bulk_insert(counter, [{"id": 1, "value": int(time.time() * 1000) * 1000}])
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger, autoincrement=False, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("owner", sa.Text, nullable=True),
        sa.Column("data", sa.JSON, nullable=False),
        sa.Column("at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_table(
        "kv",
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("namespace", sa.Text, nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("owner", "namespace", "key", name=op.f("pk_kv")),
    )


def downgrade() -> None:
    op.drop_table("kv")
    op.drop_table("events")
    op.drop_table("event_counter")
