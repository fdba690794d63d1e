"""The example catalogue: three small apps (one per template), published to an OCI registry and a
git server through a running shell, and the index that lists them (docs/authoring.md "Your own
index").

``atrium publish-examples`` runs it; the same steps serve anyone's own apps: publish each folder,
then write one index entry per app naming both sources and a `stable` channel.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from atrium.authoring.scaffold import create
from atrium.distribution import artifact


@dataclass(frozen=True, slots=True)
class Example:
    """One app of the catalogue: made by ``atrium new`` from ``template``, then described."""

    id: str
    template: str
    name: str
    description: str
    categories: tuple[str, ...]


EXAMPLES: Final = (
    Example(
        "com.example.hello",
        "python",
        "Hello",
        "A list you can share with other apps, written with the shell's SDK.",
        ("examples", "productivity"),
    ),
    Example(
        "com.example.plain",
        "stdlib",
        "Plain",
        "The same list in plain Python: the HTTP contract by hand, no Atrium import.",
        ("examples", "developer"),
    ),
    Example(
        "com.example.nodelist",
        "node",
        "Node List",
        "The same list on Node's http module.",
        ("examples", "developer"),
    ),
)
PUBLISHER: Final = "Atrium examples"
VERSION: Final = "0.1.0"

#: publishes one folder: (folder, target, tag) -> the shell's answer; `POST /api/dist/publish`
Publish = Callable[[Path, str, str], dict[str, Any]]


def make_examples(workdir: Path, examples: Iterable[Example] = EXAMPLES) -> list[Path]:
    """Each example's folder in ``workdir``, from its template, with its name and description."""
    folders = []
    for example in examples:
        folder = create(workdir, example.id, example.template)
        manifest_file = folder / "app.manifest.json"
        manifest = json.loads(manifest_file.read_text())
        manifest.update(name=example.name, description=example.description)
        manifest_file.write_text(json.dumps(manifest, indent=2) + "\n")
        folders.append(folder)
    return folders


def git_ref_base(url: str) -> str:
    """``url`` as the shell reads a git ref: `git://` as it is, `file://` and `https://` under
    `git+` (a bare `file:///srv/apps` is not a ref it accepts)."""
    url = url.rstrip("/")
    if url.startswith(("file://", "https://")):
        return f"git+{url}"
    return url


def artifact_size(folder: Path, app_id: str) -> int:
    """Bytes of the app's artifact: the layer `publish` pushes (the same deterministic tar+gzip,
    so the index's ``size`` is what an install fetches)."""
    layer = io.BytesIO()  # an example's layer is a few kilobytes
    artifact.write_layer(folder, app_id, layer)
    return layer.tell()


def index_entry(
    example: Example,
    oci_repository: str | None,
    git_url: str | None,
    version: str = VERSION,
    size: int | None = None,
) -> dict[str, Any]:
    """An index entry (docs/api.md "The store's catalogue") for an app published under
    ``version`` (OCI tag) and ``v<version>`` (git tag); the examples have no screenshots."""
    sources: dict[str, Any] = {}
    stable: dict[str, str] = {}
    if oci_repository:
        sources["oci"] = {"ref": oci_repository}
        stable["oci-tag"] = version
    if git_url:
        sources["git"] = {"ref": git_url, "default-branch": "main"}
        stable["git-tag"] = f"v{version}"
    entry: dict[str, Any] = {
        "id": example.id,
        "name": example.name,
        "description": example.description,
        "publisher": {"name": PUBLISHER},
        "categories": list(example.categories),
        "sources": sources,
        "channels": {"stable": stable},
    }
    if size is not None:
        entry["size"] = size
    return entry


def publish_examples(
    publish: Publish,
    workdir: Path,
    *,
    oci: str | None,
    git_dir: Path | None,
    git_url: str | None,
) -> dict[str, Any]:
    """Make the examples in ``workdir``, publish each to ``<oci>/<id>`` and to the bare
    repository ``<git_dir>/<id>.git`` (served as ``<git_url>/<id>.git``), and return the index.
    ``oci`` is a registry and path prefix (``127.0.0.1:5000/examples``)."""
    if not oci and not git_dir:
        raise ValueError("publish to an OCI registry (--oci), a git folder (--git-dir), or both")
    if git_dir and not git_url:
        raise ValueError("--git-dir needs --git-url: where installs will fetch those repositories")
    entries = []
    for example, folder in zip(EXAMPLES, make_examples(workdir), strict=True):
        oci_repository = f"{oci.rstrip('/')}/{example.id}" if oci else None
        git_repository = f"{git_ref_base(git_url)}/{example.id}.git" if git_url else None
        if oci_repository:
            publish(folder, f"oci://{oci_repository}", VERSION)
        if git_dir:
            publish(folder, str(git_dir / f"{example.id}.git"), f"v{VERSION}")
        size = artifact_size(folder, example.id)
        entries.append(index_entry(example, oci_repository, git_repository, size=size))
    return {"schema": 1, "apps": entries}
