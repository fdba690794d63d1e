"""The app artifact format in an OCI registry (decisions.md "Distribution"), built and checked.

One layer: the app directory as a deterministic tar+gzip rooted at ``<id>/`` (sorted entries, fixed
mtime, uid/gid 0, no user names), media type ``application/vnd.os.app.layer.v1.tar+gzip``; the empty
config; an OCI image manifest with ``artifactType`` ``application/vnd.os.app.v1`` and the title and
version annotations. Knows nothing of HTTP: oci.py moves these bytes, fetchers/oci.py unpacks them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import stat
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from atrium.distribution.tree import ignore_rule, is_vcs_name
from atrium.errors import InvalidRequest, ManifestInvalid
from atrium.manifest import MANIFEST_FILE, Manifest, parse_manifest

ARTIFACT_TYPE: Final = "application/vnd.os.app.v1"
LAYER_MEDIA_TYPE: Final = "application/vnd.os.app.layer.v1.tar+gzip"
EMPTY_MEDIA_TYPE: Final = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG: Final = b"{}"
OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX: Final = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST: Final = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES: Final = (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST)
TITLE: Final = "org.opencontainers.image.title"
VERSION: Final = "org.opencontainers.image.version"
#: every entry of the published layer carries this mtime, so one tree always gives one digest
FIXED_MTIME: Final = 0
#: never published: bytecode caches (rebuilt by the interpreter); nor is version-control metadata
#: at any depth (`is_vcs_name`: every install refuses a tree that carries it)
SKIPPED_NAMES: Final = frozenset({".git", "__pycache__"})
#: the most file data an OCI install unpacks from an artifact (an image layout the app carries
#: included); `atrium pack` and an OCI publish refuse a larger tree before anything moves
MAX_UNPACKED: Final = 256 << 20


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Descriptor:
    """An OCI content descriptor."""

    media_type: str
    digest: str
    size: int

    def wire(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


EMPTY_DESCRIPTOR: Final = Descriptor(EMPTY_MEDIA_TYPE, sha256_digest(EMPTY_CONFIG), 2)


@dataclass(frozen=True, slots=True)
class AppArtifact:
    """What an app artifact's manifest says: its one layer and the title/version annotations."""

    layer: Descriptor
    title: str | None
    version: str | None


def read_app_manifest(app_dir: Path) -> Manifest:
    """Parse ``app_dir``'s manifest against the directory's name (ManifestInvalid otherwise)."""
    path = app_dir / MANIFEST_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise parse_error(app_dir, f"{MANIFEST_FILE} is missing") from None
    except (OSError, ValueError) as err:
        raise parse_error(app_dir, f"{MANIFEST_FILE} is not readable JSON: {err}") from err
    except RecursionError as err:
        raise parse_error(app_dir, f"{MANIFEST_FILE} is nested too deeply") from err
    return parse_manifest(data, app_dir.name)


def parse_error(app_dir: Path, message: str) -> ManifestInvalid:
    return ManifestInvalid(app_dir.name, [{"field": "(manifest)", "message": message}])


def is_runtime_data(app_id: str, name: str) -> bool:
    """An instance's runtime data directory ``<appId>-<n>`` inside an installed app (decisions.md)."""
    return re.fullmatch(re.escape(app_id) + r"-[0-9]+", name) is not None


def app_files(app_dir: Path, app_id: str) -> Iterator[Path]:
    """Every path of the app tree to publish, sorted, without git metadata, caches, runtime data
    and what `.atriumignore` (over the defaults of `atrium.distribution.ignore`) leaves out.

    Raises InvalidRequest for what an installer would refuse: special files, links leaving the tree.
    """
    root = app_dir.resolve()
    rule = ignore_rule(app_dir)

    def walk(folder: Path) -> Iterator[Path]:
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            if (
                entry.name in SKIPPED_NAMES
                or is_vcs_name(entry.name)
                or (folder == app_dir and entry.is_dir() and is_runtime_data(app_id, entry.name))
            ):
                continue
            mode = entry.lstat().st_mode
            relative = entry.relative_to(app_dir).as_posix()
            if rule.ignores(relative, stat.S_ISDIR(mode)):
                continue
            if stat.S_ISLNK(mode):
                link = entry.readlink()
                if link.is_absolute() or not (entry.parent / link).resolve().is_relative_to(root):
                    raise InvalidRequest(
                        f"{entry} is a link that leaves the app directory; installs refuse it"
                    )
                yield entry
            elif stat.S_ISDIR(mode):
                yield entry
                yield from walk(entry)
            elif stat.S_ISREG(mode):
                yield entry
            else:
                raise InvalidRequest(f"{entry} is not a file, directory or link; cannot publish it")

    return walk(app_dir)


