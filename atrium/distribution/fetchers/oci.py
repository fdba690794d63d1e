"""OCI fetcher: pulls an app artifact by its digest into staging and unpacks it safely.

docs/api.md "Progress events" and decisions.md "Distribution". The manifest is pulled by the
resolved digest and checked; the one layer streams to a file in staging (``fetch.progress`` every
256 KiB) with its sha256 verified; then it is unpacked member by member into
``staging/<dir_name>/``. Refused, each with FetchFailed naming the member: absolute paths, ``..``,
members outside the ``<dir_name>/`` top-level folder, links that leave it, device files, fifos and
other special types, a member that appears twice or is written through a link, and more than
256 MiB unpacked (counted from the headers, before any data is read). The unpacked tree then goes
through the one tree check of every fetcher (atrium.distribution.tree.check_tree): no VCS metadata
such as ``<id>/.git/``, no link chain that leads out.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import os
import posixpath
import shutil
import stat
import tarfile
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final, Protocol, Self

from atrium.distribution import artifact
from atrium.distribution.fetchers import ProgressEvent, ResolvedRef
from atrium.distribution.ociclient import RegistryClient, RegistryError
from atrium.distribution.reach import Reach
from atrium.distribution.refs import OciRef, parse_ref
from atrium.distribution.tree import UnsafeTree, check_tree, is_vcs_name
from atrium.errors import BadRef, FetchFailed
from atrium.events import FETCH_PROGRESS
from atrium.images.layers import EXTENDED_HEADERS, MAX_HEADER

MAX_UNPACKED: Final = artifact.MAX_UNPACKED
#: a compressed layer cannot legitimately be much larger than what it unpacks to
MAX_LAYER: Final = MAX_UNPACKED + (16 << 20)
MAX_MEMBERS: Final = 100_000
PROGRESS_STEP: Final = 256 << 10
#: tar headers and padding on top of the file bytes, for the cap on the decompressed stream
TAR_OVERHEAD: Final = 2048
COPY_CHUNK: Final = 1 << 20


class OciFetcher:
    """Fetches ``source == "oci"`` resolved refs (the contract is in ``atrium.distribution.fetchers``).

    ``docker_config``: the Docker config file or directory holding registry credentials; None
    means ``$DOCKER_CONFIG`` or ``~/.docker``.
    """

    def __init__(self, docker_config: Path | None = None, reach: Reach | None = None) -> None:
        self.docker_config = docker_config
        self.reach = reach

    async def fetch(self, resolved: ResolvedRef, staging: Path) -> AsyncIterator[ProgressEvent]:
        ref = oci_ref(resolved)
        raw = str(resolved.ref)
        layer_file = staging / f".{resolved.digest.removeprefix('sha256:')[:32]}.layer"
        try:
            async with RegistryClient(
                ref.registry, ref.repository, docker_config=self.docker_config, reach=self.reach
            ) as client:
                pulled = await client.manifest(resolved.digest)
                try:
                    layer = artifact.check_app_manifest(pulled.json(), pulled.media_type).layer
                except ValueError as err:
                    raise FetchFailed(raw, str(err)) from err
                if layer.size > MAX_LAYER:
                    raise FetchFailed(
                        raw, f"the layer is {layer.size} bytes; an app is at most 256 MiB unpacked"
                    )
                async for event in _download(client, layer, layer_file):
                    yield event
            await asyncio.to_thread(unpack_layer, layer_file, staging, resolved.dir_name, raw)
        except RegistryError as err:
            raise FetchFailed(raw, err.reason) from err
        finally:
            await asyncio.to_thread(layer_file.unlink, missing_ok=True)


def oci_ref(resolved: ResolvedRef) -> OciRef:
    """The repository to pull from: the resolved address (pinned), else the ref itself."""
    try:
        pinned = parse_ref(resolved.address)
    except BadRef:
        pinned = resolved.ref
    if isinstance(pinned, OciRef):
        return pinned
    if isinstance(resolved.ref, OciRef):
        return resolved.ref
    raise FetchFailed(str(resolved.ref), f"{resolved.address!r} is not an OCI ref")


async def _download(
    client: RegistryClient, layer: artifact.Descriptor, target: Path
) -> AsyncIterator[ProgressEvent]:
    done = reported = 0
    with await asyncio.to_thread(target.open, "wb") as out:
        async for chunk in client.blob(layer.digest, layer.size):
            out.write(chunk)
            done += len(chunk)
            if done - reported >= PROGRESS_STEP:
                reported = done
                yield _progress(done, layer)
    if reported != done or done == 0:
        yield _progress(done, layer)


def _progress(done: int, layer: artifact.Descriptor) -> ProgressEvent:
    return {"type": FETCH_PROGRESS, "done": done, "total": layer.size, "digest": layer.digest}


class _MetaHeaderTooLarge(Exception):
    pass


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses a long-name or pax header larger than 1 MiB before tarfile reads it into memory."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        info = super().frombuf(buf, encoding, errors)
        if info.type in EXTENDED_HEADERS and info.size > MAX_HEADER:
            raise _MetaHeaderTooLarge(f"a {info.size}-byte {info.type!r} metadata header")
        return info


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _CappedReader:
    """Counts decompressed bytes and stops a stream that grows past ``cap`` (a gzip bomb).

    Read-only and sequential: what ``tarfile.open(mode="r|")`` needs.
    """

    def __init__(self, raw: _Readable, cap: int, refuse: FetchFailed) -> None:
        self._raw, self._cap, self._refuse, self.count = raw, cap, refuse, 0

    def read(self, size: int = -1, /) -> bytes:
        data = self._raw.read(size)
        self.count += len(data)
        if self.count > self._cap:
            raise self._refuse
        return data

    def write(self, b: bytes, /) -> int:
        raise io.UnsupportedOperation("write")

    def tell(self) -> int:
        return self.count

    def seek(self, pos: int, /) -> int:
        raise io.UnsupportedOperation("seek")

    def close(self) -> None:
        return None


class _Unpacker:
    """Unpacks one layer under ``staging``; every member must land in ``staging/<dir_name>/``."""

    def __init__(self, staging: Path, dir_name: str, ref: str) -> None:
        self.staging, self.dir_name, self.ref = staging, dir_name, ref
        self.unpacked = 0
        self.links: dict[str, Path] = {}
        self.dirs: list[tuple[Path, int]] = []

    def refuse(self, member: str, why: str) -> FetchFailed:
        return FetchFailed(self.ref, f"unsafe artifact: member {member!r} {why}")

    def parts(self, name: str, member: str) -> tuple[str, ...]:
        """The path components of an archive name, checked to stay inside ``<dir_name>/``."""
        if "\x00" in name:
            raise self.refuse(member, "has a NUL in its name")
        if name.startswith("/"):
            raise self.refuse(member, "has an absolute path")
        parts = tuple(p for p in name.removeprefix("./").split("/") if p not in ("", "."))
        if ".." in parts:
            raise self.refuse(member, "has a '..' path component")
        if not parts or parts[0] != self.dir_name:
            raise self.refuse(member, f"is outside the app's top-level folder {self.dir_name!r}/")
        return parts

    def through_link(self, parts: tuple[str, ...]) -> bool:
        return any("/".join(parts[:i]) in self.links for i in range(1, len(parts) + 1))

    def member(self, tar: tarfile.TarFile, info: tarfile.TarInfo) -> None:
        parts = self.parts(info.name, info.name)
        dest = self.staging.joinpath(*parts)
        if self.through_link(parts):
            raise self.refuse(info.name, "is written through a link")
        if any(is_vcs_name(part) for part in parts[1:]):
            # refused before it is written; check_tree in finish() says the same of the tree
            raise self.refuse(info.name, "is version-control metadata (e.g. a .git folder)")
        if len(parts) == 1 and not info.isdir():
            raise self.refuse(info.name, "must be the app's folder")
        if info.isdir():
            self.directory(info, dest)
        elif info.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
            self.unpacked += info.size
            if self.unpacked > MAX_UNPACKED:
                raise self.refuse(info.name, "takes the app past 256 MiB unpacked")
            self.regular(tar, info, dest)
        elif info.issym():
            self.symlink(info, parts, dest)
        elif info.islnk():
            self.hardlink(info, dest)
        elif info.ischr() or info.isblk():
            raise self.refuse(info.name, "is a device file")
        elif info.isfifo():
            raise self.refuse(info.name, "is a fifo")
        else:
            raise self.refuse(info.name, f"has an unsupported tar type {info.type!r}")

    def directory(self, info: tarfile.TarInfo, dest: Path) -> None:
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            raise self.refuse(info.name, "appears twice")
        dest.mkdir(parents=True, exist_ok=True)
        self.dirs.append((dest, info.mode))

    def symlink(self, info: tarfile.TarInfo, parts: tuple[str, ...], dest: Path) -> None:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(info.name), info.linkname))
        if info.linkname.startswith("/") or not (
            target == self.dir_name or target.startswith(self.dir_name + "/")
        ):
            raise self.refuse(info.name, f"is a link to {info.linkname!r} outside the app")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(info.linkname)
        self.links["/".join(parts)] = dest

    def hardlink(self, info: tarfile.TarInfo, dest: Path) -> None:
        source_parts = self.parts(info.linkname, info.name)
        source = self.staging.joinpath(*source_parts)
        if self.through_link(source_parts) or not _is_file(source):
            raise self.refuse(info.name, f"is a hard link to {info.linkname!r}, not to a file")
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(source, dest, follow_symlinks=False)

    def regular(self, tar: tarfile.TarFile, info: tarfile.TarInfo, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            fd = os.open(dest, flags, 0o600)
        except FileExistsError:
            raise self.refuse(info.name, "appears twice") from None
        with os.fdopen(fd, "wb") as out:
            data = tar.extractfile(info)
            if data is not None:
                shutil.copyfileobj(data, out, COPY_CHUNK)
            os.fchmod(out.fileno(), info.mode & 0o777)

    def finish(self) -> None:
        root = (self.staging / self.dir_name).resolve()
        if not (self.staging / self.dir_name).is_dir():
            raise FetchFailed(self.ref, f"the artifact holds no {self.dir_name!r}/ folder")
        for name, link in self.links.items():
            if not link.resolve().is_relative_to(root):
                raise self.refuse(name, "is a link that resolves outside the app")
        try:
            check_tree(root)  # the one check of every fetcher: no VCS metadata, no link out
        except UnsafeTree as err:
            raise FetchFailed(self.ref, f"unsafe artifact: member {self.dir_name}/{err}") from err
        for path, mode in reversed(self.dirs):
            # the owner keeps rwx, so the tree can always be moved, updated and removed
            path.chmod((mode & 0o777) | 0o700)


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def unpack_layer(layer: Path, staging: Path, dir_name: str, ref: str) -> None:
    """Unpack a tar+gzip layer into ``staging/<dir_name>/`` (blocking; run it in a thread)."""
    if (staging / dir_name).exists() or (staging / dir_name).is_symlink():
        raise FetchFailed(ref, f"{staging / dir_name} exists already")
    unpacker = _Unpacker(staging, dir_name, ref)
    too_big = FetchFailed(ref, "unsafe artifact: it unpacks to more than 256 MiB")
    count = 0
    current = "(archive)"
    try:
        with (
            layer.open("rb") as raw,
            gzip.GzipFile(fileobj=raw, mode="rb") as gz,
            tarfile.open(
                fileobj=_CappedReader(gz, MAX_UNPACKED + MAX_MEMBERS * TAR_OVERHEAD, too_big),
                mode="r|",
                tarinfo=_BoundedTarInfo,
            ) as tar,
        ):
            for info in tar:
                current = info.name
                count += 1
                if count > MAX_MEMBERS:
                    raise unpacker.refuse(info.name, f"is past the limit of {MAX_MEMBERS} entries")
                unpacker.member(tar, info)
    except _MetaHeaderTooLarge as err:
        raise FetchFailed(ref, f"unsafe artifact: after {current!r} comes {err}") from err
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError) as err:
        raise FetchFailed(ref, f"the layer is not a valid tar+gzip ({err})") from err
    except OSError as err:
        raise FetchFailed(ref, f"cannot unpack member {current!r}: {err}") from err
    unpacker.finish()
