"""Users and everything hung on them, in the state database (`atrium.state.schema`): on SQLite
in the home for one shell, on PostgreSQL shared by several.

Every change is one transaction that also appends a `UserChanged` event naming the user, so the
event exists if and only if the change committed. What a request needs to know who is calling —
users, the sha256 of each session cookie and personal token — is held in memory and changed only
after its row committed; identifying a caller whose credential is remembered touches no database
(the data proxy asks for every request).

Several shells on one database: a cookie or token this shell does not remember is looked up once
in the database and then remembered (`find_session`, `find_token`); a secret the database does
not hold is remembered as unknown, which is safe for ever since a secret is only handed out after
its row committed. A change made by another shell reaches this one as its `UserChanged` event
(`heard`): that user's sign-ins and tokens are forgotten at once (the next request with one reads
the database) and the user is read again, after which the `on_change` callbacks run as for a
change made here.

Domain rules live here because they are checks on the table as a whole: the last enabled admin
cannot be disabled, demoted or deleted (`LastAdmin`), checked inside the transaction with the
enabled admins' rows locked (in id order), so two shells cannot each remove one of the last two.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from atrium.errors import IdentityLinked, InvalidRequest, LastAdmin, NotFound, UserExists
from atrium.events import GRANT_ADDED, GRANT_REVOKED, USER_CHANGED, Payload, UserChanged
from atrium.state import events
from atrium.state.schema import egress_revokes, grants, identities, sessions, tokens, users
from atrium.state.schema import events as event_rows
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

if TYPE_CHECKING:
    from atrium.bus import Event
    from atrium.state.database import Database

_LOGGER = logging.getLogger(__name__)
#: how often a session's "last seen" reaches the database (it is kept in memory between)
LAST_SEEN_EVERY: Final = timedelta(minutes=1)
#: what a personal token starts with: a bearer token without it (the bootstrap token, an app's)
#: is never looked up in the database
TOKEN_PREFIX: Final = "atp_"  # noqa: S105 - a prefix, not a secret
#: the form of every secret `new_secret` makes: anything else is not looked up either
_SECRET: Final = re.compile(r"[A-Za-z0-9_-]{43}")
#: how many secrets the database does not hold are remembered (an attacker's guesses each cost
#: one lookup; a browser's ended cookie costs one, then none)
UNKNOWN_KEPT: Final = 10_000


class Bus(Protocol):
    """What the store needs of the event bus (`atrium.bus.EventBus`)."""

    def listen(
        self,
        globs: tuple[str, ...] | None,
        listener: Callable[[Event], object],
        *,
        others: bool = False,
    ) -> Callable[[], None]: ...

    @property
    def on_fell_behind(self) -> list[Callable[[], None]]: ...


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


@dataclass(frozen=True, slots=True)
class _Kept:
    """One user's rows, as read from the database."""

    user: User | None
    password: str | None
    sessions: dict[str, tuple[Session, str | None]]  # by hash: the session and its link key
    tokens: dict[str, Token]  # by hash
    identities: list[Identity]


