"""What a member's fetch may connect to (docs/decisions.md "Users: what a member's fetch may reach").

An install names a URL, and the shell connects to it from inside its own network: without a
rule, a member could make the shell knock on its loopback services, the cloud metadata address
(169.254.169.254) or the private network behind it. A member's fetches (git and OCI, resolving
and fetching, every redirect and token service on the way) may connect only to

- a public (globally routable) address, or
- a host the admin allowed (``ATRIUM_MEMBER_FETCH_HOSTS``: host names, addresses or networks,
  comma-separated), or the configured index's host.

The check is on the address the connection is really made to, after resolution (a name that
resolves to a private address is refused unless the name is allowed), so a name whose DNS answer
changes between a check and the connection cannot slip past: aiohttp connects to the checked
address, git is pinned to it. An admin's fetches are not restricted.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from atrium.errors import FetchHostRefused

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: git transports a member may use: ssh would sign in with the shell's own keys
MEMBER_GIT_SCHEMES = frozenset({"git", "http", "https"})
DEFAULT_PORTS = {"git": 9418, "http": 80, "https": 443}


def _address(text: str) -> IpAddress:
    found = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped
    return found


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    """The hosts beyond the public internet a member's fetch may reach."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IpNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> FetchPolicy:
        """Host names, addresses (``10.0.0.5``) and networks (``10.0.0.0/8``); a bad network
        raises ValueError."""
        hosts: set[str] = set()
        networks: list[IpNetwork] = []
        for raw in entries:
            entry = raw.strip().lower().strip("[]")
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                if "/" in entry:
                    raise ValueError(f"{raw.strip()!r} is not a network") from None
                hosts.add(entry.rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def allows(self, host: str, address: str) -> bool:
        """May a member's fetch of ``host`` connect to ``address`` (what ``host`` resolved to)?"""
        name = host.lower().strip("[]").rstrip(".")
        if name in self.hosts:
            return True
        ip = _address(address)
        if ip.is_global and not ip.is_multicast:
            return True
        return any(ip.version == net.version and ip in net for net in self.networks)


@dataclass(frozen=True, slots=True)
class Reach:
    """One user's fetch rule: ``restricted()`` is asked at each connection (the role may change)."""

    policy: FetchPolicy
    restricted: Callable[[], bool] = field(default=lambda: True)
    #: the host of the store's catalogue now (an admin may change it while the shell runs)
    index_host: Callable[[], str | None] = field(default=lambda: None)

    def check(self, host: str, address: str) -> None:
        if not self.restricted() or self.policy.allows(host, address):
            return
        index_host = self.index_host()
        if index_host is not None and host.lower().strip("[]").rstrip(".") == index_host:
            return
        raise FetchHostRefused(host, address)

    async def addresses(self, host: str, port: int) -> list[str]:
        """``host``'s addresses, each checked: one refused address refuses the host."""
        try:
            _address(host.strip("[]"))
            found = [host.strip("[]")]
        except ValueError:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError:
                return []  # the fetch itself reports the unknown host in git's words
            found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in found:
            self.check(host, address)
        return found

    def connector(self) -> aiohttp.TCPConnector:
        return _CheckedConnector(self)

    async def git_args(self, url: str) -> tuple[list[str], str]:
        """``(git -c options, url)`` for a member's fetch of ``url``: the host checked and git
        pinned to the checked address, redirects and the shell's credentials off. Unrestricted:
        ``([], url)``."""
        if not self.restricted():
            return [], url
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = parts.hostname or ""
        if scheme not in MEMBER_GIT_SCHEMES or not host:
            raise FetchHostRefused(
                host or url,
                None,
                f"a member's git source is a git://, http:// or https:// URL, not {url!r}",
            )
        port = parts.port or DEFAULT_PORTS[scheme]
        found = await self.addresses(host, port)
        if not found:
            # git would look the name up again itself, unchecked: a DNS server that fails this
            # lookup and answers git's with a private address would get past the rule
            raise FetchHostRefused(
                host,
                None,
                f"{host!r} does not resolve here, and a member's git fetch goes only to an "
                "address the shell has checked",
            )
        options = ["-c", "credential.helper=", "-c", "http.followRedirects=false"]
        pinned = found[0]
        if scheme == "git":
            literal = f"[{pinned}]" if ":" in pinned else pinned
            netloc = f"{literal}:{port}"
            return options, parts._replace(netloc=netloc).geturl()
        literal = f"[{pinned}]" if ":" in pinned else pinned
        return [*options, "-c", f"http.curloptResolve={host}:{port}:{literal}"], url


class _CheckedConnector(aiohttp.TCPConnector):
    """Checks every address a connection is about to be made to (redirects and token services
    included: each connection resolves here, IP literals too)."""

    def __init__(self, reach: Reach) -> None:
        super().__init__(use_dns_cache=False)
        self._reach = reach

    async def _resolve_host(self, host: str, port: int, traces: Any = None) -> Any:
        results = await super()._resolve_host(host, port, traces)
        for result in results:
            self._reach.check(host, str(result["host"]))
        return results


#: nothing restricted (an admin's pipeline, or code that fetches for the shell itself)
UNRESTRICTED = Reach(FetchPolicy(), restricted=lambda: False)
