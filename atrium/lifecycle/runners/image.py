"""Image apps: an unpacked OCI image (`atrium.images.store`) run as an app under bubblewrap.

What the image sees (built by ``image_argv``), for a shell running as root:

- its own user namespace mapping uids and gids 0-65535 to a block of 65536 host ids of its own
  (`image_ids`: per app and user, apart from the contract apps' ids), written by the shell from
  outside: bwrap starts under the block's first id (``setpriv``), makes the namespace, tells the
  shell its pid (``--info-fd``) and waits (``--userns-block-fd``) until the shell wrote the map.
  Root inside is an unprivileged host uid; the image's ``User`` (`atrium.images.config.launch`)
  is ``--uid``/``--gid`` inside, so another of the block's ids on the host;
- its own pid, IPC, UTS and network namespaces. With the shell's network
  (`atrium.lifecycle.network`) the network namespace is one the shell made, joined to the
  shell's bridge: the shell reaches the image's port at the instance's address, and the image
  reaches only the shell's API. Without it, the namespace holds only a loopback and the shell
  reaches the image's port through a forwarder (`Forwarder`) listening on the loopback port the
  shell allocated, which opens each connection from inside the image's network namespace; the
  image then reaches nothing;
- the image's root read-only (the store's entry, shared by every instance of the digest), the
  runtime ``data`` folders bound read-write from the instance's data folder (``<data>/<path>``),
  a tmpfs ``/tmp`` and ``/run``, its own ``/proc`` and ``/dev``;
- the capabilities a container runtime gives by default, inside its namespace only (root inside
  may ``chown`` in its data, bind port 80 in its own network, drop to another uid); none on the
  host;
- exactly the image's environment laid over by the manifest's ``env``: none of the Atrium
  contract's (no token, no shell secret: the image does not speak the contract).

The data folder and its ``data`` sub-folders belong to the user the image runs as (host ids of the
block). A mount point a ``data`` path needs in the image is made in the store's entry (an empty
folder), resolved without following any link: a link on the way refuses the spawn (cause
``mount``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
import socket
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from atrium.errors import SpawnFailed
from atrium.images.config import Launch
from atrium.lifecycle.network import Lease, Network
from atrium.lifecycle.runners import AppUser, SpawnSpec
from atrium.lifecycle.runners.bwrap import (
    SandboxedChild,
    bwrap_command,
    classify_early_exit,
    setpriv_command,
)
from atrium.lifecycle.runners.process import (
    LocalRunner,
    give_data_dir,
    local_port,
    lock_data_dir,
    prepare_dirs,
    start_child,
)

_LOGGER = logging.getLogger(__name__)

#: first host id of the image apps' blocks: right above the contract apps' ids
#: (`atrium.lifecycle.spawning.APP_UID_BASE` + its span), below 2**31 (systemd leaves
#: 1879048192-2147483647 unused)
IMAGE_ID_BASE: Final = 0x71000000
#: ids one image may use inside: 0-65535, as a container runtime maps them
IMAGE_ID_COUNT: Final = 65536
IMAGE_BLOCKS: Final = (0x80000000 - IMAGE_ID_BASE) // IMAGE_ID_COUNT
#: what docker grants a container's root by default, held only inside the image's namespaces
CAPABILITIES: Final = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
)
CLONE_NEWNET: Final = 0x40000000
CLONE_NEWNS: Final = 0x00020000
MS_NOSUID: Final = 2
MS_NODEV: Final = 4
MS_BIND: Final = 4096
MS_REC: Final = 16384
MS_PRIVATE: Final = 1 << 18
#: where the child's own mount namespace shows the image's root and data folders to bwrap
RELAY: Final = "/tmp"  # noqa: S108 - a tmpfs of the child's own mount namespace
_MAX_LINKS: Final = 40
_INFO_LIMIT: Final = 4096
_BUFFER: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class ImageRun:
    """What an image instance runs besides the usual spec: the store's root file system, the
    launch (argv, environment, folder, port, user inside) and the ``data`` folders."""

    rootfs: Path
    launch: Launch
    #: the first host id of the instance's block (`image_ids`)
    ids: AppUser
    data: tuple[str, ...] = ()

    @property
    def host_user(self) -> AppUser:
        """The host ids of the image's user (its ``User``, in the block)."""
        return AppUser(self.ids.uid + self.launch.uid, self.ids.gid + self.launch.gid)


