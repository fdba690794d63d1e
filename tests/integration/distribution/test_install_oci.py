"""Round trips through the running shell's HTTP API with a real OCI registry (Debian's
docker-registry on 127.0.0.1): publish, then install by every OCI ref form and by bare id through an
index, progress over SSE, credentials from ``DOCKER_CONFIG``, a registry that is down, a tampered
blob, updates of a moved tag, and `skopeo` reading what the shell's publish pushed.

One registry without auth and one with htpasswd basic auth serve the whole module; every test uses
its own app id (its own repository and layer blob), so the tests do not see each other's pushes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.distribution import artifact
from atrium.distribution.oci import push_app
from atrium.distribution.ociclient import RegistryClient
from atrium.distribution.refs import DIGEST_RE, OciRef
from tests.integration.conftest import RunningShell, StartShell, run_async
from tests.integration.distribution.conftest import (
    GitRepo,
    MakeApp,
    app_listing,
    install,
    installed_ok,
    sse,
    write_manifest,
)
from tests.integration.registry import (
    PASSWORD,
    USERNAME,
    Registry,
    running_registry,
    write_docker_config,
)

pytestmark = pytest.mark.integration

PERMISSION = "com.atrium.notes.read"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("oci-registry")) as started:
        yield started


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("oci-auth-registry"), auth="basic") as started:
        yield started


# -- helpers ------------------------------------------------------------------------------------


def repository(app_id: str) -> str:
    return f"apps/{app_id}"


def publish(api: httpx.Client, app: Path, registry: Registry, tag: str) -> str:
    """Publish ``app`` through the shell's `POST /api/dist/publish`; returns the manifest digest."""
    target = f"oci://{registry.host}/{repository(app.name)}"
    response = api.post("/api/dist/publish", json={"path": str(app), "to": target, "tag": tag})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ref"] == f"{target}:{tag}"
    assert body["installCommand"] == f"atrium install {target}:{tag}"
    done = body["events"][-1]
    assert done["type"] == "publish.done"
    digest: str = done["digest"]
    assert DIGEST_RE.fullmatch(digest), digest
    return digest


def push(app: Path, registry: Registry, tag: str) -> str:
    """Publish ``app`` with push_app (the registry's own credentials, if any), not the shell."""
    ref = OciRef(registry.host, repository(app.name), tag)
    digest: str = run_async(push_app(app, ref, registry.docker_config))
    return digest


def oci_ref(registry: Registry, app_id: str, tag: str) -> str:
    return f"oci://{registry.host}/{repository(app_id)}:{tag}"


def up_to_date(answer: dict[str, Any]) -> bool:
    """The no-op update answer (its ``events`` are the resolve steps)."""
    return (answer["ok"], answer["record"], answer["upToDate"]) == (True, None, True)


def git_lines(cwd: Path, *args: str) -> list[str]:
    out = subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return out.splitlines()


def assert_nothing_installed(api: httpx.Client, home: Path, app_id: str) -> None:
    """No app directory, no record, no listing, a clean scope repository with only its baseline."""
    scope = home / "scopes/global"
    assert not (scope / "apps" / app_id).exists()
    assert not (scope / "records" / f"{app_id}.json").exists()
    assert app_listing(api, app_id) is None
    assert api.get("/api/dist/installed").json() == []
    assert git_lines(scope, "status", "--porcelain") == []
    assert git_lines(scope, "log", "--format=%s") == ["baseline: Atrium scope"]
    staging = scope / ".staging"
    assert not staging.exists() or not list(staging.iterdir())


