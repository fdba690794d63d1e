"""A copy of a tree that someone else may be changing while the shell copies it, made through
open file descriptors only.

An app's runtime data is written by the app's uid while the shell, often root, copies it (a
backup; the same copier serves restore, an import's data and the local fetcher). Anything that
looks at a path and then acts on the same path can be pointed elsewhere in between: a file
checked as regular and then opened, chmod-ed or chown-ed by name may meanwhile be a link to any
host file. So nothing here acts on a path it checked before:

- each entry is copied as what ``fstat`` on one descriptor of it says it is, through that
  descriptor alone, so a name swapped meanwhile changes nothing: a name the listing calls a
  folder or a regular file is opened to be read, ``O_NOFOLLOW|O_NONBLOCK|O_NOCTTY`` relative to
  its folder's descriptor (a FIFO swapped in is closed unread; an app cannot make a device
  node); a name the listing calls anything else, or whose open found a link (``ELOOP``) or a
  socket, is looked up as the entry itself, ``O_PATH|O_NOFOLLOW`` (a link is the link itself,
  nothing is opened), and that lookup is final: a folder or file it found is reopened from it
  (``/proc/self/fd``, the same inode);
- a folder is listed through its own descriptor (``os.scandir(fd)``), so a folder swapped for a
  link is never entered and its entries are the ones of the folder opened;
- a regular file's bytes are copied up to the length that ``fstat`` gave, the regions holding
  data only (a hole stays a hole: a long empty file costs the copy no disk, a file lengthened
  meanwhile no endless copy);
- a link is read from its lookup (``readlinkat`` with an empty name) and written as a link, never
  followed; sockets, FIFOs and devices are skipped (or refused, by the caller's rules);
- every target is created relative to its parent's descriptor (``O_EXCL|O_NOFOLLOW``), and mode,
  owner and times are set on the target's own descriptor (``fchown`` before ``fchmod``: a chown
  clears set-user-ID and set-group-ID bits, so the source's bits, and only those, are kept).

There is no gap between looking at an entry and acting on it, so nothing is retried and a tree
that keeps changing cannot fail the copy (an app racing it once did, whenever the shell was the
slower: docs/decisions.md "Backups: one look per entry"). Blocking file-system work: callers run
it in a thread.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

#: `FICLONE` from linux/fs.h: share the source file's blocks (btrfs, xfs, bcachefs)
FICLONE: Final = 0x40049409
NO_CLONE: Final = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS}
)
#: `copy_file_range` refused (another filesystem on an older kernel, a filesystem without it)
NO_RANGE: Final = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})
CHUNK: Final = 1 << 20
#: bytes asked of one `copy_file_range` (the kernel copies at most ~2 GiB per call)
RANGE: Final = 1 << 30
#: folders below the root (each level holds two descriptors open while it is copied)
MAX_DEPTH: Final = 256
DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
#: the one lookup of an entry: the entry itself, whatever it is, opened for nothing
LOOKUP: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
#: an entry's folder or file opened from its lookup (``/proc/self/fd/<n>`` is a link to exactly
#: that entry: O_NOFOLLOW would refuse the link itself)
REOPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
REOPEN_FILE: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR, _FILE, _LINK, _SPECIAL = "d", "f", "l", "s"


@dataclass(slots=True)
class Copied:
    """What one or more copies wrote: regular files and their bytes, and how (``reflink`` while
    every file was cloned, ``copy`` from the first one the filesystem could not clone).
    ``sizes``: each regular file's relative posix path (under the copy's ``prefix``) and the
    size of the copy written."""

    files: int = 0
    bytes: int = 0
    method: str = "reflink"
    sizes: dict[str, int] = field(default_factory=dict)


def _never(rel: str) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Rules:
    """What a copy keeps and refuses. The defaults are those of a copy of runtime data."""

    #: give each copy the source's owner (only a root shell can)
    owners: bool = True
    #: follow the root itself when it is a link (a path the user named; never for app data)
    follow_root: bool = False
    #: bits added to every copied folder's mode (the root's is ``root_mode`` when given)
    folder_bits: int = 0
    root_mode: int | None = None
    #: entries left out, by relative posix path
    skip: Callable[[str], bool] = _never
    #: entries left out, by relative posix path and whether the listing called it a folder (an
    #: author's `.atriumignore`: `node_modules/` names folders only); a folder left out is not
    #: entered
    leave_out: Callable[[str, bool], bool] | None = None
    #: called with (relative path, target) before a link is written; raises to refuse it
    check_link: Callable[[str, str], None] | None = None
    #: called with the relative path of a socket, FIFO or device; raises to refuse it (else skipped)
    special: Callable[[str], None] | None = None


DATA: Final = Rules()


def copy_tree(
    source: Path,
    target: Path,
    *,
    rules: Rules = DATA,
    into: Copied | None = None,
    prefix: str = "",
) -> Copied:
    """Copy the folder ``source`` to ``target``, which must not exist and whose parent must be
    the shell's own; returns ``into`` (or a new Copied) with this copy added, its sizes keyed
    ``prefix/relative path``."""
    copied = into if into is not None else Copied()
    flags = DIR_FLAGS & ~os.O_NOFOLLOW if rules.follow_root else DIR_FLAGS
    src = os.open(source, flags)
    try:
        info = os.fstat(src)
        target.mkdir(mode=0o700)
        dst = os.open(target, DIR_FLAGS)
        try:
            _Walk(rules, copied).folder(src, dst, prefix, "", 0)
            _own(dst, info, rules, rules.root_mode)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return copied


class _Walk:
    def __init__(self, rules: Rules, copied: Copied) -> None:
        self.rules = rules
        self.copied = copied

    def folder(self, src: int, dst: int, prefix: str, rel: str, depth: int) -> None:
        """Copy the entries of the open folder ``src`` into the open folder ``dst``."""
        if depth > MAX_DEPTH:
            raise OSError(errno.ELOOP, f"{rel} is more than {MAX_DEPTH} folders deep")
        with os.scandir(src) as listing:
            entries = sorted((entry.name, _listed_kind(entry)) for entry in listing)
        for name, listed in entries:
            here = f"{rel}/{name}" if rel else name
            if not self.rules.skip(here):
                self.entry(src, dst, name, listed, prefix, here, depth)

    def entry(
        self, src: int, dst: int, name: str, listed: str, prefix: str, rel: str, depth: int
    ) -> None:
        """Open ``name`` and copy what the descriptor is. A folder or file the listing named is
        opened to be read (``O_NOFOLLOW``: one that is a link now fails); anything else, and
        such a failure, is looked up as the entry itself (``O_PATH``), and that is final."""
        try:
            found, opened = _open_entry(src, name, listed)
        except FileNotFoundError:
            return  # gone since the listing
        try:
            info = os.fstat(found)
            kind = _kind(info.st_mode)
            if self.rules.leave_out is not None and self.rules.leave_out(rel, kind == _DIR):
                return
            if kind == _LINK:  # (only a lookup gives a link)
                self.link(found, info, dst, name, rel)
            elif kind in (_DIR, _FILE):
                flags = REOPEN_DIR if kind == _DIR else REOPEN_FILE
                fd = found if opened else _reopen(found, flags, info)
                try:
                    if kind == _DIR:
                        self.subfolder(fd, info, dst, name, prefix, rel, depth)
                    else:
                        self.file(fd, info, dst, name, prefix, rel)
                finally:
                    if fd != found:
                        os.close(fd)
            elif self.rules.special is not None:
                self.rules.special(rel)  # (a FIFO opened since the listing: closed unread)
        finally:
            os.close(found)

    def subfolder(
        self,
        child: int,
        info: os.stat_result,
        dst: int,
        name: str,
        prefix: str,
        rel: str,
        depth: int,
    ) -> None:
        os.mkdir(name, 0o700, dir_fd=dst)
        made = os.open(name, DIR_FLAGS, dir_fd=dst)
        try:
            self.folder(child, made, prefix, rel, depth + 1)
            _own(made, info, self.rules, None)
        finally:
            os.close(made)

    def file(
        self, fd: int, info: os.stat_result, dst: int, name: str, prefix: str, rel: str
    ) -> None:
        info = os.fstat(fd)
        out = os.open(name, NEW_FILE, 0o600, dir_fd=dst)
        try:
            self.data(fd, out, info.st_size)
            _own(out, info, self.rules, None)
            size = os.fstat(out).st_size
        finally:
            os.close(out)
        self.copied.files += 1
        self.copied.bytes += size
        self.copied.sizes[f"{prefix}/{rel}" if prefix else rel] = size

    def link(self, found: int, info: os.stat_result, dst: int, name: str, rel: str) -> None:
        target = os.readlink("", dir_fd=found)  # the link looked up, whatever the name is now
        if self.rules.check_link is not None:
            self.rules.check_link(rel, target)
        os.symlink(target, name, dir_fd=dst)
        if self.rules.owners and os.geteuid() == 0:
            # the new link in the shell's own folder, never what it points at
            os.chown(name, info.st_uid, info.st_gid, dir_fd=dst, follow_symlinks=False)

    def data(self, src: int, dst: int, size: int) -> None:
        """The bytes of ``src`` (``size`` long when opened) into the empty ``dst``: cloned while
        the filesystem can, else copied hole for hole."""
        if self.copied.method == "reflink":
            try:
                fcntl.ioctl(dst, FICLONE, src)
                return
            except OSError as err:
                if err.errno not in NO_CLONE:
                    raise
                self.copied.method = "copy"
        copy_bytes(src, dst, size)


def copy_bytes(src: int, dst: int, size: int) -> None:
    """The first ``size`` bytes of ``src`` (its length when it was opened) into the empty
    ``dst``, hole for hole: only the regions that hold data are copied (``SEEK_DATA``/
    ``SEEK_HOLE``), the rest stays a hole of the copy. A file of any length that holds few
    blocks (a `truncate` costs its owner nothing) costs its copy as few, and a file someone
    lengthens meanwhile is copied as long as it was, so the copy always ends."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
            end = min(os.lseek(src, start, os.SEEK_HOLE), size)
        except OSError as err:
            if err.errno == errno.ENXIO:  # nothing but a hole up to the end
                break
            if err.errno != errno.EINVAL:
                raise
            start, end = offset, size  # a filesystem that cannot tell: all of it is data
        if start >= size or not _copy_range(src, dst, start, end):
            break
        offset = end
    os.ftruncate(dst, size)


