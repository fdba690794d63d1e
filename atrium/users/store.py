"""The users table and everything hung on it, in SQLite (``$ATRIUM_HOME/users.sqlite3``, 0600).

One writer thread (shared with the grants kept in the same file) makes each change one transaction (synchronous=FULL), as the KV store does. What a
request needs to know who is calling — users, the sha256 of each session cookie and personal token —
is also held in memory and changed only after its row was written, so identifying a caller never
touches the disk (the data proxy asks for every request).

Domain rules live here because they are checks on the table as a whole: the last enabled admin
cannot be disabled, demoted or deleted (`LastAdmin`).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, TypeVar

from atrium.errors import IdentityLinked, InvalidRequest, LastAdmin, NotFound, UserExists
from atrium.users.model import (
    MAX_NAME,
    USER_ID_RULE,
    Identity,
    Role,
    Session,
    SessionKind,
    Token,
    User,
    valid_user_id,
)
from atrium.users.sqlitefile import SqliteFile

T = TypeVar("T")
_LOGGER = logging.getLogger(__name__)
#: how often a session's "last seen" reaches the disk (it is kept in memory between)
LAST_SEEN_EVERY: Final = timedelta(minutes=1)

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    disabled INTEGER NOT NULL DEFAULT 0,
    password TEXT,
    created_at TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at TEXT NOT NULL,
    last_seen TEXT NOT NULL,
    address TEXT NOT NULL,
    device TEXT NOT NULL,
    link_key TEXT
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    user_id TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS identities (
    issuer TEXT NOT NULL,
    subject TEXT NOT NULL,
    user_id TEXT NOT NULL,
    email TEXT,
    linked_at TEXT NOT NULL,
    PRIMARY KEY (issuer, subject)
) WITHOUT ROWID;
"""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def secret_hash(secret: str) -> str:
    """How a session cookie or personal token is stored and looked up."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    """256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


