"""An OCI image layout an app carries (``runtime.image: "oci:<folder>"``), read as a registry is.

The folder holds ``oci-layout`` (``{"imageLayoutVersion": "1.0.0"}``), ``index.json`` listing
exactly one image, and ``blobs/sha256/<hex>`` (the OCI image layout specification). Every file is
opened from the app folder down one name at a time without following a link (`O_NOFOLLOW`), must
be a regular file, and a blob is handed over only once its size and sha256 match what named it;
a manifest is read whole (at most 4 MiB) and hashed before it is parsed. Each refusal is an
ImageError naming the file and what is wrong with it.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import stat
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, Final

from atrium.distribution import artifact
from atrium.distribution.ociclient import MAX_MANIFEST, PulledManifest
from atrium.images.store import DIGEST_RE, LAYOUT_TYPES, ImageError

LAYOUT_FILE: Final = "oci-layout"
INDEX_FILE: Final = "index.json"
LAYOUT_VERSION: Final = "1.0.0"
CHUNK: Final = 1 << 20
_OPEN: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class LayoutSource:
    """The layout at ``app_dir / folder`` (``folder`` a relative path the manifest checked)."""

    def __init__(self, app_dir: Path, folder: str) -> None:
        self.app_dir = app_dir
        self.folder = folder
        self.name = f"oci:{folder}"
        #: the one image's descriptor, once `image` read ``index.json``
        self._top: tuple[str, str, int] | None = None

    # -- files, never through a link ------------------------------------------------------------

    def _open(self, rel: str) -> int:
        """A descriptor of the regular file ``rel`` (under the layout folder)."""
        parts = [*self.folder.split("/"), *rel.split("/")]
        fd = os.open(self.app_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for depth, part in enumerate(parts):
                last = depth == len(parts) - 1
                try:
                    child = os.open(part, _OPEN | (0 if last else os.O_DIRECTORY), dir_fd=fd)
                except OSError as err:
                    raise ImageError(self._why(parts[: depth + 1], err, last)) from err
                os.close(fd)
                fd = child
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ImageError(f"{self._path(parts)} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _path(self, parts: list[str]) -> str:
        return "/".join(parts)

    def _why(self, parts: list[str], err: OSError, last: bool) -> str:
        path = self._path(parts)
        if err.errno == errno.ENOENT:
            if len(parts) <= len(self.folder.split("/")):
                return (
                    f"the app carries no image layout at {self.folder}/ (the manifest's "
                    f"runtime.image is {self.name}): {path} is missing"
                )
            return f"the image layout {self.folder}/ has no {path.removeprefix(self.folder + '/')}"
        if err.errno == errno.ELOOP or (err.errno == errno.ENOTDIR and self._is_link(parts)):
            return (
                f"{path} is a symbolic link: an image layout's files are read as files, never "
                "through a link"
            )
        if err.errno == errno.ENOTDIR and not last:
            return f"{path} is not a folder"
        return f"{path} cannot be read: {err.strerror or err}"

    def _is_link(self, parts: list[str]) -> bool:
        return (self.app_dir.joinpath(*parts)).is_symlink()

    def _read(self, rel: str, limit: int) -> bytes:
        fd = self._open(rel)
        with os.fdopen(fd, "rb") as file:
            body = file.read(limit + 1)
        if len(body) > limit:
            raise ImageError(f"{self.folder}/{rel} is larger than {limit >> 20} MiB")
        return body

    def _json(self, rel: str) -> dict[str, Any]:
        try:
            document = json.loads(self._read(rel, MAX_MANIFEST))
        except ValueError as err:
            raise ImageError(f"{self.folder}/{rel} is not JSON: {err}") from err
        if not isinstance(document, dict):
            raise ImageError(f"{self.folder}/{rel} is not a JSON object")
        return document

    # -- the layout -----------------------------------------------------------------------------

    def image(self) -> str:
        """The digest of the one image ``index.json`` lists (blocking: run it in a thread)."""
        marker = self._json(LAYOUT_FILE)
        if marker.get("imageLayoutVersion") != LAYOUT_VERSION:
            raise ImageError(
                f"{self.folder}/{LAYOUT_FILE} says imageLayoutVersion "
                f"{marker.get('imageLayoutVersion')!r}, not {LAYOUT_VERSION!r}"
            )
        index = self._json(INDEX_FILE)
        kind = index.get("mediaType", artifact.OCI_INDEX)
        if kind != artifact.OCI_INDEX:
            raise ImageError(
                f"{self.folder}/{INDEX_FILE} has media type {kind!r}, not an OCI image index"
                f"{LAYOUT_TYPES.hint(kind)}"
            )
        entries = index.get("manifests")
        if not isinstance(entries, list) or not entries:
            raise ImageError(f"{self.folder}/{INDEX_FILE} lists no image")
        if len(entries) > 1:
            raise ImageError(
                f"{self.folder}/{INDEX_FILE} lists {len(entries)} images: a layout an app "
                "carries holds exactly one (for several platforms, one image index naming them)"
            )
        entry = entries[0]
        if not isinstance(entry, dict):
            raise ImageError(f"{self.folder}/{INDEX_FILE}'s entry is not a descriptor")
        kind, digest, size = entry.get("mediaType"), entry.get("digest"), entry.get("size")
        if kind not in LAYOUT_TYPES.images | LAYOUT_TYPES.indexes:
            raise ImageError(
                f"{self.folder}/{INDEX_FILE} names {kind!r}, not an OCI image manifest or index"
                f"{LAYOUT_TYPES.hint(kind)}"
            )
        if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
            raise ImageError(f"{self.folder}/{INDEX_FILE}'s entry has no sha256 digest")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_MANIFEST:
            raise ImageError(f"{self.folder}/{INDEX_FILE}'s entry has no size of at most 4 MiB")
        self._top = (str(kind), digest, size)
        return digest

    def _blob_path(self, digest: str) -> str:
        if not DIGEST_RE.fullmatch(digest):
            raise ImageError(f"{digest!r} is not a sha256 digest")
        return f"blobs/sha256/{digest.removeprefix('sha256:')}"

    async def manifest(self, reference: str) -> PulledManifest:
        """The manifest blob ``reference`` (a digest), hashed before it is returned; the index's
        own entry is checked against its size and media type too."""
        rel = self._blob_path(reference)
        body = await asyncio.to_thread(self._read, rel, MAX_MANIFEST)
        actual = artifact.sha256_digest(body)
        if actual != reference:
            raise ImageError(
                f"{self.folder}/{rel} hashes to {actual}, not to its name (the layout is damaged "
                "or was altered)"
            )
        media_type = None
        if self._top is not None and self._top[1] == reference:
            media_type, _, size = self._top
            if len(body) != size:
                raise ImageError(
                    f"{self.folder}/{rel} is {len(body)} bytes, not the {size} {INDEX_FILE} says"
                )
        return PulledManifest(body, media_type, actual)

    async def blob(self, digest: str, size: int) -> AsyncGenerator[bytes, None]:
        """The blob in chunks; its size is checked first and its sha256 after the last chunk
        (before the caller sees the end)."""
        rel = self._blob_path(digest)
        fd = await asyncio.to_thread(self._open, rel)
        with os.fdopen(fd, "rb") as file:
            found = os.fstat(file.fileno()).st_size
            if found != size:
                raise ImageError(
                    f"{self.folder}/{rel} is {found} bytes, not the {size} its descriptor says"
                )
            hasher, read = hashlib.sha256(), 0
            while chunk := await asyncio.to_thread(file.read, CHUNK):
                read += len(chunk)
                if read > size:
                    raise ImageError(f"{self.folder}/{rel} grew while it was read")
                hasher.update(chunk)
                yield chunk
        actual = "sha256:" + hasher.hexdigest()
        if read != size or actual != digest:
            raise ImageError(
                f"{self.folder}/{rel} hashes to {actual}, not to its name (the layout is damaged "
                "or was altered)"
            )

    # -- for `atrium validate` ------------------------------------------------------------------

    def check(self) -> str:
        """Every blob the one image names (its manifests, config and layers, every platform's),
        present and matching its size and digest, without the store: what an author's
        `atrium validate` runs (blocking). The image's digest; ImageError at the first fault."""
        top = self.image()
        pending: list[tuple[str, int, object]] = [(top, -1, None)]
        if self._top is not None:
            pending = [(top, self._top[2], self._top[0])]
        seen: set[str] = set()
        while pending:
            digest, size, kind = pending.pop()
            if digest in seen:
                continue
            seen.add(digest)
            body = self._verified(digest, size, kind in LAYOUT_TYPES.images | LAYOUT_TYPES.indexes)
            if body is None:
                continue
            try:
                document = json.loads(body)
            except ValueError as err:
                raise ImageError(f"{self.folder}/{self._blob_path(digest)} is not JSON") from err
            config = document.get("config")
            named = [
                *([(config, LAYOUT_TYPES.configs)] if isinstance(config, dict) else []),
                *((layer, LAYOUT_TYPES.layers) for layer in document.get("layers") or []),
                *(
                    (entry, LAYOUT_TYPES.images | LAYOUT_TYPES.indexes)
                    for entry in document.get("manifests") or []
                ),
            ]
            for entry, types in named:
                if not isinstance(entry, dict) or not isinstance(entry.get("size"), int):
                    continue
                kind = entry.get("mediaType")
                if kind not in types:
                    raise ImageError(
                        f"{self.folder}/{self._blob_path(digest)} names a blob of media type "
                        f"{kind!r}{LAYOUT_TYPES.hint(kind)}"
                    )
                pending.append((str(entry.get("digest")), entry["size"], kind))
        return top

    def _verified(self, digest: str, size: int, keep: bool) -> bytes | None:
        """The blob's bytes when ``keep`` (a manifest or an index), once its size and sha256
        match."""
        rel = self._blob_path(digest)
        hasher, kept, read = hashlib.sha256(), bytearray(), 0
        with os.fdopen(self._open(rel), "rb") as file:
            while chunk := file.read(CHUNK):
                read += len(chunk)
                hasher.update(chunk)
                if keep and read <= MAX_MANIFEST:
                    kept += chunk
        if size >= 0 and read != size:
            raise ImageError(f"{self.folder}/{rel} is {read} bytes, not the {size} named")
        actual = "sha256:" + hasher.hexdigest()
        if actual != digest:
            raise ImageError(
                f"{self.folder}/{rel} hashes to {actual}, not to its name (the layout is damaged "
                "or was altered)"
            )
        return bytes(kept) if keep else None
