"""The app artifact format: the layer is deterministic, the manifest is checked."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from atrium.distribution import artifact
from atrium.errors import InvalidRequest, ManifestInvalid

APP_ID = "com.example.notes"


@pytest.fixture
def app(tmp_path: Path) -> Path:
    root = tmp_path / APP_ID
    (root / "lib").mkdir(parents=True)
    (root / "app.manifest.json").write_text(
        json.dumps({"id": APP_ID, "version": "1.2.3", "name": "Notes"})
    )
    (root / "lib" / "a.py").write_text("a = 1\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "lib" / ".hg").mkdir()
    (root / "lib" / ".hg" / "hgrc").write_text("[hooks]\n")
    (root / ".svn").mkdir()
    (root / "lib" / "__pycache__").mkdir()
    (root / "lib" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (root / f"{APP_ID}-0").mkdir()
    (root / f"{APP_ID}-0" / "notes.db").write_bytes(b"user data")
    return root


def layer_of(app: Path) -> bytes:
    out = io.BytesIO()
    artifact.write_layer(app, APP_ID, out)
    return out.getvalue()


def test_the_layer_is_rooted_at_the_id_and_skips_git_caches_and_runtime_data(app: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(layer_of(app)), mode="r:gz") as tar:
        names = tar.getnames()
        infos = tar.getmembers()
    assert names == [
        APP_ID,
        f"{APP_ID}/app.manifest.json",
        f"{APP_ID}/lib",
        f"{APP_ID}/lib/a.py",
    ]
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname) for i in infos} == {(0, 0, 0, "", "")}


def test_the_layer_does_not_depend_on_mtimes(app: Path) -> None:
    first = layer_of(app)
    (app / "lib" / "a.py").touch()
    assert layer_of(app) == first


def test_a_link_leaving_the_app_cannot_be_published(app: Path) -> None:
    (app / "escape").symlink_to("../../etc")
    with pytest.raises(InvalidRequest, match="leaves the app directory"):
        layer_of(app)


def test_the_manifest_is_read_against_the_directory_name(tmp_path: Path, app: Path) -> None:
    assert artifact.read_app_manifest(app).version == "1.2.3"
    with pytest.raises(ManifestInvalid, match="directory name"):
        artifact.read_app_manifest(app.rename(tmp_path / "com.example.other"))
    with pytest.raises(ManifestInvalid, match="missing"):
        artifact.read_app_manifest(tmp_path)


def manifest(**changes: Any) -> dict[str, Any]:
    layer = artifact.Descriptor(artifact.LAYER_MEDIA_TYPE, "sha256:" + "a" * 64, 10)
    document: dict[str, Any] = json.loads(artifact.image_manifest(layer, APP_ID, "1.0.0"))
    document.update(changes)
    return {k: v for k, v in document.items() if v is not None}


def test_an_app_manifest_names_its_layer_title_and_version() -> None:
    found = artifact.check_app_manifest(manifest(), None)
    assert found.layer.digest == "sha256:" + "a" * 64
    assert (found.title, found.version) == (APP_ID, "1.0.0")


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"artifactType": "application/vnd.example"}, "wrong artifact type"),
        ({"mediaType": artifact.OCI_INDEX, "manifests": []}, "image index"),
        ({"mediaType": artifact.DOCKER_MANIFEST}, "Docker container image"),
        ({"layers": []}, "exactly one layer"),
        (
            {"layers": [{"mediaType": "text/plain", "digest": "sha256:" + "a" * 64, "size": 1}]},
            "layer media type",
        ),
        (
            {"layers": [{"mediaType": artifact.LAYER_MEDIA_TYPE, "digest": "md5:x", "size": 1}]},
            "not a sha256",
        ),
        (
            {
                "layers": [
                    {
                        "mediaType": artifact.LAYER_MEDIA_TYPE,
                        "digest": "sha256:" + "a" * 64,
                        "size": -1,
                    }
                ]
            },
            "byte count",
        ),
    ],
)
def test_other_manifests_are_not_app_artifacts(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        artifact.check_app_manifest(manifest(**changes), None)


def test_an_artifact_type_in_the_config_media_type_is_accepted() -> None:
    config = {"mediaType": artifact.ARTIFACT_TYPE, "digest": "sha256:" + "b" * 64, "size": 2}
    assert artifact.check_app_manifest(manifest(artifactType=None, config=config), None)
