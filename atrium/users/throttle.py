"""How many failed password sign-ins one (account, address) pair may make (decisions.md "Users:
accounts and sign-in"). Pure: the caller gives the time.

After `LIMIT` failures for one account from one address within `WINDOW` seconds, that pair is
refused until the oldest of those failures leaves the window. Only the pair: the same account from
another address, or another account from this address, signs in as before, so whoever guesses
cannot keep the real user out for longer than the window. The account is the name as typed, known
or not, so the refusal tells nothing of whether it exists.

The address is counted as a network hands them out (`address_key`): an IPv4 address alone, an IPv6
address by its /64 prefix (one host is routinely given a whole /64, 2^64 addresses that would each
bring five fresh guesses), and an IPv4-mapped IPv6 address as the IPv4 address it maps.

The memory is bounded: at most `MAX_PAIRS` pairs are remembered, each with at most `LIMIT` times.
When full, pairs whose failures all left the window go first, then the least recently failed. A
client that sprays names to push its own pair out must make `MAX_PAIRS` failed sign-ins, each a full
password verification (at most a few run at once), which takes longer than the window itself.
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict, deque
from typing import Final

LIMIT: Final = 5
WINDOW: Final = 60.0
MAX_PAIRS: Final = 10_000
#: the longest account name remembered (longer ones are cut: they cannot be users anyway)
MAX_ACCOUNT: Final = 64
#: the prefix length an IPv6 address is counted by
IPV6_PREFIX: Final = 64

Pair = tuple[str, str]


class SignInThrottle:
    """Failed sign-ins by (account, address), newest last."""

    def __init__(
        self, limit: int = LIMIT, window: float = WINDOW, max_pairs: int = MAX_PAIRS
    ) -> None:
        self._limit = limit
        self._window = window
        self._max_pairs = max_pairs
        self._failures: OrderedDict[Pair, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    @staticmethod
    def pair(account: str, address: str) -> Pair:
        return account[:MAX_ACCOUNT], address_key(address)

    def retry_after(self, account: str, address: str, now: float) -> int | None:
        """Whole seconds until the pair may try again, or None when it may now."""
        times = self._failures.get(self.pair(account, address))
        if times is None or len(times) < self._limit:
            return None
        left = times[0] + self._window - now
        if left <= 0:
            return None
        return max(1, math.ceil(left))

    def failed(self, account: str, address: str, now: float) -> None:
        key = self.pair(account, address)
        times = self._failures.pop(key, None)
        if times is None:
            times = deque(maxlen=self._limit)
            self._make_room(now)
        times.append(now)
        self._failures[key] = times  # the most recently failed pair is last

    def succeeded(self, account: str, address: str) -> None:
        self._failures.pop(self.pair(account, address), None)

    def _make_room(self, now: float) -> None:
        if len(self._failures) < self._max_pairs:
            return
        stale = [k for k, t in self._failures.items() if t[-1] + self._window <= now]
        for key in stale:
            del self._failures[key]
        while len(self._failures) >= self._max_pairs:
            self._failures.popitem(last=False)


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
