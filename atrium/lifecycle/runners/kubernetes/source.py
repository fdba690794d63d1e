"""An app's files as one deterministic tar, and its digest: what a pod's init container fetches.

The shell serves the tar (`GET /api/runner/source`) and the runner names its digest in the pod;
`fetch` checks the bytes against it before unpacking. The same folder always gives the same bytes
(sorted names, no times, no owners), so the digest is the content's, not the copy's.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import Final

from atrium.distribution.validate import runtime_dir_re

#: folders of an app copy that are not the app (its git history)
SKIPPED: Final = frozenset({".git"})


def source_tar(app_dir: Path) -> bytes:
    """The regular files and folders under ``app_dir`` (symlinks and special files left out: a
    pod gets no link to follow), modes kept as 0755 for executables and 0644 otherwise.

    The instances' data folders the bootstrap admin keeps inside an app folder (`<appId>-<n>`,
    `<appId>-provider`, ``ScopeLayout.runtime_dir``) are not the app: they are left out, as the
    local sandbox covers them, so no pod gets another instance's data (and the digest does not
    change when an instance is made or writes)."""
    buffer = io.BytesIO()
    runtime = runtime_dir_re(app_dir.name)
    top = [e for e in _entries(app_dir) if not runtime.fullmatch(e.name)]
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
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
            data = path.read_bytes()
            info.size = len(data)
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
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
    """The digest a pod of ``app_dir`` fetches by."""
    return digest_of(source_tar(app_dir))