class UserStore:
    """Users, sessions, tokens and identities: the state database for keeps, memory for lookups."""

    def __init__(self, db: Database, bus: Bus | None = None) -> None:
        self._db = db
        self._bus = bus
        self._users: dict[str, User] = {}
        self._passwords: dict[str, str] = {}
        self._sessions: dict[str, Session] = {}  # by hash
        self._session_link: dict[str, str | None] = {}  # session id -> link key
        self._tokens: dict[str, Token] = {}  # by hash
        self._identities: dict[tuple[str, str], Identity] = {}
        self._seen_written: dict[str, datetime] = {}
        #: when each session's use was last noted (monotonic seconds: the write's fence)
        self._seen_at: dict[str, float] = {}
        #: hashes the database did not hold when asked (see the module's docstring)
        self._unknown: OrderedDict[str, None] = OrderedDict()
        #: the ids of the events this store appended (its own are not read back)
        self._own: deque[int] = deque(maxlen=1024)
        self._telling = False
        #: the changes made here or heard from other shells, numbered, with the user of each: a
        #: lookup that spans one of its user's is made again (it may have read a row the change
        #: removed)
        self._changes = 0
        self._recent: deque[tuple[int, str]] = deque(maxlen=4096)
        self._reading = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        #: the id of the last event a `change` committed, read right after its ``async with``
        #: (nothing is awaited between): the grants order their reads after it
        self.last_committed = 0
        #: called with a user id when another shell changed that user (before `on_change`,
        #: which follows once the user was read again)
        self.on_heard: list[Callable[[str], None]] = []
        #: called with a user id when the account this shell knew under it ended elsewhere:
        #: another shell removed or disabled it (heard, before `on_heard`), or a read found
        #: another account under the id (made since). What this shell ran for the id was the
        #: old account's, whatever the user reads as now.
        self.on_ended: list[Callable[[str], None]] = []
        #: called with a user id when any of that user's sign-ins or tokens ends, or their role
        #: or disabled flag changes (here, or on another shell of the same database)
        self.on_change: list[Callable[[str], None]] = []

    # ---- opening -------------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls, db: Database, *, bootstrap_admin: str, bus: Bus | None = None
    ) -> AsyncIterator[UserStore]:
        """Read the tables; a database without ``bootstrap_admin`` gets them as an admin (a new
        home, or one whose bootstrap user is missing). With a ``bus``, other shells' changes
        are heard (`heard`)."""
        store = cls(db, bus)
        await store._load()
        if bootstrap_admin not in store._users:
            try:
                await store.add(bootstrap_admin, bootstrap_admin, Role.ADMIN)
            except UserExists:  # another shell of the same database made them at this moment
                await store._reread(bootstrap_admin)
        stop = bus.listen((USER_CHANGED,), store.heard, others=True) if bus is not None else None
        if bus is not None:
            bus.on_fell_behind.append(store.fell_behind)
        try:
            yield store
        finally:
            if stop is not None:
                stop()
            if bus is not None:
                bus.on_fell_behind.remove(store.fell_behind)
            for task in list(store._tasks):
                task.cancel()
            await asyncio.gather(*store._tasks, return_exceptions=True)
            await store._flush_seen()

    async def _load(self) -> None:
        async with self._db.connect() as conn:
            for row in await conn.execute(sa.select(users)):
                self._users[row.id] = _user(row)
                if row.password:
                    self._passwords[row.id] = row.password
            for row in await conn.execute(sa.select(sessions)):
                self._sessions[row.hash] = _session(row)
                self._session_link[row.id] = row.link_key
            for row in await conn.execute(sa.select(tokens)):
                self._tokens[row.hash] = _token(row)
            for row in await conn.execute(sa.select(identities)):
                self._identities[(row.issuer, row.subject)] = _identity(row)

    @asynccontextmanager
    async def change(self, *user_ids: str, ended: bool = False) -> AsyncIterator[AsyncConnection]:
        """A write transaction that announces, in the same commit, a change of each of
        ``user_ids`` (the grants use it too: what a grantee may reach changed); ``ended``: it
        removes or disables them (`UserChanged.ended`)."""
        payloads = [UserChanged(u, ended, owner=u) for u in dict.fromkeys(user_ids)]
        async with self._db.transaction() as tx:
            yield tx
            stored = [
                (await events.append(tx, USER_CHANGED, p.user_id, p.wire()), p) for p in payloads
            ]
            # known before the commit: the bus's reader may meet the rows before `committed`
            self._own.extend(e.id for e, _ in stored)
        if stored:
            self.last_committed = stored[-1][0].id
        for payload in payloads:
            self._count_change(payload.user_id)
        self._committed(stored)

    def _committed(self, stored: Sequence[tuple[events.StoredEvent, Payload]]) -> None:
        committed = getattr(self._bus, "committed", None)  # the bus's side of the event table
        if committed is not None and stored:
            self._telling = True  # what the listeners hear now is this store's own
            try:
                committed(stored)
            finally:
                self._telling = False

    def _count_change(self, user_id: str) -> None:
        self._changes += 1
        self._recent.append((self._changes, user_id))

    def _changed_since(self, before: int, user_id: str) -> bool:
        """Whether a change of ``user_id`` was made or heard after change number ``before``
        (True too when too many were to tell)."""
        if self._changes == before:
            return False
        if not self._recent or self._recent[0][0] > before + 1:
            return True
        return any(n > before and uid == user_id for n, uid in self._recent)

    def _changed(self, user_id: str) -> None:
        for callback in self.on_change:
            try:
                callback(user_id)
            except Exception:  # one listener's bug must not undo a committed change's others
                _LOGGER.exception("a user-change listener failed for %r", user_id)

    def _ended(self, user_id: str) -> None:
        for callback in self.on_ended:
            try:
                callback(user_id)
            except Exception:
                _LOGGER.exception("an account-ended listener failed for %r", user_id)

    # ---- other shells' changes -----------------------------------------------------------

    def heard(self, event: Event) -> None:
        """A `UserChanged` on the bus: another shell's (this store's own are skipped) makes this
        one forget the user's sign-ins and tokens now and read the user again."""
        if self._telling or event.id in self._own:
            return
        user_id = event.payload.get("userId")
        if not isinstance(user_id, str):
            return
        self._count_change(user_id)
        self._forget(user_id)
        if event.payload.get("ended") is True:
            self._ended(user_id)
        for callback in self.on_heard:
            callback(user_id)
        task = asyncio.get_running_loop().create_task(
            self._reread_then_tell(user_id), name=f"user {user_id} changed"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def fell_behind(self) -> None:
        """The bus's reader found rows gone before it read them: a `UserChanged` among them was
        never heard, so nothing remembered of any user can be trusted. Every sign-in and token is
        forgotten now (the next request with one reads the database), every user read again, and
        the `on_heard` (their grants read again) and `on_change` callbacks run for each (a stream
        of a user disabled meanwhile ends)."""
        self._changes += 1
        self._recent.clear()  # a lookup under way reads again (`_changed_since`)
        self._sessions.clear()
        self._session_link.clear()
        self._seen_written.clear()
        self._tokens.clear()
        task = asyncio.get_running_loop().create_task(self._reload(), name="users read again")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reload(self) -> None:
        try:
            async with self._reading:
                known = dict(self._users)
                before = set(known)
                start = self._changes
                fresh = UserStore(self._db)
                await fresh._load()
                # a user changed during the read (here or heard; one added here too) may have
                # rows it predates: read again below
                named = before | set(self._users) | set(fresh._users) | {u for _, u in self._recent}
                stale = {u for u in named if self._changed_since(start, u)}
                self._users, self._passwords = fresh._users, fresh._passwords
                self._identities = fresh._identities
                for hashed, session in fresh._sessions.items():
                    if session.user_id not in stale:
                        self._sessions.setdefault(hashed, session)
                        self._session_link[session.id] = fresh._session_link.get(session.id)
                for hashed, token in fresh._tokens.items():
                    if token.user_id not in stale:
                        self._tokens.setdefault(hashed, token)
            for user_id in sorted(stale):
                await self._reread(user_id)
        except SQLAlchemyError as err:  # what stays forgotten is read on use
            _LOGGER.warning("could not read the users again: %s", err)
            return
        # the rows of a removal were among those gone: an id that reads as another account
        # now (made again since, at another second) was the old one's here
        for user_id in sorted(before & set(fresh._users)):
            if fresh._users[user_id].created_at != known[user_id].created_at:
                self._ended(user_id)
        everyone = sorted(before | set(self._users))
        for user_id in everyone:  # the grants of each, both ways, are read again too
            for callback in self.on_heard:
                callback(user_id)
        for user_id in everyone:
            self._changed(user_id)

    async def _reread_then_tell(self, user_id: str) -> None:
        try:
            await self._reread(user_id)
        except SQLAlchemyError as err:  # its sign-ins stay forgotten: each is read on use
            _LOGGER.warning("could not read user %r again: %s", user_id, err)
        self._changed(user_id)

    async def _reread(self, user_id: str) -> None:
        """Replace what is remembered of ``user_id`` with the database's rows (one at a time,
        in the order the changes were heard)."""
        async with self._reading:
            kept = await self._read_user(user_id)
            known = self._users.get(user_id)
            self._forget(user_id)
            for key in [k for k, i in self._identities.items() if i.user_id == user_id]:
                del self._identities[key]
            self._passwords.pop(user_id, None)
            if kept.user is None:
                self._users.pop(user_id, None)
                return
            self._users[user_id] = kept.user
            if known is not None and known.created_at != kept.user.created_at:
                self._ended(user_id)  # another account under the id (see `_reload`)
            if kept.password:
                self._passwords[user_id] = kept.password
            for hashed, (session, link) in kept.sessions.items():
                self._sessions[hashed] = session
                self._session_link[session.id] = link
            self._tokens.update(kept.tokens)
            for identity in kept.identities:
                self._identities[(identity.issuer, identity.subject)] = identity

    async def _read_user(self, user_id: str) -> _Kept:
        async with self._db.connect() as conn:
            row = (await conn.execute(sa.select(users).where(users.c.id == user_id))).first()
            if row is None:
                return _Kept(None, None, {}, {}, [])
            found = _Kept(_user(row), row.password, {}, {}, [])
            for s in await conn.execute(sa.select(sessions).where(sessions.c.user_id == user_id)):
                found.sessions[s.hash] = (_session(s), s.link_key)
            for t in await conn.execute(sa.select(tokens).where(tokens.c.user_id == user_id)):
                found.tokens[t.hash] = _token(t)
            for i in await conn.execute(
                sa.select(identities).where(identities.c.user_id == user_id)
            ):
                found.identities.append(_identity(i))
        return found

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
            async with self.change(user_id) as tx:
                await tx.execute(sa.insert(users).values(_user_row(user)))
                await _disown_events_of(tx, user_id)
        except IntegrityError as err:  # added by another caller (or shell) while this one waited
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
            async with self.change(user_id) as tx:
                await tx.execute(sa.insert(users).values(_user_row(user)))
                await tx.execute(sa.insert(identities).values(_identity_row(linked)))
                await _disown_events_of(tx, user_id)
        except IntegrityError as err:  # another writer made the same id or link first
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
        """Change a user; disabling ends their sessions and tokens (deleted, so enabling does
        not bring them back)."""
        self.require(user_id)
        async with self.change(user_id, ended=disabled is True) as tx:
            user, other_admins = await _locked_user(tx, user_id)
            new = replace(
                user,
                name=user.name if name is None else _name(name),
                role=user.role if role is None else role,
                disabled=user.disabled if disabled is None else disabled,
            )
            was_admin = user.role is Role.ADMIN and not user.disabled
            if was_admin and not (new.role is Role.ADMIN and not new.disabled):
                _check_not_last_admin(user_id, other_admins)
            await tx.execute(
                sa.update(users)
                .where(users.c.id == user_id)
                .values(name=new.name, role=new.role.value, disabled=new.disabled)
            )
            if new.disabled and not user.disabled:
                await _end_all(tx, user_id)
        self._users[user_id] = new
        if new.disabled and not user.disabled:
            self._forget(user_id)
        if new.disabled != user.disabled or new.role != user.role:
            self._changed(user_id)
        return new

    async def remove(self, user_id: str) -> User:
        self.require(user_id)
        async with self.change(user_id, ended=True) as tx:
            user, other_admins = await _locked_user(tx, user_id)
            if user.role is Role.ADMIN and not user.disabled:
                _check_not_last_admin(user_id, other_admins)
            await tx.execute(sa.delete(users).where(users.c.id == user_id))
            await tx.execute(sa.delete(identities).where(identities.c.user_id == user_id))
            # their grants, both ways, in the same commit: a delete made later, apart from the
            # request, could land after the id was given again and take the new account's
            await tx.execute(
                sa.delete(grants).where(
                    sa.or_(grants.c.user_id == user_id, grants.c.owner == user_id)
                )
            )
            # and their revokes of their own copies' egress, for the same reason: an account
            # given the id since would stay revoked after approving its own install
            await tx.execute(sa.delete(egress_revokes).where(egress_revokes.c.holder == user_id))
            await _end_all(tx, user_id)
        del self._users[user_id]
        self._passwords.pop(user_id, None)
        self._forget(user_id)
        for key in [k for k, i in self._identities.items() if i.user_id == user_id]:
            del self._identities[key]
        self._changed(user_id)
        return user

    async def set_password(self, user_id: str, hashed: str, *, end_sessions: bool) -> None:
        """Store a new password hash; a reset by an admin or a change ends the other sign-ins."""
        self.require(user_id)
        async with self.change(user_id) as tx:
            done = await tx.execute(
                sa.update(users).where(users.c.id == user_id).values(password=hashed)
            )
            if not done.rowcount:
                raise NotFound("user", user_id)
            if end_sessions:
                await tx.execute(sa.delete(sessions).where(sessions.c.user_id == user_id))
        self._passwords[user_id] = hashed
        self._users[user_id] = replace(self._users[user_id], has_password=True)
        if end_sessions:
            self._forget(user_id, tokens=False)
            self._changed(user_id)

    def _forget(self, user_id: str, *, tokens: bool = True) -> None:
        for key in [k for k, s in self._sessions.items() if s.user_id == user_id]:
            self._unseen(self._sessions.pop(key).id)
        if tokens:
            for key in [k for k, t in self._tokens.items() if t.user_id == user_id]:
                del self._tokens[key]

    def _unseen(self, session_id: str) -> None:
        """Drop what is kept beside a session no longer remembered (its link key, when its use
        was last written): a sign-in loop must not grow the shell's memory."""
        self._session_link.pop(session_id, None)
        self._seen_written.pop(session_id, None)
        self._seen_at.pop(session_id, None)

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
        async with self.change(user_id) as tx:
            await tx.execute(
                sa.insert(sessions).values(
                    id=session.id,
                    hash=secret_hash(secret),
                    user_id=user_id,
                    kind=kind.value,
                    created_at=stamp,
                    last_seen=stamp,
                    address=session.address,
                    device=session.device,
                    link_key=link_key,
                )
            )
        self._sessions[secret_hash(secret)] = session
        self._session_link[session.id] = link_key
        return secret, session

    def session(self, secret: str) -> tuple[User, Session] | None:
        """The enabled user and session a cookie's secret belongs to, among those remembered
        (`find_session` also asks the database)."""
        session = self._sessions.get(secret_hash(secret))
        if session is None:
            return None
        user = self._users.get(session.user_id)
        if user is None or user.disabled:
            return None
        return user, session

    async def find_session(self, secret: str) -> tuple[User, Session] | None:
        """`session`, reading the database for a secret not remembered (a sign-in made on
        another shell), which is remembered from then on."""
        hashed = secret_hash(secret)
        if (
            hashed not in self._sessions
            and hashed not in self._unknown
            and _SECRET.fullmatch(secret) is not None
        ):
            await self._look_up(hashed, sessions)
        return self.session(secret)

    def seen(self, session: Session, address: str) -> None:
        """Note a request of ``session``; written at most once a minute (and at close)."""
        moment = datetime.now(UTC)
        session.last_seen = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
        session.address = address[:64]
        self._seen_at[session.id] = noted = time.monotonic()
        last = self._seen_written.get(session.id)
        if last is None or moment - last >= LAST_SEEN_EVERY:
            self._seen_written[session.id] = moment
            task = asyncio.get_running_loop().create_task(
                self._write_seen([(session.id, session.last_seen, session.address, noted)]),
                name="session seen",
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write_seen(self, notes: Sequence[tuple[str, str, str, float]]) -> None:
        """Write each note (session id, when, from where, when it was noted: monotonic) but those
        noted at or before this shell last found its database link broken: the requests they
        came with may have been given up by their clients, which went on through another shell
        (the write fence, `atrium.state.fence`, for a task apart from the request)."""
        try:
            async with self._db.transaction() as tx:
                # fenced on the connection it writes with (getting it may have found the link
                # broken)
                kept = [n for n in notes if not self._db.lost_since(n[3])]
                for sid, *_ in set(notes).difference(kept):
                    self._seen_written.pop(sid, None)  # the next use writes again
                for sid, when, where, _ in kept:
                    await tx.execute(
                        sa.update(sessions)
                        .where(sessions.c.id == sid)
                        .values(last_seen=when, address=where)
                    )
        except SQLAlchemyError as err:  # a note of when, never worth failing a request over
            _LOGGER.warning("could not note a session's last use: %s", err)

    async def _flush_seen(self) -> None:
        notes = [
            (s.id, s.last_seen, s.address, self._seen_at.get(s.id, 0.0))
            for s in self._sessions.values()
            if s.id in self._seen_written
        ]
        if notes:
            await self._write_seen(notes)

    def sessions_of(self, user_id: str) -> list[Session]:
        found = [s for s in self._sessions.values() if s.user_id == user_id]
        return sorted(found, key=lambda s: s.created_at)

    async def end_session(self, user_id: str, session_id: str) -> bool:
        """End one of ``user_id``'s sessions, remembered here or not (made on another shell)."""
        try:
            async with self.change(user_id) as tx:
                done = await tx.execute(
                    sa.delete(sessions).where(
                        sessions.c.id == session_id, sessions.c.user_id == user_id
                    )
                )
                if not done.rowcount:
                    raise _Nothing
        except _Nothing:
            return False
        for key in [k for k, s in self._sessions.items() if s.id == session_id]:
            del self._sessions[key]
        self._unseen(session_id)
        self._changed(user_id)
        return True

    async def end_link_sessions(self, keep: str) -> int:
        """End the login-link sessions made with a bootstrap token other than ``keep``'s key: a
        new token ends the old link's sign-ins, as it always has."""
        gone = sa.and_(
            sessions.c.kind == SessionKind.LINK.value,
            sa.or_(sessions.c.link_key.is_(None), sessions.c.link_key != keep),
        )
        async with self._db.connect() as conn:
            owners = sorted(
                set((await conn.execute(sa.select(sessions.c.user_id).where(gone))).scalars())
            )
        ended = 0
        for owner in owners:
            try:
                async with self.change(owner) as tx:
                    done = await tx.execute(
                        sa.delete(sessions).where(gone, sessions.c.user_id == owner)
                    )
                    ended += done.rowcount
            except _Nothing:
                continue
        for key in [
            k
            for k, s in self._sessions.items()
            if s.kind is SessionKind.LINK and self._session_link.get(s.id) != keep
        ]:
            self._unseen(self._sessions.pop(key).id)
        return ended

    # ---- personal tokens -----------------------------------------------------------------

    async def create_token(
        self, user_id: str, name: str, expires_in_days: int | None
    ) -> tuple[str, Token]:
        self.require(user_id)
        if not name.strip() or len(name) > MAX_NAME:
            raise InvalidRequest(f"a token's name has 1-{MAX_NAME} characters", field="name")
        secret = TOKEN_PREFIX + new_secret()
        stamp = now()
        expires = None
        if expires_in_days is not None:
            moment = datetime.now(UTC) + timedelta(days=expires_in_days)
            expires = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
        token = Token(new_id("tok"), user_id, name.strip(), stamp, expires)
        async with self.change(user_id) as tx:
            await tx.execute(
                sa.insert(tokens).values(
                    id=token.id,
                    hash=secret_hash(secret),
                    user_id=user_id,
                    name=token.name,
                    created_at=stamp,
                    expires_at=expires,
                )
            )
        self._tokens[secret_hash(secret)] = token
        return secret, token

    def token(self, secret: str) -> tuple[User, Token] | None:
        """The enabled user a personal token belongs to, if it has not expired, among those
        remembered (`find_token` also asks the database)."""
        token = self._tokens.get(secret_hash(secret))
        if token is None:
            return None
        if token.expires_at is not None and token.expires_at <= now():
            return None
        user = self._users.get(token.user_id)
        if user is None or user.disabled:
            return None
        return user, token

    async def find_token(self, secret: str) -> tuple[User, Token] | None:
        """`token`, reading the database for a secret not remembered (made on another shell).
        Only what has a personal token's form is read: an app's token, asked first of all
        bearer tokens, never costs a database read."""
        hashed = secret_hash(secret)
        if (
            hashed not in self._tokens
            and hashed not in self._unknown
            and secret.startswith(TOKEN_PREFIX)
            and _SECRET.fullmatch(secret.removeprefix(TOKEN_PREFIX)) is not None
        ):
            await self._look_up(hashed, tokens)
        return self.token(secret)

    async def _look_up(self, hashed: str, table: sa.Table) -> None:
        """Read the session or token row of ``hashed`` with its user, and remember both (or
        that there is none). A read during which a change was made here or heard from another
        shell is made again: it may predate that change."""
        for _ in range(3):
            before = self._changes
            async with self._db.connect() as conn:
                row = (
                    await conn.execute(
                        sa.select(table, *(c.label(f"u_{c.name}") for c in users.c))
                        .join(users, users.c.id == table.c.user_id)
                        .where(table.c.hash == hashed)
                    )
                ).first()
            # a secret absent now can never appear (see the module docstring): None is final
            if row is None or not self._changed_since(before, row.user_id):
                break
        else:
            return  # nothing remembered: the next request reads again
        if row is None:
            self._unknown[hashed] = None
            if len(self._unknown) > UNKNOWN_KEPT:
                self._unknown.popitem(last=False)
            return
        if hashed in self._sessions or hashed in self._tokens:
            return  # made here meanwhile
        self._users[row.user_id] = User(
            row.u_id,
            row.u_name,
            Role(row.u_role),
            bool(row.u_disabled),
            row.u_created_at,
            bool(row.u_password),
        )
        if row.u_password:
            self._passwords[row.user_id] = row.u_password
        if table is sessions:
            session = _session(row)
            self._sessions[hashed] = session
            self._session_link[session.id] = row.link_key
        else:
            self._tokens[hashed] = _token(row)

    def has_session(self, user_id: str, session_id: str) -> bool:
        return any(s.id == session_id and s.user_id == user_id for s in self._sessions.values())

    def has_token(self, user_id: str, token_id: str) -> bool:
        return any(t.id == token_id and t.user_id == user_id for t in self._tokens.values())

    def tokens_of(self, user_id: str) -> list[Token]:
        found = [t for t in self._tokens.values() if t.user_id == user_id]
        return sorted(found, key=lambda t: t.created_at)

    async def delete_token(self, user_id: str, token_id: str) -> bool:
        """Delete one of ``user_id``'s tokens, remembered here or not (made on another shell)."""
        try:
            async with self.change(user_id) as tx:
                done = await tx.execute(
                    sa.delete(tokens).where(tokens.c.id == token_id, tokens.c.user_id == user_id)
                )
                if not done.rowcount:
                    raise _Nothing
        except _Nothing:
            return False
        for key in [k for k, t in self._tokens.items() if t.id == token_id]:
            del self._tokens[key]
        self._changed(user_id)
        return True

    # ---- OIDC identities -----------------------------------------------------------------

    def identity(self, issuer: str, subject: str) -> Identity | None:
        return self._identities.get((issuer, subject))

    def identities_of(self, user_id: str) -> list[Identity]:
        return [i for i in self._identities.values() if i.user_id == user_id]

    async def link(self, issuer: str, subject: str, user_id: str, email: str | None) -> Identity:
        self.require(user_id)
        identity = Identity(issuer, subject, user_id, email, now())
        key = sa.and_(identities.c.issuer == issuer, identities.c.subject == subject)
        async with self.change(user_id) as tx:
            holder = (
                await tx.execute(sa.select(identities.c.user_id).where(key).with_for_update())
            ).scalar()
            if holder is not None and holder != user_id:
                raise IdentityLinked(
                    "that identity is linked to another user already",
                    issuer=issuer,
                    subject=subject,
                )
            await tx.execute(sa.delete(identities).where(key))
            await tx.execute(sa.insert(identities).values(_identity_row(identity)))
        self._identities[(issuer, subject)] = identity
        return identity

    async def unlink(self, issuer: str, subject: str, user_id: str) -> bool:
        """Remove ``user_id``'s link to the identity; False when they have no such link."""
        try:
            async with self.change(user_id) as tx:
                done = await tx.execute(
                    sa.delete(identities).where(
                        identities.c.issuer == issuer,
                        identities.c.subject == subject,
                        identities.c.user_id == user_id,
                    )
                )
                if not done.rowcount:
                    raise _Nothing
        except _Nothing:
            return False
        self._identities.pop((issuer, subject), None)
        return True


class _Nothing(Exception):
    """Raised inside a change that found nothing to do: its transaction (and event) roll back."""


def _name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_NAME or any(ord(ch) < 32 for ch in name):
        raise InvalidRequest(f"a display name has 1-{MAX_NAME} printable characters", field="name")
    return name


async def _locked_user(tx: AsyncConnection, user_id: str) -> tuple[User, list[str]]:
    """``user_id`` and the other enabled admins, their rows locked until the commit: the
    last-admin rule is checked against the database, not a store's memory, and a concurrent
    change of one of them (on another shell) waits and then sees this one's. All in one
    statement in id order, so two such changes never hold one each and wait for the other's."""
    rows = (
        await tx.execute(
            sa.select(users)
            .where(
                sa.or_(
                    users.c.id == user_id,
                    sa.and_(users.c.role == Role.ADMIN.value, users.c.disabled.is_(False)),
                )
            )
            .order_by(users.c.id)
            .with_for_update()
        )
    ).all()
    found = [_user(r) for r in rows if r.id == user_id]
    if not found:
        raise NotFound("user", user_id)
    return found[0], [r.id for r in rows if r.id != user_id]


def _check_not_last_admin(user_id: str, other_admins: list[str]) -> None:
    if not other_admins:
        raise LastAdmin(
            f"{user_id!r} is the last enabled admin: make another admin first", user=user_id
        )


#: the owner the kept events of a removed account get when its id is given again: no user id
#: holds a `~`, so nobody hears them
NOBODY: Final = "~removed"


async def _disown_events_of(tx: AsyncConnection, user_id: str) -> None:
    """A new account's id may be a removed account's: the kept events that were the old
    account's to hear (owned by it, or a grant's naming it) are made nobody's in the transaction
    that makes the new one, so its stream's `Last-Event-ID` replays none of them (any id resumes
    from the table, and the old account's rows stay there until 10,000 newer ones push them
    out). Rows written after its removal, of its instances stopping, go too. The rows are kept,
    changed: event ids have no gaps, and a reader that meets one ends its streams."""
    await tx.execute(
        sa.update(event_rows).where(event_rows.c.owner == user_id).values(owner=NOBODY)
    )
    grants = await tx.execute(
        sa.select(event_rows.c.id, event_rows.c.data).where(
            event_rows.c.topic.in_((GRANT_ADDED, GRANT_REVOKED))
        )
    )
    named = [
        row.id for row in grants if isinstance(row.data, dict) and row.data.get("user") == user_id
    ]
    if named:
        # a grant's row that does not read as its payload is heard by nobody
        await tx.execute(
            sa.update(event_rows).where(event_rows.c.id.in_(named)).values(data={}, owner=NOBODY)
        )


async def _end_all(tx: AsyncConnection, user_id: str) -> None:
    await tx.execute(sa.delete(sessions).where(sessions.c.user_id == user_id))
    await tx.execute(sa.delete(tokens).where(tokens.c.user_id == user_id))


def _user(row: Any) -> User:
    return User(
        row.id, row.name, Role(row.role), bool(row.disabled), row.created_at, bool(row.password)
    )


def _user_row(user: User) -> dict[str, object]:
    return {
        "id": user.id,
        "name": user.name,
        "role": user.role.value,
        "disabled": user.disabled,
        "created_at": user.created_at,
    }


def _session(row: Any) -> Session:
    return Session(
        row.id,
        row.user_id,
        SessionKind(row.kind),
        row.created_at,
        row.last_seen,
        row.address,
        row.device,
    )


def _token(row: Any) -> Token:
    return Token(row.id, row.user_id, row.name, row.created_at, row.expires_at)


def _identity(row: Any) -> Identity:
    return Identity(row.issuer, row.subject, row.user_id, row.email, row.linked_at)


def _identity_row(identity: Identity) -> dict[str, object]:
    return {
        "issuer": identity.issuer,
        "subject": identity.subject,
        "user_id": identity.user_id,
        "email": identity.email,
        "linked_at": identity.linked_at,
    }