def image_ids(app_id: str, owner: str | None = None) -> AppUser:
    """The first host uid/gid of the block an image app's namespace maps 0-65535 onto.

    One block per app and user, stable, with no table to keep (as `spawning.app_user`), taken
    from 3,840 blocks above the contract apps' ids so an image's ids never meet theirs. Two image
    apps share a block on a hash collision (about 1 in 80 for 10 of them): each still sees only its
    own mounts, processes and network, so what they could share is a file neither can name.
    """
    key = app_id if owner is None else f"{app_id}\0{owner}"
    block = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % IMAGE_BLOCKS
    first = IMAGE_ID_BASE + block * IMAGE_ID_COUNT
    return AppUser(uid=first, gid=first)


def _step(parent: int, name: str, *, create: bool) -> tuple[int, str | None]:
    """Open ``name`` in the folder ``parent`` without following it: its fd, or the link target."""
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent), None
    except FileNotFoundError:
        if not create:
            raise
        os.mkdir(name, 0o755, dir_fd=parent)
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent), None
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.EMLINK):
            raise
        return -1, os.readlink(name, dir_fd=parent)


def open_inside(root: Path, path: str, *, create: bool = False, links: bool = True) -> int:
    """An fd of ``path`` resolved as the image sees it, ``root`` being its ``/``: a link is read
    and followed inside ``root`` (an absolute target from ``root``, ``..`` never above it), so no
    link leads out of the image. ``create``: missing folders are made (0755). ``links`` False: a
    link on the way is refused (OSError ELOOP)."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    stack = [root_fd]
    pending = [p for p in path.split("/") if p not in ("", ".")]
    hops = 0
    try:
        while pending:
            name = pending.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            fd, target = _step(stack[-1], name, create=create)
            if target is None:
                stack.append(fd)
                continue
            hops += 1
            if not links or hops > _MAX_LINKS:
                raise OSError(errno.ELOOP, f"{path!r} goes through a link in the image", name)
            if target.startswith("/"):
                while len(stack) > 1:
                    os.close(stack.pop())
            pending = [p for p in target.split("/") if p not in ("", ".")] + pending
        return os.dup(stack[-1])
    finally:
        for fd in stack:
            os.close(fd)


def read_inside(root: Path, path: str, limit: int = 1 << 20) -> str:
    """The text of the image's file ``path`` (links followed inside the image), or ''."""
    try:
        fd = open_inside(root, path)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return ""
        return file.read(limit).decode(errors="replace")


def make_mount_points(rootfs: Path, paths: Sequence[str]) -> None:
    """Empty folders in the image's root for its ``data`` paths, made without following a link:
    bubblewrap makes a missing one through the host's view of the path, where an absolute link in
    the image would lead out of it."""
    for path in paths:
        try:
            fd = open_inside(rootfs, path, create=True, links=False)
        except OSError as err:
            raise OSError(
                err.errno, f"the image's {path} cannot be a data folder: {err.strerror}", path
            ) from err
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise OSError(errno.ENOTDIR, f"the image's {path} is not a folder", path)
        finally:
            os.close(fd)


