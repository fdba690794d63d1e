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

#: accounts; ``password`` is the scrypt string (None: no password sign-in)
users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("disabled", sa.Boolean, nullable=False),
    sa.Column("password", sa.Text, nullable=True),
    sa.Column("created_at", sa.Text, nullable=False),
)

#: sign-ins of the host page; ``hash`` is the sha256 of the cookie's secret
sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("hash", sa.Text, nullable=False, unique=True),
    sa.Column("user_id", sa.Text, nullable=False, index=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("last_seen", sa.Text, nullable=False),
    sa.Column("address", sa.Text, nullable=False),
    sa.Column("device", sa.Text, nullable=False),
    #: the bootstrap token's link key a login-link session was made with
    sa.Column("link_key", sa.Text, nullable=True),
)

#: personal API tokens; ``hash`` is the sha256 of the secret
tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("hash", sa.Text, nullable=False, unique=True),
    sa.Column("user_id", sa.Text, nullable=False, index=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("expires_at", sa.Text, nullable=True),
)

#: OIDC identities linked to users, by (issuer, subject)
identities = sa.Table(
    "identities",
    metadata,
    sa.Column("issuer", sa.Text, primary_key=True),
    sa.Column("subject", sa.Text, primary_key=True),
    sa.Column("user_id", sa.Text, nullable=False, index=True),
    sa.Column("email", sa.Text, nullable=True),
    sa.Column("linked_at", sa.Text, nullable=False),
)

#: one user's role on one instance of another's; ``seq`` keeps the order they were made in
grants = sa.Table(
    "grants",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("instance_id", sa.Text, nullable=False),
    sa.Column("app_id", sa.Text, nullable=False),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.UniqueConstraint("owner", "instance_id", "user_id"),
)

#: failed (or not yet verified) password sign-ins of the last window, one row each, shared by every
#: shell of the database (`atrium.users.throttle`); ``account`` is the sha256 of the name as typed,
#: ``at`` the Unix time of the attempt
sign_in_failures = sa.Table(
    "sign_in_failures",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("account", sa.Text, nullable=False),
    sa.Column("address", sa.Text, nullable=False),
    sa.Column("at", sa.Float, nullable=False, index=True),
    sa.Index("ix_sign_in_failures_pair", "account", "address", "at"),
)

#: the bootstrap admin's token shared by every shell of a PostgreSQL database
#: (`atrium.users.bootstrap`): its sha256 and its link key, never the token
bootstrap_tokens = sa.Table(
    "bootstrap_tokens",
    metadata,
    sa.Column("user_id", sa.Text, primary_key=True),
    sa.Column("hash", sa.Text, nullable=False),
    sa.Column("link_key", sa.Text, nullable=False),
    sa.Column("set_at", sa.Text, nullable=False),
)

