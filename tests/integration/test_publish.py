"""Publish to git (bare repositories over file paths) and to OCI (a real registry), as generators."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atrium.distribution.fetchers import ResolvedRef
from atrium.distribution.fetchers.oci import OciFetcher
from atrium.distribution.oci import resolve_oci
from atrium.distribution.publish import Publisher, PublishEvent
from atrium.distribution.refs import OciRef
from atrium.errors import InvalidRequest, ManifestInvalid, UpstreamFailed
from atrium.events import DIST_PUBLISH_COMPLETE, DIST_PUBLISH_DONE, DIST_PUBLISH_PROGRESS
from tests.integration.registry import Registry, running_registry
from tests.integration.tars import app_dir, tree_of

pytestmark = pytest.mark.integration

APP_ID = "com.example.hello"
BusLog = list[tuple[str, dict[str, Any]]]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "registry") as started:
        yield started


@pytest.fixture
def app(tmp_path: Path) -> Path:
    return app_dir(tmp_path / "src", APP_ID)


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    path = tmp_path / "remotes" / f"{APP_ID}.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(path)], check=True, timeout=60)
    return path


@pytest.fixture
def bus() -> BusLog:
    return []


@pytest.fixture
def publisher(bus: BusLog) -> Publisher:
    return Publisher(publish_event=lambda payload: bus.append((payload.TOPIC, payload.wire())))


async def publish_all(publisher: Publisher, app: Path, to: str, tag: str) -> list[PublishEvent]:
    return [event async for event in publisher.publish(app, to, tag)]


def git_tree_at(repo: Path, tag: str, into: Path) -> dict[str, tuple[str, int, bytes]]:
    """The tree of ``tag`` as a shallow clone sees it, with git's file modes (644 or 755)."""
    subprocess.run(
        ["git", "clone", "--quiet", "--depth", "1", "--branch", tag, repo.as_uri(), str(into)],
        check=True,
        timeout=60,
        capture_output=True,
    )
    shutil.rmtree(into / ".git")
    return tree_of(into)


def as_git_stores(tree: dict[str, tuple[str, int, bytes]]) -> dict[str, tuple[str, int, bytes]]:
    return {
        name: (kind, (0o755 if mode & stat.S_IXUSR else 0o644) if kind == "file" else 0, data)
        for name, (kind, mode, data) in tree.items()
    }