def image_argv(
    spec: SpawnSpec, run: ImageRun, bwrap: str, ids: AppUser, fds: Fds, *, joined: bool = False
) -> list[str]:
    """``setpriv`` to the host id of the image's user, then bwrap building the sandbox;
    ``joined``: the child already joined the shell's namespace for it (no network of bwrap's)."""
    setpriv = setpriv_command()
    if setpriv is None:
        raise SpawnFailed(
            f"cannot start {spec.app_id!r}: 'setpriv' (util-linux) is not in /usr/bin or /bin",
            app_id=spec.app_id,
            cause="mount",
        )
    # bwrap does not change ids once the shell wrote the map (``--uid`` only chooses the map it
    # would write itself): it starts as the host id of the image's user, which the map shows as
    # that user inside
    launch = run.launch
    uid, gid = ids.uid + launch.uid, ids.gid + launch.gid
    drop = [str(setpriv), f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all"]
    options = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        *(() if joined else ("--unshare-net",)),
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--info-fd",
        str(fds.info),
        "--userns-block-fd",
        str(fds.block),
        "--sync-fd",
        str(fds.lock),
        "--cap-drop",
        "ALL",
    ]
    if launch.uid == 0:
        for capability in CAPABILITIES:
            options += ["--cap-add", capability]
    relayed = relay_points(run)
    options += ["--ro-bind", relayed[0][1], "/", "--proc", "/proc", "--dev", "/dev"]
    for scratch in ("/tmp", "/run"):  # noqa: S108
        # an image whose /run is a link (to /var/run) keeps it: a mount there would follow it
        if (run.rootfs / scratch[1:]).is_dir() and not (run.rootfs / scratch[1:]).is_symlink():
            options += ["--perms", "1777" if scratch == "/tmp" else "0755", "--tmpfs", scratch]  # noqa: S108
    for path, (_, point) in zip(run.data, relayed[1:], strict=True):
        options += ["--bind", point, path]
    # the image's environment is set by bwrap for the command alone, read from a file (`--args`),
    # never on a command line (readable by every user of the host, and a manifest's env may hold
    # a password), nor the environment setpriv and bwrap start with (`HOST_ENV`, `env_args`)
    options += ["--args", str(fds.env)]
    options += ["--hostname", spec.instance_id[:63], "--chdir", launch.cwd]
    return [*drop, bwrap, *options, "--", *launch.argv]


def relay_points(run: ImageRun, data_dir: Path | None = None) -> list[tuple[str, str]]:
    """``(host path, relay point)`` of the image's root, then of each ``data`` folder."""
    points = [(str(run.rootfs), f"{RELAY}/root")]
    for number, path in enumerate(run.data):
        source = "" if data_dir is None else str(data_folder(data_dir, path))
        points.append((source, f"{RELAY}/data{number}"))
    return points


def relay(points: Sequence[tuple[str, str]], netns: Path | None = None) -> Callable[[], None]:
    """What the forked child does as root before it becomes the image's ids: the network
    namespace the shell made for it (``netns``, when given), a mount namespace of its own
    (private: nothing reaches the host's) with a fresh tmpfs at `RELAY` where the image's root
    and data folders are bound.

    bwrap starts under the image's first host id and builds the sandbox from inside the new user
    namespace, where the shell's private folders (``$ATRIUM_HOME`` 0700, and its parents) cannot
    be crossed, nor ``/proc/self/fd`` read: the relay hands it the folders themselves.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    encoded = [(source.encode(), point.encode()) for source, point in points]
    network = None if netns is None else os.fsencode(netns)

    def check(result: int, what: bytes) -> None:
        if result != 0:
            err = ctypes.get_errno()
            os.write(2, b"atrium: the image's relay failed: " + what + b": ")
            os.write(2, os.strerror(err).encode() + b"\n")
            os._exit(126)

    def child() -> None:
        if network is not None:
            fd = os.open(network, os.O_RDONLY | os.O_CLOEXEC)
            check(libc.setns(fd, CLONE_NEWNET), b"setns")
            os.close(fd)
        check(libc.unshare(CLONE_NEWNS), b"unshare")
        check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), b"private /")
        # held open before the tmpfs, which may cover where they are (a home under /tmp)
        held = [os.open(source, os.O_PATH | os.O_CLOEXEC) for source, _ in encoded]
        check(
            libc.mount(b"tmpfs", RELAY.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755"),
            b"tmpfs",
        )
        for fd, (source, point) in zip(held, encoded, strict=True):
            os.mkdir(point, 0o755)  # noqa: PTH102 - bytes, in a forked child
            bound = libc.mount(f"/proc/self/fd/{fd}".encode(), point, None, MS_BIND | MS_REC, None)
            check(bound, source)
            os.close(fd)

    return child


def data_folder(data_dir: Path, path: str) -> Path:
    """Where the instance keeps the image's ``data`` folder ``path``: ``<data>/<path>``."""
    return data_dir / path.lstrip("/")


