"""The rules for an image's layer members, decided before anything touches the disk.

Pure: a tar member's name, type, mode and link target in, a `Step` (what the unpacker does) or a
`LayerRefused` out (docs/decisions.md "Images: the runtime field and the image store"):

- names are relative to the root file system: a leading ``./`` is dropped; an absolute name, a
  ``..`` part, a NUL or an empty part after the root is refused (the whole image with it);
- ``.wh.<name>`` deletes ``<name>`` from the lower layers, ``.wh..wh..opq`` empties its folder of
  what the lower layers put there (the OCI image layer rules);
- device nodes and fifos are skipped (the sandbox mounts its own ``/dev``; an image that ships
  ``/dev/console`` still runs), counted so the store can say how many;
- setuid, setgid and sticky bits are cleared; a file is 0444, or 0555 when the image made it
  executable, a folder 0755, all owned by the store (the store is shared read-only by every
  instance of the image, each under its own uid: the image's owners and private modes would make
  files unreadable to them, and nothing in a pulled image is a secret from who can pull it);
- a symbolic link is kept when its target, read inside the image (an absolute target from the
  image's root, a relative one from the link's folder), stays in the image; a target that climbs
  out with ``..`` is refused. Read alone a target can look inside yet leave through another
  link (``d -> .`` then ``x -> d/..``): once the last layer is unpacked every link is resolved
  through the tree's own links (`resolve_link`). A hard link must name a member path, never
  absolute or with ``..``. Links are never followed while unpacking: the unpacker refuses a
  member (a hard link's source and a whiteout too) whose parent folder is a link (see
  `atrium.images.store`);
- an extended header (PAX, GNU long name or link) larger than `MAX_HEADER` is refused before
  tarfile reads it (`BoundedTarInfo`): tarfile holds one whole in memory, beyond every limit.
"""

from __future__ import annotations

import posixpath
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

WHITEOUT: Final = ".wh."
OPAQUE: Final = ".wh..wh..opq"
#: a file in the store: readable by all, executable by all when the image made it executable,
#: never writable, never setuid, setgid or sticky (ownership is the store's, not the image's)
FILE_MODE: Final = 0o444
EXEC_MODE: Final = 0o555
FOLDER_MODE: Final = 0o755
MAX_NAME: Final = 4096
#: the most an extended header (PAX, GNU long name or link) may hold: tarfile reads one whole
#: into memory before any member is seen, so an unbounded one is a memory bomb
MAX_HEADER: Final = 1 << 20
#: the tar member types whose body tarfile reads whole into memory (PAX, GNU long name/link)
EXTENDED_HEADERS: Final = frozenset(
    {
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
    }
)
#: layer media types the store unpacks (compression is read from the bytes themselves)
LAYER_TYPES: Final = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.docker.image.rootfs.diff.tar",
    }
)


class LayerRefused(ValueError):
    """A layer member breaks a rule; the message names the member and the rule."""


class Kind(StrEnum):
    """What a member becomes."""

    FOLDER = "folder"
    FILE = "file"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"
    WHITEOUT = "whiteout"
    OPAQUE = "opaque"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Step:
    """What to do for one member: ``parts`` is its path under the root (``()`` is the root
    itself); ``target`` the link target (a symlink's as written, a hard link's as parts);
    ``mode`` the permission bits to set."""

    kind: Kind
    parts: tuple[str, ...]
    mode: int = 0
    target: str = ""
    target_parts: tuple[str, ...] = ()
    size: int = 0


