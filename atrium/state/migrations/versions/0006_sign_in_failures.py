"""The sign-in throttle's failures in the database (``sign_in_failures``), so that every shell of
one database counts a guesser's attempts together (`atrium.users.throttle`).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sign_in_failures",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("account", sa.Text, nullable=False),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sign_in_failures")),
    )
    op.create_index(op.f("ix_sign_in_failures_at"), "sign_in_failures", ["at"])
    op.create_index("ix_sign_in_failures_pair", "sign_in_failures", ["account", "address", "at"])


def downgrade() -> None:
    op.drop_table("sign_in_failures")
