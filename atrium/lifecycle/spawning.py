"""What a spawn needs besides the runner: the argv, the environment, the interpreter's paths, and
two probes used to name a failure (does the port answer; what did the child last say)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

from atrium import lifecycle
from atrium.registry import AppCopy


def interpreter_paths() -> tuple[Path, ...]:
    """What the shell's interpreter needs inside a sandbox so SDK apps import `atrium`."""
    package_dir = Path(lifecycle.__file__).resolve().parent.parent
    return tuple(dict.fromkeys(Path(p) for p in (sys.prefix, sys.base_prefix, package_dir)))


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
        argv[0] = sys.executable
    elif "/" not in argv[0]:
        argv[0] = shutil.which(argv[0]) or argv[0]
    return argv


def app_environment(
    *, app_id: str, instance_id: str, host: str, port: int, shell_url: str, token: str, secret: str
) -> dict[str, str]:
    """The environment of decisions.md "Manifest" (the runner adds `OS_DATA_DIR`)."""
    return {
        "OS_APP_ID": app_id,
        "OS_INSTANCE_ID": instance_id,
        "OS_HOST": host,
        "OS_PORT": str(port),
        "PORT": str(port),
        "OS_SHELL_URL": shell_url,
        "OS_APP_TOKEN": token,
        "OS_SHELL_SECRET": secret,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # app directories are read-only in the sandbox; the shell compiles the SDK at start
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "LANG": "C.UTF-8",
    }


async def port_answers(host: str, port: int) -> bool:
    """Does anything accept connections on ``host:port``?"""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
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
