"""Signed apps through the running shell, a real docker-registry and a real git daemon: signed
publishes (a cosign-style ``.sig`` tag read back with skopeo; an SSH-signed git tag), the trust
store per scope, and the install policy: ``require`` refuses unsigned, unknown, revoked and
misdirected signatures with nothing installed; ``warn`` installs and says so in the review.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from atrium.cli.main import app
from atrium.distribution import signing
from tests.integration.conftest import RunningShell
from tests.integration.distribution.conftest import GitDaemon, MakeApp, install, installed_ok
from tests.integration.registry import Registry, running_registry

pytestmark = pytest.mark.integration

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("signed-registry")) as started:
        yield started


# -- helpers ------------------------------------------------------------------------------------


def keygen(folder: Path, name: str) -> tuple[Path, str]:
    """A key pair as `atrium keygen` writes it: the private key file and the public PEM."""
    private, public = signing.generate_key_pair()
    key = folder / f"{name}.key"
    key.write_bytes(private)
    key.chmod(0o600)
    return key, public.decode()


def trust(
    api: httpx.Client, policy: str, keys: dict[str, str], scope: str = "global"
) -> dict[str, Any]:
    body = {"policy": policy, "keys": [{"name": n, "key": k} for n, k in keys.items()]}
    response = api.put(f"/api/scopes/{scope}/trust", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def target(registry: Registry, app_id: str) -> str:
    return f"oci://{registry.host}/apps/{app_id}"


def publish(
    api: httpx.Client, app: Path, to: str, tag: str, key: Path | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"path": str(app), "to": to, "tag": tag}
    if key is not None:
        body["sign"] = str(key)
    response = api.post("/api/dist/publish", json=body)
    assert response.status_code == 200, response.text
    done: dict[str, Any] = response.json()["events"][-1]
    assert done["type"] == "publish.done"
    return done


def skopeo_raw(registry: Registry, reference: str) -> dict[str, Any]:
    out = subprocess.run(
        [
            "skopeo",
            "inspect",
            "--raw",
            "--tls-verify=false",
            f"docker://{registry.host}/{reference}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout
    found: dict[str, Any] = json.loads(out)
    return found


def git_lines(cwd: Path, *args: str) -> list[str]:
    out = subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return out.splitlines()


def assert_refused_and_nothing_installed(
    response: httpx.Response, home: Path, app_id: str, status: str, scope: str = "global"
) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "untrusted_artifact"
    assert error["appId"] == app_id
    assert error["signature"]["status"] == status
    root = home / "scopes" / scope
    assert not (root / "apps" / app_id).exists()
    assert not (root / "records" / f"{app_id}.json").exists()
    assert git_lines(root, "status", "--porcelain") == []
    assert not any(f"{app_id}" in line for line in git_lines(root, "log", "--format=%s"))
    staging = root / ".staging"
    assert not staging.exists() or not list(staging.iterdir())


# -- OCI ----------------------------------------------------------------------------------------


def test_a_signed_publish_stores_a_cosign_signature_and_installs_under_require(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path, tmp_path: Path
) -> None:
    app_id = "com.example.signed"
    key, public = keygen(tmp_path, "alice")
    done = publish(api, make_app(app_id), target(registry, app_id), "1.0.0", key)
    digest = done["digest"]

    # what was pushed, as another tool reads it: the .sig tag with the payload and annotation
    sig = skopeo_raw(registry, f"apps/{app_id}:{signing.signature_tag(digest)}")
    [layer] = sig["layers"]
    assert layer["mediaType"] == signing.PAYLOAD_MEDIA_TYPE
    annotation = layer["annotations"][signing.SIGNATURE_ANNOTATION]
    payload = httpx.get(
        f"http://{registry.host}/v2/apps/{app_id}/blobs/{layer['digest']}", timeout=30
    ).content
    document = json.loads(payload)
    assert document == {
        "critical": {
            "identity": {"docker-reference": f"{registry.host}/apps/{app_id}"},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    # verified offline with the public key alone
    assert signing.verifies(signing.load_public_key(public), payload, annotation)

    answer = trust(api, "require", {"alice": public})
    assert answer["policy"] == "require"
    assert answer["keys"][0]["fingerprint"].startswith("SHA256:")
    assert git_lines(home / "scopes/global", "log", "-1", "--format=%s") == [
        "trust: policy require, alice"
    ]
    assert json.loads((home / "scopes/global/trust.json").read_text())["policy"] == "require"

    result = installed_ok(api, f"{target(registry, app_id)}:1.0.0")

    assert result["signature"] == {"status": "signed", "signer": "alice"}
    assert result["record"]["signedBy"] == "alice"
    listed = api.get("/api/dist/installed").json()
    assert [r["signedBy"] for r in listed if r["id"] == app_id] == ["alice"]


def test_unsigned_under_require_is_refused_with_nothing_installed(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path, tmp_path: Path
) -> None:
    app_id = "com.example.unsignedreq"
    _, public = keygen(tmp_path, "alice")
    publish(api, make_app(app_id), target(registry, app_id), "1.0.0")
    trust(api, "require", {"alice": public})

    response = install(api, f"{target(registry, app_id)}:1.0.0", autoApprove=True)

    assert_refused_and_nothing_installed(response, home, app_id, "unsigned")
    preview = api.post(
        "/api/dist/install/preview", json={"ref": f"{target(registry, app_id)}:1.0.0"}
    )
    assert preview.status_code == 403, preview.text


def test_unsigned_under_warn_installs_and_the_review_says_unsigned(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path
) -> None:
    app_id = "com.example.unsignedwarn"
    source = make_app(app_id, permissions=["com.atrium.notes.read"])
    publish(api, source, target(registry, app_id), "1.0.0")
    trust(api, "warn", {})
    ref = f"{target(registry, app_id)}:1.0.0"

    review = install(api, ref).json()
    assert review["needsApproval"] is True
    assert review["signature"]["status"] == "unsigned"

    result = installed_ok(api, ref)
    assert result["signature"]["status"] == "unsigned"
    assert "signedBy" not in result["record"]
    assert (home / "scopes/global/apps" / app_id).is_dir()


def test_a_signature_of_another_digest_is_refused(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path, tmp_path: Path
) -> None:
    app_id = "com.example.othersig"
    key, public = keygen(tmp_path, "alice")
    source = make_app(app_id)
    signed = publish(api, source, target(registry, app_id), "1.0.0", key)["digest"]
    # the tag now holds another artifact; alice's valid signature of the first is put beside it
    (source / "extra.txt").write_text("not what alice signed\n")
    moved = publish(api, source, target(registry, app_id), "1.0.0")["digest"]
    assert moved != signed
    sig_tag = signing.signature_tag(signed)
    subprocess.run(
        [
            "skopeo", "copy", "--all", "--src-tls-verify=false", "--dest-tls-verify=false",
            f"docker://{registry.host}/apps/{app_id}:{sig_tag}",
            f"docker://{registry.host}/apps/{app_id}:{signing.signature_tag(moved)}",
        ],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    trust(api, "require", {"alice": public})

    response = install(api, f"{target(registry, app_id)}:1.0.0", autoApprove=True)

    assert_refused_and_nothing_installed(response, home, app_id, "invalid")


def test_a_tampered_layer_of_a_signed_artifact_is_refused(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path, tmp_path: Path
) -> None:
    app_id = "com.example.signedtamper"
    key, public = keygen(tmp_path, "alice")
    done = publish(api, make_app(app_id), target(registry, app_id), "1.0.0", key)
    manifest = httpx.get(
        f"http://{registry.host}/v2/apps/{app_id}/manifests/{done['digest']}",
        headers={"Accept": OCI_MANIFEST},
        timeout=30,
    ).json()
    blob = registry.blob_data(manifest["layers"][0]["digest"])
    original = blob.read_bytes()
    blob.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    trust(api, "require", {"alice": public})

    response = install(api, f"{target(registry, app_id)}:1.0.0", autoApprove=True)

    assert response.status_code == 502, response.text
    assert "digest mismatch" in response.json()["error"]["message"]
    assert not (home / "scopes/global/apps" / app_id).exists()
    assert git_lines(home / "scopes/global", "status", "--porcelain") == []


def test_a_revoked_key_is_refused_and_a_new_signer_needs_approval(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path, tmp_path: Path
) -> None:
    app_id = "com.example.revoked"
    alice_key, alice = keygen(tmp_path, "alice")
    bob_key, bob = keygen(tmp_path, "bob")
    source = make_app(app_id)
    publish(api, source, target(registry, app_id), "1.0.0", alice_key)
    trust(api, "require", {"alice": alice, "bob": bob})
    installed_ok(api, f"{target(registry, app_id)}:1.0.0")

    # bob signs the next version: same permissions, but a new signer asks again
    (source / "extra.txt").write_text("v2\n")
    publish(api, source, target(registry, app_id), "1.0.0", bob_key)
    review = api.post(f"/api/dist/update/{app_id}", json={}).json()
    assert review["needsApproval"] is True, review
    assert review["signature"] == {"status": "signed", "signer": "bob", "signerChanged": True}
    record = json.loads((home / "scopes/global/records" / f"{app_id}.json").read_text())
    assert record["signedBy"] == "alice"

    # alice's key is removed: her signature no longer counts
    trust(api, "require", {"bob": bob})
    other = "com.example.revoked2"
    publish(api, make_app(other), target(registry, other), "1.0.0", alice_key)
    response = install(api, f"{target(registry, other)}:1.0.0", autoApprove=True)
    assert_refused_and_nothing_installed(response, home, other, "unknown_signer")


# -- git ----------------------------------------------------------------------------------------


def test_a_signed_git_tag_installs_under_require_and_an_unsigned_one_is_refused(
    api: httpx.Client, make_app: MakeApp, git_daemon: GitDaemon, home: Path, tmp_path: Path
) -> None:
    app_id = "com.example.gitsigned"
    key, public = keygen(tmp_path, "alice")
    source = make_app(app_id)
    bare = git_daemon.base / f"{app_id}.git"
    publish(api, source, str(bare), "v1", key)
    (source / "extra.txt").write_text("v2\n")
    publish(api, source, str(bare), "v2")
    assert "-----BEGIN SSH SIGNATURE-----" in "\n".join(git_lines(bare, "cat-file", "tag", "v1"))
    trust(api, "require", {"alice": public})

    result = installed_ok(api, f"{git_daemon.url(app_id + '.git')}#v1")
    assert result["signature"] == {"status": "signed", "signer": "alice"}
    assert result["record"]["signedBy"] == "alice"

    other = "com.example.gitunsigned"
    bare2 = git_daemon.base / f"{other}.git"
    publish(api, make_app(other), str(bare2), "v1")
    response = install(api, f"{git_daemon.url(other + '.git')}#v1", autoApprove=True)
    assert_refused_and_nothing_installed(response, home, other, "unsigned")


# -- the trust API ------------------------------------------------------------------------------


def test_trust_writes_follow_the_admin_rules(
    api: httpx.Client, dist_shell: RunningShell, home: Path, tmp_path: Path
) -> None:
    _, public = keygen(tmp_path, "alice")
    token = dist_shell.add_user("bea")
    with dist_shell.client(token) as bea:
        refused = bea.put("/api/scopes/global/trust", json={"policy": "off", "keys": []})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "permission_denied"
        own = bea.put(
            "/api/scopes/user/trust",
            json={"policy": "require", "keys": [{"name": "alice", "key": public}]},
        )
        assert own.status_code == 200, own.text
        assert bea.get("/api/scopes/user/trust").json()["policy"] == "require"
        assert bea.get("/api/scopes/global/trust").json()["policy"] == "off"
    assert (home / "scopes/users/bea/trust.json").is_file()
    assert api.get("/api/scopes/user/trust").json()["policy"] == "off"
    system = api.put("/api/scopes/system/trust", json={"policy": "off", "keys": []})
    assert system.json()["error"]["code"] == "system_scope_immutable"
    bad = api.put(
        "/api/scopes/global/trust",
        json={"policy": "require", "keys": [{"name": "x", "key": "not a key"}]},
    )
    assert bad.status_code == 400, bad.text
    assert not (home / "scopes/global/trust.json").exists()


# -- the CLI ------------------------------------------------------------------------------------


def test_the_cli_makes_keys_trusts_them_signs_and_shows_the_signer(
    dist_shell: RunningShell,
    make_app: MakeApp,
    git_daemon: GitDaemon,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ATRIUM_URL", dist_shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", dist_shell.token)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    cli = CliRunner()

    made = cli.invoke(app, ["keygen", "carol"])
    assert made.exit_code == 0, made.output
    assert (tmp_path / "carol.key").stat().st_mode & 0o777 == 0o600
    assert cli.invoke(app, ["keygen", "carol"]).exit_code != 0  # never overwrites a key
    added = cli.invoke(app, ["trust", "add", "carol", "carol.pub"])
    assert added.exit_code == 0, added.output
    set_policy = cli.invoke(app, ["trust", "policy", "global", "require"])
    assert set_policy.exit_code == 0, set_policy.output
    listed = cli.invoke(app, ["trust", "list"])
    assert "policy require" in listed.output
    assert "carol" in listed.output
    assert "SHA256:" in listed.output

    app_id = "com.example.clisigned"
    bare = git_daemon.base / f"{app_id}.git"
    published = cli.invoke(
        app,
        ["publish", str(make_app(app_id)), "--to", str(bare), "--tag", "v1", "--sign", "carol.key"],
    )
    assert published.exit_code == 0, published.output
    installed = cli.invoke(app, ["install", f"{git_daemon.url(app_id + '.git')}#v1", "--yes"])
    assert installed.exit_code == 0, installed.output
    row = next(
        line for line in cli.invoke(app, ["installed"]).output.splitlines() if app_id in line
    )
    assert "carol" in row

    removed = cli.invoke(app, ["trust", "remove", "carol"])
    assert removed.exit_code == 0, removed.output
    assert json.loads(cli.invoke(app, ["trust", "list", "--json"]).output)["keys"] == []


def test_a_damaged_trust_store_refuses_installs_rather_than_turning_off(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path
) -> None:
    app_id = "com.example.damagedtrust"
    publish(api, make_app(app_id), target(registry, app_id), "1.0.0")
    (home / "scopes/global/trust.json").write_text('{"policy": "require", "keys": [')

    response = install(api, f"{target(registry, app_id)}:1.0.0", autoApprove=True)

    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "storage_damaged"
    assert not (home / "scopes/global/apps" / app_id).exists()
