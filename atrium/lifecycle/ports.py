"""Ports for app servers: handed out once, checked free on the host, given back on stop.

The allocator remembers what it handed out, so two instances of this shell never get the same port,
and it binds each candidate once before handing it out, so a port some other program already uses
is skipped. That check cannot reserve the port for the app (it binds it only later): a port taken
in between shows up as a failed start, which the lifecycle manager reports as ``spawn_failed``
with cause ``port``. The scan starts at a random point of the range, so two shells on one machine
rarely race for the same ports.

Synchronous and quick (one ``bind`` per candidate): called from the event loop.
"""

from __future__ import annotations

import logging
import secrets
import socket

_LOGGER = logging.getLogger(__name__)


class PortExhausted(Exception):
    """Every port of the range is held or taken; the manager turns it into SpawnFailed(port).

    Not an AtriumError itself: it knows no app id, and the error tree has one class per code.
    """

    def __init__(self, host: str, start: int, end: int, held: int) -> None:
        super().__init__(
            f"no free port on {host} in {start}-{end}: this shell holds {held} of them and other "
            "programs use the rest; stop some instances or give the shell a wider port range"
        )
        self.host = host
        self.start = start
        self.end = end


class PortAllocator:
    """Hands out ports of ``start..end`` (inclusive) on ``host``."""

    def __init__(self, host: str = "127.0.0.1", start: int = 20000, end: int = 29999) -> None:
        if not 0 < start <= end <= 65535:
            raise ValueError(f"bad port range {start}-{end}: need 0 < start <= end <= 65535")
        self._host = host
        self._start = start
        self._end = end
        self._held: set[int] = set()
        self._family = _family(host)

    @property
    def in_use(self) -> frozenset[int]:
        """The ports handed out and not released."""
        return frozenset(self._held)

    def reserve(self) -> int:
        """A port nobody holds or listens on, now held until ``release``; or PortExhausted."""
        size = self._end - self._start + 1
        offset = secrets.randbelow(size)
        for step in range(size):
            port = self._start + (offset + step) % size
            if port not in self._held and self._is_free(port):
                self._held.add(port)
                return port
        raise PortExhausted(self._host, self._start, self._end, len(self._held))

    def release(self, port: int) -> None:
        """Give a port back (a port not held is ignored: stop paths may release twice)."""
        self._held.discard(port)

    def _is_free(self, port: int) -> bool:
        # no SO_REUSEADDR: a port with a listener, or a socket bound to it, fails the bind
        with socket.socket(self._family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((self._host, port))
            except OSError:
                _LOGGER.debug("port %d on %s is taken; skipped", port, self._host)
                return False
        return True


def _family(host: str) -> socket.AddressFamily:
    """The address family of ``host`` (an IP literal or a name)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise ValueError(f"cannot resolve the app host {host!r}: {err}") from err
    return infos[0][0]


__all__ = ["PortAllocator", "PortExhausted"]
