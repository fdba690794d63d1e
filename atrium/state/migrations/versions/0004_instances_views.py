"""Instances, their views and the views' one-time tickets in the database, so that any shell
serves any app origin (``instances``: where each instance runs and which shell runs it;
``views`` and ``view_tickets``: the sha256 of each view cookie and ticket, never the secrets).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instances",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("app_id", sa.Text, nullable=False),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("slug", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("runner", sa.Text, nullable=False),
        sa.Column("ref", sa.JSON, nullable=True),
        sa.Column("network", sa.Text, nullable=True),
        sa.Column("address", sa.Text, nullable=True),
        sa.Column("secret", sa.Text, nullable=True),
        sa.Column("shell", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
        sa.UniqueConstraint("slug", name=op.f("uq_instances_slug")),
    )
    op.create_index(op.f("ix_instances_shell"), "instances", ["shell"])
    op.create_table(
        "views",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("slug", sa.Text, nullable=False),
        sa.Column("hash", sa.Text, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_views")),
        sa.UniqueConstraint("hash", name=op.f("uq_views_hash")),
    )
    op.create_index(op.f("ix_views_slug"), "views", ["slug"])
    op.create_table(
        "view_tickets",
        sa.Column("hash", sa.Text, nullable=False),
        sa.Column("slug", sa.Text, nullable=False),
        sa.Column("view_id", sa.Text, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_view_tickets")),
    )
    op.create_index(op.f("ix_view_tickets_slug"), "view_tickets", ["slug"])


def downgrade() -> None:
    op.drop_table("view_tickets")
    op.drop_table("views")
    op.drop_table("instances")