def make_data_folder(data_dir: Path, path: str) -> None:
    """``<data>/<path>`` made folder by folder (0700) without following a link: everything under
    an earlier version's data folder is the image's own, links to anywhere on the host included,
    and a later version may name a folder under it. A link or a file on the way refuses
    (OSError naming ``path``), so nothing outside the data folder is made, chmodded, chowned or
    bound into the image."""
    fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in path.strip("/").split("/"):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            try:
                inner = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise OSError(
                    err.errno,
                    f"the data folder {path} goes through {part!r}, which the image's data made "
                    "a link or a file",
                    path,
                ) from err
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


def prepare_data(spec: SpawnSpec, run: ImageRun, owner: AppUser) -> None:
    """The data folder and one folder per ``data`` path, owned by the user the image runs as."""
    for path in run.data:
        make_data_folder(spec.data_dir, path)
    give_data_dir(spec.data_dir, owner)
    for path in run.data:
        folder = spec.data_dir
        for part in path.strip("/").split("/"):
            folder /= part
            give_data_dir(folder, owner)


@dataclass(slots=True)
class Fds:
    info: int
    block: int
    lock: int
    #: the image's environment as bwrap arguments (`env_args`)
    env: int


#: the whole environment setpriv and bwrap start with: they are host programs started as root,
#: whose dynamic loader obeys LD_PRELOAD, LD_LIBRARY_PATH, LD_DEBUG_OUTPUT … (and the image's
#: root is at a known path of their mount namespace), so nothing of the image's may reach them
HOST_ENV: Final = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def env_args(env: dict[str, str]) -> int:
    """An fd of bwrap's ``--args`` file giving the image's command exactly ``env``: NUL-separated
    ``--clearenv`` and ``--setenv NAME VALUE`` (a memory file: nothing on a disk, no size limit
    of a pipe)."""
    words = ["--clearenv"]
    for name, value in env.items():
        words += ["--setenv", name, value]
    fd = os.memfd_create("atrium-image-env", os.MFD_CLOEXEC)
    try:
        os.write(fd, b"".join(word.encode() + b"\0" for word in words))
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def inside_network(netns: int) -> Iterator[None]:
    """The calling thread in the network namespace ``netns`` for the block, then back (a socket
    keeps the namespace it was made in; ``/proc/sys/net`` opened there is that namespace's)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(netns, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot enter the image's network: {os.strerror(err)}")
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:  # pragma: no cover - root always may
                os.abort()  # the event loop's thread in the image's network: never go on
    finally:
        os.close(own)


def socket_in(netns: int) -> socket.socket:
    """A TCP socket made inside the network namespace ``netns``."""
    with inside_network(netns):
        made = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    made.setblocking(False)
    return made


def open_low_ports(netns: int) -> None:
    """Any uid of the image may bind any port in its own network (a container runtime does the
    same): the image's ``User`` serves on port 80 with no capability."""
    with inside_network(netns):
        fd = os.open("/proc/sys/net/ipv4/ip_unprivileged_port_start", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"0\n")
    finally:
        os.close(fd)


def _proc_endpoint(address: tuple[str, int]) -> str:
    """An IPv4 endpoint as ``/proc/net/tcp`` writes it (the address in host byte order)."""
    packed = socket.inet_aton(address[0])
    return f"{int.from_bytes(packed, sys.byteorder):08X}:{address[1]:04X}"


