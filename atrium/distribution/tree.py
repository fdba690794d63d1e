"""App directory trees: a content hash, THE safety check every fetcher applies, and a safe copy.

Blocking file-system work: callers run it in a thread.

A tree is safe (`check_tree`) when it holds only directories, regular files and symlinks, no
version-control metadata at any depth, and no symlink through which anything outside the tree can
be reached, however links are chained (docs/decisions.md "Distribution safety"). The local, git and
OCI fetchers all run `check_tree` on the tree they staged; an unsafe tree is refused, never
stripped, with an UnsafeTree naming the first offending path.

The one exception is the *source's* own repository: a local directory's top-level `.git` (and
`.hg`, `.svn`, …) belongs to the developer's checkout, not to the app, so `entries(...,
skip_top_vcs=True)` leaves it out of the content hash and the copy; the git fetcher removes its
clone's `.git` before the check.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
import unicodedata
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Final

from atrium.distribution import fdcopy
from atrium.distribution.ignore import IGNORE_FILE, IgnoreRule

CHUNK: Final = 1 << 20
#: folders and files by which a version-control tool recognises (and configures) a repository;
#: git reads `.git/config` (core.fsmonitor, hooks: code execution), Mercurial `.hg/hgrc` (hooks)
VCS_NAMES: Final = frozenset({".git", ".hg", ".svn", ".bzr", ".pijul", ".fossil", ".jj", ".sl"})
#: metadata names without a leading dot, matched exactly: an app's own `cvs/` folder is not CVS's
EXACT_VCS_NAMES: Final = frozenset({"CVS", "_darcs", "_FOSSIL_"})
#: ``git~1``: the NTFS short name git itself refuses (core.protectNTFS)
SHORT_NAMES: Final = frozenset({"git~1"})
#: code points HFS+ ignores in names (git's ``is_hfs_dotgit`` list), so `.g\u200cit` is `.git` there
HFS_IGNORED: Final = frozenset(
    "\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u206a\u206b\u206c\u206d\u206e\u206f\ufeff"
)
#: symlinks followed while resolving one path before it counts as a loop (Linux's limit)
MAX_HOPS: Final = 40


class UnsafeTree(Exception):
    """The tree holds VCS metadata, a link through which something outside it is reachable, or a
    device, FIFO or socket. The message names the path."""


def is_vcs_name(name: str) -> bool:
    """Whether a file system anywhere could take ``name`` for version-control metadata: the dot
    names compared case-insensitively, without trailing dots and spaces (Windows drops them) and
    without the code points HFS+ ignores; `CVS`, `_darcs`, `_FOSSIL_` exactly."""
    if name in EXACT_VCS_NAMES:
        return True
    folded = "".join(c for c in name if c not in HFS_IGNORED)
    folded = unicodedata.normalize("NFC", folded).rstrip(". ").casefold()
    return folded in VCS_NAMES or folded in SHORT_NAMES


#: the most of an `.atriumignore` that is read (a rule file is a few lines; more is ignored)
IGNORE_FILE_MAX: Final = 256 * 1024


def ignore_rule(app_dir: Path) -> IgnoreRule:
    """The folder's `.atriumignore` over the defaults (`atrium.distribution.ignore`).

    It is read before the tree check, so never through a link (`O_NOFOLLOW`: a link out of the
    folder is the check's to refuse, not a file to load), only when it is a regular file
    (`O_NONBLOCK` so a FIFO cannot hold the open), and at most `IGNORE_FILE_MAX` bytes of it."""
    try:
        fd = os.open(
            app_dir / IGNORE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:  # none, a link, or unreadable: the defaults alone
        return IgnoreRule()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return IgnoreRule()
        head = os.read(fd, IGNORE_FILE_MAX)
    finally:
        os.close(fd)
    return IgnoreRule(head.decode(errors="replace").splitlines())


def entries(
    root: Path, *, skip_top_vcs: bool = False, rule: IgnoreRule | None = None
) -> Iterator[tuple[str, Path, os.stat_result]]:
    """``(relative posix path, path, lstat)`` of every entry under ``root`` in sorted order;
    directory symlinks are not followed. ``skip_top_vcs`` leaves out VCS metadata directly in
    ``root`` (a local source's own checkout); ``rule`` what an author's folder does not ship
    (its `.atriumignore` over the defaults; a folder left out is not entered)."""
    pending = [root]
    found: list[tuple[str, Path, os.stat_result]] = []
    while pending:
        directory = pending.pop()
        for entry in os.scandir(directory):
            if skip_top_vcs and directory == root and is_vcs_name(entry.name):
                continue
            path = Path(entry.path)
            st = entry.stat(follow_symlinks=False)
            rel = path.relative_to(root).as_posix()
            if rule is not None and rule.ignores(rel, stat.S_ISDIR(st.st_mode)):
                continue
            found.append((rel, path, st))
            if stat.S_ISDIR(st.st_mode):
                pending.append(path)
    yield from sorted(found, key=lambda e: e[0])


def check_link(rel: str, target: str) -> None:
    """A symlink at ``rel`` must point inside the tree (relative, never above the root) as
    written; `check_tree` also follows chains of links."""
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


def _resolve_inside(root: Path, rel: str) -> None:
    """Resolve the link at ``rel`` the way the kernel would, with ``root`` as the top: every
    intermediate step must stay inside the tree (so the answer does not depend on where the tree
    sits), absolute targets are refused, and more than MAX_HOPS links is a loop. A missing
    component ends the walk; what follows it is still checked lexically."""
    hops = 0
    first = str((root / rel).readlink())
    if first.startswith("/"):
        raise UnsafeTree(f"{rel} is a symlink to the absolute path {first!r}")
    # the components still to walk, consumed from the front; `stack` is where the walk is now
    pending = first.split("/")
    stack = rel.split("/")[:-1]
    exists = True
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                raise UnsafeTree(
                    f"{rel} is a symlink whose chain of links reaches outside the app directory"
                )
            stack.pop()
            continue
        here = root.joinpath(*stack, part)
        if exists and here.is_symlink():
            hops += 1
            if hops > MAX_HOPS:
                raise UnsafeTree(f"{rel} is a symlink in a loop of links")
            target = str(here.readlink())
            if target.startswith("/"):
                raise UnsafeTree(
                    f"{rel} is a symlink that leads through {posixpath.join(*stack, part)} "
                    f"to the absolute path {target!r}"
                )
            pending[:0] = target.split("/")
            continue
        stack.append(part)
        exists = exists and os.path.lexists(here)


def check_tree(root: Path, *, skip_top_vcs: bool = False, rule: IgnoreRule | None = None) -> None:
    """Raise UnsafeTree for the first entry that makes ``root`` unsafe (see the module doc);
    ``skip_top_vcs`` for a local source directory, whose own checkout is not copied, ``rule``
    for what such a directory does not ship (never copied, so never a danger)."""
    for rel, _path, st in entries(root, skip_top_vcs=skip_top_vcs, rule=rule):
        if is_vcs_name(rel.rpartition("/")[2]):
            raise UnsafeTree(
                f"{rel} is version-control metadata; an app must not carry a repository "
                "(a tool run over the installed tree would read its configuration)"
            )
        if _kind(rel, st) == "l":
            check_link(rel, str((root / rel).readlink()))
            _resolve_inside(root, rel)


def content_hash(root: Path, rule: IgnoreRule | None = None) -> str:
    """``sha256:<hex>`` over the sorted relative paths, kinds, file modes, file bytes and link
    targets; equal for a tree and its copy. A local source's own top-level VCS folder is left
    out, and what ``rule`` leaves out."""
    digest = hashlib.sha256()
    for rel, path, st in entries(root, skip_top_vcs=True, rule=rule):
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


def _refuse_special(rel: str) -> None:
    raise UnsafeTree(f"{rel} is a device, FIFO or socket")


#: a source folder's copy: owned by the shell, folders always its to write, the root 0755
_SOURCE_RULES: Final = fdcopy.Rules(
    owners=False,
    follow_root=True,
    folder_bits=0o700,
    root_mode=0o755,
    skip=lambda rel: "/" not in rel and is_vcs_name(rel),
    check_link=check_link,
    special=_refuse_special,
)


def copy_tree(source: Path, target: Path, rule: IgnoreRule | None = None) -> None:
    """Copy ``source`` to ``target`` (which must not exist): files with their modes, links as
    links, the source's own top-level VCS folder and what ``rule`` leaves out left out; then
    `check_tree` on the copy. Raises UnsafeTree for a device, FIFO or socket, or a link that
    leaves as written.

    Through descriptors only (fdcopy.py): whoever else may write the source folder cannot make
    the copy follow a link it swaps in while the shell copies, nor chmod anything by a path."""
    rules = _SOURCE_RULES if rule is None else replace(_SOURCE_RULES, leave_out=rule.ignores)
    fdcopy.copy_tree(source, target, rules=rules)
    check_tree(target)
