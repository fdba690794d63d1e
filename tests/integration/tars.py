"""Test helpers for app trees and crafted tar+gzip layers (not fixtures)."""

from __future__ import annotations

import gzip
import io
import json
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["dir", "file", "symlink", "hardlink", "chr", "fifo", "longname"]
TYPES: dict[Kind, bytes] = {
    "dir": tarfile.DIRTYPE,
    "file": tarfile.REGTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "chr": tarfile.CHRTYPE,
    "fifo": tarfile.FIFOTYPE,
    "longname": tarfile.GNUTYPE_LONGNAME,
}


@dataclass(frozen=True)
class Member:
    """One tar member as a test wants it, including lies (``claimed_size`` without the data)."""

    name: str
    kind: Kind
    data: bytes = b""
    link: str = ""
    claimed_size: int | None = None
    #: this many zero bytes of honest data (compresses to almost nothing)
    zeros: int = 0
    mode: int = 0o644


def crafted_layer(members: list[Member]) -> bytes:
    """A tar+gzip layer holding exactly ``members`` (headers written by hand, nothing checked)."""
    out = _GzipStream()
    for member in members:
        info = tarfile.TarInfo(member.name)
        info.type = TYPES[member.kind]
        info.mode = 0o755 if member.kind == "dir" else member.mode
        info.linkname = member.link
        size = len(member.data) + member.zeros
        info.size = member.claimed_size if member.claimed_size is not None else size
        if member.kind == "chr":
            info.devmajor, info.devminor = 1, 3
        out.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        if member.claimed_size is not None:
            break  # the data never follows: the reader must refuse from the header alone
        out.write(member.data)
        for _ in range(member.zeros >> 20):
            out.write(ZEROS)
        out.write(b"\0" * (member.zeros % len(ZEROS)))
        out.write(b"\0" * (-size % 512))
    out.write(b"\0" * 1024)
    return out.finish()


ZEROS = bytes(1 << 20)


class _GzipStream:
    """Compresses as it goes (fast level), so hundreds of MiB of zeros cost little memory."""

    def __init__(self) -> None:
        self._out = io.BytesIO()
        self._gz = gzip.GzipFile(fileobj=self._out, mode="wb", compresslevel=1, mtime=0)

    def write(self, data: bytes) -> None:
        self._gz.write(data)

    def finish(self) -> bytes:
        self._gz.close()
        return self._out.getvalue()


def app_dir(parent: Path, app_id: str, version: str = "1.0.0") -> Path:
    """A small valid app: manifest, an executable entrypoint, a sub-folder, a link inside."""
    root = parent / app_id
    (root / "static" / "img").mkdir(parents=True)
    (root / "app.manifest.json").write_text(
        json.dumps({"id": app_id, "version": version, "name": "Hello"})
    )
    (root / "entrypoint.sh").write_text("#!/bin/sh\nexec python3 server.py\n")
    (root / "entrypoint.sh").chmod(0o755)
    (root / "server.py").write_text("print('hello')\n")
    (root / "static" / "index.html").write_text("<h1>hello</h1>\n")
    (root / "static" / "img" / "dot.bin").write_bytes(bytes(range(256)))
    (root / "static" / "private.txt").write_text("owner only\n")
    (root / "static" / "private.txt").chmod(0o600)
    (root / "index.html").symlink_to("static/index.html")
    return root


def tree_of(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """Every entry under ``root``: kind, permission bits (files) and content or link target."""
    found: dict[str, tuple[str, int, bytes]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            found[rel] = ("link", 0, str(path.readlink()).encode())
        elif stat.S_ISDIR(st.st_mode):
            found[rel] = ("dir", 0, b"")
        else:
            found[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return found
