"""An image app's image at install: its tag resolved to a digest, the image pulled into the store,
the staged manifest pinned to that digest, and what the install review says of it.

The pull comes before the review, so the review can give the image's real size; the store is a
cache shared by digest, so a declined or failed install leaves at most an entry there and nothing
installed (docs/decisions.md "Images: running an OCI image as an app").
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atrium.distribution.ociclient import RegistryClient, RegistryError, size_text
from atrium.distribution.reach import Reach
from atrium.egress import ask_wire, asked, words
from atrium.errors import FetchFailed, ManifestInvalid
from atrium.files import write_atomic
from atrium.images.config import ConfigInvalid, image_port
from atrium.images.store import ImageError, ImageStore, StoredImage
from atrium.manifest import MANIFEST_FILE, Manifest


@dataclass(frozen=True, slots=True)
class PinnedImage:
    """The manifest pinned to the pulled image, and the image."""

    manifest: Manifest
    image: StoredImage


async def pin_image(
    manifest: Manifest,
    app_dir: Path,
    store: ImageStore,
    *,
    docker_config: Path | None,
    reach: Reach | None,
) -> PinnedImage:
    """Resolve ``runtime.image`` to a digest (a tag asks the registry once), pull it into the
    store and write the pinned reference into the staged manifest in ``app_dir``: what the user
    reviews is what runs. FetchFailed when the registry or the image says no."""
    runtime = manifest.runtime
    if runtime is None:  # pragma: no cover - called for image apps only
        raise ValueError(f"{manifest.id} is not an image app")
    registry, repository, tag, digest = runtime.parts()
    try:
        if digest is None:
            async with RegistryClient(
                registry, repository, docker_config=docker_config, reach=reach
            ) as client:
                digest = (await client.manifest(tag or "latest")).digest
        image = await store.pull(registry, repository, digest, reach=reach)
    except RegistryError as err:
        raise FetchFailed(runtime.image, err.reason) from err
    except ImageError as err:
        raise FetchFailed(runtime.image, err.reason) from err
    try:
        image_port(image.config, runtime)
    except ConfigInvalid as err:
        raise ManifestInvalid(
            manifest.id, [{"field": "runtime.port", "message": str(err)}]
        ) from err
    pinned = runtime.pin(digest)
    await asyncio.to_thread(_write_pinned, app_dir / MANIFEST_FILE, pinned.image)
    return PinnedImage(manifest.model_copy(update={"runtime": pinned}), image)


def _write_pinned(path: Path, image: str) -> None:
    mode = path.stat().st_mode & 0o777
    data = json.loads(path.read_text())
    data["runtime"]["image"] = image
    write_atomic(path, json.dumps(data, indent=2) + "\n")
    path.chmod(mode)


def image_review(pinned: PinnedImage) -> dict[str, Any]:
    """The install review's ``image``: that the app is a container image, where it comes from,
    its size, the folders it keeps and what of the network it may reach (docs/api.md)."""
    runtime = pinned.manifest.runtime
    if runtime is None:  # pragma: no cover - called for image apps only
        raise ValueError(f"{pinned.manifest.id} is not an image app")
    registry, repository, _, digest = runtime.parts()
    image = pinned.image
    folders = list(runtime.data)
    kept = ", ".join(folders) if folders else "nothing"
    ask = asked(pinned.manifest)
    reach = words(ask)
    return {
        "kind": "container image",
        "image": runtime.image,
        "publisher": f"{registry}/{repository}",
        "digest": digest,
        "size": image.size,
        "pulledBytes": image.pulled_bytes,
        "files": image.files,
        "folders": folders,
        "network": ask_wire(ask),
        "words": [
            f"A container image published at {registry}/{repository}, not an Atrium app",
            f"{size_text(image.size)} unpacked ({size_text(image.pulled_bytes)} downloaded)",
            f"Keeps {kept} in its data folder",
            (
                "Cannot reach the network; only the shell reaches its page"
                if reach is None
                else f"{reach} once you approve it; only the shell reaches its page"
            ),
        ],
    }


def egress_review(manifest: Manifest) -> dict[str, Any]:
    """The review's ``egress`` when the app asks to reach anything: what, and in words
    ("Can reach the internet"); nothing otherwise."""
    ask = asked(manifest)
    if ask is False:
        return {}
    return {"egress": {"asked": ask_wire(ask), "words": words(ask)}}
