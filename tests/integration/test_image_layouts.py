"""An image app that carries its image: Debian's busybox-static httpd built by the test
(tests/integration/test_image_store.py's layers), written as an OCI image layout with the standard
library and copied into the app folder by skopeo, installed from a local folder with no registry
anywhere, launched and its page fetched through the app's origin (root only: the shell maps the
image's users onto ids of their own). Then damaged layouts, each refused with a reason naming what
is wrong and nothing installed, nothing left in the image store; `atrium validate`, `atrium pack`
and an OCI publish with a layout in the tree."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Final

import pytest
from typer.testing import CliRunner

from atrium.cli.main import app as cli
from atrium.distribution import artifact
from atrium.distribution.publish import Publisher
from atrium.errors import InvalidRequest
from atrium.images.layout import LayoutSource
from atrium.images.store import STAGING, ImageError, ImageStore, machine_arch
from tests.integration.conftest import RunningShell, StartShell, launch_shell
from tests.integration.registry import running_registry
from tests.integration.test_image_apps import CONFIG, httpd_layers
from tests.integration.test_image_store import CONFIG_TYPE, Layer, digest_of
from tests.integration.test_origins import enter, open_view

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="image apps need the shell to run as root"),
]

APP: Final = "test.image.carried"
BORROWER: Final = "test.image.borrower"
DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LAYER: Final = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def write_layout(
    folder: Path,
    layers: list[Layer],
    config: dict[str, object],
    *,
    media_type: str = artifact.OCI_MANIFEST,
    layer_type: str | None = None,
) -> str:
    """``folder`` as an OCI image layout of one image; its manifest digest."""
    blobs = folder / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(body: bytes) -> str:
        digest = digest_of(body)
        (blobs / digest.removeprefix("sha256:")).write_bytes(body)
        return digest

    config_body = json.dumps(
        {
            "architecture": machine_arch(),
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": []},
        }
    ).encode()
    described = []
    for layer in layers:
        kind, body = layer.blob()
        described.append({"mediaType": layer_type or kind, "digest": put(body), "size": len(body)})
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": {
                "mediaType": CONFIG_TYPE,
                "digest": put(config_body),
                "size": len(config_body),
            },
            "layers": described,
        }
    ).encode()
    digest = put(manifest)
    entry = {"mediaType": media_type, "digest": digest, "size": len(manifest)}
    (folder / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (folder / "index.json").write_text(
        json.dumps({"schemaVersion": 2, "mediaType": artifact.OCI_INDEX, "manifests": [entry]})
    )
    return digest


def app_manifest(image: str = "oci:image") -> dict[str, object]:
    return {
        "id": APP,
        "version": "1.0.0",
        "name": "Busybox httpd, carried",
        "runtime": {"image": image, "health": {"path": "/"}, "data": ["/www/data"]},
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The httpd image as a layout written by the test (the bad layouts are made from it)."""
    folder = tmp_path_factory.mktemp("built") / "layout"
    write_layout(folder, httpd_layers(), CONFIG)
    return folder


def app_folder(root: Path, manifest: dict[str, object], layout: Path | None) -> Path:
    folder = root / APP
    folder.mkdir(parents=True)
    (folder / "app.manifest.json").write_text(json.dumps(manifest))
    if layout is not None:
        shutil.copytree(layout, folder / "image", symlinks=True)
    return folder


def store_entries(home: Path) -> list[str]:
    images = home / "images"
    staging = images / STAGING
    return (
        sorted(p.name for p in images.iterdir() if p.name != STAGING)
        + sorted(p.name for p in (staging.iterdir() if staging.is_dir() else []))
        if images.is_dir()
        else []
    )


