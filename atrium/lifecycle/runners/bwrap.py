"""The ``bwrap`` runner: the app's command inside a bubblewrap sandbox.

What the app sees (built by ``sandbox_argv``):

- its own pid, IPC and UTS namespaces; with the shell's network (`atrium.lifecycle.network`, a
  root shell, unless ``ATRIUM_APP_NETWORK_APPS=images``) a network namespace of its own on the
  shell's bridge, where it listens on its address (``OS_HOST``) and reaches only the shell's API
  (``OS_SHELL_URL``, the shell's address on the bridge) and its own loopback; without it, the
  host's network; no capabilities; when the shell runs as root, the app's own unprivileged
  uid/gid (``spec.user``, set by ``setpriv`` after bwrap made the mounts as root: see
  ``_drop_to``);
- ``/etc``, ``/usr/lib``, ``/usr/lib64``, ``/usr/libexec``, ``/usr/share`` read-only, and the
  merged-/usr links (``/bin -> usr/bin`` …) as on the host;
- ``/usr/bin`` (and so ``/bin``): a tmpfs holding only the app's interpreter and the tools its
  manifest declares (decisions.md, Lifecycle ``tools``); ``PATH=/usr/bin``;
- ``spec.ro_paths`` (the base interpreter's prefix) read-only at their own paths, except the
  ``PYTHONPATH`` folder (the SDK), shown at ``/run/atrium/python``; every mount point's missing
  parents are made 0755 (bwrap's own are 0700, which an unprivileged app could not cross);
- its app directory read-only at its own path (the working directory), its runtime data directory
  read-write at ``/data`` (``OS_DATA_DIR`` and ``HOME``), an empty ``/tmp``.

Limits, on purpose: tool confinement is about declared dependencies, not a security barrier — the
helpers git runs live in ``/usr/lib/git-core`` and stay reachable there, and an app may run any
binary it writes under ``/data`` or ``/tmp``. The environment is handed to bwrap as its own
environment rather than ``--setenv`` arguments, because a command line is readable by every user of
the host (``/proc/<pid>/cmdline``) and the environment holds ``OS_APP_TOKEN``/``OS_SHELL_SECRET``;
the shell's own environment still does not leak, since the child gets exactly ``spec.env``.

A missing bind source is reported by bwrap itself within milliseconds (``bwrap: Can't find source
path …`` in the log, exit 1); spawn() does not wait for it: the manager sees the early exit through
``RunningApp.wait()`` and names it with ``classify_early_exit``.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from atrium.errors import SpawnFailed
from atrium.lifecycle.network import Lease, Network, NetworkUnavailable, joiner
from atrium.lifecycle.runners import SpawnSpec
from atrium.lifecycle.runners.process import (
    SYSTEM_PATH,
    KeptChild,
    LocalRunner,
    absolute,
    host_command,
    local_port,
    lock_data_dir,
    prepare_dirs,
    start_child,
)

_LOGGER = logging.getLogger(__name__)

NAMESPACE_FLAGS: Final = (
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
)
#: host directories every app may read (those that exist on this host are bound)
SYSTEM_DIRS: Final = ("/etc", "/usr/lib", "/usr/lib64", "/usr/libexec", "/usr/share")
#: top-level entries that merged-/usr hosts make symlinks into /usr
ROOT_LINKS: Final = ("bin", "sbin", "lib", "lib64", "lib32", "libx32")
SANDBOX_BIN: Final = Path("/usr/bin")
SANDBOX_DATA: Final = "/data"
#: where an interpreter named by ``#!/usr/bin/env X`` is looked for first: a system interpreter
#: matches the /usr/lib the sandbox shows (a pyenv shim on the host PATH would not even run)
_SYSTEM_PATH: Final = SYSTEM_PATH
#: where the sandbox holds ``setpriv`` (util-linux) when the app must drop root: outside the
#: app's PATH; it can do nothing once the app runs (no capabilities, no_new_privs, nosuid mounts)
SANDBOX_SETPRIV: Final = "/run/atrium/setpriv"
#: where the folder ``PYTHONPATH`` names (the SDK) appears: a fixed path, so the sandbox shows
#: no skeleton of ``$ATRIUM_HOME`` and the app learns nothing of where the shell keeps it
SANDBOX_PYTHONPATH: Final = "/run/atrium/python"
#: bwrap's own messages for a sandbox it could not build (bwrap 0.8 wording)
_MOUNT_ERRORS: Final = (
    "Can't find source path",
    "Can't mount",
    "Can't bind",
    "Can't create file",
    "Can't mkdir",
    "Can't make symlink",
    "Can't remount",
)
_CHECK_TIMEOUT: Final = 10.0


def bwrap_command() -> str:
    """The bwrap executable (Debian package ``bubblewrap``)."""
    return shutil.which("bwrap") or "/usr/bin/bwrap"


@functools.cache
def bwrap_works() -> str | None:
    """None when a trivial sandbox with the runner's flags runs here, else why not.

    Blocking (it runs bwrap once); called at start-up, before the event loop serves.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "the bwrap command is not installed (Debian/Ubuntu package 'bubblewrap')"
    true = shutil.which("true", path=_SYSTEM_PATH)
    if true is None:
        return "no 'true' command in /usr/bin or /bin to try the sandbox with"
    with tempfile.TemporaryDirectory(prefix="atrium-bwrap-check-") as data:
        argv = [
            bwrap,
            *with_parents(
                [
                    *NAMESPACE_FLAGS,
                    *system_layout(),
                    *usr_bin_layout({"true": Path(true)}),
                    *("--bind", data, SANDBOX_DATA),
                ]
            ),
            str(SANDBOX_BIN / "true"),
        ]
        try:
            result = subprocess.run(  # noqa: S603 (argv is ours: bwrap and fixed options)
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_CHECK_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"running {bwrap} failed: {err}"
    if result.returncode != 0:
        said = result.stderr.decode(errors="replace").strip()[-500:]
        return f"a trivial sandbox exited with {result.returncode}: {said or 'no message'}"
    return None


def classify_early_exit(log_path: Path, returncode: int) -> str:
    """``mount`` when the log ends with bwrap's report of a sandbox it could not build, else
    ``exited`` (the app itself ended): the SpawnFailed cause for a child that died while starting.
    """
    if returncode == 0:
        return "exited"
    try:
        with log_path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            tail = log.read().decode(errors="replace").splitlines()[-10:]
    except OSError:
        return "exited"
    for line in tail:
        if line.startswith("bwrap:") and any(marker in line for marker in _MOUNT_ERRORS):
            return "mount"
    return "exited"


@functools.cache
def system_layout() -> tuple[str, ...]:
    """The host-independent part of every sandbox: kernel filesystems and read-only system dirs."""
    # a fresh /tmp every user may write (sticky, like the host's), also the app's own uid
    args = ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]  # noqa: S108
    for directory in SYSTEM_DIRS:
        if Path(directory).is_dir():
            args += ["--ro-bind", directory, directory]
    for name in ROOT_LINKS:
        path = Path("/", name)
        if path.is_symlink():
            args += ["--symlink", str(path.readlink()), str(path)]
        elif name in ("bin", "sbin") and path.is_dir():
            # not merged-/usr: /bin must still show the curated /usr/bin, never the host's /bin
            args += ["--symlink", f"usr/{name}", str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return tuple(args)


#: bwrap options that make something at a path inside the sandbox (their last argument)
_MAKES: Final = {"--ro-bind": 2, "--bind": 2, "--symlink": 2, "--tmpfs": 1, "--proc": 1}
_MAKES_TOO: Final = {"--dev": 1, "--dir": 1}
#: every other bwrap option this module uses that takes an argument
_ARITY: Final = {
    **dict.fromkeys(("--remount-ro", "--chdir", "--sync-fd", "--cap-add", "--cap-drop"), 1),
    "--perms": 1,
    **_MAKES,
    **_MAKES_TOO,
}


def with_parents(options: Sequence[str]) -> list[str]:
    """``options`` with a ``--dir`` (mode 0755) before each mount for every missing parent.

    bwrap makes a destination's missing parents mode 0700: harmless while the app runs as root,
    but an app under its own uid could then reach nothing below ``/usr`` or the interpreter's
    prefix. Parents inside a bound host directory already exist and are left alone.
    """
    made = {"/"}
    bound: list[Path] = []
    out: list[str] = []
    i = 0
    while i < len(options):
        flag = options[i]
        arity = _ARITY.get(flag, 0)
        where = _MAKES.get(flag) or _MAKES_TOO.get(flag)
        if where is not None:
            dest = Path(options[i + where])
            for parent in reversed(dest.parents):
                if str(parent) in made or _is_under(parent, bound):
                    continue
                out += ["--dir", str(parent)]
                made.add(str(parent))
            if flag in ("--ro-bind", "--bind"):
                bound.append(dest)
            made.add(str(dest))
        out += options[i : i + 1 + arity]
        i += 1 + arity
    return out


def usr_bin_layout(entries: dict[str, Path]) -> list[str]:
    """A fresh read-only ``/usr/bin`` holding ``name -> host file`` entries only."""
    args = ["--tmpfs", str(SANDBOX_BIN)]
    for name, source in entries.items():
        args += ["--ro-bind", str(source), str(SANDBOX_BIN / name)]
    return [*args, "--remount-ro", str(SANDBOX_BIN)]


def _is_under(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _shebang(script: Path) -> list[str]:
    """``['/usr/bin/env', 'python3']`` for a script starting with ``#!/usr/bin/env python3``."""
    try:
        with script.open("rb") as file:
            head = file.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    return head[2:].split(b"\n", 1)[0].decode(errors="replace").split()


class _Binds:
    """What goes into the sandbox's /usr/bin and which host files are bound at their own path."""

    def __init__(self, covered: Sequence[Path]) -> None:
        self.usr_bin: dict[str, Path] = {}
        self.own_path: list[Path] = []
        self._covered = list(covered)

    def add_interpreter(self, path: Path) -> None:
        real = Path(os.path.realpath(path))
        if not real.is_file():
            # the app's own mistake (a bad #! line): let exec fail inside, cause "exited"
            _LOGGER.warning("interpreter %s does not exist on this host; not bound", path)
            return
        self.usr_bin.setdefault(path.name, real)
        if path.parent not in (SANDBOX_BIN, Path("/bin")) and not _is_under(path, self._covered):
            self.own_path.append(path)
            self._covered.append(path)

    def add_tool(self, name: str, source: Path, app_id: str) -> None:
        if not source.exists():
            _LOGGER.warning(
                "%s declares tool %r, which the toolchain %s lacks (run `atrium tools add %s`); "
                "it is left out of the sandbox",
                app_id,
                name,
                source.parent,
                name,
            )
            return
        self.usr_bin.setdefault(name, Path(os.path.realpath(source)))


def _interpreter(spec: SpawnSpec, command: Path, binds: _Binds) -> None:
    """The app's interpreter: argv[0] itself, or what its ``#!`` line needs."""
    if not _is_under(command, [absolute(spec.app_dir)]):
        binds.add_interpreter(command)
        return
    words = _shebang(command)
    if not words:
        return  # a binary of the app, visible with the app directory
    interpreter = Path(words[0])
    binds.add_interpreter(interpreter)
    if interpreter.name == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        if not names:
            return
        host = os.environ.get("PATH", "")
        found = shutil.which(names[0], path=f"{_SYSTEM_PATH}:{host}")
        if found is None:
            _LOGGER.warning(
                "%s: %r (from %s's #! line) is not on this host", spec.app_id, names[0], command
            )
            return
        binds.usr_bin.setdefault(names[0], Path(os.path.realpath(found)))


def _tools(spec: SpawnSpec, binds: _Binds) -> None:
    if not spec.tools:
        return
    toolchain = spec.toolchain_dir
    if toolchain is None:
        _LOGGER.warning(
            "%s declares tools %s but the shell has no toolchain", spec.app_id, list(spec.tools)
        )
        return
    names = list(spec.tools)
    if "*" in names:
        everything = [entry.name for entry in toolchain.iterdir()] if toolchain.is_dir() else []
        names = sorted({*everything, *names} - {"*"})
    for name in names:
        if not name or "/" in name or name in (".", ".."):
            _LOGGER.warning("%s: tool name %r is not a file name; skipped", spec.app_id, name)
            continue
        binds.add_tool(name, toolchain / name, spec.app_id)


def _ro_paths(spec: SpawnSpec) -> list[Path]:
    """``spec.ro_paths`` worth binding: none that would replace the curated /usr/bin (a Debian
    venv's base prefix is ``/usr``, already shown through /usr/lib and /usr/share), none already
    visible. Missing ones are kept: bwrap names them and the early exit is classified ``mount``."""
    kept: list[Path] = []
    system = [Path(p) for p in SYSTEM_DIRS]
    for path in (absolute(p) for p in spec.ro_paths):
        if SANDBOX_BIN.is_relative_to(path) or _is_under(path, [SANDBOX_BIN, Path("/bin")]):
            _LOGGER.debug(
                "%s: read-only path %s would expose /usr/bin; left out", spec.app_id, path
            )
        elif not _is_under(path, [*system, *kept]):
            kept.append(path)
    return kept


def runtime_folders_in(app_dir: Path, app_id: str) -> list[Path]:
    """The instances' data folders kept inside the app directory (`<appId>-<n>`,
    `<appId>-provider`: the bootstrap admin's, for apps of the global and user scopes): each is
    covered by an empty read-only tmpfs in the sandbox, so an instance sees no data but its own,
    at ``/data``. A folder made after the sandbox was built is not covered, but it is mode 0700
    and owned by the uid of (app, user) when the shell is root (`app_user`), which no other
    user's instance runs as (decisions.md "Users: instances and their data")."""
    names = re.compile(rf"{re.escape(app_id)}-(?:[0-9]+|provider)")
    try:
        entries = sorted(app_dir.iterdir())
    except OSError:
        return []
    return [e for e in entries if names.fullmatch(e.name) and e.is_dir() and not e.is_symlink()]


def setpriv_command() -> Path | None:
    """util-linux's ``setpriv`` on this host (Debian: always installed)."""
    found = shutil.which("setpriv", path=_SYSTEM_PATH)
    return Path(os.path.realpath(found)) if found else None


def _drop_to(spec: SpawnSpec) -> tuple[list[str], list[str]]:
    """With ``spec.user``: bwrap flags keeping only CAP_SETUID/CAP_SETGID for the first process,
    and the ``setpriv`` prefix that becomes the app's uid/gid with no groups before exec.

    bwrap as root sets up every mount as root (the 0700 ``$ATRIUM_HOME`` and an interpreter
    under ``/root`` stay bindable), and ``--unshare-user --uid N`` would not help: real root's
    user namespace maps the sandbox's uid to kuid 0 outside, which still reads ``/etc/shadow``.
    A real setuid to an unprivileged kuid inside does; it also clears every capability.
    """
    if spec.user is None:
        return list(NAMESPACE_FLAGS), []
    setpriv = setpriv_command()
    if setpriv is None:
        raise SpawnFailed(
            f"cannot start {spec.app_id!r}: the shell runs as root and apps must not, but the "
            "'setpriv' command (Debian package util-linux) is not in /usr/bin or /bin",
            app_id=spec.app_id,
            cause="mount",
        )
    flags = [f for f in NAMESPACE_FLAGS if f not in ("--cap-drop", "ALL")]
    flags += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    flags += ["--ro-bind", str(setpriv), SANDBOX_SETPRIV]
    uid, gid = str(spec.user.uid), str(spec.user.gid)
    prefix = [SANDBOX_SETPRIV, "--reuid", uid, "--regid", gid, "--clear-groups"]
    return flags, [*prefix, "--inh-caps=-all", "--"]


def _python_path(spec: SpawnSpec) -> Path | None:
    """The one ``PYTHONPATH`` folder, when it is among the read-only paths (the SDK)."""
    value = spec.env.get("PYTHONPATH")
    if not value or os.pathsep in value:
        return None
    path = absolute(Path(value))
    return path if path in {absolute(p) for p in spec.ro_paths} else None


def sandbox_argv(spec: SpawnSpec, bwrap: str, *, sync_fd: int | None = None) -> list[str]:
    """The whole bwrap command line for ``spec`` (the environment is passed separately)."""
    command = host_command(spec)
    ro_paths = _ro_paths(spec)
    app_dir = str(absolute(spec.app_dir))
    binds = _Binds(covered=[*ro_paths, *(Path(p) for p in SYSTEM_DIRS)])
    _interpreter(spec, command, binds)
    _tools(spec, binds)
    flags, prefix = _drop_to(spec)
    options = [*flags, *system_layout(), *usr_bin_layout(binds.usr_bin)]
    python_path = _python_path(spec)
    for path in [*binds.own_path, *ro_paths]:
        inside = SANDBOX_PYTHONPATH if path == python_path else str(path)
        options += ["--ro-bind", str(path), inside]
    options += ["--ro-bind", app_dir, app_dir]
    for folder in runtime_folders_in(Path(app_dir), spec.app_id):
        options += ["--tmpfs", str(folder), "--remount-ro", str(folder)]
    options += ["--bind", str(spec.data_dir), SANDBOX_DATA, "--chdir", app_dir]
    if sync_fd is not None:
        options += ["--sync-fd", str(sync_fd)]
    return [bwrap, *with_parents(options), *prefix, *spec.argv]


class SandboxedChild(KeptChild):
    """A bwrap process and the sandbox below it.

    bwrap does not forward signals: a SIGTERM to its group kills bwrap at once, and
    ``--die-with-parent`` then SIGKILLs everything inside — no grace at all. So the polite signal
    (and the kill) goes to the processes inside the sandbox, seen from the host below bwrap's pid;
    bwrap stays to report the app's exit code (128 + N for a signal N) and exits after it. bwrap
    may exit a moment before its pid-1 reaper is gone, so stop() also waits for those processes.
    """

    #: the sandbox's namespace of the shell's network, released once the sandbox is gone
    lease: tuple[Network, Lease] | None = None

    async def _watch(self) -> None:
        try:
            await super()._watch()
        finally:
            # after the exit is told (a crash is seen at once); a stop waits for it
            if self.lease is not None:
                network, lease = self.lease
                await network.release(lease)

    @staticmethod
    def _by_signal(code: int) -> bool:
        """bwrap exits with 128 + N when a signal N ended the app (the shell's convention), so
        a `kill -9` of the app from outside is ``killed``, not an exit of its own (an app that
        exits with a code above 128 by itself reads the same, as it would to a shell)."""
        return code < 0 or code > 128


class BwrapRunner(LocalRunner):
    """Runs the app's command in a bubblewrap sandbox (see the module docstring for the layout)."""

    name = "bwrap"

    def early_exit_cause(self, log_path: Path, returncode: int) -> str:
        return classify_early_exit(log_path, returncode)

    def __init__(self, bwrap: str | None = None, network: Network | None = None) -> None:
        self._bwrap = bwrap or bwrap_command()
        #: the shell's network (None: apps share the host's)
        self.network = network

    async def spawn(self, spec: SpawnSpec) -> SandboxedChild:
        if not spec.argv:
            raise SpawnFailed(
                f"cannot start {spec.app_id!r}: empty command", app_id=spec.app_id, cause="exited"
            )
        prepare_dirs(spec)
        env = {
            **spec.env,
            **spec.secrets,
            "OS_DATA_DIR": SANDBOX_DATA,
            "HOME": SANDBOX_DATA,
            "PATH": str(SANDBOX_BIN),
        }
        if _python_path(spec) is not None:
            env["PYTHONPATH"] = SANDBOX_PYTHONPATH
        label = f"{spec.app_id} instance {spec.instance_id}"
        lock = lock_data_dir(spec)
        lease: Lease | None = None
        try:
            if self.network is not None:
                lease = await self._plumb(label, spec)
            if lease is not None and self.network is not None:
                # it listens on its own address and finds the shell on the bridge
                env["OS_HOST"] = lease.address
                env["OS_SHELL_URL"] = self.network.plan.shell_url
            argv = sandbox_argv(spec, self._bwrap, sync_fd=lock)
            _LOGGER.debug("sandbox for %s: %s", label, " ".join(argv))
            process = await start_child(
                spec,
                argv,
                env,
                label=label,
                pass_fds=(lock,),
                die_with_shell=True,
                before_exec=None if lease is None else joiner(lease.path),
            )
            if lease is not None and self.network is not None:
                self.network.unname(lease)  # the child is in it: it lives as long as the sandbox
        except BaseException:
            if lease is not None and self.network is not None:
                await self.network.release(lease)
            raise
        finally:
            os.close(lock)
        _LOGGER.info("started %s in bwrap: pid %d, %s", label, process.pid, " ".join(spec.argv))
        child = SandboxedChild(
            process,
            host=spec.host if lease is None else lease.address,
            port=local_port(spec),
            label=label,
            cgroup=spec.cgroup,
            log_path=spec.log_path,
        )
        if lease is not None and self.network is not None:
            child.lease = (self.network, lease)
        return child

    async def _plumb(self, label: str, spec: SpawnSpec) -> Lease | None:
        """The instance's namespace, reaching what its app's manifest asks if that was granted
        and is not revoked (`Network.plumb_granted`); None when the shell's network stepped
        back (its bridge's range was taken by another shell after this one started): the app
        then shares the host's network, as with a clash seen at the start."""
        if self.network is None:  # pragma: no cover - the caller checked
            raise RuntimeError("no network")
        try:
            return await self.network.plumb_granted(spec.egress_key, spec.egress)
        except (OSError, RuntimeError) as err:
            if isinstance(err, NetworkUnavailable) and self.network.refused is not None:
                return None
            raise SpawnFailed(
                f"cannot start {label}: its network could not be made: {err}",
                app_id=spec.app_id,
                cause="mount",
            ) from err


__all__ = ["BwrapRunner", "bwrap_works", "classify_early_exit", "sandbox_argv"]