class UserStore:
    """Users, sessions, tokens and identities: SQLite for keeps, memory for lookups."""

    def __init__(self, file: SqliteFile) -> None:
        #: the file's one connection and writer thread, which the grants share
        self.file = file
        self._conn = file.conn
        self._users: dict[str, User] = {}
        self._passwords: dict[str, str] = {}
        self._sessions: dict[str, Session] = {}  # by hash
        self._session_link: dict[str, str | None] = {}  # session id -> link key
        self._tokens: dict[str, Token] = {}  # by hash
        self._identities: dict[tuple[str, str], Identity] = {}
        self._seen_written: dict[str, datetime] = {}
        #: called with a user id when any of that user's sign-ins or tokens ends, or their role
        #: or disabled flag changes
        self.on_change: list[Callable[[str], None]] = []

    # ---- opening -------------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(cls, path: Path, *, bootstrap_admin: str) -> AsyncIterator[UserStore]:
        """Open (creating it 0600); a home without users gets ``bootstrap_admin`` as its admin,
        and a home whose bootstrap user is missing gets them back as an admin."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        async with SqliteFile.open(
            path, "the users store", _SCHEMA, thread="users", check=True
        ) as file:
            store = cls(file)
            await store._run(store._load)
            if bootstrap_admin not in store._users:
                await store.add(bootstrap_admin, bootstrap_admin, Role.ADMIN)
            try:
                yield store
            finally:
                await store._run(store._flush_seen)

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self.file.run(fn)

    def _load(self) -> None:
        c = self._conn
        for uid, name, role, disabled, password, created in c.execute(
            "SELECT id, name, role, disabled, password, created_at FROM users"
        ):
            self._users[uid] = User(uid, name, Role(role), bool(disabled), created, bool(password))
            if password:
                self._passwords[uid] = password
        for sid, hashed, uid, kind, created, seen, address, device, link in c.execute(
            "SELECT id, hash, user_id, kind, created_at, last_seen, address, device, link_key "
            "FROM sessions"
        ):
            self._sessions[hashed] = Session(
                sid, uid, SessionKind(kind), created, seen, address, device
            )
            self._session_link[sid] = link
        for tid, hashed, uid, name, created, expires in c.execute(
            "SELECT id, hash, user_id, name, created_at, expires_at FROM tokens"
        ):
            self._tokens[hashed] = Token(tid, uid, name, created, expires)
        for issuer, subject, uid, email, linked in c.execute(
            "SELECT issuer, subject, user_id, email, linked_at FROM identities"
        ):
            self._identities[(issuer, subject)] = Identity(issuer, subject, uid, email, linked)

    def _write(self, statements: Iterable[tuple[str, tuple[object, ...]]]) -> None:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            for sql, args in statements:
                c.execute(sql, args)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    async def _commit(self, *statements: tuple[str, tuple[object, ...]]) -> None:
        await self._run(lambda: self._write(statements))

    def _changed(self, user_id: str) -> None:
        for callback in self.on_change:
            callback(user_id)

    # ---- users ---------------------------------------------------------------------------

    def get(self, user_id: str) -> User | None:
        return self._users.get(user_id)

    def require(self, user_id: str) -> User:
        user = self._users.get(user_id)
        if user is None:
            raise NotFound("user", user_id)
        return user

    def all(self) -> list[User]:
        return sorted(self._users.values(), key=lambda u: u.id)

    def password_hash(self, user_id: str) -> str | None:
        return self._passwords.get(user_id)

    async def add(self, user_id: str, name: str | None, role: Role) -> User:
        if not valid_user_id(user_id):
            raise InvalidRequest(f"user id {user_id!r} is not valid: {USER_ID_RULE}", field="id")
        if user_id in self._users:
            raise UserExists(f"user {user_id!r} exists", user=user_id)
        user = User(user_id, _name(name or user_id), role, False, now())
        try:
            await self._commit(
                (
                    "INSERT INTO users (id, name, role, disabled, created_at) "
                    "VALUES (?, ?, ?, 0, ?)",
                    (user.id, user.name, user.role.value, user.created_at),
                )
            )
        except sqlite3.IntegrityError as err:  # added by another caller while this one waited
            raise UserExists(f"user {user_id!r} exists", user=user_id) from err
        self._users[user_id] = user
        return user

    async def add_linked(
        self,
        user_id: str,
        name: str | None,
        role: Role,
        identity: tuple[str, str],
        email: str | None,
    ) -> tuple[User, Identity]:
        """Add a user and link the identity (issuer, subject) to them in one transaction: a
        sign-up either makes both or neither, so a failed link never leaves a member behind."""
        if not valid_user_id(user_id):
            raise InvalidRequest(f"user id {user_id!r} is not valid: {USER_ID_RULE}", field="id")
        if user_id in self._users:
            raise UserExists(f"user {user_id!r} exists", user=user_id)
        issuer, subject = identity
        if identity in self._identities:
            raise IdentityLinked(
                "that identity is linked to another user already", issuer=issuer, subject=subject
            )
        user = User(user_id, _name(name or user_id), role, False, now())
        linked = Identity(issuer, subject, user_id, email, user.created_at)
        try:
            await self._commit(
                (
                    "INSERT INTO users (id, name, role, disabled, created_at) "
                    "VALUES (?, ?, ?, 0, ?)",
                    (user.id, user.name, user.role.value, user.created_at),
                ),
                (
                    "INSERT INTO identities VALUES (?, ?, ?, ?, ?)",
                    (issuer, subject, user_id, email, linked.linked_at),
                ),
            )
        except sqlite3.IntegrityError as err:  # another writer made the same id or link first
            raise UserExists(
                f"user {user_id!r} or that identity was made at the same moment", user=user_id
            ) from err
        self._users[user_id] = user
        self._identities[identity] = linked
        return user, linked

    async def update(
        self,
        user_id: str,
        *,
        name: str | None = None,
        role: Role | None = None,
        disabled: bool | None = None,
    ) -> User:
        """Change a user; disabling ends their sessions and tokens (kept in the table as rows
        that no longer identify anyone, so enabling does not bring them back)."""
        user = self.require(user_id)
        new = replace(
            user,
            name=user.name if name is None else _name(name),
            role=user.role if role is None else role,
            disabled=user.disabled if disabled is None else disabled,
        )
        was_admin = user.role is Role.ADMIN and not user.disabled
        if was_admin and not (new.role is Role.ADMIN and not new.disabled):
            self._check_not_last_admin(user_id)
        statements: list[tuple[str, tuple[object, ...]]] = [
            (
                "UPDATE users SET name = ?, role = ?, disabled = ? WHERE id = ?",
                (new.name, new.role.value, int(new.disabled), user_id),
            )
        ]
        if new.disabled and not user.disabled:
            statements += _end_all(user_id)
        await self._commit(*statements)
        self._users[user_id] = new
        if new.disabled and not user.disabled:
            self._forget(user_id)
        if new.disabled != user.disabled or new.role != user.role:
            self._changed(user_id)
        return new

    async def remove(self, user_id: str) -> User:
        user = self.require(user_id)
        if user.role is Role.ADMIN and not user.disabled:
            self._check_not_last_admin(user_id)
        await self._commit(
            ("DELETE FROM users WHERE id = ?", (user_id,)),
            ("DELETE FROM identities WHERE user_id = ?", (user_id,)),
            *_end_all(user_id),
        )
        del self._users[user_id]
        self._passwords.pop(user_id, None)
        self._forget(user_id)
        for key in [k for k, i in self._identities.items() if i.user_id == user_id]:
            del self._identities[key]
        self._changed(user_id)
        return user

    def _check_not_last_admin(self, user_id: str) -> None:
        others = [
            u
            for u in self._users.values()
            if u.id != user_id and u.role is Role.ADMIN and not u.disabled
        ]
        if not others:
            raise LastAdmin(
                f"{user_id!r} is the last enabled admin: make another admin first", user=user_id
            )

    async def set_password(self, user_id: str, hashed: str, *, end_sessions: bool) -> None:
        """Store a new password hash; a reset by an admin or a change ends the other sign-ins."""
        self.require(user_id)
        statements: list[tuple[str, tuple[object, ...]]] = [
            ("UPDATE users SET password = ? WHERE id = ?", (hashed, user_id))
        ]
        if end_sessions:
            statements.append(("DELETE FROM sessions WHERE user_id = ?", (user_id,)))
        await self._commit(*statements)
        self._passwords[user_id] = hashed
        self._users[user_id] = replace(self._users[user_id], has_password=True)
        if end_sessions:
            self._forget(user_id, tokens=False)
            self._changed(user_id)

    def _forget(self, user_id: str, *, tokens: bool = True) -> None:
        for key in [k for k, s in self._sessions.items() if s.user_id == user_id]:
            self._session_link.pop(self._sessions.pop(key).id, None)
        if tokens:
            for key in [k for k, t in self._tokens.items() if t.user_id == user_id]:
                del self._tokens[key]

    # ---- sessions ------------------------------------------------------------------------

    async def create_session(
        self,
        user_id: str,
        kind: SessionKind,
        *,
        address: str,
        device: str,
        link_key: str | None = None,
    ) -> tuple[str, Session]:
        """A new sign-in: the cookie's secret (returned once) and the session."""
        self.require(user_id)
        secret = new_secret()
        stamp = now()
        session = Session(new_id("ses"), user_id, kind, stamp, stamp, address[:64], device[:200])
        await self._commit(
            (
                "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session.id,
                    secret_hash(secret),
                    user_id,
                    kind.value,
                    stamp,
                    stamp,
                    session.address,
                    session.device,
                    link_key,
                ),
            )
        )
        self._sessions[secret_hash(secret)] = session
        self._session_link[session.id] = link_key
        return secret, session

    def session(self, secret: str) -> tuple[User, Session] | None:
        """The enabled user and session a cookie's secret belongs to, marking it seen."""
        session = self._sessions.get(secret_hash(secret))
        if session is None:
            return None
        user = self._users.get(session.user_id)
        if user is None or user.disabled:
            return None
        return user, session

    def seen(self, session: Session, address: str) -> None:
        """Note a request of ``session``; written at most once a minute (and at close)."""
        moment = datetime.now(UTC)
        session.last_seen = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
        session.address = address[:64]
        last = self._seen_written.get(session.id)
        if last is None or moment - last >= LAST_SEEN_EVERY:
            self._seen_written[session.id] = moment
            sid, when, where = session.id, session.last_seen, session.address
            self.file.submit(self._write_seen, sid, when, where)

    def _write_seen(self, sid: str, when: str, where: str) -> None:
        try:
            self._conn.execute(
                "UPDATE sessions SET last_seen = ?, address = ? WHERE id = ?", (when, where, sid)
            )
        except sqlite3.Error as err:  # a note of when, never worth failing a request over
            _LOGGER.warning("could not note a session's last use: %s", err)

    def _flush_seen(self) -> None:
        for session in self._sessions.values():
            if session.id in self._seen_written:
                self._write_seen(session.id, session.last_seen, session.address)

    def sessions_of(self, user_id: str) -> list[Session]:
        found = [s for s in self._sessions.values() if s.user_id == user_id]
        return sorted(found, key=lambda s: s.created_at)

    async def end_session(self, user_id: str, session_id: str) -> bool:
        for key, session in self._sessions.items():
            if session.id == session_id and session.user_id == user_id:
                await self._commit(("DELETE FROM sessions WHERE id = ?", (session_id,)))
                self._sessions.pop(key, None)
                self._session_link.pop(session_id, None)
                self._changed(user_id)
                return True
        return False

    async def end_link_sessions(self, keep: str) -> int:
        """End the login-link sessions made with a bootstrap token other than ``keep``'s key: a
        new token ends the old link's sign-ins, as it always has."""
        gone = [
            key
            for key, s in self._sessions.items()
            if s.kind is SessionKind.LINK and self._session_link.get(s.id) != keep
        ]
        if gone:
            await self._commit(*(("DELETE FROM sessions WHERE hash = ?", (key,)) for key in gone))
            for key in gone:
                self._session_link.pop(self._sessions.pop(key).id, None)
        return len(gone)

    # ---- personal tokens -----------------------------------------------------------------

    async def create_token(
        self, user_id: str, name: str, expires_in_days: int | None
    ) -> tuple[str, Token]:
        self.require(user_id)
        if not name.strip() or len(name) > MAX_NAME:
            raise InvalidRequest(f"a token's name has 1-{MAX_NAME} characters", field="name")
        secret = "atp_" + new_secret()
        stamp = now()
        expires = None
        if expires_in_days is not None:
            moment = datetime.now(UTC) + timedelta(days=expires_in_days)
            expires = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
        token = Token(new_id("tok"), user_id, name.strip(), stamp, expires)
        await self._commit(
            (
                "INSERT INTO tokens VALUES (?, ?, ?, ?, ?, ?)",
                (token.id, secret_hash(secret), user_id, token.name, stamp, expires),
            )
        )
        self._tokens[secret_hash(secret)] = token
        return secret, token

    def token(self, secret: str) -> tuple[User, Token] | None:
        """The enabled user a personal token belongs to, if it has not expired."""
        token = self._tokens.get(secret_hash(secret))
        if token is None:
            return None
        if token.expires_at is not None and token.expires_at <= now():
            return None
        user = self._users.get(token.user_id)
        if user is None or user.disabled:
            return None
        return user, token

    def has_session(self, user_id: str, session_id: str) -> bool:
        return any(s.id == session_id and s.user_id == user_id for s in self._sessions.values())

    def has_token(self, user_id: str, token_id: str) -> bool:
        return any(t.id == token_id and t.user_id == user_id for t in self._tokens.values())

    def tokens_of(self, user_id: str) -> list[Token]:
        found = [t for t in self._tokens.values() if t.user_id == user_id]
        return sorted(found, key=lambda t: t.created_at)

    async def delete_token(self, user_id: str, token_id: str) -> bool:
        for key, token in self._tokens.items():
            if token.id == token_id and token.user_id == user_id:
                await self._commit(("DELETE FROM tokens WHERE id = ?", (token_id,)))
                self._tokens.pop(key, None)
                self._changed(user_id)
                return True
        return False

    # ---- OIDC identities -----------------------------------------------------------------

    def identity(self, issuer: str, subject: str) -> Identity | None:
        return self._identities.get((issuer, subject))

    def identities_of(self, user_id: str) -> list[Identity]:
        return [i for i in self._identities.values() if i.user_id == user_id]

    async def link(self, issuer: str, subject: str, user_id: str, email: str | None) -> Identity:
        self.require(user_id)
        existing = self._identities.get((issuer, subject))
        if existing is not None and existing.user_id != user_id:
            raise IdentityLinked(
                "that identity is linked to another user already", issuer=issuer, subject=subject
            )
        identity = Identity(issuer, subject, user_id, email, now())
        await self._commit(
            (
                "INSERT OR REPLACE INTO identities VALUES (?, ?, ?, ?, ?)",
                (issuer, subject, user_id, email, identity.linked_at),
            )
        )
        self._identities[(issuer, subject)] = identity
        return identity

    async def unlink(self, issuer: str, subject: str, user_id: str) -> bool:
        """Remove ``user_id``'s link to the identity; False when they have no such link."""
        existing = self._identities.get((issuer, subject))
        if existing is None or existing.user_id != user_id:
            return False
        await self._commit(
            ("DELETE FROM identities WHERE issuer = ? AND subject = ?", (issuer, subject))
        )
        self._identities.pop((issuer, subject), None)
        return True


def _name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_NAME or any(ord(ch) < 32 for ch in name):
        raise InvalidRequest(f"a display name has 1-{MAX_NAME} printable characters", field="name")
    return name


def _end_all(user_id: str) -> list[tuple[str, tuple[object, ...]]]:
    return [
        ("DELETE FROM sessions WHERE user_id = ?", (user_id,)),
        ("DELETE FROM tokens WHERE user_id = ?", (user_id,)),
    ]
