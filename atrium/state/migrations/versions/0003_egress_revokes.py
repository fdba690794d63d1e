"""An app's network egress revoked by whoever may manage it (``egress_revokes``): a grant is
the install's approval of the manifest's ``network.egress``; a row here takes it back until it
is granted again or an update asking more is approved (`atrium.egress`).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "egress_revokes",
        sa.Column("app_id", sa.Text, nullable=False),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("asked", sa.JSON, nullable=False),
        sa.Column("revoked_by", sa.Text, nullable=False),
        sa.Column("revoked_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("app_id", "holder", name=op.f("pk_egress_revokes")),
    )


def downgrade() -> None:
    op.drop_table("egress_revokes")
