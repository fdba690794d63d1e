"""The image store: OCI images pulled by digest, verified and unpacked once, shared read-only.

``$ATRIUM_HOME/images/sha256-<hex>/`` holds one image by the digest it is pinned to (an image
manifest's, or an index's: the entry then holds the platform this machine runs): ``rootfs/`` (the
layers applied in order by the rules of `atrium.images.layers`), ``config.json`` (the image config
as served), ``manifest.json`` and ``image.json`` (what the store learnt: digests, sizes, counts);
an image an app carried also ``layout/``, the blobs it uses as an OCI image layout, which an
export of the app carries (`ImageStore.keep_layout`).

An entry appears whole or not at all: a pull stages in ``images/.staging/<hex>-<pid>-<token>/``
and renames it into place; a staging folder whose process is gone (a killed pull) is swept at the
next pull. A second pull of the same digest reuses the entry without asking the registry. Every
blob is verified by size and sha256 (`atrium.distribution.ociclient.RegistryClient.blob`) before
a byte of it is unpacked. The registry client (and its Docker-config logins) is the one app
artifacts use. An image an app carries as an OCI image layout comes in through `ImageStore.load`
(`atrium.images.layout.LayoutSource`, OCI media types only) and is unpacked the same way.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import platform
import re
import secrets
import shutil
import stat
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Final, Protocol, TypeVar

import zstandard

from atrium.distribution import artifact
from atrium.distribution.ociclient import (
    PulledManifest,
    RegistryClient,
    RegistryError,
    size_text,
)
from atrium.distribution.reach import Reach
from atrium.images.config import ConfigInvalid, ImageConfig, parse_config
from atrium.images.layers import (
    FOLDER_MODE,
    LAYER_TYPES,
    BoundedTarInfo,
    Kind,
    LayerRefused,
    Node,
    Step,
    normal_path,
    plan,
    resolve_link,
    setid_cleared,
)

DIGEST_RE: Final = re.compile(r"sha256:[0-9a-f]{64}\Z")
STAGING: Final = ".staging"
META: Final = "image.json"
#: an entry's copy of the blobs of an image an app carried (`ImageStore.keep_layout`)
LAYOUT: Final = "layout"
CONFIG_TYPES: Final = frozenset(
    {"application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"}
)
IMAGE_TYPES: Final = frozenset({artifact.OCI_MANIFEST, artifact.DOCKER_MANIFEST})
INDEX_TYPES: Final = frozenset({artifact.OCI_INDEX, artifact.DOCKER_LIST})
MAX_CONFIG: Final = 1 << 20
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class MediaTypes:
    """What a source's manifests, configs and layers may be."""

    images: frozenset[str]
    indexes: frozenset[str]
    configs: frozenset[str]
    layers: frozenset[str]
    #: said after a refused media type that this source does not read (the Docker ones of a layout)
    refused: frozenset[str] = frozenset()
    advice: str = ""

    def hint(self, media_type: object) -> str:
        return self.advice if media_type in self.refused else ""


#: a registry serves OCI and Docker v2 images alike
REGISTRY_TYPES: Final = MediaTypes(IMAGE_TYPES, INDEX_TYPES, CONFIG_TYPES, LAYER_TYPES)
#: an OCI image layout holds OCI content; a Docker v2 type there is refused, naming it
LAYOUT_TYPES: Final = MediaTypes(
    frozenset({artifact.OCI_MANIFEST}),
    frozenset({artifact.OCI_INDEX}),
    frozenset({"application/vnd.oci.image.config.v1+json"}),
    frozenset(t for t in LAYER_TYPES if t.startswith("application/vnd.oci.")),
    refused=frozenset(
        t for t in (*IMAGE_TYPES, *INDEX_TYPES, *CONFIG_TYPES, *LAYER_TYPES) if ".docker." in t
    ),
    advice=(
        ": an image layout an app carries holds OCI media types only, not Docker v2 ones "
        "(`skopeo copy docker://<image> oci:<folder>` writes one)"
    ),
)


class BlobSource(Protocol):
    """Where an image's manifests and blobs come from: a registry (`RegistryClient`) or a layout
    an app carries (`atrium.images.layout.LayoutSource`); both verify what they hand over."""

    async def manifest(self, reference: str) -> PulledManifest: ...

    def blob(self, digest: str, size: int) -> AsyncIterator[bytes]: ...


