"""A network of its own for an image instance when the shell is not root: slirp4netns.

A shell that is not root makes no bridge and no named namespace (`atrium.lifecycle.network`).
Its image sandboxes then get bubblewrap's own network namespace (``--unshare-net``, owned by the
sandbox's user namespace, which the shell's uid owns) and, attached to it:

- inbound: a socket maker (`SocketMaker`) in the sandbox's user and network namespaces hands the
  shell one new socket of that network per connection; the shell's forwarder
  (`atrium.lifecycle.runners.image.Forwarder`) on the instance's loopback port, which serves only
  the shell's own connections, connects it to the image's port on the image's loopback;
- outbound: one slirp4netns process (user-mode TCP/IP in the host's namespace, as the shell's
  uid, ``--disable-host-loopback``, its seccomp filter) and an nft table inside
  the namespace (`ruleset`, written by the shell before the image runs: the sandbox holds no
  CAP_NET_ADMIN and cannot change it) that drops everything the image opens except on its own
  loopback. Granted egress (slirp's NAT to the outside) is `ruleset`'s ``egress`` lines: none
  today;
- both die with the shell (``PR_SET_PDEATHSIG``; slirp4netns's ``--exit-fd`` and the maker's
  socket, whose only other ends the shell holds, close at a ``kill -9`` of the shell) and are
  stopped with the instance.

slirp4netns opens ``/dev/net/tun`` as the shell's uid: where that device is not open to every
user (mode 0600), or slirp4netns is missing, image apps are refused under a shell that is not
root (`slirp_problem` says why; ``atrium doctor`` reports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import shutil
import socket
import sys
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Final

#: the sandbox's side of slirp's network (its defaults)
TAP: Final = "tap0"
MTU: Final = 65520
LOW_PORTS: Final = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
PR_SET_PDEATHSIG: Final = 1
#: ioctl of a namespace: an fd of the user namespace that owns it
NS_GET_USERNS: Final = 0xB701
_SIGKILL: Final = 9
_READY_TIMEOUT: Final = 10.0
_MAPPED_TIMEOUT: Final = 10.0
_MAPPED_POLL: Final = 0.005
_libc = ctypes.CDLL(None, use_errno=True)


def slirp_command() -> str | None:
    return shutil.which("slirp4netns", path="/usr/bin:/bin:/usr/sbin:/sbin")


@cache
def slirp_problem() -> str | None:
    """Why slirp4netns cannot give a sandbox a network here (None: it can). Probed once: the
    command, and ``/dev/net/tun`` opened as the shell's uid (slirp4netns opens it so)."""
    if slirp_command() is None:
        return "slirp4netns is not installed"
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    except OSError as err:
        return f"/dev/net/tun cannot be opened by the shell's user ({err.strerror})"
    os.close(fd)
    return None


def rootless_isolation() -> str:
    """What ``atrium doctor`` says of the network of a shell that is not root. Blocking (runs
    bwrap once)."""
    from atrium.lifecycle.runners.bwrap import bwrap_works

    shared = "contract apps share the host's network (the shell does not run as root)"
    problem = bwrap_works() or slirp_problem()
    if problem is not None:
        return (
            "network: image apps cannot run (they need a root shell, or bubblewrap and "
            f"slirp4netns: {problem}); {shared}"
        )
    return (
        "network: each image instance in a namespace of its own behind slirp4netns, reaching "
        f"nothing; {shared}"
    )


def ruleset(egress: Sequence[str] = ()) -> str:
    """The namespace's nft table: nothing goes out but on its loopback and on connections made
    to it; nothing comes in but on the loopback (the shell's connections, through `SocketMaker`)
    and those answers. ``egress``: nft rule lines of the out chain a grant adds (e.g. ``ip daddr
    192.0.2.7 tcp dport 443 accept``), which slirp4netns then carries out; none without one."""
    granted = "".join(f"    {line}\n" for line in egress)
    return (
        "table inet atrium {\n"
        "  chain out {\n"
        "    type filter hook output priority 0; policy drop;\n"
        '    oifname "lo" accept\n'
        "    ct state established,related accept\n"
        f"{granted}"
        "  }\n"
        "  chain in {\n"
        "    type filter hook input priority 0; policy drop;\n"
        '    iifname "lo" accept\n'
        "    ct state established,related accept\n"
        "  }\n"
        "}\n"
    )


def _die_with_shell() -> None:
    """In the forked child: SIGKILL when the shell dies (system calls only)."""
    _libc.prctl(PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)


