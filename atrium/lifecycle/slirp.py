"""A network of its own for an image instance when the shell is not root: slirp4netns.

A shell that is not root makes no bridge and no named namespace (`atrium.lifecycle.network`).
Its image sandboxes then get bubblewrap's own network namespace (``--unshare-net``, owned by the
sandbox's user namespace, which the shell's uid owns) and, attached to it, one slirp4netns
process (user-mode TCP/IP in the host's namespace, as the shell's uid):

- inbound: slirp4netns forwards the loopback port the shell allocated for the instance
  (``127.0.0.1:<port>``, where the shell's proxy connects) to the image's port inside;
- outbound: ``--disable-host-loopback`` keeps the host's loopback out of reach through the
  gateway, and an nft table inside the namespace (`ruleset`, written by the shell before the
  image runs: the sandbox holds no CAP_NET_ADMIN and cannot change it) drops everything the
  image opens except on its own loopback. Granted egress (slirp's NAT to the outside) is
  `ruleset`'s ``egress`` lines: none today;
- slirp4netns runs with its own sandbox and seccomp filter, dies with the shell
  (``PR_SET_PDEATHSIG`` and ``--exit-fd``: the shell holds the only write end, so a ``kill -9``
  of the shell closes it) and is stopped with the instance (`Slirp.close`).

slirp4netns opens ``/dev/net/tun`` as the shell's uid: where that device is not open to every
user (mode 0600), nothing is attached and the instance keeps a loopback-only namespace behind
the shell's forwarder... which a shell that is not root cannot reach either, so image apps are
refused there (`slirp_problem` says why; ``atrium doctor`` reports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Final

#: the sandbox's side of slirp's network (its defaults)
TAP: Final = "tap0"
GATEWAY: Final = "10.0.2.2"
MTU: Final = 65520
PR_SET_PDEATHSIG: Final = 1
_SIGKILL: Final = 9
_READY_TIMEOUT: Final = 10.0
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


def ruleset(port: int, egress: Sequence[str] = ()) -> str:
    """The namespace's nft table: nothing goes out but on its loopback and on connections made
    to it; nothing comes in but on the loopback, those answers, and the image's ``port`` from
    slirp's gateway (the forward). ``egress``: nft rule lines of the out chain a grant adds
    (e.g. ``ip daddr 192.0.2.7 tcp dport 443 accept``); none without one."""
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
        f"    ip saddr {GATEWAY} tcp dport {port} accept\n"
        "  }\n"
        "}\n"
    )


def _die_with_shell() -> None:
    """In the forked child: SIGKILL when the shell dies (system calls only)."""
    _libc.prctl(PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)


async def _run_inside(pid: int, argv: Sequence[str], stdin: str) -> None:
    """``argv`` in the user and network namespaces of ``pid`` (the shell's uid owns them)."""
    nsenter = shutil.which("nsenter", path="/usr/bin:/bin:/usr/sbin:/sbin") or "nsenter"
    process = await asyncio.create_subprocess_exec(
        nsenter,
        f"--target={pid}",
        "--user",
        "--net",
        "--preserve-credentials",
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate(stdin.encode())
    if process.returncode != 0:
        said = err.decode(errors="replace").strip()[-300:]
        raise OSError(f"{argv[0]} in the sandbox's network failed: {said or process.returncode}")


class Slirp:
    """One slirp4netns process attached to a sandbox's network namespace."""

    def __init__(self, process: asyncio.subprocess.Process, exit_w: int, folder: Path) -> None:
        self.process = process
        self._exit_w = exit_w
        self._folder = folder

    @classmethod
    async def attach(
        cls, pid: int, host: tuple[str, int], guest_port: int, log_path: Path
    ) -> Slirp:
        """slirp4netns for the namespace of ``pid`` with the firewall in place and the forward
        ``host`` (the loopback address and port the shell connects to) → ``guest_port``, its messages in the instance's log; OSError
        says what failed (nothing is left)."""
        command = slirp_command()
        if command is None:
            raise OSError("slirp4netns is not installed")
        nft = shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin:/bin")
        if nft is None:
            raise OSError("the nft command is not installed")
        # the firewall before the tap exists: no moment in which the image reaches out
        await _run_inside(pid, [nft, "-f", "-"], ruleset(guest_port))
        folder = Path(tempfile.mkdtemp(prefix="atrium-slirp-"))
        socket_path = folder / "api.sock"
        exit_r, exit_w = os.pipe2(os.O_CLOEXEC)
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        log = log_path.open("ab")
        try:
            process = await asyncio.create_subprocess_exec(
                command,
                "--configure",
                f"--mtu={MTU}",
                "--disable-host-loopback",
                "--enable-sandbox",
                "--enable-seccomp",
                f"--exit-fd={exit_r}",
                f"--ready-fd={ready_w}",
                f"--api-socket={socket_path}",
                str(pid),
                TAP,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
                pass_fds=(exit_r, ready_w),
                preexec_fn=_die_with_shell,
                start_new_session=True,
            )
        except BaseException:
            for fd in (exit_r, exit_w, ready_r, ready_w):
                os.close(fd)
            shutil.rmtree(folder, ignore_errors=True)
            raise
        finally:
            log.close()
        os.close(exit_r)
        os.close(ready_w)
        slirp = cls(process, exit_w, folder)
        try:
            loop = asyncio.get_running_loop()
            ready = await asyncio.wait_for(
                loop.run_in_executor(None, os.read, ready_r, 1), _READY_TIMEOUT
            )
            if ready != b"1":
                raise OSError("slirp4netns did not start (its messages are in the instance's log)")
            await slirp._add_forward(host, guest_port)
        except BaseException:
            await slirp.close()
            raise
        finally:
            os.close(ready_r)
            # the one forward is made: no one needs the API again, and a shell killed later
            # leaves no folder behind
            shutil.rmtree(folder, ignore_errors=True)
        return slirp

    async def _add_forward(self, host: tuple[str, int], guest_port: int) -> None:
        reader, writer = await asyncio.open_unix_connection(str(self._folder / "api.sock"))
        try:
            request = {
                "execute": "add_hostfwd",
                "arguments": {
                    "proto": "tcp",
                    "host_addr": host[0],
                    "host_port": host[1],
                    "guest_port": guest_port,
                },
            }
            writer.write(json.dumps(request).encode())
            writer.write_eof()
            answer = json.loads(await asyncio.wait_for(reader.read(), _READY_TIMEOUT) or b"{}")
        finally:
            writer.close()
        if "return" not in answer:
            raise OSError(f"slirp4netns refused the forward of {host[0]}:{host[1]}: {answer}")

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
        shutil.rmtree(self._folder, ignore_errors=True)


__all__ = ["Slirp", "rootless_isolation", "ruleset", "slirp_problem"]
