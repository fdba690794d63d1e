"""Durable private files: the one atomic writer and the directory sync every store uses.

Records, journals, the index cache, `run/token`, `run/url` and a scope repository's own files
are the shell's alone (owner-only, issue 13) and must never be seen half-written (issue 14): each
is written to a temporary sibling, synced, renamed over the old one, and the rename made durable.
"""

from __future__ import annotations

import os
from pathlib import Path


def sync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data``, owner-only (0600), so a crash leaves the old or the new
    file, never half of one. The temporary file is ``.<name>.tmp`` beside it (a reader that
    lists the folder can tell it from the real thing); a write that fails (a full disk) removes
    it before the error goes up, so only a kill can leave one behind."""
    if isinstance(data, str):
        data = data.encode()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_dir(path.parent)


def tree_bytes(roots: list[Path]) -> int:
    """The bytes of the regular files under ``roots`` by their length, links never followed
    (a link is counted as nothing: what it points to is not the tree's), entries that vanish
    while walked skipped. What a storage figure reports; blocking."""
    total = 0
    stack = [str(root) for root in roots]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    return total


def touched_since(entry: Path, moment: float) -> bool:
    """Whether ``entry`` (not followed if a link) changed at or after ``moment`` (Unix time); True
    when it is gone meanwhile (nothing left to remove)."""
    try:
        return entry.lstat().st_mtime >= moment
    except FileNotFoundError:
        return True
