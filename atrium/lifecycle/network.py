"""Each sandboxed instance in a network of its own, reachable only by the shell.

The layout (one shell, running as root):

- a bridge the shell owns (`bridge_name`: ``atrb<shell pid>``) holding the first address of the
  configured range (``ATRIUM_APP_NETWORK``, a /16 by default), made with the host's table by the
  first instance that needs it (a start of the shell makes neither); the shell listens there
  too, at its own port, and reaches each instance at the instance's address;
- per instance a named network namespace (``atrium-<shell pid>-<n>``) made by the shell, so
  owned by the host's user namespace: nothing inside may change its addresses or its firewall,
  whatever capabilities the sandbox holds in its own user namespace. A veth joins it to the
  bridge; the instance side (``eth0``) has an address of the range and a MAC derived from it
  (`mac_of`), and the shell's side a permanent neighbour entry for that pair, so a relaunch on
  the same address never waits on a stale ARP entry and no instance can answer for another's
  address;
- in the namespace an nft table (`ruleset`) whose output policy drops everything but its own
  loopback, answers on connections made to it, and the shell's bridge address at the shell's
  port; ``ip_unprivileged_port_start`` is 0 there (any user of the sandbox binds port 80);
- an instance whose app was granted egress (`atrium.egress`) also reaches the outside (for a
  list, those addresses and ports only) through the host: its table lets it out past the range,
  the host's table forwards and masquerades its address alone (the ``egress`` set), and refuses
  every connection from the bridge to the host itself but the shell's API. A revoke or a grant
  replaces the table of each running instance of the app at once (`Network.set_egress`).

Deleting the namespace takes its veth pair and its nft table with it. Everything is named after
the shell's pid, so a start-up `sweep` removes what a shell killed with SIGKILL left (its pid no
longer runs) and never touches a live shell's.

The planning (names, addresses, commands, the clash check) is pure; `Network` runs ``ip`` and
``nft`` (iproute2 and nftables).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import itertools
import json
import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from atrium.egress import Ask, granted

_LOGGER = logging.getLogger(__name__)

DEFAULT_RANGE: Final = "10.213.0.0/16"
NETNS_DIR: Final = Path("/run/netns")
NETNS_PREFIX: Final = "atrium-"
BRIDGE_PREFIX: Final = "atrb"
VETH_PREFIX: Final = "atv"
#: the host's network interfaces, one folder each
SYS_NET: Final = Path("/sys/class/net")
#: the first two bytes of every instance's MAC: locally administered, unicast
MAC_PREFIX: Final = "02:a7"
#: SO_MARK of the shell's connections to its apps (`UpstreamClient.mark`): the host's table
#: (`Plan.host_ruleset`) refuses every other connection of the host to an instance's address
SHELL_MARK: Final = 0x61747269
#: never reached even with egress granted: link-local (the metadata service of most clouds, at
#: 169.254.169.254) and Alibaba Cloud's, at 100.100.100.200; they hand out the host's cloud
#: credentials to whoever asks from the machine
METADATA: Final = ("169.254.0.0/16", "100.100.100.200")
CLONE_NEWNET: Final = 0x40000000
MNT_DETACH: Final = 2
_TIMEOUT: Final = 10.0
_libc = ctypes.CDLL(None, use_errno=True)
#: the process's shells and instances so far: names stay unique when one process opens several
#: shells, one after the other or at once
_shells = itertools.count()
_instances = itertools.count()


class NetworkUnavailable(RuntimeError):
    """The instances' network cannot be made here (why, in words)."""


# --- planning (pure) -------------------------------------------------------------------------


def parse_range(text: str) -> ipaddress.IPv4Network:
    """The configured range: a private IPv4 network with room for the bridge and instances."""
    try:
        network = ipaddress.IPv4Network(text.strip(), strict=True)
    except ValueError as err:
        raise ValueError(f"{text!r} is not an IPv4 network such as {DEFAULT_RANGE}: {err}") from err
    if not network.is_private or network.prefixlen > 28:
        raise ValueError(f"{text!r} must be a private IPv4 network of at least 16 addresses")
    return network