#: ``image.json``'s mark that `check_links` passed on the entry's tree
LINKS_RESOLVED: Final = "resolved"
#: defaults of the store's limits (``ImageStore(max_bytes=..., max_files=...)``)
MAX_BYTES: Final = 8 << 30
MAX_FILES: Final = 500_000
MAX_LAYERS: Final = 128
ARCHES: Final = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}
ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC: Final = b"\x1f\x8b"
CHUNK: Final = 1 << 20
#: staging folders of the pulls under way in this process, whichever store started them
_PULLING: Final[set[Path]] = set()
#: folders every rootfs has, for the sandbox's /proc, /dev, /sys, /tmp and /run
MOUNT_POINTS: Final = ("proc", "dev", "sys", "tmp", "run")


class ImageError(Exception):
    """A pull failed; ``reason`` is a sentence for the user. Nothing is left in the store."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def machine_arch() -> str:
    """This machine's architecture as OCI platforms name it."""
    machine = platform.machine()
    return ARCHES.get(machine, machine)


@dataclass(frozen=True, slots=True)
class StoredImage:
    """One entry of the store."""

    digest: str
    path: Path
    manifest_digest: str
    config_digest: str
    config: ImageConfig
    #: bytes of the layers as pulled, and unpacked
    pulled_bytes: int
    size: int
    files: int
    #: device nodes and fifos left out, files whose setuid/setgid bits were cleared
    skipped: int
    setid_cleared: int
    reused: bool = False

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"


@dataclass(slots=True)
class _Budget:
    max_bytes: int
    max_files: int
    size: int = 0
    files: int = 0
    skipped: int = 0
    setid_cleared: int = 0

    def add_file(self, name: str) -> None:
        self.files += 1
        if self.files > self.max_files:
            raise LayerRefused(
                f"the image has more than {self.max_files} files (the store's limit) at {name}"
            )

    def add_bytes(self, count: int, name: str) -> None:
        self.size += count
        if self.size > self.max_bytes:
            raise LayerRefused(
                f"the image unpacks to more than {size_text(self.max_bytes)} (the store's "
                f"limit) at {name}"
            )


def entry_name(digest: str) -> str:
    return digest.replace(":", "-", 1)


# -- unpacking (synchronous, run in a thread) ------------------------------------------------


@contextmanager
def _decompressed(path: Path) -> Iterator[IO[bytes]]:
    """The layer's tar stream: gzip, zstd or plain, told by the bytes (not the media type)."""
    with path.open("rb") as raw:
        magic = raw.read(4)
        raw.seek(0)
        if magic.startswith(GZIP_MAGIC):
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield unzipped  # type: ignore[misc]
        elif magic == ZSTD_MAGIC:
            with zstandard.ZstdDecompressor().stream_reader(raw) as unzstd:
                yield unzstd
        else:
            yield raw


@dataclass(slots=True)
class _Layer:
    """What one layer's unpack remembers: the paths it wrote (an opaque marker keeps them) and the
    folders already checked to be real folders (each removal of a folder forgets them all)."""

    touched: set[tuple[str, ...]] = field(default_factory=set)
    folders: set[tuple[str, ...]] = field(default_factory=set)


def _walk_parent(root: Path, parts: tuple[str, ...], layer: _Layer, *, create: bool) -> Path | None:
    """The folder that holds ``parts``, each folder on the way a real folder (never a link:
    the unpacker follows no link); missing folders are made (``create``) or None."""
    folder = root
    for depth, part in enumerate(parts[:-1], start=1):
        folder = folder / part
        if parts[:depth] in layer.folders:
            continue
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            if not create:
                return None
            folder.mkdir(FOLDER_MODE)
            layer.folders.add(parts[:depth])
            continue
        if stat.S_ISLNK(info.st_mode):
            raise LayerRefused(
                f"{normal_path(parts)} would be written through the symbolic link "
                f"{normal_path(parts[:depth])} (the store follows no link while unpacking)"
            )
        if not stat.S_ISDIR(info.st_mode):
            raise LayerRefused(
                f"{normal_path(parts)} is under {normal_path(parts[:depth])}, a file"
            )
        layer.folders.add(parts[:depth])
    return folder


def _remove(path: Path, layer: _Layer) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        layer.folders.clear()
        shutil.rmtree(path)
    else:
        path.unlink()


