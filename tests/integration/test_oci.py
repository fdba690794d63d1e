"""The OCI registry client and fetcher against a real registry (Debian docker-registry on loopback)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from atrium.distribution import artifact
from atrium.distribution.fetchers import ProgressEvent, ResolvedRef
from atrium.distribution.fetchers.oci import OciFetcher
from atrium.distribution.oci import push_app, push_artifact, resolve_oci
from atrium.distribution.ociclient import RegistryClient
from atrium.distribution.refs import OciRef
from atrium.errors import FetchFailed
from tests.integration.registry import Registry, running_registry, write_docker_config
from tests.integration.tars import Member, app_dir, crafted_layer, tree_of

pytestmark = pytest.mark.integration

APP_ID = "com.example.hello"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "registry") as started:
        yield started


@pytest.fixture
def auth_registry(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "auth-registry", auth="basic") as started:
        yield started


@pytest.fixture
def token_registry(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "token-registry", auth="token") as started:
        yield started


@pytest.fixture
def app(tmp_path: Path) -> Path:
    return app_dir(tmp_path / "src", APP_ID)


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    path = tmp_path / "box" / "staging"
    path.mkdir(parents=True)
    return path


def resolved_for(ref: OciRef, digest: str, dir_name: str = APP_ID) -> ResolvedRef:
    pinned = OciRef(ref.registry, ref.repository, None, digest)
    return ResolvedRef("oci", str(pinned), digest, ref, dir_name)


async def fetch_all(
    resolved: ResolvedRef, staging: Path, docker_config: Path | None = None
) -> list[ProgressEvent]:
    return [e async for e in OciFetcher(docker_config).fetch(resolved, staging)]


async def test_push_resolve_fetch_round_trip_keeps_files_and_modes(
    registry: Registry, app: Path, staging: Path
) -> None:
    ref = registry.ref(f"apps/{APP_ID}", "1.0.0")
    pushed = await push_app(app, ref)
    digest, preview = await resolve_oci(ref)
    await fetch_all(resolved_for(ref, digest), staging)
    assert digest == pushed
    assert preview == {"id": APP_ID, "version": "1.0.0"}
    assert tree_of(staging / APP_ID) == tree_of(app)


async def test_resolve_by_digest_gives_the_same_digest(registry: Registry, app: Path) -> None:
    pushed = await push_app(app, registry.ref(APP_ID, "1.0.0"))
    digest, _ = await resolve_oci(OciRef(registry.host, APP_ID, None, pushed))
    assert digest == pushed


async def test_the_same_tree_always_gives_the_same_digest(registry: Registry, app: Path) -> None:
    first = await push_app(app, registry.ref(APP_ID, "a"))
    os.utime(app / "entrypoint.sh", (1, 1))
    second = await push_app(app, registry.ref(APP_ID, "b"))
    assert first == second


async def test_skopeo_reads_what_we_pushed(registry: Registry, app: Path) -> None:
    digest = await push_app(app, registry.ref(f"apps/{APP_ID}", "1.0.0"))
    raw = subprocess.run(
        [
            "skopeo",
            "inspect",
            "--raw",
            "--tls-verify=false",
            f"docker://{registry.host}/apps/{APP_ID}:1.0.0",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout
    manifest = json.loads(raw)
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["artifactType"] == "application/vnd.os.app.v1"
    assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    assert [layer["mediaType"] for layer in manifest["layers"]] == [
        "application/vnd.os.app.layer.v1.tar+gzip"
    ]
    assert manifest["annotations"] == {
        "org.opencontainers.image.title": APP_ID,
        "org.opencontainers.image.version": "1.0.0",
    }


async def test_fetch_reports_progress_several_times_for_a_large_blob(
    registry: Registry, app: Path, staging: Path
) -> None:
    (app / "big.bin").write_bytes(os.urandom(1 << 20))
    ref = registry.ref(APP_ID, "big")
    digest = await push_app(app, ref)
    events = await fetch_all(resolved_for(ref, digest), staging)
    done = [e["done"] for e in events]
    assert len(events) >= 3
    assert all(e["type"] == "fetch.progress" for e in events)
    assert done == sorted(done)
    assert done[-1] == events[-1]["total"] > 1 << 20
    assert (staging / APP_ID / "big.bin").read_bytes() == (app / "big.bin").read_bytes()


async def test_push_reports_upload_progress(registry: Registry, app: Path) -> None:
    (app / "big.bin").write_bytes(os.urandom(1 << 20))
    messages: list[str] = []
    await push_app(app, registry.ref(APP_ID, "big"), progress=messages.append)
    assert sum("uploading layer" in m for m in messages) >= 2


async def test_credentials_from_the_docker_config_work(
    auth_registry: Registry, app: Path, staging: Path
) -> None:
    ref = auth_registry.ref(APP_ID, "1.0.0")
    pushed = await push_app(app, ref, auth_registry.docker_config)
    digest, _ = await resolve_oci(ref, auth_registry.docker_config)
    await fetch_all(resolved_for(ref, digest), staging, auth_registry.docker_config)
    assert digest == pushed
    assert tree_of(staging / APP_ID) == tree_of(app)


async def test_bearer_token_auth_works_with_the_docker_config_credentials(
    token_registry: Registry, app: Path, staging: Path
) -> None:
    ref = token_registry.ref(APP_ID, "1.0.0")
    pushed = await push_app(app, ref, token_registry.docker_config)
    digest, _ = await resolve_oci(ref, token_registry.docker_config)
    await fetch_all(resolved_for(ref, digest), staging, token_registry.docker_config)
    assert digest == pushed
    assert tree_of(staging / APP_ID) == tree_of(app)


async def test_bearer_token_auth_without_credentials_names_them(
    token_registry: Registry, tmp_path: Path
) -> None:
    with pytest.raises(FetchFailed) as caught:
        await resolve_oci(token_registry.ref(APP_ID, "1.0.0"), tmp_path / "none")
    assert "needs credentials (401)" in caught.value.message


async def test_a_private_repository_behind_anonymous_tokens_names_the_missing_credentials(
    token_registry: Registry, app: Path, staging: Path, tmp_path: Path
) -> None:
    """Issue 14 row 9: the token service hands out an anonymous token that grants nothing (as Docker
    Hub does for a private repository); the refusal names the Docker config entry to add."""
    ref = token_registry.ref(APP_ID, "1.0.0")
    digest = await push_app(app, ref, token_registry.docker_config)
    assert token_registry.token_service is not None
    token_registry.token_service.anonymous = True
    with pytest.raises(FetchFailed) as caught:
        await resolve_oci(ref, tmp_path / "empty-docker-config")
    message = caught.value.message
    assert "needs credentials" in message, message
    assert "'auths'" in message
    assert f"docker login {token_registry.host}" in message
    with pytest.raises(FetchFailed) as fetched:
        await fetch_all(resolved_for(ref, digest), staging, tmp_path / "empty-docker-config")
    assert "needs credentials" in fetched.value.message


async def test_credentials_are_read_from_docker_config_env(
    auth_registry: Registry, app: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert auth_registry.docker_config is not None
    monkeypatch.setenv("DOCKER_CONFIG", str(auth_registry.docker_config))
    ref = auth_registry.ref(APP_ID, "1.0.0")
    pushed = await push_app(app, ref)
    assert (await resolve_oci(ref))[0] == pushed


async def test_missing_credentials_fail_the_fetch_naming_them(
    auth_registry: Registry, app: Path, tmp_path: Path
) -> None:
    ref = auth_registry.ref(APP_ID, "1.0.0")
    await push_app(app, ref, auth_registry.docker_config)
    with pytest.raises(FetchFailed) as caught:
        await resolve_oci(ref, tmp_path / "no-docker-config")
    assert "credentials" in caught.value.message
    assert "401" in caught.value.message


async def test_wrong_credentials_fail_the_fetch(
    auth_registry: Registry, app: Path, tmp_path: Path
) -> None:
    ref = auth_registry.ref(APP_ID, "1.0.0")
    await push_app(app, ref, auth_registry.docker_config)
    wrong = write_docker_config(tmp_path / "wrong", auth_registry.host, "publisher", "nope")
    with pytest.raises(FetchFailed) as caught:
        await resolve_oci(ref, wrong)
    assert "refused the credentials" in caught.value.message
    assert caught.value.fields["ref"] == str(ref)


async def test_a_registry_that_is_down_fails_the_fetch(registry: Registry) -> None:
    registry.stop()
    with pytest.raises(FetchFailed) as caught:
        await resolve_oci(registry.ref(APP_ID, "1.0.0"))
    assert "cannot reach the registry" in caught.value.message


async def test_an_unknown_tag_fails_the_fetch(registry: Registry, app: Path) -> None:
    await push_app(app, registry.ref(APP_ID, "1.0.0"))
    with pytest.raises(FetchFailed) as caught:
        await resolve_oci(registry.ref(APP_ID, "9.9.9"))
    assert "manifest unknown" in caught.value.message


async def test_an_artifact_of_another_type_is_refused(registry: Registry) -> None:
    ref = registry.ref("other", "1")
    layer = b"not an app"
    layer_digest = artifact.sha256_digest(layer)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": artifact.OCI_MANIFEST,
            "artifactType": "application/vnd.example.other",
            "config": artifact.EMPTY_DESCRIPTOR.wire(),
            "layers": [{"mediaType": "text/plain", "digest": layer_digest, "size": len(layer)}],
        }
    ).encode()
    async with RegistryClient(ref.registry, ref.repository, docker_config=None, push=True) as c:
        await c.push_blob(artifact.EMPTY_CONFIG, artifact.EMPTY_DESCRIPTOR.digest)
        await c.push_blob(layer, layer_digest)
        await c.put_manifest("1", manifest, artifact.OCI_MANIFEST)
    with pytest.raises(FetchFailed) as caught:
        await resolve_oci(ref)
    assert "wrong artifact type" in caught.value.message


async def test_a_tampered_blob_fails_the_fetch(
    registry: Registry, app: Path, staging: Path
) -> None:
    ref = registry.ref(APP_ID, "1.0.0")
    digest = await push_app(app, ref)
    layer = artifact.check_app_manifest(
        json.loads(await _manifest_bytes(registry, ref)), None
    ).layer
    data = registry.blob_data(layer.digest)
    original = data.read_bytes()
    data.write_bytes(bytes([original[0] ^ 0xFF]) + original[1:])
    with pytest.raises(FetchFailed) as caught:
        await fetch_all(resolved_for(ref, digest), staging)
    assert "digest mismatch" in caught.value.message
    assert not (staging / APP_ID).exists()


async def test_a_folder_other_than_the_resolved_directory_name_is_refused(
    registry: Registry, app: Path, staging: Path
) -> None:
    ref = registry.ref(APP_ID, "1.0.0")
    digest = await push_app(app, ref)
    with pytest.raises(FetchFailed) as caught:
        await fetch_all(resolved_for(ref, digest, "com.example.other"), staging)
    assert "outside the app's top-level folder 'com.example.other'" in caught.value.message


async def _manifest_bytes(registry: Registry, ref: OciRef) -> bytes:
    async with RegistryClient(ref.registry, ref.repository, docker_config=None) as client:
        return (await client.manifest(ref.tag or "latest")).body


EVIL = "com.example.evil"
HUGE = 300 << 20


def _malicious(box: Path) -> dict[str, tuple[list[Member], str]]:
    """Crafted layers, each with the words its refusal must contain."""
    escape = str(box / "escaped")
    top = Member(EVIL, "dir")
    return {
        "absolute path": ([top, Member(escape, "file", b"x")], "absolute path"),
        "dot-dot": ([top, Member(f"{EVIL}/../escaped", "file", b"x")], "'..'"),
        "outside the top folder": ([top, Member("other/file", "file", b"x")], "outside"),
        "a second top folder file": ([top, Member("escaped", "file", b"x")], "outside"),
        "symlink out": ([top, Member(f"{EVIL}/link", "symlink", link="../../escaped")], "link"),
        "absolute symlink": ([top, Member(f"{EVIL}/link", "symlink", link=escape)], "link"),
        "write through a symlink": (
            [
                top,
                Member(f"{EVIL}/here", "symlink", link="."),
                Member(f"{EVIL}/here/x", "file", b"x"),
            ],
            "through a link",
        ),
        "symlink chain that resolves outside": (
            [
                top,
                Member(f"{EVIL}/s", "symlink", link="."),
                Member(f"{EVIL}/t", "symlink", link="s/s/s/../../.."),
            ],
            "resolves outside",
        ),
        "hardlink out": ([top, Member(f"{EVIL}/hard", "hardlink", link="/etc/passwd")], "hard"),
        "hardlink dot-dot": (
            [top, Member(f"{EVIL}/hard", "hardlink", link=f"{EVIL}/../../escaped")],
            "'..'",
        ),
        "device file": ([top, Member(f"{EVIL}/null", "chr")], "device"),
        "fifo": ([top, Member(f"{EVIL}/pipe", "fifo")], "fifo"),
        "a header claiming 300 MiB": (
            [top, Member(f"{EVIL}/huge", "file", claimed_size=HUGE)],
            "256 MiB",
        ),
        "a 300 MiB long-name header (a memory bomb)": (
            [top, Member("././@LongLink", "longname", claimed_size=HUGE)],
            "metadata header",
        ),
        "files adding up past 256 MiB": (
            [
                top,
                Member(f"{EVIL}/zeros", "file", zeros=200 << 20),
                Member(f"{EVIL}/more", "file", claimed_size=100 << 20),
            ],
            "256 MiB",
        ),
    }


@pytest.mark.parametrize("case", list(_malicious(Path("/x"))))
async def test_malicious_artifacts_are_refused_with_nothing_outside_staging(
    case: str, registry: Registry, staging: Path
) -> None:
    box = staging.parent
    members, words = _malicious(box)[case]
    ref = registry.ref(EVIL, "1.0.0")
    digest = await push_artifact(ref, crafted_layer(members), app_id=EVIL, version="1.0.0")
    with pytest.raises(FetchFailed) as caught:
        await fetch_all(resolved_for(ref, digest, EVIL), staging)
    assert words in caught.value.message
    assert "unsafe artifact" in caught.value.message or "256 MiB" in caught.value.message
    assert sorted(p.name for p in box.iterdir()) == ["staging"]
    assert not any(p.name.startswith(".") for p in staging.iterdir()), "the layer file is left"