def bridge_name(shell_pid: int, number: int = 0) -> str:
    """The bridge of the ``number``-th shell the process ``shell_pid`` opened (tests open
    several shells in one process)."""
    return f"{BRIDGE_PREFIX}{shell_pid}-{number}"


def netns_name(shell_pid: int, number: int) -> str:
    return f"{NETNS_PREFIX}{shell_pid}-{number}"


def veth_name(shell_pid: int, number: int) -> str:
    """The shell's end of an instance's veth (at most 15 characters: the number in base 36)."""
    digits, left = "", number
    while True:
        left, rest = divmod(left, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[rest] + digits
        if left == 0:
            break
    name = f"{VETH_PREFIX}{shell_pid}x{digits}"
    if len(name) > 15:
        raise ValueError(f"no interface name for instance {number} of shell {shell_pid}")
    return name


def mac_of(address: ipaddress.IPv4Address) -> str:
    """The one MAC an address ever has: the prefix and the address's four bytes."""
    return MAC_PREFIX + "".join(f":{byte:02x}" for byte in address.packed)


def owner_pid(name: str) -> int | None:
    """The shell pid a namespace, bridge or veth of ours is named after; None for any other."""
    if name.startswith(NETNS_PREFIX):
        head = name[len(NETNS_PREFIX) :].split("-", 1)[0]
    elif name.startswith(BRIDGE_PREFIX):
        head = name[len(BRIDGE_PREFIX) :].split("-", 1)[0]
    elif name.startswith(VETH_PREFIX):
        head = name[len(VETH_PREFIX) :].split("x", 1)[0]
    else:
        return None
    return int(head) if head.isdigit() else None


def leftovers(names: Iterable[str], alive: Iterable[int]) -> list[str]:
    """Those of ``names`` that a shell no longer running made."""
    running = set(alive)
    return [name for name in names if (pid := owner_pid(name)) is not None and pid not in running]


def clash(
    network: ipaddress.IPv4Network, routes: Sequence[dict[str, object]], own: str
) -> str | None:
    """The first route of the host (``ip -j route``) that overlaps ``network``, in words, unless
    it is the shell's own bridge ``own``; None when the range is free."""
    for route in routes:
        dst, dev = str(route.get("dst", "")), str(route.get("dev", ""))
        if dst in ("", "default") or dev == own:
            continue
        try:
            other = ipaddress.IPv4Network(dst, strict=False)
        except ValueError:
            continue
        if other.overlaps(network):
            return f"{network} overlaps the host's route to {dst} on {dev or 'no device'}"
    return None


@dataclass(frozen=True, slots=True)
class Plan:
    """The shell's side of the network: its range, bridge and address."""

    range: ipaddress.IPv4Network
    shell_pid: int
    #: the shell's port, the one an instance may reach at the bridge's address
    shell_port: int
    #: which of the process's shells this is (`bridge_name`)
    number: int = 0

    @property
    def bridge(self) -> str:
        return bridge_name(self.shell_pid, self.number)

    @property
    def shell_address(self) -> ipaddress.IPv4Address:
        return self.range.network_address + 1

    @property
    def shell_url(self) -> str:
        """What an instance reaches the shell's API at."""
        return f"http://{self.shell_address}:{self.shell_port}"

    def address(self, slot: int) -> ipaddress.IPv4Address:
        """The address of slot ``slot`` (0 is the first after the shell's)."""
        address = self.range.network_address + 2 + slot
        if address >= self.range.broadcast_address:
            raise NetworkUnavailable(f"no address left in {self.range}")
        return address

    def bridge_commands(self) -> list[str]:
        """``ip -batch`` lines making the bridge and giving it the shell's address."""
        return [
            f"link add {self.bridge} type bridge",
            f"addr add {self.shell_address}/{self.range.prefixlen} dev {self.bridge}",
            f"link set {self.bridge} up",
        ]

    def host_commands(self, number: int, slot: int) -> list[str]:
        """The shell's side of instance ``number``: its namespace, its veth into the bridge, the
        other end moved into the namespace with its fixed MAC, and the neighbour entry for it."""
        address = self.address(slot)
        veth, netns = veth_name(self.shell_pid, number), netns_name(self.shell_pid, number)
        return [
            f"netns add {netns}",
            f"link add {veth} type veth peer name eth0 address {mac_of(address)} netns {netns}",
            f"link set {veth} master {self.bridge} up",
            f"neigh replace {address} lladdr {mac_of(address)} dev {self.bridge} nud permanent",
        ]

    def inside_commands(self, slot: int) -> list[str]:
        """``ip -n <namespace> -batch`` lines: loopback, the address, the route to the shell."""
        address = self.address(slot)
        return [
            "link set lo up",
            f"addr add {address}/{self.range.prefixlen} dev eth0",
            "link set eth0 up",
            f"route add default via {self.shell_address}",
        ]

    def ruleset(self, egress: Egress = False) -> str:
        """The instance's nft table: nothing leaves but to its loopback, on connections made to
        it, and to the shell's API; nothing comes in but from its loopback and from the shell's
        address (a neighbour on the host's network that routes the range here, another
        instance). With ``egress``, also out past the range (never to another instance or the
        bridge's other ports, nor a cloud's metadata service: `METADATA`): to
        anywhere (True) or to those addresses and ports."""
        allowed = ""
        if egress is not False:
            allowed = f"    ip daddr {self.range} drop\n" + "".join(
                f"    ip daddr {blocked} drop\n" for blocked in METADATA
            )
            if egress is True:
                allowed += "    accept\n"
            else:
                allowed += "".join(
                    f"    ip daddr {address} meta l4proto {{ tcp, udp }} th dport {port} accept\n"
                    for address, port in egress
                )
        return (
            "table inet atrium {\n"
            "  chain out {\n"
            "    type filter hook output priority 0; policy drop;\n"
            '    oifname "lo" accept\n'
            "    ct state established,related accept\n"
            f"    ip daddr {self.shell_address} tcp dport {self.shell_port} accept\n"
            f"{allowed}"
            "  }\n"
            "  chain in {\n"
            "    type filter hook input priority 0; policy drop;\n"
            '    iifname "lo" accept\n'
            "    ct state established,related accept\n"
            f"    ip saddr {self.shell_address} accept\n"
            "  }\n"
            "}\n"
        )

    def egress_commands(self) -> str:
        """``nft -f`` lines adding to the host's table what granted instances need: answers to
        their connections forwarded in, their connections forwarded out (inserted before the
        table's drops) and masqueraded."""
        table = f"inet {self.bridge}"
        return (
            f"add chain {table} post {{ type nat hook postrouting priority srcnat; "
            "policy accept; }\n"
            f"add rule {table} post ip saddr @egress ip daddr != {self.range} oifname != "
            f'"{self.bridge}" masquerade\n'
            f'insert rule {table} forward iifname "{self.bridge}" ip saddr @egress ip daddr != '
            f"{self.range} accept\n"
            f"insert rule {table} forward ip daddr @egress ct state established,related accept\n"
        )

    def host_ruleset(self) -> str:
        """The host's nft table (named as the bridge): a connection of the host to an
        instance's address is refused unless the shell's socket marked it (`SHELL_MARK`): image
        apps check no shell secret, so another user's process (or another app on the host's
        network) would be served as the shell. Only the opening of a connection is refused (a
        SYN without the mark; anything but TCP): the kernel's own packets for a connection
        already made carry no mark (a reset for a socket the shell closed) and pass, and so do
        answers to an instance's own connections (to the shell's API); no connection tracking
        is needed in the host's namespace. Nothing is forwarded into the range (a neighbour
        that routes it here; instance to instance when the host bridges through iptables) but
        answers to connections that instances granted egress (the ``egress`` set) made; nothing
        is forwarded out of it but theirs, masqueraded. From the bridge, no connection reaches
        the host itself but the shell's API (a granted instance's table lets it past the range,
        and the host's addresses are the host's own). The forwarding rules come with the first
        grant (`egress_commands`): connection tracking costs every connection of the host."""
        return (
            f"table inet {self.bridge} {{\n"
            "  set egress {\n"
            "    type ipv4_addr;\n"
            "  }\n"
            "  chain in {\n"
            "    type filter hook input priority 0; policy accept;\n"
            f'    iifname "{self.bridge}" ip daddr {self.shell_address} tcp dport '
            f"{self.shell_port} accept\n"
            f'    iifname "{self.bridge}" tcp flags & (syn | ack) == syn reject with tcp reset\n'
            f'    iifname "{self.bridge}" meta l4proto != {{ tcp, icmp }} drop\n'
            "  }\n"
            "  chain out {\n"
            "    type filter hook output priority 0; policy accept;\n"
            f"    ip daddr {self.range} ip daddr != {self.shell_address} meta mark != "
            f"{SHELL_MARK:#x} tcp flags & (syn | ack) == syn reject with tcp reset\n"
            f"    ip daddr {self.range} ip daddr != {self.shell_address} meta mark != "
            f"{SHELL_MARK:#x} meta l4proto != tcp reject\n"
            "  }\n"
            "  chain forward {\n"
            "    type filter hook forward priority 0; policy accept;\n"
            f"    ip daddr {self.range} drop\n"
            f"    ip saddr {self.range} drop\n"
            "  }\n"
            "}\n"
        )


#: what an instance may reach beyond the shell's API: nothing (False), anywhere outside the
#: range (True), or those (IPv4 address, port) pairs (`resolve`)
Egress = bool | tuple[tuple[str, int], ...]


@dataclass(slots=True)
class _Held:
    """A running instance's namespace, held open by the shell so its table can be replaced
    after its name is gone (`Network.unname`); closed with the lease."""

    fd: int
    key: tuple[str, str] | None
    address: str
    egress: Egress


@dataclass(frozen=True, slots=True)
class Lease:
    """One instance's namespace and address, held until `Network.release`."""

    number: int
    slot: int
    netns: str
    address: str

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.netns


# --- I/O -------------------------------------------------------------------------------------


def _tool(name: str) -> str:
    found = shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if found is None:
        raise NetworkUnavailable(f"the {name} command is not installed")
    return found


def _run(argv: Sequence[str], stdin: str = "") -> str:
    result = subprocess.run(  # noqa: S603 - our own tools and arguments
        argv, input=stdin.encode(), capture_output=True, timeout=_TIMEOUT, check=False
    )
    if result.returncode != 0:
        said = result.stderr.decode(errors="replace").strip()[-300:]
        raise OSError(f"{' '.join(argv[:3])} failed: {said or result.returncode}")
    return result.stdout.decode()


async def _arun(argv: Sequence[str], stdin: str = "") -> None:
    """``argv`` with ``stdin`` as its input (a pipe written in full before the start: a few
    hundred bytes, far below a pipe's buffer, and no transport to outlive a quick exit)."""
    read, write = os.pipe2(os.O_CLOEXEC)
    try:
        os.write(write, stdin.encode())
        os.close(write)
        write = -1
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    finally:
        os.close(read)
        if write != -1:
            os.close(write)
    _, err = await process.communicate()
    if process.returncode != 0:
        said = err.decode(errors="replace").strip()[-300:]
        raise OSError(f"{' '.join(argv[:3])} failed: {said or process.returncode}")


@contextlib.contextmanager
def entered(path: Path) -> Iterator[None]:
    """The calling thread in the network namespace at ``path`` for the block, then back."""
    target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot enter {path}: {os.strerror(err)}")
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:  # pragma: no cover - root always may
                os.abort()
    finally:
        os.close(target)
        os.close(own)


def joiner(path: Path) -> Callable[[], None]:
    """What a forked child (still root) does before it executes its command: join the network
    namespace at ``path`` (system calls only: the child of a threaded process)."""
    encoded = os.fsencode(path)

    def join() -> None:
        fd = os.open(encoded, os.O_RDONLY | os.O_CLOEXEC)
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            os.write(2, b"atrium: cannot join the instance's network\n")
            os._exit(126)
        os.close(fd)

    return join


def _write_sysctls(path: Path) -> None:
    """Port 80 for any user inside; no IPv6 (the ruleset speaks for IPv4 addresses only)."""
    with entered(path):
        fds = [
            (os.open(f"/proc/sys/net/{name}", os.O_WRONLY | os.O_CLOEXEC), value)
            for name, value in (
                ("ipv4/ip_unprivileged_port_start", b"0\n"),
                ("ipv6/conf/all/disable_ipv6", b"1\n"),
            )
        ]
    for fd, value in fds:
        try:
            os.write(fd, value)
        finally:
            os.close(fd)


def _forwarding_on() -> None:
    """The host forwards IPv4 (what an instance granted egress needs); logged when the shell
    turned it on. The host's table of each shell forwards nothing into or out of its range but
    granted instances' connections."""
    path = Path("/proc/sys/net/ipv4/ip_forward")
    if path.read_text().strip() != "1":
        path.write_text("1\n")
        _LOGGER.warning("network: turned on IPv4 forwarding for apps granted egress")


def resolve(ask: bool | Sequence[str]) -> Egress:
    """An app's granted ask as the table takes it: True, False, or its ``host:port`` entries
    with each name's IPv4 addresses (looked up now; a name that does not resolve reaches
    nothing and is logged). Blocking."""
    if isinstance(ask, bool):
        return ask
    pairs: set[tuple[str, int]] = set()
    for entry in ask:
        host, _, port = entry.rpartition(":")
        try:
            infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
        except (OSError, UnicodeError) as err:
            _LOGGER.warning("network: %s does not resolve (%s): not reachable", entry, err)
            continue
        pairs.update((str(info[4][0]), int(port)) for info in infos)
    return tuple(sorted(pairs))


def alive_pids() -> set[int]:
    return {int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()}


def sweep() -> list[str]:
    """Remove the namespaces, veths and bridges of shells that no longer run; what was removed."""
    ip = _tool("ip")
    alive = alive_pids()
    removed: list[str] = []
    names = sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []
    for name in leftovers(names, alive):
        with contextlib.suppress(OSError):
            _run([ip, "netns", "delete", name])
            removed.append(name)
    links = json.loads(_run([ip, "-j", "link", "show"]) or "[]")
    for name in leftovers((str(link.get("ifname", "")) for link in links), alive):
        with contextlib.suppress(OSError):
            _run([ip, "link", "delete", name])
            removed.append(name)
    nft = _tool("nft")
    tables = [line.split() for line in _run([nft, "list", "tables"]).splitlines()]
    ours = {t[2]: t[1] for t in tables if len(t) == 3 and t[0] == "table"}
    for name in leftovers(ours, alive):
        with contextlib.suppress(OSError):
            _run([nft, "delete", "table", ours[name], name])
            removed.append(f"nft table {name}")
    if removed:
        _LOGGER.warning("network: removed what stopped shells left: %s", ", ".join(removed))
    return removed


class Network:
    """The shell's bridge and its instances' namespaces (see the module docstring)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._ip = _tool("ip")
        self._nft = _tool("nft")
        self._nsenter = _tool("nsenter")
        self._slots: set[int] = set()
        self._leases: set[str] = set()
        #: the namespaces of running instances by name, with what they may reach
        self._held: dict[str, _Held] = {}
        #: the ask revoked for an app and holder, or None (`atrium.state.egress`; the shell
        #: sets it): what `plumb_granted` asks before it plumbs
        self.revoked: Callable[[str, str], Ask | None] = lambda app_id, holder: None
        #: how many times each app and holder's egress was changed (`set_egress`): a spawn that
        #: read the grant before a change made while it plumbed reads it again (`changes`)
        self._changes: dict[tuple[str, str], int] = {}
        #: the host's table forwards for granted instances (`Plan.egress_commands`)
        self._forwards = False
        self._forwarding = asyncio.Lock()
        #: the bridge and the host's table are (being) made: `close` removes them
        self._bridged = False
        self._bridging = asyncio.Lock()
        #: why the bridge could not be made (a range another shell took since the start): the
        #: network stays refused until the shell starts again, as a clash at the start is
        self.refused: str | None = None
        #: called (on the event loop) once the bridge is up: the shell's listener on the
        #: bridge's address binds to it then (`atrium.api.server`)
        self.on_bridge: list[Callable[[], None]] = []

    @classmethod
    def open(cls, plan: Plan) -> Network:
        """Sweep leftovers and refuse a range the host routes elsewhere. Blocking. The bridge and
        the host's table wait for the first instance (`bridge`): most starts of a shell start
        no sandbox, and a bridge costs about 30 ms to make and 60 ms to remove."""
        sweep()
        network = cls(plan)
        network._refuse_a_clash()
        return network

    @property
    def bridged(self) -> bool:
        """Whether the bridge is up (or being made)."""
        return self._bridged

    async def bridge(self) -> None:
        """The bridge and the host's table made, once (the first `plumb` calls it);
        NetworkUnavailable says why not (a range another shell took since the start)."""
        async with self._bridging:
            if self.refused is not None:
                raise NetworkUnavailable(self.refused)
            if not self._bridged:
                try:
                    await asyncio.to_thread(self._make_bridge)
                except NetworkUnavailable as err:
                    self.refused = str(err)
                    _LOGGER.warning("instances get no network of their own: %s", err)
                    raise
                for call in self.on_bridge:
                    call()

    def _make_bridge(self) -> None:
        self._bridged = True  # from here on `close` removes whatever was made
        try:
            # the table first: no moment in which the bridge's range is open to the host
            _run([self._nft, "-f", "-"], self.plan.host_ruleset())
            _run([self._ip, "-batch", "-"], "\n".join(self.plan.bridge_commands()) + "\n")
            # again once the bridge is up: another shell may have taken the range meanwhile
            # (both then step back rather than route the range two ways)
            self._refuse_a_clash()
        except (OSError, NetworkUnavailable) as err:
            self._remove_bridge()
            self._bridged = False
            raise NetworkUnavailable(str(err)) from err

    def _refuse_a_clash(self) -> None:
        routes = json.loads(_run([self._ip, "-j", "-4", "route", "show"]) or "[]")
        problem = clash(self.plan.range, routes, self.plan.bridge)
        if problem is not None:
            raise NetworkUnavailable(f"{problem}: choose another range in ATRIUM_APP_NETWORK")

    def close(self) -> None:
        """Remove the bridge and every namespace still held. Blocking."""
        for name in sorted(self._leases):
            with contextlib.suppress(OSError):
                _run([self._ip, "netns", "delete", name])
        self._leases.clear()
        for held in self._held.values():
            os.close(held.fd)
        self._held.clear()
        self._forwards = False
        if self._bridged:
            self._remove_bridge()
            self._bridged = False

    def _remove_bridge(self) -> None:
        """The bridge and the host's table, each if there."""
        with contextlib.suppress(OSError):
            _run([self._nft, "delete", "table", "inet", self.plan.bridge])
        with contextlib.suppress(OSError):
            _run([self._ip, "link", "delete", self.plan.bridge])

    async def plumb(self, key: tuple[str, str] | None = None, egress: Egress = False) -> Lease:
        """A namespace for one instance, joined to the bridge (made now if it is the first),
        its firewall in place. ``key``: the app and holder its egress is granted for
        (`set_egress` changes all of theirs); ``egress``: what it may reach now."""
        await self.bridge()
        number = next(_instances)
        slot = next(n for n in range(len(self._slots) + 1) if n not in self._slots)
        self._slots.add(slot)
        plan = self.plan
        lease = Lease(number, slot, netns_name(plan.shell_pid, number), str(plan.address(slot)))
        self._leases.add(lease.netns)
        try:
            await _arun(
                [self._ip, "-batch", "-"], "\n".join(plan.host_commands(number, slot)) + "\n"
            )
            _write_sysctls(lease.path)
            # the firewall names no interface of the namespace but its loopback: both at once
            await asyncio.gather(
                _arun(
                    [self._ip, "-n", lease.netns, "-batch", "-"],
                    "\n".join(plan.inside_commands(slot)) + "\n",
                ),
                _arun(
                    [self._nsenter, f"--net={lease.path}", self._nft, "-f", "-"],
                    plan.ruleset(egress),
                ),
            )
            fd = os.open(lease.path, os.O_RDONLY | os.O_CLOEXEC)
            self._held[lease.netns] = _Held(fd, key, lease.address, False)
            if egress is not False:
                await self._open_egress(self._held[lease.netns], egress)
        except BaseException:
            await self.release(lease)
            raise
        return lease

    async def plumb_granted(self, key: tuple[str, str] | None, ask: Ask) -> Lease:
        """`plumb` for an instance of ``key`` (the app and holder) whose manifest asks ``ask``:
        it reaches that if it was granted and is not revoked (`revoked`). A revoke or grant
        made while it plumbs is read again and made true for all of ``key``'s instances."""
        if key is None or ask is False:
            return await self.plumb(key)
        before = self.changes(key)
        lease = await self.plumb(key, await self._granted(key, ask))
        if self.changes(key) != before:
            await self.set_egress(key, await self._granted(key, ask))
        return lease

    async def _granted(self, key: tuple[str, str], ask: Ask) -> Egress:
        """What ``key``'s instances may reach now: ``ask`` unless revoked (`atrium.egress`)."""
        given = granted(ask, self.revoked(*key))
        return False if given is False else await asyncio.to_thread(resolve, given)

    async def set_egress(self, key: tuple[str, str], egress: Egress) -> int:
        """What the running instances of ``key`` may reach, changed at once: each one's table
        replaced (in one nft transaction) and the host's ``egress`` set updated. How many
        instances it changed."""
        self._changes[key] = self._changes.get(key, 0) + 1
        changed = 0
        for held in [h for h in self._held.values() if h.key == key]:
            if egress is False:
                await self._close_egress(held)
            text = f"delete table inet atrium\n{self.plan.ruleset(egress)}"
            namespace = f"/proc/{os.getpid()}/fd/{held.fd}"
            await _arun([self._nsenter, f"--net={namespace}", self._nft, "-f", "-"], text)
            if egress is not False:
                await self._open_egress(held, egress)
            changed += 1
        return changed

    def changes(self, key: tuple[str, str]) -> int:
        """How many times ``key``'s egress was changed so far."""
        return self._changes.get(key, 0)

    async def _open_egress(self, held: _Held, egress: Egress) -> None:
        """The host forwards and masquerades ``held``'s address (forwarding on, if it was not)."""
        if held.egress is False:
            async with self._forwarding:
                if not self._forwards:
                    await asyncio.to_thread(_forwarding_on)
                    await _arun([self._nft, "-f", "-"], self.plan.egress_commands())
                    self._forwards = True
            element = f"add element inet {self.plan.bridge} egress {{ {held.address} }}\n"
            await _arun([self._nft, "-f", "-"], element)
        held.egress = egress

    async def _close_egress(self, held: _Held) -> None:
        if held.egress is not False:
            element = f"delete element inet {self.plan.bridge} egress {{ {held.address} }}\n"
            with contextlib.suppress(OSError):  # a table already gone (a shell closing)
                await _arun([self._nft, "-f", "-"], element)
        held.egress = False

    def unname(self, lease: Lease) -> None:
        """The namespace's name removed once the sandbox joined it: the namespace then lives
        exactly as long as the sandbox's processes (with its veth pair and firewall), so a shell
        killed with SIGKILL, whose sandboxes die with it, leaves none behind."""
        if _libc.umount2(os.fsencode(lease.path), MNT_DETACH) != 0:
            err = ctypes.get_errno()
            _LOGGER.warning("network: %s keeps its name: %s", lease.netns, os.strerror(err))
            return
        with contextlib.suppress(FileNotFoundError):
            lease.path.unlink()

    async def release(self, lease: Lease) -> None:
        """The namespace deleted (its veth pair and firewall go with it), its address free;
        once (a second release of the same lease does nothing)."""
        if lease.netns not in self._leases:
            return
        self._leases.discard(lease.netns)
        held = self._held.pop(lease.netns, None)
        if held is not None:
            await self._close_egress(held)
            os.close(held.fd)
        veth = veth_name(self.plan.shell_pid, lease.number)
        try:
            if lease.path.exists():
                await _arun([self._ip, "netns", "delete", lease.netns])
        except OSError as err:
            _LOGGER.warning("network: %s could not be removed: %s", lease.netns, err)
        try:
            # the pair deleted now, by its host end: the kernel tears a namespace down after its
            # last process, later (seconds on a busy machine), and until then its veth stayed on
            # the bridge with the address's one MAC, where the bridge sent the shell's packets
            # for the next instance on that address (whose start then met its deadline)
            if (SYS_NET / veth).exists():
                await _arun([self._ip, "link", "delete", veth])
        except OSError as err:
            if (SYS_NET / veth).exists():  # not gone meanwhile with its namespace
                _LOGGER.warning("network: %s could not be removed: %s", veth, err)
        finally:
            self._slots.discard(lease.slot)


def isolation_here(text: str, apps: str = "all") -> str:
    """Which network instances of a shell started here with ``ATRIUM_APP_NETWORK`` = ``text``
    (and ``ATRIUM_APP_NETWORK_APPS`` = ``apps``) would get, in words, without making anything
    (`atrium doctor`). Blocking (runs ``ip`` and bwrap once)."""
    from atrium.lifecycle.runners.bwrap import bwrap_works

    shared = "contract apps share the host's network"
    loopback = "image apps in a loopback-only namespace behind a forwarder"
    why: str | None = None
    if text == "off":
        why = "ATRIUM_APP_NETWORK is off"
    elif os.geteuid() != 0:
        from atrium.lifecycle.slirp import rootless_isolation

        return rootless_isolation()
    else:
        why = bwrap_works()
    if why is None:
        try:
            network = parse_range(text)
            routes = json.loads(_run([_tool("ip"), "-j", "-4", "route", "show"]) or "[]")
            _tool("nft"), _tool("nsenter")
            ours = [r for r in routes if owner_pid(str(r.get("dev", ""))) is None]
            problem = clash(network, ours, "")
            if problem is not None:
                why = f"{problem}: choose another range in ATRIUM_APP_NETWORK"
        except (ValueError, OSError, NetworkUnavailable) as err:
            why = str(err)
    if why is not None:
        return f"network: {loopback}; {shared} ({why})"
    if apps == "all":
        return (
            f"network: each image instance and each contract app under bwrap in its own "
            f"namespace on {text}, reaching only the shell's API (the process runner's apps "
            "share the host's network)"
        )
    return (
        f"network: each image instance in its own namespace on {text}, reaching only the "
        f"shell's API; {shared} (ATRIUM_APP_NETWORK_APPS=images)"
    )


def open_network(text: str, shell_port: int) -> Network:
    """The shell's network for ``ATRIUM_APP_NETWORK`` = ``text``; NetworkUnavailable says why
    not (not root, no tools, a clash). Blocking."""
    if os.geteuid() != 0:
        raise NetworkUnavailable("the shell does not run as root")
    try:
        plan = Plan(parse_range(text), os.getpid(), shell_port, next(_shells))
    except ValueError as err:
        raise NetworkUnavailable(str(err)) from err
    return Network.open(plan)


__all__ = [
    "DEFAULT_RANGE",
    "SHELL_MARK",
    "Egress",
    "Lease",
    "Network",
    "NetworkUnavailable",
    "Plan",
    "clash",
    "isolation_here",
    "joiner",
    "leftovers",
    "mac_of",
    "open_network",
    "resolve",
    "sweep",
]
