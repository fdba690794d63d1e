"""An image app's image at install: its tag resolved to a digest, the image pulled into the store
(or loaded from the OCI image layout the app carries), the staged manifest pinned to that digest,
and what the install review says of it.

The pull comes before the review, so the review can give the image's real size; the store is a
cache shared by digest, so a declined or failed install leaves at most an entry there and nothing
installed (docs/decisions.md "Images: running an OCI image as an app"). A carried layout leaves
the staged tree once its image is in the store: the scope's repository never holds its blobs
(docs/decisions.md "Images: an app may carry its image").
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atrium.distribution.exports import CarriedImage
from atrium.distribution.ociclient import RegistryClient, RegistryError, size_text
from atrium.distribution.reach import Reach
from atrium.egress import ask_wire, asked, words
from atrium.errors import FetchFailed, ImageNotKept, ManifestInvalid
from atrium.files import write_atomic
from atrium.images.config import ConfigInvalid, image_port
from atrium.images.layout import INDEX_FILE, LAYOUT_FILE, LayoutSource
from atrium.images.store import LAYOUT, ImageError, ImageStore, StoredImage
from atrium.manifest import MANIFEST_FILE, Manifest, Runtime, parse_manifest


@dataclass(frozen=True, slots=True)
class PinnedImage:
    """The manifest pinned to the pulled image, and the image."""

    manifest: Manifest
    image: StoredImage
    #: the image came in the app's own tree (``oci:<folder>``), not from a registry
    carried: bool = False


async def pin_image(
    manifest: Manifest,
    app_dir: Path,
    store: ImageStore,
    *,
    docker_config: Path | None,
    reach: Reach | None,
    held: Runtime | None = None,
) -> PinnedImage:
    """Resolve ``runtime.image`` to a digest (a tag asks the registry once), pull it into the
    store (or load it from the layout the app carries, which then leaves ``app_dir``) and write
    the pinned reference into the staged manifest in ``app_dir``: what the user reviews is what
    runs. FetchFailed when the registry, the layout or the image says no. ``held``: the runtime
    of the copy this one replaces (same app, same scope): the one image the store gives without
    proof, to a tree without its layout or naming the same registry image (any other digest the
    store holds is asked of its registry, as this pipeline's caller, before it is used)."""
    runtime = manifest.runtime
    if runtime is None:  # pragma: no cover - called for image apps only
        raise ValueError(f"{manifest.id} is not an image app")
    if runtime.layout is not None:
        stored, pin = await _carried(
            runtime.image,
            runtime.layout,
            runtime.digest,
            app_dir,
            store,
            None if held is None else held.digest,
        )
        return await _pinned(manifest, app_dir, stored, pin, carried=True)
    registry, repository, tag, digest = runtime.parts()
    try:
        if digest is None:
            async with RegistryClient(
                registry, repository, docker_config=docker_config, reach=reach
            ) as client:
                digest = (await client.manifest(tag or "latest")).digest
        known = held is not None and held.image == f"{registry}/{repository}@{digest}"
        image = await store.pull(registry, repository, digest, reach=reach, known=known)
    except RegistryError as err:
        raise FetchFailed(runtime.image, err.reason) from err
    except ImageError as err:
        raise FetchFailed(runtime.image, err.reason) from err
    return await _pinned(manifest, app_dir, image, digest, carried=False)


async def _carried(
    image: str,
    folder: str,
    pin: str | None,
    app_dir: Path,
    store: ImageStore,
    held: str | None = None,
) -> tuple[StoredImage, str]:
    """The image of the layout at ``folder``, loaded into the store and verified blob by blob
    (pinned: it must be ``pin``), then the layout removed from the staged tree. A tree without
    the layout (an installed copy's, which never keeps it) takes its pinned image from the store
    only when it is ``held``, the image the copy it replaces runs: a digest is no proof of
    holding an image, and the store holds other apps' and other users' images, some pulled with
    the shell's registry logins."""
    source = LayoutSource(app_dir, folder)
    try:
        if pin is not None and not await asyncio.to_thread(_carries, app_dir / folder):
            if pin != held:
                raise ImageError(
                    f"the app carries no image layout at {folder}/ for the {pin} its manifest "
                    "pins: only a copy of this app already running that image here may take it "
                    "from the image store (a digest is no proof of holding the image); install "
                    "from the source that carries it"
                )
            stored = await asyncio.to_thread(store.get, pin)
            if stored is None:
                raise ImageError(
                    f"the app carries no image layout at {folder}/ and the image store has no "
                    f"{pin}: install the app from the source that carries its image"
                )
            return stored, pin
        digest = await asyncio.to_thread(source.image)
        if pin is not None and digest != pin:
            raise ImageError(
                f"the image layout {folder}/ holds {digest}, not the {pin} the manifest pins"
            )
        stored = await store.load(source, digest, f"the app's image layout {folder}/")
        await store.keep_layout(source, digest)
    except ImageError as err:
        raise FetchFailed(image, err.reason) from err
    await asyncio.to_thread(_drop_layout, app_dir, folder)
    return stored, digest


def export_layout(app_dir: Path, store: ImageStore) -> CarriedImage | None:
    """What an export of the installed copy at ``app_dir`` carries of its image: for an app that
    carried its image as a layout (which the installed copy no longer holds), that folder and the
    store's copy of the layout (`ImageStore.keep_layout`), so that an import anywhere installs
    it; None for any other app (a pulled image is pulled again by digest where it is missing).
    ImageNotKept when the store has no copy to give: such an archive would install nowhere
    else (blocking)."""
    try:
        manifest = parse_manifest(json.loads((app_dir / MANIFEST_FILE).read_bytes()), None)
    except (OSError, ValueError, ManifestInvalid):
        return None  # not an image app the install would take: the import says why
    runtime = manifest.runtime
    if runtime is None or runtime.layout is None or runtime.digest is None:
        return None
    if _carries(app_dir / runtime.layout):
        return None
    kept = store.entry(runtime.digest) / LAYOUT
    if not (kept / INDEX_FILE).is_file():
        raise ImageNotKept(manifest.id, runtime.digest, runtime.layout)
    return runtime.layout, kept


def _carries(layout: Path) -> bool:
    """Whether any of a layout's own files is there (an installed copy keeps none of them, and
    may keep the rest of the folder)."""
    return any(os.path.lexists(layout / name) for name in (LAYOUT_FILE, INDEX_FILE, "blobs"))


def _drop_layout(app_dir: Path, folder: str) -> None:
    """Remove the layout's own files (``oci-layout``, ``index.json``, ``blobs/``) from the staged
    tree, and the folders that leaves empty: its image is in the store by digest, and what stays
    is committed to the scope's git repository. Anything else in the folder (an icon) stays."""
    layout = app_dir / folder
    for name in (LAYOUT_FILE, INDEX_FILE):
        (layout / name).unlink(missing_ok=True)
    shutil.rmtree(layout / "blobs", ignore_errors=True)
    while layout != app_dir and not any(layout.iterdir()):
        layout.rmdir()
        layout = layout.parent


async def _pinned(
    manifest: Manifest, app_dir: Path, image: StoredImage, digest: str, *, carried: bool
) -> PinnedImage:
    """The staged manifest pinned to ``digest`` once the image's port is known."""
    runtime = manifest.runtime
    if runtime is None:  # pragma: no cover - called for image apps only
        raise ValueError(f"{manifest.id} is not an image app")
    try:
        image_port(image.config, runtime)
    except ConfigInvalid as err:
        raise ManifestInvalid(
            manifest.id, [{"field": "runtime.port", "message": str(err)}]
        ) from err
    pinned = runtime.pin(digest)
    await asyncio.to_thread(_write_pinned, app_dir / MANIFEST_FILE, pinned.image)
    return PinnedImage(manifest.model_copy(update={"runtime": pinned}), image, carried)


def _write_pinned(path: Path, image: str) -> None:
    mode = path.stat().st_mode & 0o777
    data = json.loads(path.read_text())
    data["runtime"]["image"] = image
    write_atomic(path, json.dumps(data, indent=2) + "\n")
    path.chmod(mode)


def image_review(pinned: PinnedImage, source: str) -> dict[str, Any]:
    """The install review's ``image``: that the app is a container image, where it comes from,
    its size, the folders it keeps and what of the network it may reach (docs/api.md).
    ``source``: the app's ref, the publisher of an image the app carries."""
    runtime = pinned.manifest.runtime
    if runtime is None:  # pragma: no cover - called for image apps only
        raise ValueError(f"{pinned.manifest.id} is not an image app")
    digest = runtime.digest
    if pinned.carried:
        publisher = source
        origin = f"A container image carried in the app from {source}, not an Atrium app"
        moved = "carried in the app"
    else:
        registry, repository, _, _ = runtime.parts()
        publisher = f"{registry}/{repository}"
        origin = f"A container image published at {publisher}, not an Atrium app"
        moved = "downloaded"
    image = pinned.image
    folders = list(runtime.data)
    kept = ", ".join(folders) if folders else "nothing"
    ask = asked(pinned.manifest)
    reach = words(ask)
    return {
        "kind": "container image",
        "image": runtime.image,
        "publisher": publisher,
        "carried": pinned.carried,
        "digest": digest,
        "size": image.size,
        "pulledBytes": image.pulled_bytes,
        "files": image.files,
        "folders": folders,
        "network": ask_wire(ask),
        "words": [
            origin,
            f"{size_text(image.size)} unpacked ({size_text(image.pulled_bytes)} {moved})",
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
