"""Opening the users package's SQLite files (users, grants, audit): one writer connection in WAL
mode, the file and its -wal and -shm owner-only, the schema made, and every failure one
ConfigError naming the file."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

from atrium.settings import ConfigError, create_private


def connect(
    path: Path,
    what: str,
    schema: str,
    *,
    synchronous: Literal["FULL", "NORMAL"] = "FULL",
    check: bool = False,
) -> sqlite3.Connection:
    """A connection to ``path`` (``what`` names it in errors, e.g. "the users store"), created
    0600 if missing; ``check`` runs ``PRAGMA quick_check`` first and refuses a damaged file."""
    try:
        create_private(path)
        for suffix in ("", "-wal", "-shm"):  # an older shell's file: readable by others
            sibling = path.with_name(path.name + suffix)
            if sibling.is_file():
                sibling.chmod(0o600)
    except OSError as err:
        raise ConfigError(f"{what} {path} cannot be opened: {err.strerror or err}") from err
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        if check:
            problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
            if problems != ["ok"]:
                raise ConfigError(f"{what} {path} is damaged: {'; '.join(problems)}")
        conn.executescript(schema)
    except sqlite3.Error as err:
        conn.close()
        raise ConfigError(f"{what} {path} cannot be opened: {err}") from err
    except BaseException:
        conn.close()
        raise
    return conn