def _owner_mapped(pid: int) -> bool:
    """Whether the user namespace that owns ``pid``'s network namespace has its id maps. Until
    it has, the shell's uid is no one there: a process entering it loses its capabilities at
    ``execve`` (not root in it) and cannot write the namespace's sysctl or table."""
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        owner = fcntl.ioctl(net, NS_GET_USERNS)
        try:
            known = os.fstat(owner)
        finally:
            os.close(owner)
    finally:
        os.close(net)
    now = Path(f"/proc/{pid}/ns/user").stat()
    if (now.st_dev, now.st_ino) != (known.st_dev, known.st_ino):
        return True  # bwrap nested a second namespace, which it does after mapping the first
    return all(Path(f"/proc/{pid}/{name}").read_text().strip() for name in ("uid_map", "gid_map"))


async def owner_mapped(pid: int) -> None:
    """Wait until the sandbox's user namespace has its id maps (`_owner_mapped`), before the
    shell enters it (`entering`). A bwrap that is not setuid gives its child's pid (``--info-fd``)
    before that child wrote its own maps: entered in between, the table and ``LOW_PORTS`` fail
    with "Permission denied" (seen under load). OSError when the sandbox ended or never maps."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _MAPPED_TIMEOUT
    while not _owner_mapped(pid):
        if loop.time() > deadline:
            raise OSError(f"the sandbox's user namespace got no id map in {_MAPPED_TIMEOUT:.0f} s")
        await asyncio.sleep(_MAPPED_POLL)


@contextlib.contextmanager
def entering(pid: int) -> Iterator[tuple[list[str], tuple[int, int]]]:
    """``nsenter`` into the network namespace of ``pid`` and the user namespace that owns it,
    and the two descriptors to pass it. That owner is not always ``pid``'s own user namespace:
    bwrap nests a second one when the image's user is not root inside. The namespace must have
    its id maps first (`owner_mapped`)."""
    nsenter = shutil.which("nsenter", path="/usr/bin:/bin:/usr/sbin:/sbin") or "nsenter"
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        user = fcntl.ioctl(net, NS_GET_USERNS)
        try:
            prefix = [
                nsenter,
                f"--user=/proc/self/fd/{user}",
                f"--net=/proc/self/fd/{net}",
                "--preserve-credentials",
            ]
            yield prefix, (user, net)
        finally:
            os.close(user)
    finally:
        os.close(net)


async def run_inside(pid: int, argv: Sequence[str], stdin: str) -> None:
    """``argv`` in the network namespace of ``pid`` as its owner (`entering`)."""
    with entering(pid) as (prefix, fds):
        process = await asyncio.create_subprocess_exec(
            *prefix,
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=fds,
        )
    _, err = await process.communicate(stdin.encode())
    if process.returncode != 0:
        said = err.decode(errors="replace").strip()[-300:]
        raise OSError(f"{argv[0]} in the sandbox's network failed: {said or process.returncode}")


#: the socket maker's program (`SocketMaker`): one TCP socket of its network namespace sent
#: back for each byte read on fd ``argv[1]``; it ends at that socket's end
MAKER: Final = (
    "import socket,sys\n"
    "c=socket.socket(fileno=int(sys.argv[1]))\n"
    "while c.recv(1):\n"
    " s=socket.socket(socket.AF_INET,socket.SOCK_STREAM)\n"
    " socket.send_fds(c,[b'1'],[s.fileno()])\n"
    " s.close()\n"
)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SocketMaker:
    """A small process in the sandbox's user and network namespaces (not its pid namespace:
    the image cannot see it) that hands the shell new TCP sockets of that network, one per
    connection: a shell that is not root cannot enter the namespace itself (``setns`` asks for
    ``CAP_SYS_ADMIN`` in its own user namespace too), and a socket keeps the namespace it was
    made in. So only the shell's forwarder, which checks that a connection is the shell's own,
    reaches the image's port: slirp4netns's forward would serve every local user. It ends when
    the shell closes its end (the instance ended, or the shell died) and at the shell's death."""

    def __init__(self, process: asyncio.subprocess.Process, end: socket.socket) -> None:
        self.process = process
        self._end = end
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, pid: int, log_path: Path) -> SocketMaker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log = log_path.open("ab")
        try:
            with entering(pid) as (prefix, fds):
                process = await asyncio.create_subprocess_exec(
                    *prefix,
                    sys.executable,
                    "-S",
                    "-I",
                    "-c",
                    MAKER,
                    str(theirs.fileno()),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=log,
                    pass_fds=(theirs.fileno(), *fds),
                    preexec_fn=_die_with_shell,
                    start_new_session=True,
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            log.close()
        ours.setblocking(False)
        return cls(process, ours)

    async def socket(self) -> socket.socket:
        """A new TCP socket of the sandbox's network (non-blocking); OSError when the maker is
        gone."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            await loop.sock_sendall(self._end, b"1")
            while True:
                try:
                    _, fds, _, _ = socket.recv_fds(self._end, 1, 1)
                    break
                except BlockingIOError:
                    ready: asyncio.Future[None] = loop.create_future()
                    loop.add_reader(self._end.fileno(), _settle, ready)
                    try:
                        await ready
                    finally:
                        loop.remove_reader(self._end.fileno())
        if not fds:
            raise OSError("the image's socket maker ended")
        made = socket.socket(fileno=fds[0])
        for extra in fds[1:]:
            os.close(extra)
        made.setblocking(False)
        return made

    async def close(self) -> None:
        """Stop the maker (its end closed, then SIGKILL if it lingers); once."""
        self._end.close()
        try:
            await asyncio.wait_for(self.process.wait(), 2)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()


class Slirp:
    """One slirp4netns process attached to a sandbox's network namespace: its link to the
    outside, which the namespace's table closes (`ruleset`) but for granted egress."""

    def __init__(self, process: asyncio.subprocess.Process, exit_w: int) -> None:
        self.process = process
        self._exit_w = exit_w

    @classmethod
    async def attach(cls, pid: int, log_path: Path, egress: Sequence[str] = ()) -> Slirp:
        """slirp4netns for the namespace of ``pid``, the namespace's table written first, its
        messages in the instance's log; OSError says what failed (nothing is left)."""
        command = slirp_command()
        if command is None:
            raise OSError("slirp4netns is not installed")
        nft = shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin:/bin")
        if nft is None:
            raise OSError("the nft command is not installed")
        # bwrap gives the sandbox's pid before its child mapped its ids: not to be entered yet
        await owner_mapped(pid)
        # the table before the tap exists: no moment in which the image reaches out; any user of
        # the image may bind any port there (its ``User`` serves on port 80, as a container
        # runtime allows)
        await run_inside(
            pid,
            ["/bin/sh", "-c", f'echo 0 > {LOW_PORTS} && exec "$0" -f -', nft],
            ruleset(egress),
        )
        exit_r, exit_w = os.pipe2(os.O_CLOEXEC)
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        log = log_path.open("ab")
        try:
            with entering(pid) as (_, (user, net)):
                # no --enable-sandbox: its parent sets its ids to 0 in the sandbox's user
                # namespace, which bwrap's map refuses there (``setegid(0)``)
                process = await asyncio.create_subprocess_exec(
                    command,
                    "--configure",
                    f"--mtu={MTU}",
                    "--disable-host-loopback",
                    "--enable-seccomp",
                    f"--exit-fd={exit_r}",
                    f"--ready-fd={ready_w}",
                    "--netns-type=path",
                    f"--userns-path=/proc/self/fd/{user}",
                    f"/proc/self/fd/{net}",
                    TAP,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=log,
                    pass_fds=(exit_r, ready_w, user, net),
                    preexec_fn=_die_with_shell,
                    start_new_session=True,
                )
        except BaseException:
            for fd in (exit_r, exit_w, ready_r, ready_w):
                os.close(fd)
            raise
        finally:
            log.close()
        os.close(exit_r)
        os.close(ready_w)
        slirp = cls(process, exit_w)
        try:
            loop = asyncio.get_running_loop()
            ready = await asyncio.wait_for(
                loop.run_in_executor(None, os.read, ready_r, 1), _READY_TIMEOUT
            )
            if ready != b"1":
                raise OSError("slirp4netns did not start (its messages are in the instance's log)")
        except BaseException:
            await slirp.close()
            raise
        finally:
            os.close(ready_r)
        return slirp

    async def close(self) -> None:
        """Stop slirp4netns (its exit fd closed, then SIGKILL if it lingers); once."""
        if self._exit_w != -1:
            os.close(self._exit_w)
            self._exit_w = -1
        try:
            await asyncio.wait_for(self.process.wait(), 2)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()


__all__ = [
    "Slirp",
    "SocketMaker",
    "owner_mapped",
    "rootless_isolation",
    "ruleset",
    "slirp_problem",
]