class BoundedTarInfo(tarfile.TarInfo):
    """A member whose extended header is refused past `MAX_HEADER`, and a sparse member refused
    outright, before tarfile reads either (``tarfile.open(..., tarinfo=BoundedTarInfo)``): tarfile
    holds an extended header, and a sparse member's map (old GNU extension blocks, or PAX 1.0's
    map in the data), whole in memory, beyond every limit of the store's. No image builder
    writes sparse members."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in EXTENDED_HEADERS and self.size > MAX_HEADER:
            raise LayerRefused(
                f"an extended header of {self.size} bytes (more than {MAX_HEADER}) is refused "
                "before it is read"
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            _refuse_sparse(self.name)
        member: tarfile.TarInfo = super()._proc_member(archive)  # type: ignore[misc]
        return member

    def _proc_gnusparse_00(self, *args: object) -> None:
        _refuse_sparse(_member_name(args))

    def _proc_gnusparse_01(self, *args: object) -> None:
        _refuse_sparse(_member_name(args))

    def _proc_gnusparse_10(self, *args: object) -> None:
        _refuse_sparse(_member_name(args))


def _member_name(args: tuple[object, ...]) -> str:
    """The member a PAX sparse header describes (tarfile passes it first)."""
    return args[0].name if args and isinstance(args[0], tarfile.TarInfo) else "?"


def _refuse_sparse(name: str) -> None:
    raise LayerRefused(f"sparse member {name[:200]!r} is refused (no image builder writes one)")


def member_parts(name: str, what: str = "member") -> tuple[str, ...]:
    """The path parts of a member name under the root, or LayerRefused."""
    if "\x00" in name or len(name) > MAX_NAME:
        raise LayerRefused(f"{what} {name!r} has a NUL byte or is too long")
    if name.startswith("/"):
        raise LayerRefused(f"{what} {name!r} is absolute (a layer's names are relative)")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise LayerRefused(f"{what} {name!r} climbs out with '..'")
    return tuple(parts)


def symlink_stays_inside(parts: tuple[str, ...], target: str) -> bool:
    """A symlink at ``parts`` pointing at ``target`` resolves inside the image, read as the
    image sees it (absolute from its root, relative from the link's folder), never climbing
    above the root."""
    if not target or "\x00" in target:
        return False
    depth = 0 if target.startswith("/") else len(parts) - 1
    for part in target.split("/"):
        if part in ("", "."):
            continue
        depth += -1 if part == ".." else 1
        if depth < 0:
            return False
    return True


class Node(StrEnum):
    """What a path of the unpacked tree is, as `resolve_link` asks about it."""

    FOLDER = "folder"
    LINK = "link"
    OTHER = "other"
    MISSING = "missing"


#: the most links one resolution follows (the kernel's own limit, MAXSYMLINKS)
MAX_LINK_HOPS: Final = 40


def resolve_link(
    parts: tuple[str, ...],
    target: str,
    look: Callable[[tuple[str, ...]], tuple[Node, str]],
) -> tuple[str, ...]:
    """Where the symbolic link at ``parts`` pointing at ``target`` lands in the unpacked tree, as
    the kernel would resolve it: each part in turn, following the tree's own links (an absolute
    target from the image's root, a relative one from the link's folder), at most
    `MAX_LINK_HOPS` links. ``look(parts)`` says what a path is (and a link's target); it is
    only asked about paths whose folders are real folders. Past a missing path or a file the
    rest is read as written (nothing there to follow). A ``..`` above the root is refused
    (LayerRefused), not held at the root as the kernel would inside the sandbox: the store's
    rootfs is also read from outside the sandbox, where the root has a parent. A link that needs
    more than `MAX_LINK_HOPS` links is refused too (it resolves nowhere)."""
    name = normal_path(parts)
    where = [] if target.startswith("/") else list(parts[:-1])
    pending = list(reversed(_link_parts(target)))
    hops = 0
    #: how deep the first missing path (or file) is: below it nothing is looked up; a ``..``
    #: back above it looks again (a folder made there later, such as a data mount point,
    #: would be followed by the kernel)
    beyond = 0
    while pending:
        part = pending.pop()
        if part == "..":
            if not where:
                raise LayerRefused(
                    f"symbolic link {name} -> {target!r} leaves the image's root (resolved "
                    "through the image's own links)"
                )
            where.pop()
            if len(where) < beyond:
                beyond = 0
            continue
        where.append(part)
        if beyond:
            continue
        node, link_target = look(tuple(where))
        if node is Node.LINK:
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise LayerRefused(
                    f"symbolic link {name} -> {target!r} goes through more than "
                    f"{MAX_LINK_HOPS} links"
                )
            where.pop()
            if link_target.startswith("/"):
                where.clear()
            pending.extend(reversed(_link_parts(link_target)))
        elif node is not Node.FOLDER:
            beyond = len(where)
    return tuple(where)


def _link_parts(target: str) -> list[str]:
    return [p for p in target.split("/") if p not in ("", ".")]


def file_mode(mode: int) -> int:
    return EXEC_MODE if mode & 0o111 else FILE_MODE


def plan(member: tarfile.TarInfo) -> Step:
    """The step for one member (no I/O)."""
    parts = member_parts(member.name)
    base = parts[-1] if parts else ""
    if base == OPAQUE:
        return Step(Kind.OPAQUE, parts[:-1])
    if base.startswith(WHITEOUT):
        hidden = base.removeprefix(WHITEOUT)
        if not hidden or hidden in (".", ".."):
            raise LayerRefused(f"whiteout {member.name!r} names nothing")
        return Step(Kind.WHITEOUT, (*parts[:-1], hidden))
    if member.ischr() or member.isblk() or member.isfifo():
        return Step(Kind.SKIP, parts)
    if member.isdir():
        return Step(Kind.FOLDER, parts, FOLDER_MODE)
    if not parts:
        raise LayerRefused(f"member {member.name!r} would replace the root folder")
    if member.issym():
        if not symlink_stays_inside(parts, member.linkname):
            raise LayerRefused(
                f"symbolic link {member.name!r} -> {member.linkname!r} leaves the image's root"
            )
        return Step(Kind.SYMLINK, parts, target=member.linkname)
    if member.islnk():
        target = member_parts(member.linkname, f"hard link {member.name!r} target")
        if not target:
            raise LayerRefused(f"hard link {member.name!r} points at the root folder")
        return Step(Kind.HARDLINK, parts, target=member.linkname, target_parts=target)
    if member.isreg():
        return Step(Kind.FILE, parts, file_mode(member.mode), size=member.size)
    raise LayerRefused(f"member {member.name!r} has an unknown type {member.type!r}")


def setid_cleared(mode: int) -> bool:
    """Whether ``mode`` carried setuid or setgid bits (the store clears them)."""
    return bool(mode & (stat.S_ISUID | stat.S_ISGID))


def normal_path(parts: tuple[str, ...]) -> str:
    return "/" + posixpath.join(*parts) if parts else "/"