def from_this_process(sock: socket.socket) -> bool:
    """Is the other end of the loopback connection ``sock`` a socket of this process? The
    kernel's table of TCP sockets names the peer's inode, and this process's descriptors say
    whether it holds it. Blocking (reads ``/proc``)."""
    try:
        peer, local = _proc_endpoint(sock.getpeername()), _proc_endpoint(sock.getsockname())
        with Path("/proc/thread-self/net/tcp").open(encoding="ascii") as table:
            inode = next(
                (
                    fields[9]
                    for fields in map(str.split, table)
                    if fields[1] == peer and fields[2] == local
                ),
                "0",
            )
        if inode == "0":
            return False
        wanted = f"socket:[{inode}]"
        for fd in Path("/proc/self/fd").iterdir():
            with contextlib.suppress(OSError):
                if str(fd.readlink()) == wanted:
                    return True
    except (OSError, ValueError):
        return False
    return False


class Forwarder:
    """The shell's loopback port in front of the image's port in its own network namespace.

    Every process of the host may connect to a loopback port, and an image checks no shell
    secret: only connections the shell itself opened (`from_this_process`) are forwarded."""

    def __init__(self, netns: int, port: int, label: str) -> None:
        self._netns = netns
        self._port = port
        self._label = label
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        inner: socket.socket | None = None
        upstream: asyncio.StreamWriter | None = None
        try:
            accepted = writer.get_extra_info("socket")
            if accepted is None or not from_this_process(accepted):
                _LOGGER.debug("%s: refused a connection another process made", self._label)
                return
            inner = await self._inside()
            await asyncio.get_running_loop().sock_connect(inner, ("127.0.0.1", self._port))
            up_reader, upstream = await asyncio.open_connection(sock=inner)
            inner = None
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except OSError as err:
            _LOGGER.debug("%s: forwarding failed: %s", self._label, err)
        finally:
            if inner is not None:
                inner.close()
            if upstream is not None:
                upstream.close()
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _inside(self) -> socket.socket:
        """A new TCP socket of the image's network namespace."""
        return socket_in(self._netns)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(OSError):
            os.close(self._netns)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until its end, then half-close the other side."""
    while data := await reader.read(_BUFFER):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


class ImageChild(SandboxedChild):
    """A sandboxed image and the forwarder in front of it, or its namespace of the shell's
    network, closed once the sandbox is gone (an exit, a crash, a stop)."""

    forwarder: Forwarder | None = None

    async def _watch(self) -> None:
        try:
            await super()._watch()  # releases the namespace of the shell's network (`lease`)
        finally:
            if self.forwarder is not None:
                await self.forwarder.close()


async def _child_pid(info: int) -> int:
    """The sandbox's pid from bwrap's ``--info-fd`` (``{"child-pid": N}`` once it cloned)."""
    loop = asyncio.get_running_loop()
    data = b""
    while b"}" not in data and len(data) < _INFO_LIMIT:
        chunk = await loop.run_in_executor(None, os.read, info, _INFO_LIMIT)
        if not chunk:
            break
        data += chunk
    try:
        pid = json.loads(data[: data.index(b"}") + 1])["child-pid"]
    except (ValueError, KeyError, TypeError) as err:
        raise OSError(errno.EIO, f"bwrap said no child pid ({data[:200]!r})") from err
    if not isinstance(pid, int):
        raise OSError(errno.EIO, "bwrap's child pid is not a number")
    return pid


def write_id_maps(pid: int, ids: AppUser) -> None:
    """Map 0-65535 inside onto the block: the shell is root in the namespace's parent."""
    for name, first in (("uid_map", ids.uid), ("gid_map", ids.gid)):
        Path(f"/proc/{pid}/{name}").write_text(f"0 {first} {IMAGE_ID_COUNT}\n")


