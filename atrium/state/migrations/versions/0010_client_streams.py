"""Host pages across shells: ``views.client`` (the host page that holds a view) and
``client_streams`` (which shells have an event stream of a host page open), so that a page's
views are released once no shell has had a stream of it for the grace, whichever shells its
stream and its views were on.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "client_streams",
        sa.Column("client", sa.Text, nullable=False),
        sa.Column("shell", sa.Text, nullable=False),
        sa.Column("since", sa.Float, nullable=True),
        sa.PrimaryKeyConstraint("client", "shell", name=op.f("pk_client_streams")),
    )
    with op.batch_alter_table("views") as batch:
        batch.add_column(sa.Column("client", sa.Text, nullable=True))
        batch.create_index(batch.f("ix_views_client"), ["client"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("views") as batch:
        batch.drop_index(batch.f("ix_views_client"))
        batch.drop_column("client")
    op.drop_table("client_streams")
