"""Signatures beside OCI artifacts, the way cosign stores them: push one, read them back.

The payload, the signing and the verdict are atrium.distribution.signing's (pure); this module is
the registry I/O. ``push_signature`` writes the manifest ``sha256-<hex>.sig`` whose one layer is the
simple-signing payload with the signature in its ``dev.cosignproject.cosign/signature``
annotation (an existing ``.sig`` manifest's signatures are kept, as cosign appends).
``fetch_signatures`` reads them; a missing ``.sig`` tag is no signature, not an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from atrium.distribution import artifact, signing
from atrium.distribution.ociclient import RegistryClient, RegistryError
from atrium.distribution.reach import Reach
from atrium.distribution.refs import OciRef
from atrium.errors import FetchFailed, UpstreamFailed

CONFIG_MEDIA_TYPE: Final = "application/vnd.oci.image.config.v1+json"


def docker_reference(ref: OciRef) -> str:
    """What the payload's identity names: the repository, as cosign writes it."""
    return f"{ref.registry}/{ref.repository}"


async def push_signature(
    ref: OciRef, digest: str, private_pem: bytes, docker_config: Path | None = None
) -> str:
    """Sign ``digest`` (in ``ref``'s repository) and push the signature; returns the ``.sig`` tag.

    KeyProblem (a ValueError) for an unusable key, before anything is pushed."""
    key = signing.load_private_key(private_pem)
    payload = signing.build_payload(docker_reference(ref), digest)
    layer = {
        "mediaType": signing.PAYLOAD_MEDIA_TYPE,
        "digest": artifact.sha256_digest(payload),
        "size": len(payload),
        "annotations": {signing.SIGNATURE_ANNOTATION: signing.sign(key, payload)},
    }
    tag = signing.signature_tag(digest)
    try:
        async with RegistryClient(
            ref.registry, ref.repository, docker_config=docker_config, push=True
        ) as client:
            layers = await _existing_layers(client, tag)
            layers = [x for x in layers if x.get("digest") != layer["digest"]] + [layer]
            config = json.dumps(
                {
                    "architecture": "",
                    "os": "",
                    "config": {},
                    "rootfs": {"type": "layers", "diff_ids": [x["digest"] for x in layers]},
                },
                separators=(",", ":"),
            ).encode()
            await client.push_blob(payload, str(layer["digest"]))
            config_digest = artifact.sha256_digest(config)
            await client.push_blob(config, config_digest)
            manifest = {
                "schemaVersion": 2,
                "mediaType": artifact.OCI_MANIFEST,
                "config": {
                    "mediaType": CONFIG_MEDIA_TYPE,
                    "digest": config_digest,
                    "size": len(config),
                },
                "layers": layers,
            }
            body = json.dumps(manifest, separators=(",", ":")).encode()
            await client.put_manifest(tag, body, artifact.OCI_MANIFEST)
    except RegistryError as err:
        raise UpstreamFailed(
            f"signing {ref} failed: {err.reason}", ref=str(ref), reason=err.reason
        ) from err
    return tag


async def _existing_layers(client: RegistryClient, tag: str) -> list[dict[str, Any]]:
    found = await client.find_manifest(tag)
    if found is None:
        return []
    document = found.json()
    layers = document.get("layers") if isinstance(document, dict) else None
    return [x for x in layers if isinstance(x, dict)] if isinstance(layers, list) else []


async def fetch_signatures(
    ref: OciRef, digest: str, docker_config: Path | None = None, reach: Reach | None = None
) -> list[signing.Signature]:
    """The signatures stored beside ``digest``: each payload blob read (digest-checked) with its
    annotation. FetchFailed when the registry fails; [] when there is no ``.sig`` tag.
    ``reach``: whose fetch this is (a member's connects only where it may)."""
    tag = signing.signature_tag(digest)
    found: list[signing.Signature] = []
    try:
        async with RegistryClient(
            ref.registry, ref.repository, docker_config=docker_config, reach=reach
        ) as c:
            pulled = await c.find_manifest(tag)
            if pulled is None:
                return []
            document = pulled.json()
            layers = document.get("layers") if isinstance(document, dict) else None
            for layer in (layers if isinstance(layers, list) else [])[: signing.MAX_SIGNATURES]:
                signature = _annotation(layer)
                blob = _descriptor(layer)
                if signature is None or blob is None:
                    continue
                payload = b"".join([chunk async for chunk in c.blob(*blob)])
                found.append(signing.Signature(payload, signature))
    except RegistryError as err:
        raise FetchFailed(str(ref), f"reading the signatures: {err.reason}") from err
    return found


def _annotation(layer: object) -> str | None:
    if not isinstance(layer, dict):
        return None
    annotations = layer.get("annotations")
    value = annotations.get(signing.SIGNATURE_ANNOTATION) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) and len(value) < 4096 else None


def _descriptor(layer: object) -> tuple[str, int] | None:
    """The payload blob's digest and size, when they are sane (a payload is small)."""
    if not isinstance(layer, dict):
        return None
    digest, size = layer.get("digest"), layer.get("size")
    if not isinstance(digest, str) or not signing.DIGEST_HEX_RE.fullmatch(digest):
        return None
    if not isinstance(size, int) or not 0 < size <= signing.MAX_PAYLOAD:
        return None
    return digest, size
