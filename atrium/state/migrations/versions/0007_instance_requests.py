"""An action asked of another shell's instance (``instance_requests``): the shell a request
reached writes it, the shell that runs the instance takes it (``asked`` → ``taken``, once) and
writes its answer (``done`` or ``failed``); one that nobody took in time is ``withdrawn`` by the
asker, so that it is never done after its caller was told it was not.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instance_requests",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("instance_id", sa.Text, nullable=False),
        sa.Column("slug", sa.Text, nullable=False),
        sa.Column("shell", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("body", sa.JSON, nullable=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("answer", sa.JSON, nullable=True),
        sa.Column("asked_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_requests")),
    )
    op.create_index(op.f("ix_instance_requests_asked_at"), "instance_requests", ["asked_at"])


def downgrade() -> None:
    op.drop_table("instance_requests")