async def test_publish_to_a_bare_git_repository_pushes_the_tag_with_the_app_tree(
    publisher: Publisher, app: Path, bare: Path, bus: BusLog, tmp_path: Path
) -> None:
    events = await publish_all(publisher, app, str(bare), "v1.0.0")
    done = events[-1]
    assert done["type"] == "publish.done"
    assert done["ref"] == f"git+{bare.as_uri()}#v1.0.0"
    assert done["installCommand"] == f"atrium install git+{bare.as_uri()}#v1.0.0"
    assert all(e["type"] == "publish.progress" and e["message"] for e in events[:-1])
    assert git_tree_at(bare, "v1.0.0", tmp_path / "clone") == as_git_stores(tree_of(app))
    log = subprocess.run(
        ["git", "--git-dir", str(bare), "log", "--format=%s", "v1.0.0"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert log.splitlines() == [f"publish {APP_ID} 1.0.0"]
    topics = [topic for topic, _ in bus]
    assert topics[-2:] == [DIST_PUBLISH_DONE, DIST_PUBLISH_COMPLETE]
    assert set(topics[:-2]) == {DIST_PUBLISH_PROGRESS}
    assert bus[-1][1] == {"id": APP_ID, "ref": done["ref"]}


async def test_a_second_version_is_a_new_commit_and_tag_on_the_same_branch(
    publisher: Publisher, app: Path, bare: Path, tmp_path: Path
) -> None:
    await publish_all(publisher, app, str(bare), "v1.0.0")
    manifest = json.loads((app / "app.manifest.json").read_text())
    (app / "app.manifest.json").write_text(json.dumps({**manifest, "version": "1.1.0"}))
    (app / "server.py").unlink()
    await publish_all(publisher, app, f"git+{bare.as_uri()}", "v1.1.0")
    assert git_tree_at(bare, "v1.1.0", tmp_path / "clone") == as_git_stores(tree_of(app))
    log = subprocess.run(
        ["git", "--git-dir", str(bare), "log", "--format=%s", "main"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert log.splitlines() == [f"publish {APP_ID} 1.1.0", f"publish {APP_ID} 1.0.0"]


async def test_publishing_to_a_new_path_creates_a_bare_repository(
    publisher: Publisher, app: Path, tmp_path: Path
) -> None:
    target = tmp_path / "new" / f"{APP_ID}.git"
    await publish_all(publisher, app, str(target), "v1")
    assert git_tree_at(target, "v1", tmp_path / "clone") == as_git_stores(tree_of(app))


async def test_an_existing_git_tag_is_refused(publisher: Publisher, app: Path, bare: Path) -> None:
    await publish_all(publisher, app, str(bare), "v1")
    with pytest.raises(InvalidRequest, match="exists already"):
        await publish_all(publisher, app, str(bare), "v1")


async def test_an_unreachable_git_target_fails_as_upstream(publisher: Publisher, app: Path) -> None:
    with pytest.raises(UpstreamFailed, match="git ls-remote"):
        await publish_all(publisher, app, "git://127.0.0.1:9/nothing.git", "v1")


async def test_an_invalid_manifest_is_refused_before_anything_moves(
    publisher: Publisher, app: Path, bare: Path, tmp_path: Path
) -> None:
    renamed = app.rename(tmp_path / "src" / "com.example.renamed")
    with pytest.raises(ManifestInvalid) as caught:
        await publish_all(publisher, renamed, str(bare), "v1")
    assert "must equal the directory name" in caught.value.message
    assert subprocess.run(
        ["git", "--git-dir", str(bare), "tag"], check=True, capture_output=True, timeout=60
    ).stdout == (b"")


async def test_publish_to_oci_reports_the_digest_that_resolve_finds(
    publisher: Publisher, app: Path, registry: Registry, bus: BusLog, tmp_path: Path
) -> None:
    events = await publish_all(publisher, app, f"oci://{registry.host}/apps/{APP_ID}", "1.0.0")
    done = events[-1]
    ref = OciRef(registry.host, f"apps/{APP_ID}", "1.0.0")
    digest, _ = await resolve_oci(ref)
    assert done["digest"] == digest
    assert done["ref"] == str(ref)
    assert done["installCommand"] == f"atrium install oci://{registry.host}/apps/{APP_ID}:1.0.0"
    assert bus[-1] == (DIST_PUBLISH_COMPLETE, {"id": APP_ID, "ref": str(ref)})
    staging = tmp_path / "staging"
    staging.mkdir()
    pinned = OciRef(ref.registry, ref.repository, None, digest)
    resolved = ResolvedRef("oci", str(pinned), digest, ref, APP_ID)
    _ = [e async for e in OciFetcher().fetch(resolved, staging)]
    assert tree_of(staging / APP_ID) == tree_of(app)


async def test_publish_to_a_schemeless_oci_repository(
    publisher: Publisher, app: Path, registry: Registry
) -> None:
    events = await publish_all(publisher, app, f"{registry.host}/{APP_ID}", "stable")
    assert events[-1]["ref"] == f"oci://{registry.host}/{APP_ID}:stable"


async def test_publish_to_a_registry_that_is_down_fails_as_upstream(
    publisher: Publisher, app: Path, registry: Registry
) -> None:
    registry.stop()
    with pytest.raises(UpstreamFailed, match="cannot reach the registry"):
        await publish_all(publisher, app, f"oci://{registry.host}/{APP_ID}", "1.0.0")


async def test_a_link_leaving_the_app_is_refused_before_anything_moves(
    publisher: Publisher, app: Path, bare: Path
) -> None:
    (app / "secrets").symlink_to("/etc")
    with pytest.raises(InvalidRequest, match="leaves the app directory"):
        await publisher.plan(app, str(bare), "v1")