def _clear_opaque(folder: Path, parts: tuple[str, ...], layer: _Layer) -> None:
    """Remove what lower layers put under ``folder``, keeping what this layer already wrote."""
    for path in folder.iterdir():
        child = (*parts, path.name)
        if child not in layer.touched:
            _remove(path, layer)
        elif stat.S_ISDIR(os.lstat(path).st_mode):
            _clear_opaque(path, child, layer)


def _touch(touched: set[tuple[str, ...]], parts: tuple[str, ...]) -> None:
    for depth in range(1, len(parts) + 1):
        touched.add(parts[:depth])


def _write_file(path: Path, source: IO[bytes] | None, step: Step, budget: _Budget) -> None:
    name = normal_path(step.parts)
    budget.add_bytes(step.size, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        written = 0
        while source is not None and (chunk := source.read(CHUNK)):
            written += len(chunk)
            if written > step.size:
                raise LayerRefused(f"{name} holds more bytes than its header says")
            out.write(chunk)
        os.fchmod(out.fileno(), step.mode)


def _placed(root: Path, parts: tuple[str, ...], layer: _Layer) -> Path:
    folder = _walk_parent(root, parts, layer, create=True)
    if folder is None:  # create=True makes every folder on the way
        raise LayerRefused(f"{normal_path(parts)} has no folder")
    return folder / parts[-1]


def _make_folder(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        path.mkdir(FOLDER_MODE)
        return
    if not stat.S_ISDIR(info.st_mode):
        path.unlink()
        path.mkdir(FOLDER_MODE)
    path.chmod(FOLDER_MODE)


def _hard_link(root: Path, path: Path, step: Step, layer: _Layer) -> None:
    name = normal_path(step.parts)
    source_folder = _walk_parent(root, step.target_parts, layer, create=False)
    source = None if source_folder is None else source_folder / step.target_parts[-1]
    if source is None or not os.path.lexists(source):
        raise LayerRefused(f"hard link {name} points at {step.target!r}, not in the image")
    if not stat.S_ISREG(source.lstat().st_mode):
        raise LayerRefused(f"hard link {name} points at {step.target!r}, which is not a file")
    os.link(source, path, follow_symlinks=False)


def _hide(root: Path, step: Step, layer: _Layer) -> None:
    """A whiteout removes its name; an opaque marker empties its folder of the lower layers'."""
    folder = _walk_parent(root, step.parts, layer, create=False)
    if step.kind is Kind.WHITEOUT:
        if folder is not None:
            _remove(folder / step.parts[-1], layer)
        return
    target = root.joinpath(*step.parts)
    if target.is_dir() and not target.is_symlink():
        _clear_opaque(target, step.parts, layer)


def _apply(
    root: Path,
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    budget: _Budget,
    layer: _Layer,
) -> None:
    step = plan(member)
    name = normal_path(step.parts)
    # every member costs the unpacker, even one that leaves nothing behind (a fifo, a whiteout
    # with a body): all count toward the limits; a file's bytes count as it is written
    budget.add_file(name)
    if step.kind is not Kind.FILE:
        budget.add_bytes(member.size, name)
    if step.kind is Kind.SKIP:
        budget.skipped += 1
        return
    if step.kind in (Kind.WHITEOUT, Kind.OPAQUE):
        _hide(root, step, layer)
        return
    if not step.parts:  # the root folder itself
        root.chmod(FOLDER_MODE)
        return
    path = _placed(root, step.parts, layer)
    _touch(layer.touched, step.parts)
    if step.kind is Kind.FOLDER:
        _make_folder(path)
        return
    _remove(path, layer)
    if step.kind is Kind.SYMLINK:
        path.symlink_to(step.target)
    elif step.kind is Kind.HARDLINK:
        _hard_link(root, path, step, layer)
    else:
        if setid_cleared(member.mode):
            budget.setid_cleared += 1
        _write_file(path, tar.extractfile(member), step, budget)


def _look(root: Path, parts: tuple[str, ...]) -> tuple[Node, str]:
    path = root.joinpath(*parts)
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return Node.MISSING, ""
    if stat.S_ISLNK(info.st_mode):
        return Node.LINK, str(path.readlink())
    return (Node.FOLDER if stat.S_ISDIR(info.st_mode) else Node.OTHER), ""


def check_links(root: Path) -> None:
    """Refuse the unpacked tree if one of its symbolic links, resolved through the tree's own
    links (`resolve_link`), lands outside it. Run once on the whole tree after the last layer:
    a link whose target reads as inside (each member's own check) may still climb out through
    another link, made in the same layer or a later one."""
    folders = [root]
    while folders:
        folder = folders.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_symlink():
                    parts = Path(entry.path).relative_to(root).parts
                    target = str(Path(entry.path).readlink())
                    resolve_link(parts, target, lambda p: _look(root, p))
                elif entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))


