"""The tables, as SQLAlchemy Core: the one description migrations are written against.

Timestamps are text (ISO 8601 UTC with milliseconds and ``Z``, as the shell writes them today) so
both databases hold the same value; KV values are the JSON text the store encoded (its size limit
is on that text). Event ids come from the one-row ``event_counter``, never from a sequence or an
autoincrement (`atrium.state.events`).
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "ix": "ix_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    }
)

#: one row (``id`` 1): the last event id given out; its row lock orders the writers
event_counter = sa.Table(
    "event_counter",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("value", sa.BigInteger, nullable=False),
    sa.CheckConstraint("id = 1", name="one_row"),
)

#: the event log: each row written in the transaction of the change it announces
events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("topic", sa.Text, nullable=False),
    #: the user the event belongs to; NULL for the platform's own
    sa.Column("owner", sa.Text, nullable=True),
    #: the payload's wire form
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("at", sa.Text, nullable=False),
)

#: the key-value store: one row per owner, namespace (``os``, ``app/<appId>``, ``global``) and key
kv = sa.Table(
    "kv",
    metadata,
    sa.Column("owner", sa.Text, primary_key=True),
    sa.Column("namespace", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
)
