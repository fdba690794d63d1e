"""App directory trees: a content hash, a safety check and a safe recursive copy.

Blocking file-system work: callers run it in a thread. `.git` entries are never part of an app tree.
A tree is safe when it holds only directories, regular files and symlinks that stay inside it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Final

SKIPPED: Final = frozenset({".git"})
CHUNK: Final = 1 << 20


class UnsafeTree(Exception):
    """The tree holds a link that leaves it, or a device, FIFO or socket."""


def entries(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """``(relative posix path, path, lstat)`` of every entry under ``root`` in sorted order;
    directory symlinks are not followed."""
    pending = [root]
    found: list[tuple[str, Path, os.stat_result]] = []
    while pending:
        directory = pending.pop()
        for entry in os.scandir(directory):
            if entry.name in SKIPPED:
                continue
            path = Path(entry.path)
            st = entry.stat(follow_symlinks=False)
            found.append((path.relative_to(root).as_posix(), path, st))
            if stat.S_ISDIR(st.st_mode):
                pending.append(path)
    yield from sorted(found, key=lambda e: e[0])


def check_link(rel: str, target: str) -> None:
    """A symlink at ``rel`` must point inside the tree (relative, never above the root)."""
    if target.startswith("/"):
        raise UnsafeTree(f"{rel} is a symlink to the absolute path {target!r}")
    resolved = os.path.normpath(f"{rel.rpartition('/')[0] or '.'}/{target}")
    if resolved == ".." or resolved.startswith("../"):
        raise UnsafeTree(f"{rel} is a symlink to {target!r}, which leaves the app directory")


def _kind(rel: str, st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "d"
    if stat.S_ISREG(st.st_mode):
        return "f"
    if stat.S_ISLNK(st.st_mode):
        return "l"
    raise UnsafeTree(f"{rel} is a device, FIFO or socket")


def check_tree(root: Path) -> None:
    """Raise UnsafeTree for the first entry that makes ``root`` unsafe."""
    for rel, path, st in entries(root):
        if _kind(rel, st) == "l":
            check_link(rel, str(path.readlink()))


def content_hash(root: Path) -> str:
    """``sha256:<hex>`` over the sorted relative paths, kinds, file modes, file bytes and link
    targets; equal for a tree and its copy."""
    digest = hashlib.sha256()
    for rel, path, st in entries(root):
        kind = _kind(rel, st)
        digest.update(f"{kind}\0{rel}\0".encode("utf-8", "surrogateescape"))
        if kind == "l":
            digest.update(os.fsencode(str(path.readlink())) + b"\0")
        elif kind == "f":
            digest.update(f"{stat.S_IMODE(st.st_mode):o}\0{st.st_size}\0".encode())
            with path.open("rb") as file:
                while chunk := file.read(CHUNK):
                    digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def copy_tree(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` (which must not exist): files with their modes, links as
    links. Raises UnsafeTree before copying an unsafe entry."""
    target.mkdir(mode=0o755)
    for rel, path, st in entries(source):
        kind = _kind(rel, st)
        dest = target / rel
        if kind == "d":
            dest.mkdir()
            dest.chmod(stat.S_IMODE(st.st_mode) | 0o700)
        elif kind == "l":
            link = str(path.readlink())
            check_link(rel, link)
            dest.symlink_to(link)
        else:
            shutil.copy2(path, dest, follow_symlinks=False)
