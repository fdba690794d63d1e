"""An app's files as one deterministic tar, and its digest: what a pod's init container fetches.

The shell serves the tar (`GET /api/runner/source`) and the runner names its digest in the pod;
`fetch` checks the bytes against it before unpacking. The same folder always gives the same bytes
(sorted names, no times, no owners), so the digest is the content's, not the copy's.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path
from typing import IO, Final, cast

from atrium.distribution.validate import runtime_dir_re

#: folders of an app copy that are not the app (its git history)
SKIPPED: Final = frozenset({".git"})


class DigestSink:
    """A write-only file that keeps only the sha256 of what is written (and its length)."""

    def __init__(self) -> None:
        self._hasher = hashlib.sha256()
        self._size = 0

    def write(self, data: bytes) -> int:
        self._hasher.update(data)
        self._size += len(data)
        return len(data)

    def tell(self) -> int:
        return self._size

    @property
    def digest(self) -> str:
        return "sha256:" + self._hasher.hexdigest()


class Tee:
    """Writes to a file and a `DigestSink` at once (one pass gives the bytes and the digest)."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sink = out, DigestSink()

    def write(self, data: bytes) -> int:
        self.sink.write(data)
        return self.out.write(data)

    def tell(self) -> int:
        return self.sink.tell()


def write_tar(app_dir: Path, out: IO[bytes] | DigestSink | Tee) -> None:
    """The regular files and folders under ``app_dir`` as a tar written to ``out``, a file at a
    time in pieces (never the app whole in memory). Symlinks and special files are left out (a
    pod gets no link to follow; a file swapped for a link while it is read is not followed),
    modes kept as 0755 for executables and 0644 otherwise.

    The instances' data folders the bootstrap admin keeps inside an app folder (`<appId>-<n>`,
    `<appId>-provider`, ``ScopeLayout.runtime_dir``) are not the app: they are left out, as the
    local sandbox covers them, so no pod gets another instance's data (and the digest does not
    change when an instance is made or writes)."""
    runtime = runtime_dir_re(app_dir.name)
    top = [e for e in _entries(app_dir) if not runtime.fullmatch(e.name)]
    fileobj = cast("IO[bytes]", out)  # tarfile writes, and asks where it is: nothing more
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _walk(app_dir, top):
            relative = path.relative_to(app_dir).as_posix()
            info = tarfile.TarInfo(relative)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if path.is_dir():
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue  # gone, or a link now: not a file of the app's
            with os.fdopen(fd, "rb") as data:
                found = os.fstat(data.fileno())
                if not stat.S_ISREG(found.st_mode):
                    continue
                info.size = found.st_size
                info.mode = 0o755 if found.st_mode & 0o111 else 0o644
                tar.addfile(info, data)


def source_tar(app_dir: Path) -> bytes:
    """`write_tar` into memory (for tests and small folders)."""
    buffer = io.BytesIO()
    write_tar(app_dir, buffer)
    return buffer.getvalue()


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.iterdir(), key=lambda p: p.name)


def _walk(root: Path, entries: list[Path] | None = None) -> list[Path]:
    found: list[Path] = []
    for entry in _entries(root) if entries is None else entries:
        if entry.name in SKIPPED or entry.is_symlink():
            continue
        if entry.is_dir():
            found.append(entry)
            found.extend(_walk(entry))
        elif entry.is_file():
            found.append(entry)
    return found


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def source_digest(app_dir: Path) -> str:
    """The digest a pod of ``app_dir`` fetches by (the tar is hashed as it is made, never held)."""
    sink = DigestSink()
    write_tar(app_dir, sink)
    return sink.digest