def check_artifact_size(app_dir: Path, app_id: str) -> int:
    """The bytes of the files an artifact of ``app_dir`` would hold; InvalidRequest past
    `MAX_UNPACKED`, which every OCI install refuses."""
    total = sum(p.lstat().st_size for p in app_files(app_dir, app_id) if p.is_file())
    if total > MAX_UNPACKED:
        raise InvalidRequest(
            f"{app_dir} holds {total >> 20} MiB of files; an app artifact is at most "
            f"{MAX_UNPACKED >> 20} MiB unpacked (an image the app carries included): install a "
            "larger image from a local folder or a git source, or name its registry in "
            "runtime.image"
        )
    return total


def _tar_info(path: Path, name: str) -> tarfile.TarInfo:
    st = path.lstat()
    info = tarfile.TarInfo(name)
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = stat.S_IMODE(st.st_mode) & 0o777
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = str(path.readlink())
        info.mode = 0o777
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    else:
        info.size = st.st_size
    return info


def write_layer(app_dir: Path, app_id: str, out: IO[bytes]) -> None:
    """Write the layer (tar+gzip rooted at ``<id>/``) to ``out``; blocking, run it in a thread."""
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=FIXED_MTIME) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.addfile(_tar_info(app_dir, app_id))
        for path in app_files(app_dir, app_id):
            info = _tar_info(path, f"{app_id}/{path.relative_to(app_dir).as_posix()}")
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def image_manifest(layer: Descriptor, app_id: str, version: str) -> bytes:
    """The OCI image manifest of an app artifact, as the bytes that are pushed."""
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": EMPTY_DESCRIPTOR.wire(),
        "layers": [layer.wire()],
        "annotations": {TITLE: app_id, VERSION: version},
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def check_app_manifest(document: object, media_type: str | None) -> AppArtifact:
    """The app artifact a manifest describes; ValueError says why it is not one."""
    if not isinstance(document, dict):
        raise ValueError("the manifest is not a JSON object")
    kind = document.get("mediaType") or media_type
    if kind in (OCI_INDEX, DOCKER_LIST) or "manifests" in document:
        raise ValueError("it is an image index (several images), not an app artifact")
    if kind == DOCKER_MANIFEST:
        raise ValueError("it is a Docker container image, not an app artifact")
    config = document.get("config")
    config_type = config.get("mediaType") if isinstance(config, Mapping) else None
    artifact_type = document.get("artifactType") or config_type
    if artifact_type != ARTIFACT_TYPE:
        raise ValueError(
            f"wrong artifact type {artifact_type!r} (expected {ARTIFACT_TYPE!r}: an app published "
            "with `atrium publish`)"
        )
    layers = document.get("layers")
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], Mapping):
        raise ValueError("an app artifact has exactly one layer")
    layer = layers[0]
    digest, size, layer_type = layer.get("digest"), layer.get("size"), layer.get("mediaType")
    if layer_type != LAYER_MEDIA_TYPE:
        raise ValueError(f"wrong layer media type {layer_type!r} (expected {LAYER_MEDIA_TYPE!r})")
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ValueError(f"the layer digest {digest!r} is not a sha256 digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"the layer size {size!r} is not a byte count")
    annotations = document.get("annotations")
    notes = annotations if isinstance(annotations, Mapping) else {}
    title, version = notes.get(TITLE), notes.get(VERSION)
    return AppArtifact(
        Descriptor(layer_type, digest, size),
        title if isinstance(title, str) else None,
        version if isinstance(version, str) else None,
    )