def test_an_app_carrying_its_image_installs_with_no_registry_and_serves_its_page(
    start_shell: StartShell, home: Path, tmp_path: Path, built: Path
) -> None:
    source = app_folder(tmp_path / "source", app_manifest(), None)
    # the layout an author gets from the usual tool: skopeo copies the built image into the app
    subprocess.run(
        ["skopeo", "copy", "--quiet", f"oci:{built}", f"oci:{source / 'image'}:1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    (source / "image" / "NOTES").write_text("kept: the folder is the author's beyond the layout\n")
    index = json.loads((source / "image" / "index.json").read_text())
    (entry,) = index["manifests"]
    digest = entry["digest"]
    assert not os.environ.get("ATRIUM_REGISTRY")  # nothing here names or reaches a registry
    shell = start_shell()
    with shell.client(timeout=60) as api:
        asked = api.post("/api/dist/install", json={"ref": f"local:{source}"})
        assert asked.status_code == 200, asked.text
        review = asked.json()
        assert review["needsApproval"] is True
        image = review["image"]
        assert image["kind"] == "container image"
        assert image["carried"] is True
        assert image["publisher"] == f"local:{source}"
        assert image["digest"] == digest
        assert image["image"] == f"oci:image@{digest}"
        assert image["size"] > 1_000_000
        assert image["folders"] == ["/www/data"]
        assert image["network"] is False
        assert image["words"][0].startswith("A container image carried in the app from local:")
        assert "carried in the app)" in image["words"][1]
        assert api.get(f"/api/apps/{APP}").status_code == 404
        done = api.post("/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True})
        assert done.status_code == 200, done.text
        assert done.json()["ok"] is True
        listed = api.get(f"/api/apps/{APP}").json()
        assert listed["manifest"]["runtime"]["image"] == f"oci:image@{digest}"
        # the image lives in the store by digest; the installed tree (and so the scope's git
        # repository) keeps the manifest, not a second copy of the blobs
        installed = Path(listed["path"])
        assert installed.is_relative_to(home)
        assert (installed / "app.manifest.json").is_file()
        assert sorted(p.name for p in (installed / "image").iterdir()) == ["NOTES"]
        tracked = subprocess.run(
            ["git", "ls-files"], cwd=installed, check=True, capture_output=True, text=True
        ).stdout.split()
        assert tracked == ["app.manifest.json", "image/NOTES"], tracked
        assert store_entries(home) == [digest.replace(":", "-")]
        assert (source / "image" / "index.json").is_file()  # the author's folder is untouched
        instance, url = open_view(api, APP)
        assert instance["state"] in ("started", "resumed"), instance
        client, location = enter(shell, url)
        with closing(client):
            page = client.get(location)
            assert page.status_code == 200
            assert page.text == "hello from the image\n"
        # installed again from the same folder: the same digest, the store's entry reused
        again = api.post("/api/dist/update/" + APP, json={"autoApprove": True})
        assert again.status_code == 200, again.text
        assert again.json()["upToDate"] is True
        # a tree pinned to that digest without its layout (an installed copy exported and
        # imported again) takes the image from the store
        bare = app_folder(tmp_path / "bare", app_manifest(f"oci:image@{digest}"), None)
        shutil.copytree(installed / "image", bare / "image")  # NOTES, as an export keeps it
        done = api.post("/api/dist/install", json={"ref": f"local:{bare}", "autoApprove": True})
        assert done.status_code == 200, done.text
        assert done.json()["ok"] is True
        # but another app naming that digest without carrying it gets nothing from the store:
        # a digest is no proof of holding the image (another user's, another publisher's own)
        borrower = tmp_path / "borrower" / BORROWER
        borrower.mkdir(parents=True)
        manifest = {**app_manifest(f"oci:image@{digest}"), "id": BORROWER}
        (borrower / "app.manifest.json").write_text(json.dumps(manifest))
        refused = api.post(
            "/api/dist/install", json={"ref": f"local:{borrower}", "autoApprove": True}
        )
        assert refused.status_code == 502, refused.text
        assert "carries no image layout" in refused.json()["error"]["message"]
        assert api.get(f"/api/apps/{BORROWER}").status_code == 404
        # the store holds the digest, and a damaged copy of the layout is refused all the same
        damaged = app_folder(tmp_path / "damaged", app_manifest(), None)
        shutil.copytree(source / "image", damaged / "image")
        flip_a_byte(damaged / "image")
        refused = api.post(
            "/api/dist/install", json={"ref": f"local:{damaged}", "autoApprove": True}
        )
        assert refused.status_code == 502, refused.text
        assert "(the layout is damaged or was altered)" in refused.json()["error"]["message"]
        assert api.get(f"/api/apps/{APP}").json()["manifest"]["runtime"]["image"].endswith(digest)


def blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def layer_digest(layout: Path, number: int = 0) -> str:
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob(layout, index["manifests"][0]["digest"]).read_bytes())
    return str(manifest["layers"][number]["digest"])


def flip_a_byte(layout: Path) -> None:
    path = blob(layout, layer_digest(layout))
    body = bytearray(path.read_bytes())
    body[len(body) // 2] ^= 0xFF
    path.write_bytes(bytes(body))


def two_images(layout: Path) -> None:
    index = json.loads((layout / "index.json").read_text())
    index["manifests"].append(dict(index["manifests"][0], annotations={"x": "y"}))
    (layout / "index.json").write_text(json.dumps(index))


def linked_blob(layout: Path) -> None:
    path = blob(layout, layer_digest(layout))
    path.rename(layout / "kept")
    path.symlink_to("../../kept")


def linked_folder(layout: Path) -> None:
    (layout / "blobs").rename(layout / "real-blobs")
    (layout / "blobs").symlink_to("real-blobs")


def wrong_size(layout: Path) -> None:
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0]["size"] += 1
    (layout / "index.json").write_text(json.dumps(index))


def docker_layout(layout: Path) -> None:
    shutil.rmtree(layout)
    write_layout(layout, httpd_layers(), CONFIG, media_type=DOCKER_MANIFEST)


def docker_layer(layout: Path) -> None:
    shutil.rmtree(layout)
    write_layout(layout, httpd_layers(), CONFIG, layer_type=DOCKER_LAYER)


#: (how the layout is damaged, the manifest's runtime.image, words the refusal must hold)
DAMAGED: Final[list[tuple[Any, str, str]]] = [
    (flip_a_byte, "oci:image", "(the layout is damaged or was altered)"),
    (lambda p: blob(p, layer_digest(p, 1)).unlink(), "oci:image", "has no blobs/sha256/"),
    (two_images, "oci:image", "lists 2 images"),
    (docker_layout, "oci:image", "OCI media types only, not Docker v2 ones"),
    (docker_layer, "oci:image", f"has media type '{DOCKER_LAYER}', not a tar: an image layout"),
    (linked_blob, "oci:image", "is a symbolic link"),
    (linked_folder, "oci:image", "image/blobs is a symbolic link"),
    (wrong_size, "oci:image", "index.json says"),
    (lambda p: (p / "oci-layout").unlink(), "oci:image", "has no oci-layout"),
    (lambda p: shutil.rmtree(p), "oci:image", "carries no image layout at image/"),
    (lambda p: None, f"oci:image@sha256:{'0' * 64}", f"not the sha256:{'0' * 64} the manifest"),
    (
        shutil.rmtree,
        f"oci:image@sha256:{'0' * 64}",
        f"carries no image layout at image/ for the sha256:{'0' * 64}",
    ),
]


def test_a_damaged_layout_is_refused_naming_what_is_wrong_and_nothing_is_installed(
    start_shell: StartShell, home: Path, tmp_path: Path, built: Path
) -> None:
    shell = start_shell()
    with shell.client(timeout=60) as api:
        for number, (damage, image, words) in enumerate(DAMAGED):
            source = app_folder(tmp_path / str(number), app_manifest(image), built)
            damage(source / "image")
            refused = api.post(
                "/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True}
            )
            assert refused.status_code == 502, (number, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "fetch_failed", error
            assert words in error["message"], (number, error["message"])
            assert api.get(f"/api/apps/{APP}").status_code == 404
            assert store_entries(home) == [], number
        # a folder outside the app is not a layout the app carries: the manifest says so
        source = app_folder(tmp_path / "escape", app_manifest("oci:../image"), built)
        refused = api.post(
            "/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True}
        )
        assert refused.status_code == 422, refused.text
        problem = refused.json()["error"]["problems"][0]
        assert problem["field"] == "runtime.image"
        assert "no '..'" in problem["message"]
        assert api.get(f"/api/apps/{APP}").status_code == 404


def test_validate_checks_the_layout_and_pack_carries_it_inside_the_artifact(
    tmp_path: Path, built: Path
) -> None:
    damaged = app_folder(tmp_path / "damaged", app_manifest(), built)
    flip_a_byte(damaged / "image")
    found = CliRunner().invoke(cli, ["validate", str(damaged), "--json"])
    assert found.exit_code == 1, found.output
    (problem,) = json.loads(found.output)["problems"]
    assert problem["field"] == "runtime.image"
    assert "(the layout is damaged or was altered)" in problem["message"]
    docker = app_folder(tmp_path / "docker", app_manifest(), built)
    docker_layer(docker / "image")
    found = CliRunner().invoke(cli, ["validate", str(docker), "--json"])
    assert found.exit_code == 1, found.output
    (problem,) = json.loads(found.output)["problems"]
    assert "not Docker v2 ones" in problem["message"], problem
    folder = app_folder(tmp_path / "good", app_manifest(), built)
    assert CliRunner().invoke(cli, ["validate", str(folder)]).exit_code == 0
    archive = tmp_path / "app.tar.gz"
    packed = CliRunner().invoke(cli, ["pack", str(folder), "-o", str(archive), "--json"])
    assert packed.exit_code == 0, packed.output
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    shipped = {f"{APP}/image/{p.relative_to(built).as_posix()}" for p in built.rglob("*")}
    assert shipped <= names


async def test_a_tree_past_the_artifact_limit_is_neither_packed_nor_published_to_a_registry(
    tmp_path: Path, built: Path
) -> None:
    """An OCI install refuses more than 256 MiB of files: an image too large to carry in an
    artifact is refused before anything is written or pushed (a sparse file stands for it)."""
    folder = app_folder(tmp_path, app_manifest(), built)
    with (folder / "image" / "blobs" / "sha256" / ("f" * 64)).open("wb") as big:
        big.truncate(artifact.MAX_UNPACKED + 1)
    archive = tmp_path / "app.tar.gz"
    refused = CliRunner().invoke(cli, ["pack", str(folder), "-o", str(archive)])
    assert refused.exit_code == 1, refused.output
    assert "an app artifact is at most 256 MiB unpacked" in refused.output
    assert not archive.exists()
    with pytest.raises(InvalidRequest, match="at most 256 MiB"):
        await Publisher().plan(folder, "oci://127.0.0.1:9/apps/carried", "1.0.0")
    # a git source has no such limit: the same tree is a publish plan there
    assert (await Publisher().plan(folder, str(tmp_path / "repo.git"), "1.0.0")).manifest


def test_an_app_published_to_a_registry_or_to_git_carries_its_layout(
    start_shell: StartShell, home: Path, tmp_path: Path, built: Path
) -> None:
    """`atrium publish` puts the layout into the artifact's one layer; an install by the OCI ref
    takes the image from it (the registry holds no image, only the app artifact). A git publish
    commits it, and an install from the tag takes the image from the clone."""
    folder = app_folder(tmp_path / "source", app_manifest(), built)

    async def publish(to: str) -> list[dict[str, Any]]:
        return [event async for event in Publisher().publish(folder, to, "1.0.0")]

    with running_registry(tmp_path / "registry") as registry:
        ref = f"oci://{registry.host}/apps/carried:1.0.0"
        asyncio.run(publish(f"oci://{registry.host}/apps/carried"))
        shell = start_shell()
        with shell.client(timeout=60) as api:
            done = api.post("/api/dist/install", json={"ref": ref, "autoApprove": True})
            assert done.status_code == 200, done.text
            result = done.json()
            assert result["ok"] is True
            assert result["image"]["carried"] is True
            assert result["image"]["publisher"] == ref
            listed = api.get(f"/api/apps/{APP}").json()
            assert listed["manifest"]["runtime"]["image"].startswith("oci:image@sha256:")
            assert not (Path(listed["path"]) / "image").exists()
            bare = tmp_path / "remotes" / f"{APP}.git"
            asyncio.run(publish(str(bare)))
            git_ref = f"git+{bare.as_uri()}#1.0.0"
            assert api.delete(f"/api/dist/uninstall/{APP}").status_code == 200
            done = api.post("/api/dist/install", json={"ref": git_ref, "autoApprove": True})
            assert done.status_code == 200, done.text
            assert done.json()["image"]["publisher"] == git_ref
            assert done.json()["image"]["digest"] == result["image"]["digest"]


def nest(layout: Path, platforms: list[str]) -> str:
    """Make ``layout``'s one image the linux/<arch> entry of an image index the layout names
    instead, beside copies claiming other platforms; the index's digest."""
    index_file = layout / "index.json"
    image = json.loads(index_file.read_text())["manifests"][0]
    nested = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": artifact.OCI_INDEX,
            "manifests": [
                {**image, "platform": {"os": "linux", "architecture": arch}} for arch in platforms
            ],
        }
    ).encode()
    digest = digest_of(nested)
    blob(layout, digest).write_bytes(nested)
    entry = {"mediaType": artifact.OCI_INDEX, "digest": digest, "size": len(nested)}
    index_file.write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    return digest


async def test_a_layout_of_several_platforms_gives_this_machines_image(
    tmp_path: Path, built: Path
) -> None:
    folder = app_folder(tmp_path / "multi", app_manifest(), built)
    digest = nest(folder / "image", ["riscv64", machine_arch()])
    store = ImageStore(tmp_path / "images")
    loaded = await store.load(LayoutSource(folder, "image"), digest, "test")
    assert loaded.digest == digest  # pinned by the index, as a registry pull of an index is
    assert (loaded.rootfs / "www" / "index.html").read_text() == "hello from the image\n"
    other = app_folder(tmp_path / "other", app_manifest(), built)
    only = nest(other / "image", ["riscv64"])
    with pytest.raises(ImageError, match=r"offers no linux/\w+ build \(it has linux/riscv64\)"):
        await store.load(LayoutSource(other, "image"), only, "test")
    assert [p.name for p in store.root.iterdir() if p.name != STAGING] == [digest.replace(":", "-")]


def test_the_cli_review_says_it_is_a_container_image_before_asking(
    start_shell: StartShell, tmp_path: Path, built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shell = start_shell()
    monkeypatch.setenv("ATRIUM_URL", shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", shell.token)
    monkeypatch.setenv("COLUMNS", "200")
    folder = app_folder(tmp_path, app_manifest(), built)
    said = [
        f"A container image carried in the app from local:{folder}, not an Atrium app.",
        "Keeps /www/data in its data folder.",
        "Cannot reach the network; only the shell reaches its page.",
    ]
    shown = CliRunner().invoke(cli, ["preview", f"local:{folder}"])
    assert shown.exit_code == 0, shown.output
    assert all(line in shown.output for line in said), shown.output
    declined = CliRunner().invoke(cli, ["install", f"local:{folder}"], input="n\n")
    assert declined.exit_code == 1, declined.output
    assert all(line in declined.output for line in said), declined.output
    assert declined.output.index(said[0]) < declined.output.index("Grant these permissions")
    with shell.client() as api:
        assert api.get(f"/api/apps/{APP}").status_code == 404


@contextmanager
def closing_shell(shell: RunningShell) -> Iterator[RunningShell]:
    try:
        yield shell
    finally:
        shell.stop()


def test_an_export_carries_the_image_its_app_carried_to_another_machine(
    start_shell: StartShell, home: Path, system_apps: Path, tmp_path: Path, built: Path
) -> None:
    """The installed copy keeps none of the layout's blobs, so the export carries the store's
    copy of them back in its folder: another home, its image store empty, imports it, verifies
    the blobs and runs the image (the import was refused, 'the image store has no sha256:…').
    An entry with no copy (loaded before the store kept one) is not exported at all: an archive
    that installs nowhere else is a trap."""
    source = app_folder(tmp_path / "source", app_manifest(), built)
    (source / "image" / "NOTES").write_text("the author's\n")
    elsewhere = tmp_path / "elsewhere"
    with start_shell().client(timeout=60) as api:
        done = api.post("/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True})
        assert done.status_code == 200, done.text
        listed = api.get(f"/api/apps/{APP}").json()
        digest = listed["manifest"]["runtime"]["image"].split("@")[1]
        assert sorted(p.name for p in (Path(listed["path"]) / "image").iterdir()) == ["NOTES"]
        archive = api.get(f"/api/dist/export/{APP}")
        assert archive.status_code == 200, archive.text

        shell = launch_shell(elsewhere, system_apps)  # another machine's home
        with closing_shell(shell), shell.client(timeout=60) as other:
            answer = other.post(
                "/api/dist/import", params={"autoApprove": "1"}, content=archive.content
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["ok"] is True, answer.text
            assert store_entries(elsewhere) == [digest.replace(":", "-")]
            listed = other.get(f"/api/apps/{APP}").json()
            assert listed["manifest"]["runtime"]["image"] == f"oci:image@{digest}"
            assert sorted(p.name for p in (Path(listed["path"]) / "image").iterdir()) == ["NOTES"]
            instance, url = open_view(other, APP)
            assert instance["state"] in ("started", "resumed"), instance
            client, location = enter(shell, url)
            with closing(client):
                assert client.get(location).text == "hello from the image\n"
            # and its export carries the image on again
            again = other.get(f"/api/dist/export/{APP}")
            assert again.status_code == 200, again.text

        # the store's copy gone (an entry from before it was kept): refused, naming why
        shutil.rmtree(home / "images" / digest.replace(":", "-") / "layout")
        refused = api.get(f"/api/dist/export/{APP}")
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["digest"], error["folder"]) == (
            "image_not_kept",
            digest,
            "image",
        )
