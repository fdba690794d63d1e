"""Debian's PostgreSQL for the tests: ``postgres_server`` (session) and `new_database`.

``initdb`` and ``pg_ctl`` refuse root, so they run as the ``postgres`` user (``runuser``) when the
tests run as root, in folders under /tmp that user can reach (pytest's own folders are root's
alone). ``initdb`` runs once per machine into a template folder (``/tmp/atrium-pg-template-<major>``);
each session copies it (``cp -a``) and starts a server on a free port with the keepalive settings a
deployment uses, stopped when the session ends. Registered for every test folder by
``tests/conftest.py``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path

import pytest

PG_ROOT = Path("/usr/lib/postgresql")
_NAMES = count()


def _pg_bin() -> Path | None:
    versions = sorted(PG_ROOT.glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    return versions[-1].parent if versions else None


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _reachable(path: Path) -> None:
    """Let the server's user into ``path`` (a folder made by root)."""
    path.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def _template(bin_dir: Path) -> Path:
    """``initdb`` once per machine and major version; later sessions find it made."""
    # a cache every session on the machine shares, on purpose (root's own folders are 0700)
    template = Path(f"/tmp/atrium-pg-template-{bin_dir.parent.name}")  # noqa: S108
    with (Path(f"{template}.lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (template / "PG_VERSION").is_file():
            return template
        making = Path(tempfile.mkdtemp(prefix="atrium-pg-initdb-", dir="/tmp"))
        _reachable(making)
        subprocess.run(
            _as_postgres(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(making / "data"),
                    "-A",
                    "trust",
                    "-U",
                    "atrium",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
        )
        shutil.rmtree(template, ignore_errors=True)
        (making / "data").rename(template)
        making.rmdir()
        return template


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_server(bin_dir: Path, *, durable: bool = False) -> Iterator[str]:
    """A server copied from the template, on a free port with the keepalive settings a
    deployment uses, while the block runs: the URL of its ``postgres`` database. ``durable``
    keeps fsync on (what a benchmark measures); the tests turn it off."""
    run = Path(tempfile.mkdtemp(prefix="atrium-pg-", dir="/tmp"))
    _reachable(run)
    data = run / "data"
    subprocess.run(["cp", "-a", str(_template(bin_dir)), str(data)], check=True)
    port = _free_port()
    options = (
        f"-k {run} -p {port} -h 127.0.0.1 -c tcp_keepalives_idle=2 "
        f"-c tcp_keepalives_interval=1 -c tcp_keepalives_count=2"
    ) + ("" if durable else " -c fsync=off")
    pg_ctl = str(bin_dir / "pg_ctl")
    subprocess.run(
        _as_postgres(
            [pg_ctl, "-w", "-D", str(data), "-l", str(run / "log"), "-o", options, "start"]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://atrium@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([pg_ctl, "-w", "-D", str(data), "-m", "immediate", "stop"]),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server for this session: the URL of its ``postgres`` database."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (make test installs Debian's postgresql)")
    with running_server(bin_dir) as url:
        yield url


def new_database(server: str) -> str:
    """A new, empty database on ``server``: its URL."""
    import psycopg

    name = f"test_{os.getpid()}_{next(_NAMES)}"
    conninfo = server.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.rsplit("/", 1)[0] + f"/{name}"
