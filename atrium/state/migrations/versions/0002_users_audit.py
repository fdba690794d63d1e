"""Users, sign-ins (sessions), personal tokens, linked identities, grants and the audit log, which
were SQLite files of one home (``users.sqlite3``, ``audit.sqlite3``), and ``carried_over``: which
of those files a shell has copied in (`atrium.users.carry`).

Written by hand. Secrets are stored as their sha256 (``hash``) and passwords as their scrypt
string, as in the files. ``disabled`` is written by the store on every insert: no server default
(a Boolean default is spelled differently on the two databases). The audit table is append-only:
a trigger refuses an UPDATE on both databases (pruning deletes).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: the audit row id: BIGSERIAL on PostgreSQL, the rowid on SQLite (an INTEGER PRIMARY KEY)
_AUDIT_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

_PG_NO_UPDATE = """
CREATE FUNCTION audit_no_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$;
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
FOR EACH ROW EXECUTE FUNCTION audit_no_update();
"""
_SQLITE_NO_UPDATE = """
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END
"""


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("disabled", sa.Boolean, nullable=False),
        sa.Column("password", sa.Text, nullable=True),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("hash", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("last_seen", sa.Text, nullable=False),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("device", sa.Text, nullable=False),
        sa.Column("link_key", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
        sa.UniqueConstraint("hash", name=op.f("uq_sessions_hash")),
    )
    op.create_index(op.f("ix_sessions_user_id"), "sessions", ["user_id"])
    op.create_table(
        "tokens",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("hash", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("expires_at", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("hash", name=op.f("uq_tokens_hash")),
    )
    op.create_index(op.f("ix_tokens_user_id"), "tokens", ["user_id"])
    op.create_table(
        "identities",
        sa.Column("issuer", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("email", sa.Text, nullable=True),
        sa.Column("linked_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("issuer", "subject", name=op.f("pk_identities")),
    )
    op.create_index(op.f("ix_identities_user_id"), "identities", ["user_id"])
    op.create_table(
        "grants",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("instance_id", sa.Text, nullable=False),
        sa.Column("app_id", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_grants")),
        sa.UniqueConstraint("owner", "instance_id", "user_id", name=op.f("uq_grants_owner")),
    )
    op.create_table(
        "audit",
        sa.Column("seq", _AUDIT_ID, autoincrement=True, nullable=False),
        sa.Column("time", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit")),
    )
    op.create_index(op.f("ix_audit_time"), "audit", ["time"])
    op.create_index(op.f("ix_audit_actor"), "audit", ["actor", "seq"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_NO_UPDATE)
    else:
        op.execute(_SQLITE_NO_UPDATE)
    op.create_table(
        "carried_over",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_carried_over")),
    )


def downgrade() -> None:
    op.drop_table("carried_over")
    op.drop_table("audit")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION audit_no_update()")
    op.drop_table("grants")
    op.drop_table("identities")
    op.drop_table("tokens")
    op.drop_table("sessions")
    op.drop_table("users")