def add_mount_points(root: Path) -> None:
    """Empty folders where the sandbox mounts its own file systems: the root is read-only once
    an instance runs, so bubblewrap could not make them then. A name the image already uses
    (a folder, or a link such as ``/run -> /var/run``) is left as the image has it."""
    for name in MOUNT_POINTS:
        if not os.path.lexists(root / name):
            (root / name).mkdir(FOLDER_MODE)


def unpack_layer(layer: Path, root: Path, budget: _Budget) -> None:
    """Apply one layer (a verified blob on disk) over ``root``."""
    state = _Layer()
    try:
        with (
            _decompressed(layer) as stream,
            tarfile.open(fileobj=stream, mode="r|", tarinfo=BoundedTarInfo) as tar,
        ):
            for member in tar:
                _apply(root, tar, member, budget, state)
    except (tarfile.TarError, EOFError, zstandard.ZstdError, gzip.BadGzipFile) as err:
        raise LayerRefused(f"the layer is not a readable tar archive: {err}") from err


# -- manifests --------------------------------------------------------------------------------


def _descriptor(value: Any, what: str) -> tuple[str, str, int]:
    if not isinstance(value, dict):
        raise ImageError(f"the image manifest's {what} is not a descriptor")
    media_type, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise ImageError(f"the image manifest's {what} has no sha256 digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ImageError(f"the image manifest's {what} has no size")
    return str(media_type or ""), digest, size


def pick_platform(
    index: dict[str, Any], arch: str, image_types: frozenset[str] = IMAGE_TYPES
) -> str:
    """The digest of the index's linux/``arch`` image (ImageError naming what it offers)."""
    offered: list[str] = []
    for entry in index.get("manifests") or []:
        if not isinstance(entry, dict):
            continue
        plat = entry.get("platform") or {}
        pair = f"{plat.get('os')}/{plat.get('architecture')}"
        offered.append(pair)
        if pair == f"linux/{arch}" and entry.get("mediaType", artifact.OCI_MANIFEST) in image_types:
            digest = entry.get("digest")
            if isinstance(digest, str) and DIGEST_RE.fullmatch(digest):
                return digest
    raise ImageError(
        f"the image offers no linux/{arch} build (it has {', '.join(offered) or 'none'})"
    )


# -- the store --------------------------------------------------------------------------------


class ImageStore:
    """``root`` is ``$ATRIUM_HOME/images``."""

    def __init__(
        self,
        root: Path,
        *,
        docker_config: Path | None = None,
        max_bytes: int = MAX_BYTES,
        max_files: int = MAX_FILES,
        arch: str | None = None,
    ) -> None:
        self.root = root
        self.docker_config = docker_config
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.arch = arch or machine_arch()
        self._locks: dict[str, asyncio.Lock] = {}

    def entry(self, digest: str) -> Path:
        return self.root / entry_name(digest)

    def get(self, digest: str) -> StoredImage | None:
        """The stored entry for ``digest``, or None."""
        path = self.entry(digest)
        try:
            meta = json.loads((path / META).read_text())
            config = parse_config((path / "config.json").read_bytes())
        except (OSError, ValueError):
            return None
        if meta.get("links") != LINKS_RESOLVED and not _recheck_links(path, meta):
            return None
        return StoredImage(
            digest=digest,
            path=path,
            manifest_digest=meta["manifestDigest"],
            config_digest=meta["configDigest"],
            config=config,
            pulled_bytes=meta["pulledBytes"],
            size=meta["size"],
            files=meta["files"],
            skipped=meta["skipped"],
            setid_cleared=meta["setidCleared"],
            reused=True,
        )

    def sweep(self) -> list[Path]:
        """Remove staging folders of pulls that are no longer running (a killed pull's)."""
        staging = self.root / STAGING
        swept: list[Path] = []
        for folder in staging.iterdir() if staging.is_dir() else []:
            if folder in _PULLING:
                continue
            pid_text = folder.name.split("-")[-2] if folder.name.count("-") >= 2 else ""
            pid = int(pid_text) if pid_text.isdigit() else 0
            if pid and pid != os.getpid() and _alive(pid):
                continue  # another live process's pull
            shutil.rmtree(folder, ignore_errors=True)
            swept.append(folder)
        return swept

    async def pull(
        self,
        registry: str,
        repository: str,
        digest: str,
        *,
        reach: Reach | None = None,
        known: bool = False,
    ) -> StoredImage:
        """The image ``registry/repository@digest``, from the store or pulled into it.

        ``reach``: whose pull this is (a member's connects only where a member's fetch may, without
        the shell's registry logins: `atrium.distribution.reach`); None is the shell's own. An
        entry the store holds is used once that registry gives this caller the manifest by its
        digest: the store holds every app's and user's images (some pulled with the shell's
        logins), and a digest is no proof of access. ``known``: the caller already runs this
        very image (the copy it replaces pins it), so the store's entry is used as it is."""

        async def fetch(staging: Path) -> StoredImage:
            async with RegistryClient(
                registry, repository, docker_config=self.docker_config, reach=reach
            ) as client:
                return await self._unpack(
                    client, digest, staging, f"{registry}/{repository}", REGISTRY_TYPES
                )

        async def verify() -> None:
            async with RegistryClient(
                registry, repository, docker_config=self.docker_config, reach=reach
            ) as client:
                served = await client.manifest(digest)
            if served.digest != digest:
                raise ImageError(f"{registry}/{repository} serves {served.digest}, not {digest}")

        return await self._stored(digest, fetch, None if known else verify)

    async def load(self, source: BlobSource, digest: str, origin: str) -> StoredImage:
        """The image ``digest`` from an OCI image layout an app carries
        (`atrium.images.layout.LayoutSource`), unpacked into the store as a pull is. Only OCI
        media types are read from a layout. An entry the store already has is reused once the
        layout's blobs are verified all the same: a damaged artifact is refused whatever the
        store holds. ``origin``: what ``image.json`` says it came from."""

        async def fetch(staging: Path) -> StoredImage:
            return await self._unpack(source, digest, staging, origin, LAYOUT_TYPES)

        async def verify() -> None:
            _, document = await self._image_manifest(source, digest, LAYOUT_TYPES)
            config_digest, config_size, described = self._check_manifest(
                document, digest, LAYOUT_TYPES
            )
            for blob_digest, size in [(config_digest, config_size), *described]:
                async for _ in source.blob(blob_digest, size):
                    pass

        return await self._stored(digest, fetch, verify)

    async def keep_layout(self, source: BlobSource, digest: str) -> None:
        """Keep the blobs of the stored image ``digest`` an app carried (its top manifest, the
        platform's manifest, config and layers, each verified as it is read from ``source``) as
        an OCI image layout in the entry's ``layout/``: the installed copy keeps no blobs, and an
        export carries them from here so that another machine's import can verify and load the
        image (docs/decisions.md "Images: an export carries the image its app carried"). An entry
        that has them already is left as it is."""
        target = self.entry(digest) / LAYOUT
        async with self._locks.setdefault(digest, asyncio.Lock()):
            if await asyncio.to_thread((target / "index.json").is_file):
                return
            staging = self.root / STAGING / f"{digest[7:]}-{os.getpid()}-{secrets.token_hex(4)}"
            _PULLING.add(staging)
            try:
                await asyncio.to_thread(_make_staging, staging)
                await self._refusals(digest, self._copy_layout(source, digest, staging))
                await asyncio.to_thread(_place_layout, staging, target)
            finally:
                await asyncio.to_thread(shutil.rmtree, staging, True)
                _PULLING.discard(staging)

    async def _copy_layout(self, source: BlobSource, digest: str, staging: Path) -> None:
        blobs = staging / "blobs" / "sha256"
        await asyncio.to_thread(blobs.mkdir, parents=True)
        top = await source.manifest(digest)
        named = json.loads(top.body)
        top_type = (
            top.media_type
            or named.get("mediaType")
            or (artifact.OCI_INDEX if "manifests" in named else artifact.OCI_MANIFEST)
        )
        pulled, document = await self._image_manifest(source, digest, LAYOUT_TYPES)
        config_digest, config_size, described = self._check_manifest(document, digest, LAYOUT_TYPES)
        for manifest in {top.digest: top.body, pulled.digest: pulled.body}.items():
            await asyncio.to_thread((blobs / manifest[0][7:]).write_bytes, manifest[1])
        for blob_digest, size in [(config_digest, config_size), *described]:
            with (blobs / blob_digest[7:]).open("wb") as out:
                async for chunk in source.blob(blob_digest, size):
                    await asyncio.to_thread(out.write, chunk)
        index = {
            "schemaVersion": 2,
            "mediaType": artifact.OCI_INDEX,
            "manifests": [{"mediaType": top_type, "digest": digest, "size": len(top.body)}],
        }
        await asyncio.to_thread(
            (staging / "index.json").write_text, json.dumps(index, indent=1) + "\n"
        )
        await asyncio.to_thread(
            (staging / "oci-layout").write_text, json.dumps({"imageLayoutVersion": "1.0.0"})
        )

    async def _stored(
        self,
        digest: str,
        fetch: Callable[[Path], Awaitable[StoredImage]],
        verify: Callable[[], Awaitable[None]] | None,
    ) -> StoredImage:
        """The entry ``digest``: found (after ``verify``), or ``fetch`` into a staging folder."""
        if not DIGEST_RE.fullmatch(digest):
            raise ImageError(f"{digest!r} is not a sha256 digest: images are pulled by digest")
        lock = self._locks.setdefault(digest, asyncio.Lock())
        async with lock:
            await asyncio.to_thread(self.sweep)
            found = await asyncio.to_thread(self.get, digest)
            if found is not None:
                if verify is not None:
                    await self._refusals(digest, verify())
                return found
            staging = self.root / STAGING / f"{digest[7:]}-{os.getpid()}-{secrets.token_hex(4)}"
            _PULLING.add(staging)
            try:
                await asyncio.to_thread(_make_staging, staging)
                return await self._refusals(digest, fetch(staging))
            finally:
                await asyncio.to_thread(shutil.rmtree, staging, True)
                _PULLING.discard(staging)

    @staticmethod
    async def _refusals(digest: str, work: Awaitable[_T]) -> _T:
        """``work``'s result; its refusals as ImageError."""
        try:
            return await work
        except RegistryError as err:
            raise ImageError(err.reason) from err
        except (LayerRefused, ConfigInvalid) as err:
            raise ImageError(f"the image {digest} is refused: {err}") from err
        except OSError as err:  # the disk said no: a name too long, no space left
            raise ImageError(
                f"the image {digest} could not be unpacked: {err.strerror or err}"
            ) from err

    async def _image_manifest(
        self, client: BlobSource, digest: str, types: MediaTypes
    ) -> tuple[PulledManifest, dict[str, Any]]:
        """The image manifest ``digest`` names: itself, or an index's linux/<arch> entry."""
        pulled = await client.manifest(digest)
        for _ in range(2):
            document = pulled.json()
            if not isinstance(document, dict):
                raise ImageError(f"the manifest {pulled.digest} is not a JSON object")
            media_type = document.get("mediaType") or pulled.media_type
            if media_type in types.images:
                return pulled, document
            if media_type not in types.indexes or pulled.digest != digest:
                break
            pulled = await client.manifest(pick_platform(document, self.arch, types.images))
        raise ImageError(
            f"{pulled.digest} is not an image manifest ({media_type!r}{types.hint(media_type)})"
        )

    def _check_manifest(
        self, document: dict[str, Any], digest: str, types: MediaTypes
    ) -> tuple[str, int, list[tuple[str, int]]]:
        """The config's digest and size, and each layer's, once the manifest passes."""
        config_type, config_digest, config_size = _descriptor(document.get("config"), "config")
        if config_type not in types.configs or config_size > MAX_CONFIG:
            raise ImageError(
                f"the image's config {config_type!r} is not an image config"
                f"{types.hint(config_type)}"
            )
        layers = document.get("layers")
        if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
            raise ImageError(f"the image manifest's layers are not a list of ≤ {MAX_LAYERS}")
        described: list[tuple[str, int]] = []
        for number, layer in enumerate(layers):
            layer_type, layer_digest, layer_size = _descriptor(layer, f"layer {number}")
            if layer_type not in types.layers:
                raise ImageError(
                    f"layer {number} has media type {layer_type!r}, not a tar"
                    f"{types.hint(layer_type)}"
                )
            described.append((layer_digest, layer_size))
        pulled_bytes = sum(size for _, size in described)
        if pulled_bytes > self.max_bytes:
            raise ImageError(
                f"the image {digest}'s layers are {size_text(pulled_bytes)}, more than the "
                f"store's limit of {size_text(self.max_bytes)}"
            )
        return config_digest, config_size, described

    async def _unpack(
        self, client: BlobSource, digest: str, staging: Path, origin: str, types: MediaTypes
    ) -> StoredImage:
        pulled, document = await self._image_manifest(client, digest, types)
        config_digest, config_size, described = self._check_manifest(document, digest, types)
        pulled_bytes = sum(size for _, size in described)
        config_body = b"".join([c async for c in client.blob(config_digest, config_size)])
        config = parse_config(config_body)
        if config.os not in ("", "linux") or config.architecture not in ("", self.arch):
            raise ImageError(
                f"the image is built for {config.os}/{config.architecture}, not linux/{self.arch}"
            )
        budget = _Budget(self.max_bytes, self.max_files)
        rootfs = staging / "rootfs"
        for layer_digest, layer_size in described:
            blob = staging / "layer.blob"
            with blob.open("wb") as out:
                async for chunk in client.blob(layer_digest, layer_size):
                    await asyncio.to_thread(out.write, chunk)
            await asyncio.to_thread(unpack_layer, blob, rootfs, budget)
            blob.unlink()
        await asyncio.to_thread(check_links, rootfs)
        await asyncio.to_thread(add_mount_points, rootfs)
        meta = {
            "digest": digest,
            "manifestDigest": pulled.digest,
            "configDigest": config_digest,
            "pulledFrom": origin,
            "pulledBytes": pulled_bytes,
            "size": budget.size,
            "files": budget.files,
            "skipped": budget.skipped,
            "setidCleared": budget.setid_cleared,
            "links": LINKS_RESOLVED,
        }
        await asyncio.to_thread(_seal, staging, self.entry(digest), pulled.body, config_body, meta)
        stored = self.get(digest)
        if stored is None:
            raise ImageError(f"the image {digest} vanished from the store after unpacking")
        return replace(stored, reused=False)


def _recheck_links(path: Path, meta: dict[str, Any]) -> bool:
    """An entry unpacked before `check_links` ran at every pull is checked once now: kept (and
    marked) when its links stay inside, else moved into the staging folder as a dead pull's
    (the next sweep removes it; a running instance keeps the tree it has mounted) so that it
    is not launched again and the next install pulls, and refuses, it afresh."""
    try:
        check_links(path / "rootfs")
    except (LayerRefused, OSError):
        retired = path.parent / STAGING / f"{path.name.removeprefix('sha256-')}-0-retired"
        retired.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(retired, ignore_errors=True)
        with suppress(OSError):  # another caller retired it first
            path.rename(retired)
        return False
    marked = path / f"{META}.new"
    marked.unlink(missing_ok=True)  # a crashed mark's (read-only) leftover
    marked.write_text(json.dumps({**meta, "links": LINKS_RESOLVED}, indent=1))
    marked.chmod(0o444)
    marked.rename(path / META)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_staging(staging: Path) -> None:
    staging.parent.mkdir(parents=True, exist_ok=True)
    staging.parent.parent.chmod(FOLDER_MODE)
    staging.mkdir(FOLDER_MODE)
    (staging / "rootfs").mkdir(FOLDER_MODE)


def _place_layout(staging: Path, target: Path) -> None:
    """The kept layout renamed into its entry, read-only like the rest of it."""
    for path in staging.rglob("*"):
        if path.is_file():
            path.chmod(0o444)
    try:
        staging.rename(target)
    except OSError:
        if not (target / "index.json").is_file():  # another shell's copy won: keep it
            raise


def _seal(staging: Path, entry: Path, manifest: bytes, config: bytes, meta: dict[str, Any]) -> None:
    """Write the entry's records and rename the staging folder into place (all or nothing)."""
    for name, body in (
        ("manifest.json", manifest),
        ("config.json", config),
        (META, json.dumps(meta, indent=1).encode()),
    ):
        (staging / name).write_bytes(body)
        (staging / name).chmod(0o444)
    staging.chmod(FOLDER_MODE)
    try:
        staging.rename(entry)
    except OSError:
        if not (entry / META).exists():  # someone else's pull of the same digest won: reuse it
            raise