#: the audit log (append-only: a trigger refuses UPDATE; pruning deletes)
audit = sa.Table(
    "audit",
    metadata,
    sa.Column(
        "seq",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("time", sa.Text, nullable=False, index=True),
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("address", sa.Text, nullable=False),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Index(None, "actor", "seq"),
)

#: the files of a home a shell copied into this database (their path), in the copy's transaction
carried_over = sa.Table(
    "carried_over",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("at", sa.Text, nullable=False),
)

#: an app's network egress revoked: ``holder`` is "" for a shared copy (system, global), the
#: user's id for a user scope's; ``asked`` is what the app asked when it was revoked (an update
#: asking more is approved anew and granted; `atrium.egress`)
egress_revokes = sa.Table(
    "egress_revokes",
    metadata,
    sa.Column("app_id", sa.Text, primary_key=True),
    sa.Column("holder", sa.Text, primary_key=True),
    sa.Column("asked", sa.JSON, nullable=False),
    sa.Column("revoked_by", sa.Text, nullable=False),
    sa.Column("revoked_at", sa.Text, nullable=False),
)

#: the live instances of every shell, for the app origins of the others (`atrium.state.instances`):
#: ``address`` is the server's ``host:port``, ``network`` the instance's (docs/api.md "Network";
#: only a ``cluster`` one is reachable from every shell, and only its row carries the ``secret``
#: the shell's requests to it need); ``shell`` names the shell that runs it
instances = sa.Table(
    "instances",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("app_id", sa.Text, nullable=False),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("slug", sa.Text, nullable=False, unique=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("runner", sa.Text, nullable=False),
    sa.Column("ref", sa.JSON, nullable=True),
    sa.Column("network", sa.Text, nullable=True),
    sa.Column("address", sa.Text, nullable=True),
    sa.Column("secret", sa.Text, nullable=True),
    sa.Column("shell", sa.Text, nullable=False, index=True),
    sa.Column("updated_at", sa.Text, nullable=False),
    #: when another shell last sent it a data request (a headless provider's idle time counts
    #: every shell's requests: `atrium.lifecycle.headless`); None: never
    sa.Column("used_at", sa.Text, nullable=True),
)

#: the open views of those instances, by the instance's ``slug`` (never reused, unlike an id);
#: ``hash`` is the sha256 of the view cookie
views = sa.Table(
    "views",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("slug", sa.Text, nullable=False, index=True),
    sa.Column("hash", sa.Text, nullable=False, unique=True),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    #: the host page (its client id) that holds the view; None: a client of the API
    sa.Column("client", sa.Text, nullable=True, index=True),
)

#: which shells have an event stream of a host page (``client``) open: ``since`` None while
#: ``shell`` has one, else when its last one there ended (the database's clock, Unix seconds).
#: A host page's views are released once no living shell has had a stream of it for the grace
#: (`atrium.lifecycle.presence`)
client_streams = sa.Table(
    "client_streams",
    metadata,
    sa.Column("client", sa.Text, primary_key=True),
    sa.Column("shell", sa.Text, primary_key=True),
    sa.Column("since", sa.Float, nullable=True),
)

#: which operation (install, update, backup, …) holds an app's operation lock among the shells
#: (`atrium.state.locks.Coordination.operation`), written by each holder so that a shell refused
#: the lock can name it; the advisory lock, not this row, is the lock (a row outlives its holder)
app_operations = sa.Table(
    "app_operations",
    metadata,
    sa.Column("app_id", sa.Text, primary_key=True),
    sa.Column("operation", sa.Text, nullable=False),
    sa.Column("shell", sa.Text, nullable=False),
)

#: one-time view tickets not yet redeemed; ``hash`` is the sha256 of the ticket, ``expires_at``
#: the Unix time it ends
view_tickets = sa.Table(
    "view_tickets",
    metadata,
    sa.Column("hash", sa.Text, primary_key=True),
    sa.Column("slug", sa.Text, nullable=False, index=True),
    sa.Column("view_id", sa.Text, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)

#: an action (``stop``, ``destroy``, ``delete``, ``activity``, …; ``body`` what it needs) asked
#: on one shell of an instance another shell runs in a pod (`atrium.lifecycle.asked`): ``shell``
#: is the one asked, ``state`` goes
#: ``asked`` → ``taken`` → ``done`` or ``failed`` (``answer``: what the answer says), or
#: ``asked`` → ``withdrawn`` when nobody took it in time
instance_requests = sa.Table(
    "instance_requests",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("instance_id", sa.Text, nullable=False),
    sa.Column("slug", sa.Text, nullable=False),
    sa.Column("shell", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("body", sa.JSON, nullable=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("answer", sa.JSON, nullable=True),
    sa.Column("asked_at", sa.Float, nullable=False, index=True),
)

#: the app tokens of the running instances (`atrium.state.apptokens`): ``hash`` is the sha256 of
#: the token; ``shell`` the shell that holds the instance (a takeover writes its own)
app_tokens = sa.Table(
    "app_tokens",
    metadata,
    sa.Column("hash", sa.Text, primary_key=True),
    sa.Column("instance_id", sa.Text, nullable=False),
    sa.Column("app_id", sa.Text, nullable=False),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("shell", sa.Text, nullable=False, index=True),
    sa.Column("issued_at", sa.Text, nullable=False),
)

#: one row (``id`` 1): the database's key, random when its migration ran; the shells of one
#: database label with it what they share outside it (`atrium.state.key`)
state_key = sa.Table(
    "state_key",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("key", sa.Text, nullable=False),
    sa.CheckConstraint("id = 1", name="one_row"),
)
