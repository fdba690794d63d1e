"""The client's address: the connection's peer, or, when that peer is a proxy the operator named
in ATRIUM_TRUSTED_PROXIES, the address that proxy says it saw (docs/security.md "The client's
address"). Pure; `AtriumApp` calls `ClientAddress.of` once per request and puts the answer in the
ASGI scope's ``client``, so everything that reads the address (the sign-in limits, a session's
address, the audit log) reads this one.

X-Forwarded-For is a list each proxy appends the address it saw to; whatever a client sends
arrives at the left of it. So the list is read from the right: past each entry that is itself a
trusted proxy, the first that is not is the client. An entry that is no address (or a list longer
than any chain of proxies) ends the reading with the peer's own address: the header is not what a
trusted proxy writes, and nothing left of an unreadable entry is known to be a proxy's words.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from typing import Final

from atrium.settings import IPNetwork

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: the most entries read from the right of X-Forwarded-For; more trusted hops than this is no
#: chain of proxies anyone runs, and the work on one header stays bounded
MAX_HOPS: Final = 16


def parse_entry(entry: str) -> IPAddress | None:
    """One X-Forwarded-For entry as proxies write it: an IPv4 or IPv6 address, an IPv4 address
    with a port, a bracketed IPv6 address with or without one; None for anything else (a name,
    ``unknown``, a zone index)."""
    entry = entry.strip(" \t")
    host, port = entry, ""
    if entry.startswith("["):
        host, _, port = entry[1:].partition("]")
        if port and not port.startswith(":"):
            return None
        port = port[1:] if port else ""
    elif entry.count(":") == 1:  # IPv4:port (a bare IPv6 address has at least two colons)
        host, _, port = entry.partition(":")
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    if "%" in host:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return plain(address)


def plain(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it maps (one client, one address)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class ClientAddress:
    """The client's address of each request, given the proxies trusted."""

    def __init__(self, trusted: Iterable[IPNetwork]) -> None:
        self._trusted = tuple(trusted)
        self._distrusted: tuple[IPNetwork, ...] = ()
        self._warned = False

    def distrust(self, network: IPNetwork) -> None:
        """Never trust an address of ``network``, whatever the trusted proxies cover: the
        shell's own instances' range (`atrium.lifecycle.network`), whose untrusted images reach
        the shell's API from their addresses, inside a private network an operator may well
        trust whole for their proxy (10.0.0.0/8)."""
        self._distrusted = (*self._distrusted, network)

    @property
    def trusted(self) -> bool:
        """Whether any proxy is trusted (none: every address is the connection's)."""
        return bool(self._trusted)

    def trusts(self, address: IPAddress) -> bool:
        if any(address in network for network in self._distrusted):
            return False
        return any(address in network for network in self._trusted)

    def of(self, peer: str, forwarded_for: list[bytes]) -> str:
        """The client's address: ``peer`` unless it is a trusted proxy that sent
        ``forwarded_for`` (the X-Forwarded-For values, in order)."""
        if not self._trusted or not forwarded_for:
            return peer
        try:
            peer_address = plain(ipaddress.ip_address(peer))
        except ValueError:  # a Unix socket's peer, or none
            return peer
        if not self.trusts(peer_address):
            return peer
        # two headers are one list (RFC 9110 5.3); at most MAX_HOPS entries are read, from the right
        joined = b",".join(forwarded_for).decode("latin-1")
        parts = joined.rsplit(",", MAX_HOPS)
        found: IPAddress | None = None
        for entry in reversed(parts[-MAX_HOPS:]):
            address = parse_entry(entry)
            if address is None:
                return self._unreadable(peer, joined)
            if not self.trusts(address):
                return str(address)
            found = address
        if found is None or len(parts) > MAX_HOPS:
            return self._unreadable(peer, joined)
        # every entry a trusted proxy: the client is at one of them, the farthest
        return str(found)

    def _unreadable(self, peer: str, header: str) -> str:
        if not self._warned:  # once: a client sending these by the thousand fills no log
            self._warned = True
            log.warning(
                "a trusted proxy (%s) sent an X-Forwarded-For the shell cannot read (%r); the "
                "client's address is taken as the proxy's (logged once)",
                peer,
                header[:200],
            )
        return peer
