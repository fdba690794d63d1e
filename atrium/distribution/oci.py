"""Pull and push app artifacts in OCI registries: resolve_oci, push_app, push_artifact.

The artifact format is atrium.distribution.artifact's; the registry calls are atrium.distribution.ociclient's, a small
async client over aiohttp rather than oras-py (docs/decisions.md "Distribution: OCI and publish").
Credentials come from the standard Docker config (docs/api.md "Publishing"). Failures: resolve
raises FetchFailed(ref, reason), a push UpstreamFailed naming the ref and the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atrium.distribution import artifact
from atrium.distribution.ociclient import RegistryClient, RegistryError, file_size, size_text
from atrium.distribution.reach import Reach
from atrium.distribution.refs import OciRef
from atrium.errors import FetchFailed, UpstreamFailed

#: reports upload progress as one human line
PushProgress = Callable[[str], object]


def _reference(ref: OciRef) -> str:
    return ref.digest or ref.tag or "latest"


async def resolve_oci(
    ref: OciRef, docker_config: Path | None = None, reach: Reach | None = None
) -> tuple[str, dict[str, Any]]:
    """The manifest digest ``ref`` names now, and a manifest preview (id and version) when the
    artifact's annotations carry them; FetchFailed when it is not reachable or not an app."""
    try:
        async with RegistryClient(
            ref.registry, ref.repository, docker_config=docker_config, reach=reach
        ) as c:
            pulled = await c.manifest(_reference(ref))
            found = artifact.check_app_manifest(pulled.json(), pulled.media_type)
            # no title annotation (ORAS puts titles on layers only): the layer's top folder
            # names the app, as the docs promise; read from the start of the layer
            title = found.title or await _top_folder(c, found.layer)
    except (RegistryError, ValueError) as err:
        raise FetchFailed(str(ref), str(err)) from err
    preview = {"id": title, "version": found.version} if title else {}
    return pulled.digest, {k: v for k, v in preview.items() if v is not None}


async def list_tags(
    ref: OciRef, docker_config: Path | None = None, reach: Reach | None = None
) -> list[str]:
    """The tags of ``ref``'s repository; FetchFailed when the registry cannot be read."""
    try:
        async with RegistryClient(
            ref.registry, ref.repository, docker_config=docker_config, reach=reach
        ) as client:
            return await client.tags()
    except RegistryError as err:
        raise FetchFailed(str(ref), str(err)) from err


async def move_tag(ref: OciRef, digest: str, tag: str, docker_config: Path | None = None) -> None:
    """Point ``tag`` of ``ref``'s repository at the manifest ``digest`` (a moving tag such as
    ``latest``); UpstreamFailed when the registry refuses."""
    try:
        async with RegistryClient(
            ref.registry, ref.repository, docker_config=docker_config, push=True
        ) as client:
            pulled = await client.manifest(digest)
            await client.put_manifest(tag, pulled.body, pulled.media_type or artifact.OCI_MANIFEST)
    except RegistryError as err:
        raise UpstreamFailed(
            f"moving {tag!r} of {ref} failed: {err.reason}", ref=str(ref), reason=err.reason
        ) from err


#: how much of a layer is decompressed to find its first member (a pax header comes first)
PEEK_LIMIT = 1 << 20


async def _top_folder(client: RegistryClient, layer: artifact.Descriptor) -> str | None:
    """The top-level folder of the layer's first member, read from the first bytes of the blob
    (the stream is closed then; the full fetch verifies the digest and that every member sits
    under this folder). None when it cannot be told."""
    inflate = zlib.decompressobj(wbits=31)
    data = b""
    name = None
    async with contextlib.aclosing(client.blob(layer.digest, layer.size)) as chunks:
        async for chunk in chunks:
            try:
                data += inflate.decompress(chunk, PEEK_LIMIT - len(data))
            except zlib.error:
                return None
            name = _first_member(data)
            if name is not None or len(data) >= PEEK_LIMIT:
                break
    if not name:
        return None
    top = name.removeprefix("./").split("/", 1)[0]
    return top if top not in ("", ".", "..") else None


def _first_member(data: bytes) -> str | None:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
            member = tar.next()
    except (tarfile.TarError, EOFError):
        return None
    return member.name if member is not None else None


async def push_artifact(
    ref: OciRef,
    layer: bytes | Path,
    *,
    app_id: str,
    version: str,
    docker_config: Path | None = None,
    progress: PushProgress | None = None,
) -> str:
    """Push a layer as an app artifact under ``ref``'s tag; returns the manifest digest.

    The layer is taken as given (tests push crafted ones); push_app builds it from a directory.
    """
    if isinstance(layer, bytes):
        digest, size = artifact.sha256_digest(layer), len(layer)
    else:
        digest, size = await asyncio.to_thread(_file_digest, layer), await file_size(layer)
    step = max(256 << 10, size // 16)
    reported = 0

    def uploaded(sent: int, total: int) -> None:
        nonlocal reported
        if progress is not None and (sent - reported >= step or sent == total):
            reported = sent
            progress(f"uploading layer {digest[:19]}…: {size_text(sent)} of {size_text(total)}")

    manifest = artifact.image_manifest(
        artifact.Descriptor(artifact.LAYER_MEDIA_TYPE, digest, size), app_id, version
    )
    try:
        async with RegistryClient(
            ref.registry, ref.repository, docker_config=docker_config, push=True
        ) as client:
            await client.push_blob(artifact.EMPTY_CONFIG, artifact.EMPTY_DESCRIPTOR.digest)
            await client.push_blob(layer, digest, uploaded)
            if progress is not None:
                progress(f"writing the manifest of {ref}")
            return await client.put_manifest(_reference(ref), manifest, artifact.OCI_MANIFEST)
    except RegistryError as err:
        raise UpstreamFailed(
            f"publishing to {ref} failed: {err.reason}", ref=str(ref), reason=err.reason
        ) from err


def _file_digest(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()


async def push_app(
    app_dir: Path,
    ref: OciRef,
    docker_config: Path | None = None,
    progress: PushProgress | None = None,
) -> str:
    """Publish ``app_dir`` as the app artifact ``ref`` (decisions.md format); returns its digest.

    ManifestInvalid when the directory's manifest is invalid (its id must equal its name).
    """
    manifest = await asyncio.to_thread(artifact.read_app_manifest, app_dir)
    with tempfile.TemporaryDirectory(prefix="atrium-publish-") as tmp:
        layer = Path(tmp) / "layer.tar.gz"
        if progress is not None:
            progress(f"packing {app_dir} as {manifest.id}/")
        await asyncio.to_thread(_pack, app_dir, manifest.id, layer)
        return await push_artifact(
            ref,
            layer,
            app_id=manifest.id,
            version=manifest.version,
            docker_config=docker_config,
            progress=progress,
        )


def _pack(app_dir: Path, app_id: str, out: Path) -> None:
    with out.open("wb") as f:
        artifact.write_layer(app_dir, app_id, f)