class ImageRunner(LocalRunner):
    """Runs image apps (see the module docstring); needs the shell to run as root."""

    name = "image"

    def __init__(self, bwrap: str | None = None, network: Network | None = None) -> None:
        self._bwrap = bwrap or bwrap_command()
        #: the shell's network (None: a loopback-only namespace and the forwarder)
        self.network = network

    def early_exit_cause(self, log_path: Path, returncode: int) -> str:
        return classify_early_exit(log_path, returncode)

    async def spawn(self, spec: SpawnSpec, run: ImageRun | None = None) -> ImageChild:
        label = f"{spec.app_id} instance {spec.instance_id}"
        if run is None:
            raise SpawnFailed(f"cannot start {label}: no image", app_id=spec.app_id, cause="image")
        if os.geteuid() != 0:
            # one id mapped, a network of its own through slirp4netns (or refused: why)
            from atrium.lifecycle.runners.rootless import spawn_rootless

            return await spawn_rootless(spec, run, self._bwrap)
        ids = run.ids
        inside = run.host_user
        try:
            prepare_dirs(spec)
            prepare_data(spec, run, inside)
            make_mount_points(run.rootfs, run.data)
        except OSError as err:
            raise SpawnFailed(
                f"cannot start {label}: {err.strerror or err}", app_id=spec.app_id, cause="mount"
            ) from err
        lock = lock_data_dir(spec)
        lease = await self._lease(spec, label, lock, run)
        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        block_r, block_w = os.pipe2(os.O_CLOEXEC)
        env_fd = env_args(run.launch.env)
        fds = Fds(info=info_w, block=block_r, lock=lock, env=env_fd)
        try:
            argv = image_argv(spec, run, self._bwrap, ids, fds, joined=lease is not None)
            process = await start_child(
                spec,
                argv,
                dict(HOST_ENV),
                label=label,
                pass_fds=(info_w, block_r, lock, env_fd),
                die_with_shell=True,
                before_exec=relay(
                    relay_points(run, spec.data_dir), None if lease is None else lease.path
                ),
                cwd=Path("/"),  # uvloop changes folder after it: RELAY may cover the app's
            )
            if lease is not None and self.network is not None:
                self.network.unname(lease)  # the child is in it: it lives as long as the sandbox
        except BaseException:
            if lease is not None and self.network is not None:
                await self.network.release(lease)
            raise
        finally:
            for fd in (info_w, block_r, lock, env_fd):
                os.close(fd)
        child = ImageChild(
            process,
            host=spec.host if lease is None else lease.address,
            port=local_port(spec) if lease is None else run.launch.port,
            label=label,
            cgroup=spec.cgroup,
            log_path=spec.log_path,
        )
        if lease is not None and self.network is not None:
            # released when the sandbox is gone, however it ends
            child.lease = (self.network, lease)
        try:
            pid = await _child_pid(info_r)
            write_id_maps(pid, ids)
            if lease is None:
                netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                # the forwarder owns the descriptor from here: closed with it when the child ends
                forwarder = child.forwarder = Forwarder(netns, run.launch.port, label)
                open_low_ports(netns)
                await forwarder.start(spec.host, local_port(spec))
            os.write(block_w, b"1")
        except OSError as err:
            await child.stop(0)
            raise SpawnFailed(
                f"cannot start {label}: the image's sandbox could not be set up: "
                f"{err.strerror or err}",
                app_id=spec.app_id,
                cause="mount",
            ) from err
        finally:
            os.close(info_r)
            os.close(block_w)
        _LOGGER.info("started %s (image) in bwrap: pid %d", label, process.pid)
        return child

    async def _lease(self, spec: SpawnSpec, label: str, lock: int, run: ImageRun) -> Lease | None:
        """The instance's namespace of the shell's network (None without one), reaching what
        its app's manifest asks if that was granted and is not revoked."""
        if self.network is None:
            return None
        try:
            return await self.network.plumb_granted(spec.egress_key, spec.egress)
        except (OSError, RuntimeError) as err:
            os.close(lock)
            raise SpawnFailed(
                f"cannot start {label}: its network could not be made: {err}",
                app_id=spec.app_id,
                cause="mount",
            ) from err


__all__ = ["ImageRun", "ImageRunner", "image_ids", "read_inside"]