def manifest_of(registry: Registry, app_id: str, tag: str) -> tuple[bytes, dict[str, Any]]:
    response = httpx.get(
        f"http://{registry.host}/v2/{repository(app_id)}/manifests/{tag}",
        headers={"Accept": OCI_MANIFEST},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.content, response.json()


def skopeo_raw(host: str, reference: str, *extra: str) -> bytes:
    return subprocess.run(
        [
            "skopeo",
            "inspect",
            "--raw",
            "--tls-verify=false",
            *extra,
            f"docker://{host}/{reference}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout


@pytest.fixture
def shell(start_shell: StartShell) -> RunningShell:
    return start_shell()


@pytest.fixture
def api(shell: RunningShell) -> Iterator[httpx.Client]:
    with shell.client(timeout=60) as client:
        yield client


# -- publish, then install by every OCI ref form ------------------------------------------------


def test_publish_then_install_by_oci_ref_lists_the_app_with_its_record(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path
) -> None:
    app_id = "com.example.ocihello"
    digest = publish(api, make_app(app_id), registry, "1.0.0")
    ref = oci_ref(registry, app_id, "1.0.0")

    answer = installed_ok(api, ref)

    record = answer["record"]
    target = home / "scopes/global/apps" / app_id
    assert (record["id"], record["version"], record["scope"]) == (app_id, "1.0.0", "global")
    assert (record["source"], record["digest"], record["ref"]) == ("oci", digest, ref)
    assert record["channel"] is None
    assert record["path"] == str(target)
    kinds = [e["type"] for e in answer["events"]]
    assert kinds[:3] == ["resolve.start", "resolve.done", "fetch.start"]
    assert kinds[-4:] == ["fetch.done", "validate.done", "install.start", "install.done"]
    assert set(kinds[3:-4]) <= {"fetch.progress"}
    resolved = answer["events"][1]["resolved"]
    assert resolved["digest"] == digest
    assert resolved["manifestPreview"] == {"id": app_id, "version": "1.0.0"}
    # the answer comes once GET /api/apps reflects it
    listed = app_listing(api, app_id)
    assert listed is not None
    assert (listed["scope"], listed["version"], listed["record"]) == ("global", "1.0.0", record)
    assert (target / "server.py").is_file()
    assert json.loads((home / "scopes/global/records" / f"{app_id}.json").read_text()) == record
    assert git_lines(home / "scopes/global", "log", "--format=%s") == [
        f"install {app_id} 1.0.0 ({ref})",
        "baseline: Atrium scope",
    ]
    assert git_lines(home / "scopes/global", "status", "--porcelain") == []


@pytest.mark.parametrize(
    ("form", "app_id"),
    [
        ("{host}/{repo}:{tag}", "com.example.schemeless"),
        ("{host}/{repo}@{digest}", "com.example.bydigest"),
        ("oci://{host}/{repo}@{digest}", "com.example.ocidigest"),
    ],
)
def test_the_schemeless_and_digest_forms_install_the_same_artifact(
    api: httpx.Client, make_app: MakeApp, registry: Registry, form: str, app_id: str
) -> None:
    digest = publish(api, make_app(app_id), registry, "1.0.0")
    raw = form.format(host=registry.host, repo=repository(app_id), tag="1.0.0", digest=digest)

    record = installed_ok(api, raw)["record"]

    if "@" in raw:
        canonical = OciRef(registry.host, repository(app_id), None, digest)
    else:
        canonical = OciRef(registry.host, repository(app_id), "1.0.0")
    assert (record["source"], record["digest"], record["ref"]) == ("oci", digest, str(canonical))
    listed = app_listing(api, app_id)
    assert listed is not None
    assert listed["record"] == record


def test_skopeo_reads_what_the_shells_publish_pushed(
    api: httpx.Client, make_app: MakeApp, registry: Registry
) -> None:
    app_id = "com.example.skopeo"
    digest = publish(api, make_app(app_id, version="2.3.4"), registry, "2.3.4")
    raw = skopeo_raw(registry.host, f"{repository(app_id)}:2.3.4")
    manifest = json.loads(raw)
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest
    assert manifest["artifactType"] == "application/vnd.os.app.v1"
    assert [layer["mediaType"] for layer in manifest["layers"]] == [
        "application/vnd.os.app.layer.v1.tar+gzip"
    ]
    assert manifest["annotations"] == {
        "org.opencontainers.image.title": app_id,
        "org.opencontainers.image.version": "2.3.4",
    }
    # and by digest, the form an install pins
    assert skopeo_raw(registry.host, f"{repository(app_id)}@{digest}") == raw


# -- bare ids through an index ------------------------------------------------------------------


@pytest.fixture
def indexed(
    make_app: MakeApp, git_repo: Callable[..., GitRepo], registry: Registry, tmp_path: Path
) -> tuple[str, dict[str, str]]:
    """An index entry with both sources; OCI and git each hold a stable and a beta release.

    Returns the file:// index URL and the OCI digest of each channel. The artifacts are pushed with
    push_app (the test then starts its one shell on the index).
    """
    app_id = "com.example.indexedoci"
    oci_source = make_app(app_id, root=tmp_path / "oci-src")
    digests = {"stable": push(oci_source, registry, "1.0.0")}
    write_manifest(oci_source, version="1.1.0-beta.1")
    digests["beta"] = push(oci_source, registry, "1.1.0-beta.1")
    # the git copies carry other versions, so a record tells which source was taken
    git_source = make_app(app_id, root=tmp_path / "git-src", version="0.9.0")
    repo = git_repo(git_source, "v0.9.0")
    write_manifest(git_source, version="0.9.1-edge.1")
    repo.commit_and_tag("v0.9.1-edge.1", message="edge")
    entry = {
        "id": app_id,
        "name": "Indexed over OCI",
        "publisher": "Example",
        "sources": {
            "oci": {"ref": f"{registry.host}/{repository(app_id)}"},
            "git": {"ref": repo.url, "default-branch": "main"},
        },
        "channels": {
            "stable": {"oci-tag": "1.0.0", "git-tag": "v0.9.0"},
            "beta": {"oci-tag": "1.1.0-beta.1", "git-tag": "v0.9.0"},
            "edge": {"git-tag": "v0.9.1-edge.1"},
        },
    }
    path = tmp_path / "index.json"
    path.write_text(json.dumps({"schema": 1, "apps": [entry]}))
    return f"file://{path}", digests


def test_a_bare_id_prefers_oci_and_channels_pick_their_tags(
    start_shell: StartShell, indexed: tuple[str, dict[str, str]]
) -> None:
    url, digests = indexed
    app_id = "com.example.indexedoci"
    shell = start_shell(index_url=url)
    with shell.client(timeout=60) as api:
        stable = installed_ok(api, app_id)["record"]
        assert (stable["source"], stable["channel"], stable["version"]) == (
            "oci",
            "stable",
            "1.0.0",
        )
        assert (stable["ref"], stable["digest"]) == (app_id, digests["stable"])

        beta = installed_ok(api, f"{app_id}@beta", scope="user")["record"]
        assert (beta["source"], beta["channel"]) == ("oci", "beta")
        assert (beta["version"], beta["digest"]) == ("1.1.0-beta.1", digests["beta"])
        assert beta["ref"] == f"{app_id}@beta"
        listed = app_listing(api, app_id)
        assert listed is not None
        assert (listed["scope"], listed["masks"], listed["record"]) == ("user", ["global"], beta)

        # the update of the winning (user) copy re-resolves its channel through the index
        update = api.post(f"/api/dist/update/{app_id}")
        assert update.status_code == 200, update.text
        assert up_to_date(update.json())

        # a channel naming only a git tag takes the git source
        edge = installed_ok(api, f"{app_id}@edge", scope="user")["record"]
        assert (edge["source"], edge["channel"]) == ("git", "edge")
        assert edge["version"] == "0.9.1-edge.1"


# -- progress over SSE --------------------------------------------------------------------------


def test_an_sse_install_from_oci_reports_fetch_progress_with_done_and_total(
    api: httpx.Client, make_app: MakeApp, registry: Registry
) -> None:
    app_id = "com.example.ocibig"
    source = make_app(app_id)
    (source / "big.bin").write_bytes(os.urandom(1 << 20))
    publish(api, source, registry, "1.0.0")

    events = sse(
        api,
        "POST",
        "/api/dist/install",
        json={"ref": oci_ref(registry, app_id, "1.0.0"), "autoApprove": True},
    )

    kinds = [e["type"] for e in events]
    assert kinds[-3:] == ["install.start", "install.done", "result"]
    assert events[-1]["ok"] is True
    progress = [e for e in events if e["type"] == "fetch.progress"]
    first, last = (
        kinds.index("fetch.progress"),
        len(kinds) - 1 - kinds[::-1].index("fetch.progress"),
    )
    assert kinds[first - 1] == "fetch.start"
    assert kinds[last + 1] == "fetch.done"
    assert set(kinds[first : last + 1]) == {"fetch.progress"}
    assert len(progress) >= 3
    done = [e["done"] for e in progress]
    assert done == sorted(done)
    assert {e["total"] for e in progress} == {progress[-1]["total"]}
    assert done[-1] == progress[-1]["total"] > 1 << 20
    assert all(e["digest"].startswith("sha256:") for e in progress)
    listed = app_listing(api, app_id)
    assert listed is not None
    assert listed["record"]["source"] == "oci"


# -- credentials --------------------------------------------------------------------------------


def test_credentials_from_docker_config_let_the_shell_publish_and_install(
    start_shell: StartShell,
    make_app: MakeApp,
    auth_registry: Registry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert auth_registry.docker_config is not None
    monkeypatch.setenv("DOCKER_CONFIG", str(auth_registry.docker_config))
    shell = start_shell()
    app_id = "com.example.private"
    with shell.client(timeout=60) as api:
        digest = publish(api, make_app(app_id), auth_registry, "1.0.0")
        record = installed_ok(api, oci_ref(auth_registry, app_id, "1.0.0"))["record"]
        assert (record["source"], record["digest"]) == ("oci", digest)
        assert app_listing(api, app_id) is not None


def test_without_credentials_the_install_is_fetch_failed_naming_them(
    start_shell: StartShell, make_app: MakeApp, auth_registry: Registry, home: Path
) -> None:
    app_id = "com.example.locked"
    push(make_app(app_id), auth_registry, "1.0.0")
    shell = start_shell()
    with shell.client(timeout=60) as api:
        response = install(api, oci_ref(auth_registry, app_id, "1.0.0"), autoApprove=True)
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert error["code"] == "fetch_failed"
        assert "credentials" in error["message"]
        assert "401" in error["message"]
        assert_nothing_installed(api, home, app_id)


def test_wrong_credentials_are_fetch_failed(
    start_shell: StartShell,
    make_app: MakeApp,
    auth_registry: Registry,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    home: Path,
) -> None:
    app_id = "com.example.wrongpass"
    push(make_app(app_id), auth_registry, "1.0.0")
    wrong = write_docker_config(tmp_path / "wrong", auth_registry.host, USERNAME, PASSWORD + "x")
    monkeypatch.setenv("DOCKER_CONFIG", str(wrong))
    shell = start_shell()
    with shell.client(timeout=60) as api:
        response = install(api, oci_ref(auth_registry, app_id, "1.0.0"), autoApprove=True)
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert error["code"] == "fetch_failed"
        assert "refused the credentials" in error["message"]
        assert PASSWORD not in response.text
        assert_nothing_installed(api, home, app_id)


# -- failures -----------------------------------------------------------------------------------


def test_a_registry_that_is_down_is_fetch_failed_for_install_and_update(
    api: httpx.Client, make_app: MakeApp, tmp_path: Path, home: Path
) -> None:
    app_id = "com.example.downhere"
    with running_registry(tmp_path / "short-lived") as short_lived:
        publish(api, make_app(app_id), short_lived, "1.0.0")
        installed = installed_ok(api, oci_ref(short_lived, app_id, "1.0.0"))["record"]
        short_lived.stop()

        response = install(api, oci_ref(short_lived, app_id, "1.0.1"), autoApprove=True)
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert error["code"] == "fetch_failed"
        assert "cannot reach the registry" in error["message"]
        assert short_lived.host in error["message"]

        update = api.post(f"/api/dist/update/{app_id}", json={"autoApprove": True})
        assert update.status_code == 502, update.text
        assert update.json()["error"]["code"] == "fetch_failed"
    # the installed copy is untouched
    listed = app_listing(api, app_id)
    assert listed is not None
    assert listed["record"] == installed
    assert git_lines(home / "scopes/global", "status", "--porcelain") == []


def test_a_tampered_blob_is_fetch_failed_and_installs_nothing(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path
) -> None:
    app_id = "com.example.tampered"
    publish(api, make_app(app_id), registry, "1.0.0")
    _, manifest = manifest_of(registry, app_id, "1.0.0")
    blob = registry.blob_data(manifest["layers"][0]["digest"])
    original = blob.read_bytes()
    blob.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))

    response = install(api, oci_ref(registry, app_id, "1.0.0"), autoApprove=True)

    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "fetch_failed"
    assert "digest mismatch" in error["message"]
    assert_nothing_installed(api, home, app_id)


# -- updates ------------------------------------------------------------------------------------


def test_a_moved_tag_with_a_new_permission_updates_after_approval_then_is_up_to_date(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path
) -> None:
    app_id = "com.example.ocimoving"
    source = make_app(app_id)
    first_digest = publish(api, source, registry, "current")
    ref = oci_ref(registry, app_id, "current")
    first = installed_ok(api, ref)["record"]
    assert first["digest"] == first_digest

    unchanged = api.post(f"/api/dist/update/{app_id}")
    assert unchanged.status_code == 200, unchanged.text
    assert up_to_date(unchanged.json())

    write_manifest(source, version="1.1.0", permissions=[PERMISSION])
    second_digest = publish(api, source, registry, "current")
    assert second_digest != first_digest

    needs = api.post(f"/api/dist/update/{app_id}", json={})
    assert needs.status_code == 200, needs.text
    asked = needs.json()
    assert (asked["ok"], asked["needsApproval"]) == (False, True)
    assert asked["diff"]["versionFrom"] == "1.0.0"
    assert asked["diff"]["versionTo"] == "1.1.0"
    assert asked["diff"]["permissionsAdded"] == [PERMISSION]
    assert asked["resolved"]["digest"] == second_digest
    listed = app_listing(api, app_id)
    assert listed is not None
    assert listed["version"] == "1.0.0"

    approved = api.post(
        f"/api/dist/update/{app_id}",
        json={"autoApprove": True, "approvedDigest": second_digest},
    ).json()
    assert approved["ok"] is True
    record = approved["record"]
    assert (record["version"], record["digest"], record["ref"]) == ("1.1.0", second_digest, ref)
    assert record["source"] == "oci"
    assert record["installedAt"] == first["installedAt"]
    listed = app_listing(api, app_id)
    assert listed is not None
    assert (listed["version"], listed["record"]) == ("1.1.0", record)
    manifest = json.loads((home / "scopes/global/apps" / app_id / "app.manifest.json").read_text())
    assert manifest["permissions"] == [PERMISSION]

    assert up_to_date(api.post(f"/api/dist/update/{app_id}").json())
    assert git_lines(home / "scopes/global", "log", "--format=%s") == [
        f"update {app_id} 1.1.0 ({ref})",
        f"install {app_id} 1.0.0 ({ref})",
        "baseline: Atrium scope",
    ]


# -- an artifact without a title annotation -----------------------------------------------------


async def _push_untitled(app: Path, ref: OciRef) -> str:
    """Push ``app`` the way ORAS would: no manifest annotations, a file name as the layer's title."""
    out = io.BytesIO()
    artifact.write_layer(app, app.name, out)
    layer = out.getvalue()
    digest = artifact.sha256_digest(layer)
    document = json.loads(
        artifact.image_manifest(
            artifact.Descriptor(artifact.LAYER_MEDIA_TYPE, digest, len(layer)), app.name, "1.0.0"
        )
    )
    del document["annotations"]
    document["layers"][0]["annotations"] = {"org.opencontainers.image.title": "app.tar.gz"}
    async with RegistryClient(ref.registry, ref.repository, docker_config=None, push=True) as c:
        await c.push_blob(artifact.EMPTY_CONFIG, artifact.EMPTY_DESCRIPTOR.digest)
        await c.push_blob(layer, digest)
        return await c.put_manifest(
            ref.tag or "latest", json.dumps(document).encode(), OCI_MANIFEST
        )


def test_an_artifact_without_a_title_is_named_by_its_layers_top_folder(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path
) -> None:
    """Issue 14 row 9: the docs say the top folder names the app; without a title annotation the
    install used to guess the repository's name and refuse the layer as "unsafe"."""
    app_id = "com.example.untitled"
    ref = OciRef(registry.host, "apps/some-other-name", "1.0.0")
    digest = run_async(_push_untitled(make_app(app_id), ref))
    preview = api.post("/api/dist/install/preview", json={"ref": str(ref)})
    assert preview.status_code == 200, preview.text
    assert preview.json()["diff"]["appId"] == app_id
    record = installed_ok(api, str(ref))["record"]
    assert (record["id"], record["digest"], record["source"]) == (app_id, digest, "oci")
    assert (home / "scopes/global/apps" / app_id / "app.manifest.json").is_file()
    assert up_to_date(api.post(f"/api/dist/update/{app_id}").json())


def test_json_nested_past_the_parser_from_a_registry_is_fetch_failed(api: httpx.Client) -> None:
    """A registry answering a manifest (or an error body) nested 100,000 deep made json.loads
    raise RecursionError, which no ValueError handler caught: the install answered 500."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    nested = b"[" * 100_000 + b"]" * 100_000

    class Hostile(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            manifest = "/manifests/" in self.path
            self.send_response(200 if manifest or self.path == "/v2/" else 404)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            body = nested if self.path != "/v2/" else b"{}"
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        ref = f"oci://127.0.0.1:{server.server_address[1]}/com.example.nested:1.0.0"
        response = install(api, ref, autoApprove=True)
        assert response.status_code == 502, response.text
        assert response.json()["error"]["code"] == "fetch_failed"
    finally:
        server.shutdown()
        server.server_close()
