"""Who listens on an instance's port: the shell sends its secret only to the instance's own child.

The port is allocated by the shell and handed to the child, but any local process can bind it
first (a port squatter) and answer `/health` with the identity `GET /api/instances` lists. So
before a request that carries `X-Os-Shell-Secret` leaves for a health check or a hook, the shell
reads the kernel's socket tables of the child's network (`/proc/<pid>/net/tcp`, `tcp6`: the host's,
or the instance's own namespace, `atrium.lifecycle.network`) for every socket listening where a
connection to ``host:port`` could land (that address or a wildcard), and the open files of the
child and its descendants (`/proc/<pid>/fd`): every such socket must be one of theirs.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Final

from atrium.lifecycle.runners.process import descendants

_TABLES: Final = ("tcp", "tcp6")
_LISTEN: Final = "0A"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(hex_address: str) -> IPAddress:
    """A `/proc/net/tcp*` address: 32-bit words in the host's (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def listeners(host: str, port: int, pid: int | str = "self") -> set[int]:
    """The inodes of the sockets listening where a connection to ``host:port`` may land, in the
    network namespace of ``pid``."""
    target = ipaddress.ip_address(host)
    found: set[int] = set()
    for table in _TABLES:
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            hex_address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) != port:
                continue
            local = _address(hex_address)
            if local == target or local.is_unspecified:
                found.add(int(fields[9]))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        entries = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone, or not ours to read
        return inodes
    for entry in entries:
        try:
            target = str(entry.readlink())
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def foreign_listener(pid: int, host: str, port: int) -> bool | None:
    """None when nothing listens on ``host:port`` yet; False when every listener there belongs to
    ``pid`` or its descendants; True when any belongs to another process."""
    wanted = listeners(host, port, pid)
    if not wanted:
        return None
    owned: set[int] = set()
    for process in (pid, *(s.pid for s in descendants(pid))):
        owned |= _socket_inodes(process) & wanted
        if owned == wanted:
            return False
    return True