def _copy_range(src: int, dst: int, start: int, end: int) -> bool:
    """Bytes ``start`` to ``end`` of ``src`` to the same place in ``dst`` (in the kernel where
    it can); False when ``src`` ended before ``end`` (it was shortened meanwhile)."""
    at = start
    try:
        while at < end:
            done = os.copy_file_range(src, dst, min(end - at, RANGE), at, at)
            if not done:
                return False
            at += done
        return True
    except OSError as err:
        if err.errno not in NO_RANGE:
            raise
    while at < end:
        block = os.pread(src, min(end - at, CHUNK), at)
        if not block:
            return False
        view = memoryview(block)
        while view:
            written = os.pwrite(dst, view, at)
            view, at = view[written:], at + written
    return True


def _own(fd: int, info: os.stat_result, rules: Rules, mode: int | None) -> None:
    """The source's owner (a root shell, when the rules keep owners), mode and times, on the
    copy's own descriptor."""
    if rules.owners and os.geteuid() == 0:
        os.fchown(fd, info.st_uid, info.st_gid)
    if mode is None:
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISDIR(info.st_mode):
            mode |= rules.folder_bits
    os.fchmod(fd, mode)
    os.utime(fd, ns=(info.st_atime_ns, info.st_mtime_ns))


def _open_entry(folder: int, name: str, listed: str) -> tuple[int, bool]:
    """A descriptor of the entry ``name`` of ``folder`` and whether it is open to be read (else
    an ``O_PATH`` lookup of the entry itself: a link, a special file, or what a name the listing
    called a folder or a file is since)."""
    if listed in (_DIR, _FILE):
        try:
            return os.open(name, FILE_FLAGS, dir_fd=folder), True
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.ENXIO):  # a link, a socket now
                raise
    return os.open(name, LOOKUP, dir_fd=folder), False


