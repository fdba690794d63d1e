"""What a spawn needs besides the runner: the argv, the environment, the interpreter's paths, and
two probes used to name a failure (does the port answer; what did the child last say)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import py_compile
import shutil
import sys
from pathlib import Path
from typing import Final

from atrium import lifecycle
from atrium.httppool import marked_connection
from atrium.lifecycle.runners import AppUser
from atrium.registry import AppCopy

#: first uid/gid of the apps' identities: systemd leaves 1879048192-2147483647 unused
#: ("HIC SVNT LEONES" in its UIDS-GIDS.md), so no host user or container range meets it
APP_UID_BASE: Final = 0x70000000
#: 2**24 ids above the base, chosen by the app id's hash (decisions.md, sandbox section)
APP_UID_SPAN: Final = 1 << 24
#: the files of the `atrium` package an SDK app imports (atrium/sdk.py is stdlib-only)
SDK_FILES: Final = ("__init__.py", "sdk.py")


def app_user(app_id: str, owner: str | None = None) -> AppUser | None:
    """The uid/gid ``app_id`` runs as when the shell is root; None otherwise (a user's shell
    cannot change identity, and its apps run as that user, confined by the sandbox only).

    One id per app and user, stable across restarts and hosts, with no table to keep: its data
    folders (mode 0700) stay its own. The bootstrap admin's instances (``owner`` None) run as the
    app's id as they always did; another user's as the id of (app, user), so one user's instance
    cannot read another's data folder even where it can name it. Two share an id only on a hash
    collision (about 1 in 30,000 for 100 of them).
    """
    if os.geteuid() != 0:
        return None
    key = app_id if owner is None else f"{app_id}\0{owner}"
    digest = hashlib.sha256(key.encode()).digest()
    uid = APP_UID_BASE + int.from_bytes(digest[:3], "big") % APP_UID_SPAN
    return AppUser(uid=uid, gid=uid)


def python_command() -> str:
    """The interpreter `python3` means for an app: the shell's base interpreter, not its
    virtualenv, so a sandbox needs the interpreter's prefix and the SDK only, never the shell's
    checkout or dependencies."""
    base = Path(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    if base.is_file() and os.access(base, os.X_OK):
        return str(base)
    return os.path.realpath(sys.executable)


@functools.cache
def sdk_path(home: Path) -> Path:
    """``$ATRIUM_HOME/sdk``: a folder holding only ``atrium/__init__.py`` and ``atrium/sdk.py``
    (and their bytecode), the one thing of the shell an app may import (``PYTHONPATH``).

    Refreshed once per shell process and home when the shell's copy differs. Readable by every user (it is public code), so
    apps running under their own uid import it.
    """
    source = Path(str(lifecycle.__file__)).resolve().parent.parent
    target = home / "sdk" / "atrium"
    target.mkdir(parents=True, exist_ok=True)
    for directory in (target.parent, target):
        directory.chmod(0o755)
    for name in SDK_FILES:
        text = (source / name).read_bytes()
        copy = target / name
        try:
            same = copy.read_bytes() == text
        except OSError:
            same = False
        if not same:
            tmp = copy.with_suffix(".tmp")
            tmp.write_bytes(text)
            tmp.chmod(0o644)
            tmp.replace(copy)
            if compiled := py_compile.compile(str(copy), doraise=True):
                Path(compiled).chmod(0o644)
                Path(compiled).parent.chmod(0o755)
    return target.parent


def interpreter_paths(home: Path) -> tuple[Path, ...]:
    """What an app's interpreter needs inside a sandbox: the base interpreter's prefix and the
    SDK folder (not the virtualenv, not the checkout the shell runs from)."""
    return tuple(dict.fromkeys((Path(sys.base_prefix), sdk_path(home))))


def resolve_argv(copy: AppCopy) -> list[str]:
    """The entrypoint as argv: `python3`/`python` is the shell's own interpreter (so apps can use
    the SDK); a bare command is looked up on PATH; a string entrypoint is a file of the app."""
    manifest = copy.manifest
    if manifest is None:
        raise ValueError(f"{copy.id} has no valid manifest")
    if isinstance(manifest.entrypoint, str):
        return [str(copy.path / manifest.entrypoint)]
    argv = list(manifest.entrypoint)
    if argv[0] in {"python3", "python"}:
        argv[0] = python_command()
    elif "/" not in argv[0]:
        argv[0] = shutil.which(argv[0]) or argv[0]
    return argv


def app_environment(
    *,
    app_id: str,
    instance_id: str,
    host: str,
    port: int,
    shell_url: str,
    sdk: Path | None = None,
) -> dict[str, str]:
    """The environment of decisions.md "Manifest" without its secrets (`app_secrets`; the runner
    adds `OS_DATA_DIR`); ``sdk`` is the folder `import atrium.sdk` finds (``PYTHONPATH``)."""
    extra = {"PYTHONPATH": str(sdk)} if sdk is not None else {}
    return {
        **extra,
        "OS_APP_ID": app_id,
        "OS_INSTANCE_ID": instance_id,
        "OS_HOST": host,
        "OS_PORT": str(port),
        "PORT": str(port),
        "OS_SHELL_URL": shell_url,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # app directories are read-only in the sandbox; the shell compiles the SDK at start
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "LANG": "C.UTF-8",
    }


def app_secrets(*, token: str, secret: str) -> dict[str, str]:
    """What only the app may read: its token for the shell's API, and the secret the shell
    proves itself with on every request to the app."""
    return {"OS_APP_TOKEN": token, "OS_SHELL_SECRET": secret}


async def port_answers(host: str, port: int, mark: int = 0) -> bool:
    """Does anything accept connections on ``host:port``? (``mark``: the shell's SO_MARK, which
    an instance's own network asks of whoever connects.)"""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(1.0):
            if mark:
                sock = await marked_connection(loop, host, port, mark)
                _, writer = await asyncio.open_connection(sock=sock)
            else:
                _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def log_tail(log_path: Path | None, lines: int = 5) -> str:
    """The last lines of an instance's log, on one line, for a failure message."""
    try:
        text = log_path.read_text(errors="replace") if log_path else ""
    except OSError:
        return "no log"
    tail = " | ".join(text.strip().splitlines()[-lines:])
    return f"log: {tail}" if tail else "the log is empty"
