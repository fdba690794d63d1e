"""How many failed password sign-ins one (account, address) pair may make (decisions.md "Users:
accounts and sign-in"; "Several shells: the sign-in limit in the database"). The caller gives
the time.

After `LIMIT` failures for one account from one address within `WINDOW` seconds, that pair is
refused until the oldest of those failures leaves the window. Only the pair: the same account from
another address, or another account from this address, signs in as before, so whoever guesses
cannot keep the real user out for longer than the window. The account is the name as typed, known
or not, so the refusal tells nothing of whether it exists.

The address is counted as a network hands them out (`address_key`): an IPv4 address alone, an IPv6
address by its /64 prefix (one host is routinely given a whole /64, 2^64 addresses that would each
bring five fresh guesses), and an IPv4-mapped IPv6 address as the IPv4 address it maps.

Every address also has `ADDRESS_LIMIT` sign-ins per `WINDOW`, whatever the names and whether
they succeed: the pair's limit alone lets one address try one password at every name (spraying).

The failures are rows of the state database (``sign_in_failures``: the name as its sha256, never
as typed), so every shell of one database counts a pair's attempts together: in memory, a
guesser spread over N shells behind a load balancer had N times the limit. The address's own
count is rows of the same table whose account is `ANY_ACCOUNT` (no sha256 is), kept on success.
An attempt's checks and counts are one transaction under a lock of its address (PostgreSQL: an
advisory transaction lock; SQLite: its one writer), so attempts made at once on several shells
are counted one after another. Times are the shells' wall clocks (Unix
seconds): shells of one database keep their clocks in step, and a skew of a second moves a
minute's window by a second.

The table is bounded: each attempt deletes the rows that left the window (all pairs', by the
index on ``at``), and past `MAX_ROWS` rows the oldest go first, so a client that sprays names
grows it by at most the attempts of one window and never past `MAX_ROWS`. To push its own pair
out it must make `MAX_ROWS` attempts, each a full password verification (at most a few run at
once per address), which takes longer than the window itself.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import sqlalchemy as sa

from atrium.state.locks import lock_key
from atrium.state.schema import sign_in_failures as failures

if TYPE_CHECKING:
    from atrium.state.database import Database

LIMIT: Final = 5
WINDOW: Final = 60.0
#: sign-ins one address may make per `WINDOW`, whatever the names
ADDRESS_LIMIT: Final = 30
#: the account of the rows that count an address's sign-ins (a name is kept as its sha256)
ANY_ACCOUNT: Final = "*"
#: the most failures remembered, all pairs together (the memory bound of before: 10,000 pairs
#: of `LIMIT` times each)
MAX_ROWS: Final = 50_000
#: the most keys a `RateLimit` remembers
MAX_PAIRS: Final = 10_000
#: the longest account name remembered (longer ones are cut: they cannot be users anyway)
MAX_ACCOUNT: Final = 64
#: the prefix length an IPv6 address is counted by
IPV6_PREFIX: Final = 64

Pair = tuple[str, str]


@dataclass(frozen=True)
class Refused:
    """An attempt refused: the whole seconds until it may be made, and which limit refused it
    (`TooManyAttempts`'s ``limit``: ``account`` for the pair, ``address`` for the address)."""

    seconds: int
    limit: str


class SignInThrottle:
    """Failed sign-ins by (account, address), and every sign-in by address, in the state
    database."""

    def __init__(
        self,
        db: Database,
        limit: int = LIMIT,
        window: float = WINDOW,
        max_rows: int = MAX_ROWS,
        address_limit: int = ADDRESS_LIMIT,
    ) -> None:
        self._db = db
        self._limit = limit
        self._window = window
        self._max_rows = max_rows
        self._address_limit = address_limit

    @staticmethod
    def pair(account: str, address: str) -> Pair:
        """The pair as kept: the name as typed (cut to `MAX_ACCOUNT`) by its sha256, since a
        name field sometimes receives its password, and the address by `address_key`."""
        name = hashlib.sha256(f"atrium sign-in:{account[:MAX_ACCOUNT]}".encode()).hexdigest()
        return name, address_key(address)

    @asynccontextmanager
    async def attempt(
        self, account: str, address: str, now: float
    ) -> AsyncIterator[Refused | None]:
        """One attempt of the pair at ``now`` (Unix seconds). Yields why it must wait (the pair's
        limit first, then the address's), or None when it may go on; then the attempt is
        counted, as failed for the pair (until `succeeded`) and as one of the address's, when
        the block ends, unless the block raises. Counted before the password is verified, so
        that attempts made at once are all counted. A refused attempt is not counted."""
        key = self.pair(account, address)
        async with self._db.transaction() as tx:
            if self._db.dialect == "postgresql":
                # the address's lock covers its pairs too (a pair holds its address)
                lock = lock_key("sign-in", key[1])
                await tx.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock})
            await tx.execute(sa.delete(failures).where(failures.c.at <= now - self._window))
            refused = None
            for name, limit, what in (
                (key[0], self._limit, "account"),
                (ANY_ACCOUNT, self._address_limit, "address"),
            ):
                times = (
                    await tx.execute(
                        sa.select(failures.c.at)
                        .where(failures.c.account == name, failures.c.address == key[1])
                        .order_by(failures.c.at.desc())
                        .limit(limit)
                    )
                ).scalars()
                wait = _retry_after(list(times), limit, self._window, now)
                if wait is not None:
                    refused = Refused(wait, what)
                    break
            yield refused
            if refused is not None:
                return
            newest = (
                await tx.execute(
                    sa.insert(failures)
                    .values(
                        [
                            {"account": key[0], "address": key[1], "at": now},
                            {"account": ANY_ACCOUNT, "address": key[1], "at": now},
                        ]
                    )
                    .returning(failures.c.id)
                )
            ).scalars()
            top = max(newest)
            await tx.execute(sa.delete(failures).where(failures.c.id <= top - self._max_rows))

    async def succeeded(self, account: str, address: str) -> None:
        name, key = self.pair(account, address)
        async with self._db.transaction() as tx:
            await tx.execute(
                sa.delete(failures).where(
                    sa.and_(failures.c.account == name, failures.c.address == key)
                )
            )


def _retry_after(times: list[float], limit: int, window: float, now: float) -> int | None:
    """Whole seconds until a pair whose newest failures are ``times`` may try again, or None."""
    if len(times) < limit:
        return None
    left = min(times) + window - now
    if left <= 0:
        return None
    return max(1, math.ceil(left))


class RateLimit:
    """At most `limit` events per key within `window` seconds, for keys such as a client address
    (`address_key`). A refused event is not counted, so waiting out the window always helps. At
    most `max_keys` keys are remembered; when full, the least recently used go first."""

    def __init__(self, limit: int, window: float, max_keys: int = MAX_PAIRS) -> None:
        self._limit = limit
        self._window = window
        self._max_keys = max_keys
        self._events: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._events)

    def take(self, key: str, now: float) -> int | None:
        """Count one event for ``key``; or, when it has had its share, the whole seconds until
        it may have another (and nothing is counted)."""
        times = self._events.pop(key, None)
        if times is None:
            times = deque(maxlen=self._limit)
            while len(self._events) >= self._max_keys:
                self._events.popitem(last=False)
        self._events[key] = times
        if len(times) >= self._limit:
            left = times[0] + self._window - now
            if left > 0:
                return max(1, math.ceil(left))
        times.append(now)
        return None


def address_key(address: str) -> str:
    """What one client address counts as: IPv4 itself, IPv6 its /64 network (a zone id
    dropped), IPv4-mapped IPv6 the IPv4 address; anything else as given, cut to 64 characters."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)