def _listed_kind(entry: os.DirEntry[str]) -> str:
    """The kind the listing gives (``d_type``; an ``lstat`` relative to the folder without it):
    a hint of how to open the entry, never trusted for what it is."""
    try:
        if entry.is_symlink():
            return _LINK
        if entry.is_dir(follow_symlinks=False):
            return _DIR
        if entry.is_file(follow_symlinks=False):
            return _FILE
    except OSError:
        pass  # gone or unreadable: the lookup says
    return _SPECIAL


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return _LINK
    if stat.S_ISDIR(mode):
        return _DIR
    if stat.S_ISREG(mode):
        return _FILE
    return _SPECIAL


def _reopen(found: int, flags: int, info: os.stat_result) -> int:
    """The entry looked up as ``found`` (an ``O_PATH`` descriptor), opened with ``flags``: the
    same inode, never a path looked up again."""
    fd = os.open(f"/proc/self/fd/{found}", flags)
    try:
        again = os.fstat(fd)
        if (again.st_dev, again.st_ino) != (info.st_dev, info.st_ino):  # pragma: no cover
            raise OSError(errno.EIO, "a reopened descriptor is another file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: Path) -> int:
    """A read descriptor of the regular file at ``path``, never through a link as its last
    component and never of a FIFO or a device (OSError otherwise)."""
    fd = os.open(path, FILE_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd
