"""The ``bwrap`` runner: the app's command inside a bubblewrap sandbox.

What the app sees (built by ``sandbox_argv``):

- its own pid, IPC and UTS namespaces; the host's network (the shell must reach its port);
  no capabilities, even when the shell runs as root;
- ``/etc``, ``/usr/lib``, ``/usr/lib64``, ``/usr/libexec``, ``/usr/share`` read-only, and the
  merged-/usr links (``/bin -> usr/bin`` …) as on the host;
- ``/usr/bin`` (and so ``/bin``): a tmpfs holding only the app's interpreter and the tools its
  manifest declares (decisions.md, Lifecycle ``tools``); ``PATH=/usr/bin``;
- ``spec.ro_paths`` (the shell's virtualenv, interpreter prefix, SDK) read-only at their own paths;
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

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from atrium.errors import SpawnFailed
from atrium.lifecycle.runners import SpawnSpec
from atrium.lifecycle.runners.process import (
    ChildProcess,
    ProcStat,
    all_stats,
    is_alive,
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
_SYSTEM_PATH: Final = "/usr/bin:/bin"
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
            *NAMESPACE_FLAGS,
            *system_layout(),
            *usr_bin_layout({"true": Path(true)}),
            *("--bind", data, SANDBOX_DATA),
            str(SANDBOX_BIN / "true"),
        ]
        try:
            result = subprocess.run(
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
    args = ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108 - a fresh tmpfs
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


def usr_bin_layout(entries: dict[str, Path]) -> list[str]:
    """A fresh read-only ``/usr/bin`` holding ``name -> host file`` entries only."""
    args = ["--tmpfs", str(SANDBOX_BIN)]
    for name, source in entries.items():
        args += ["--ro-bind", str(source), str(SANDBOX_BIN / name)]
    return [*args, "--remount-ro", str(SANDBOX_BIN)]


def _absolute(path: Path) -> Path:
    """Absolute and normalised, symlinks kept: a bind's destination is the path the app is told."""
    return Path(os.path.normpath(path.absolute()))


def _is_under(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _host_command(spec: SpawnSpec) -> Path:
    """The host file ``argv[0]`` names, checked executable (what exec inside would fail on)."""
    command = spec.argv[0]
    if "/" in command:
        path = Path(command) if command.startswith("/") else spec.app_dir / command
    elif found := shutil.which(command, path=f"{_SYSTEM_PATH}:{os.environ.get('PATH', '')}"):
        path = Path(found)
    else:
        raise _not_executable(spec, "is not on the host's PATH")
    if not path.exists():
        raise _not_executable(spec, f"{path} does not exist")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise _not_executable(spec, f"{path} is not an executable file")
    return _absolute(path)


def _not_executable(spec: SpawnSpec, why: str) -> SpawnFailed:
    return SpawnFailed(
        f"cannot start {spec.app_id!r}: command {spec.argv[0]!r} cannot be executed: {why} (an "
        "absolute path to an executable file, or a script with a '#!' line, is expected)",
        app_id=spec.app_id,
        cause="exited",
    )


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
    if not _is_under(command, [_absolute(spec.app_dir)]):
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
    for path in (_absolute(p) for p in spec.ro_paths):
        if SANDBOX_BIN.is_relative_to(path) or _is_under(path, [SANDBOX_BIN, Path("/bin")]):
            _LOGGER.debug(
                "%s: read-only path %s would expose /usr/bin; left out", spec.app_id, path
            )
        elif not _is_under(path, [*system, *kept]):
            kept.append(path)
    return kept


def sandbox_argv(spec: SpawnSpec, bwrap: str) -> list[str]:
    """The whole bwrap command line for ``spec`` (the environment is passed separately)."""
    command = _host_command(spec)
    ro_paths = _ro_paths(spec)
    app_dir = str(_absolute(spec.app_dir))
    binds = _Binds(covered=[*ro_paths, *(Path(p) for p in SYSTEM_DIRS)])
    _interpreter(spec, command, binds)
    _tools(spec, binds)
    argv = [bwrap, *NAMESPACE_FLAGS, *system_layout(), *usr_bin_layout(binds.usr_bin)]
    for path in [*binds.own_path, *ro_paths]:
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--ro-bind", app_dir, app_dir]
    argv += ["--bind", str(spec.data_dir), SANDBOX_DATA, "--chdir", app_dir]
    return [*argv, *spec.argv]


def descendants(pid: int) -> list[ProcStat]:
    """Every process below ``pid`` (children, their children …), read from /proc."""
    children: dict[int, list[ProcStat]] = {}
    for stat in all_stats():
        children.setdefault(stat.ppid, []).append(stat)
    found: list[ProcStat] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child.pid)
    return found


class SandboxedChild(ChildProcess):
    """A bwrap process and the sandbox below it.

    bwrap does not forward signals: a SIGTERM to its group kills bwrap at once, and
    ``--die-with-parent`` then SIGKILLs everything inside — no grace at all. So the polite signal
    (and the kill) goes to the processes inside the sandbox, seen from the host below bwrap's pid;
    bwrap stays to report the app's exit code (128 + N for a signal N) and exits after it. bwrap
    may exit a moment before its pid-1 reaper is gone, so stop() also waits for those processes.
    """

    def __init__(self, process: asyncio.subprocess.Process, *, host: str, port: int, label: str):
        super().__init__(process, host=host, port=port, label=label)
        #: every process ever signalled inside, by (pid, start time): stop() waits for them all
        self._inside: dict[tuple[int, int], ProcStat] = {}

    def _terminate(self) -> None:
        self._signal_inside(signal.SIGTERM)

    def _kill(self) -> None:
        self._signal_inside(signal.SIGKILL)

    def _survivors(self) -> list[ProcStat]:
        return [*super()._survivors(), *(s for s in self._inside.values() if is_alive(s))]

    def _signal_inside(self, sig: signal.Signals) -> None:
        for stat in descendants(self.pid):
            self._inside[stat.pid, stat.start] = stat
        targets = [s for s in self._inside.values() if is_alive(s)]
        if not targets:
            self._signal_group(sig)  # bwrap has not cloned yet: nothing inside to spare
        for stat in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stat.pid, sig)


class BwrapRunner:
    """Runs the app's command in a bubblewrap sandbox (see the module docstring for the layout)."""

    name = "bwrap"

    def __init__(self, bwrap: str | None = None) -> None:
        self._bwrap = bwrap or bwrap_command()

    async def spawn(self, spec: SpawnSpec) -> SandboxedChild:
        if not spec.argv:
            raise SpawnFailed(
                f"cannot start {spec.app_id!r}: empty command", app_id=spec.app_id, cause="exited"
            )
        prepare_dirs(spec)
        argv = sandbox_argv(spec, self._bwrap)
        env = {
            **spec.env,
            "OS_DATA_DIR": SANDBOX_DATA,
            "HOME": SANDBOX_DATA,
            "PATH": str(SANDBOX_BIN),
        }
        label = f"{spec.app_id} instance {spec.instance_id}"
        _LOGGER.debug("sandbox for %s: %s", label, " ".join(argv))
        process = await start_child(spec, argv, env, label=label)
        _LOGGER.info("started %s in bwrap: pid %d, %s", label, process.pid, " ".join(spec.argv))
        return SandboxedChild(process, host=spec.host, port=spec.port, label=label)


__all__ = ["BwrapRunner", "bwrap_works", "classify_early_exit", "sandbox_argv"]
