"""Updates that arrive: an install from a pinned tag or digest says it is pinned, the update check
lists the newer semver tags of the same source, and ``to`` takes one (the permission gate applies as
for any update). Published through the running shell to a real `git daemon` and a real OCI
registry (Debian's docker-registry); a member's update follows the member fetch rule."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from atrium.cli import dist as dist_cli
from atrium.cli.publish import publish as publish_command
from tests.integration.conftest import RunningShell, StartShell
from tests.integration.distribution.conftest import (
    GitDaemon,
    MakeApp,
    installed_ok,
    write_manifest,
)
from tests.integration.registry import Registry, running_registry

pytestmark = pytest.mark.integration
PERMISSION = "com.atrium.notes.read"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("pinned-registry")) as started:
        yield started


def publish(api: httpx.Client, app: Path, to: str, tag: str) -> dict[str, Any]:
    response = api.post("/api/dist/publish", json={"path": str(app), "to": to, "tag": tag})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def record_of(api: httpx.Client, app_id: str) -> dict[str, Any]:
    return next(r for r in api.get("/api/dist/installed").json() if r["id"] == app_id)


def publish_v1_v2_v0(api: httpx.Client, app: Path, to: str) -> None:
    """v1 (1.0.0), v2 (2.0.0, asking for one permission more), and an older v0.9 after them."""
    publish(api, app, to, "v1")
    write_manifest(app, version="2.0.0", permissions=[PERMISSION])
    publish(api, app, to, "v2")
    write_manifest(app, version="0.9.0")
    publish(api, app, to, "v0.9")


def check_pinned_loop(api: httpx.Client, app_id: str, pinned_ref: str, ref_v2: str) -> None:
    """installed says pinned; the check lists v2 (not v0.9); --to v2 asks, then installs v2."""
    installed_ok(api, pinned_ref)
    record = record_of(api, app_id)
    assert (record["version"], record["pinned"]) == ("1.0.0", "v1")

    check = api.post(f"/api/dist/update/{app_id}", json={})
    assert check.status_code == 200, check.text
    answer = check.json()
    assert answer["upToDate"] is True
    assert answer["pinned"] == "v1"
    assert answer["newerTags"] == ["v2"]

    needs = api.post(f"/api/dist/update/{app_id}", json={"to": "v2"}).json()
    assert needs["needsApproval"] is True, needs
    assert needs["diff"]["permissionsAdded"] == [PERMISSION]
    assert record_of(api, app_id)["version"] == "1.0.0"  # nothing changed before approval
    approved = {"to": "v2", "autoApprove": True, "approvedDigest": needs["resolved"]["digest"]}
    done = api.post(f"/api/dist/update/{app_id}", json=approved)
    assert done.status_code == 200, done.text
    record = done.json()["record"]
    assert (record["version"], record["pinned"], record["ref"]) == ("2.0.0", "v2", ref_v2)
    after = api.post(f"/api/dist/update/{app_id}", json={}).json()
    assert (after["upToDate"], after["pinned"], after["newerTags"]) == (True, "v2", [])


def check_bad_to(api: httpx.Client, app_id: str) -> None:
    for bad in ("v0.9", "v1", "v7", "main", "../x"):
        answer = api.post(f"/api/dist/update/{app_id}", json={"to": bad, "autoApprove": True})
        assert answer.status_code == 400, (bad, answer.text)
        error = answer.json()["error"]
        assert error["to"] == bad
        assert repr(bad) in error["message"]
    assert record_of(api, app_id)["version"] == "1.0.0"


def test_a_git_tag_install_is_pinned_and_takes_a_newer_tag(
    api: httpx.Client, make_app: MakeApp, git_daemon: GitDaemon
) -> None:
    app_id = "com.example.pinnedgit"
    app = make_app(app_id)
    bare = git_daemon.base / f"{app_id}.git"
    publish_v1_v2_v0(api, app, str(bare))
    url = git_daemon.url(f"{app_id}.git")
    check_pinned_loop(api, app_id, f"{url}#v1", f"{url}#v2")


def test_a_git_to_that_is_no_newer_tag_of_the_source_is_refused(
    api: httpx.Client, make_app: MakeApp, git_daemon: GitDaemon
) -> None:
    app_id = "com.example.pinnedbad"
    app = make_app(app_id)
    bare = git_daemon.base / f"{app_id}.git"
    publish_v1_v2_v0(api, app, str(bare))
    installed_ok(api, git_daemon.url(f"{app_id}.git") + "#v1")
    check_bad_to(api, app_id)


def test_a_branch_install_follows_as_today(
    api: httpx.Client, make_app: MakeApp, git_daemon: GitDaemon
) -> None:
    app_id = "com.example.follows"
    app = make_app(app_id)
    bare = git_daemon.base / f"{app_id}.git"
    publish(api, app, str(bare), "v1")
    installed_ok(api, git_daemon.url(f"{app_id}.git") + "#main")
    assert record_of(api, app_id).get("pinned") is None
    write_manifest(app, version="1.1.0")
    publish(api, app, str(bare), "v1.1")
    answer = api.post(f"/api/dist/update/{app_id}", json={"autoApprove": True}).json()
    assert answer["record"]["version"] == "1.1.0"
    assert "pinned" not in answer["record"]


def test_an_oci_tag_install_is_pinned_and_takes_a_newer_tag(
    api: httpx.Client, make_app: MakeApp, registry: Registry
) -> None:
    app_id = "com.example.pinnedoci"
    app = make_app(app_id)
    repo = f"oci://{registry.host}/pinned/{app_id}"
    publish_v1_v2_v0(api, app, repo)
    check_pinned_loop(api, app_id, f"{repo}:v1", f"{repo}:v2")


def test_an_oci_digest_install_is_pinned_to_its_digest(
    api: httpx.Client, make_app: MakeApp, registry: Registry
) -> None:
    app_id = "com.example.pinneddigest"
    app = make_app(app_id)
    repo = f"oci://{registry.host}/pinned/{app_id}"
    digest = publish(api, app, repo, "v1")["events"][-1]["digest"]
    write_manifest(app, version="2.0.0")
    publish(api, app, repo, "v2")
    installed_ok(api, f"{repo}@{digest}")
    assert record_of(api, app_id)["pinned"] == digest
    answer = api.post(f"/api/dist/update/{app_id}", json={}).json()
    assert (answer["upToDate"], answer["pinned"], answer["newerTags"]) == (True, digest, ["v2"])
    done = api.post(f"/api/dist/update/{app_id}", json={"to": "v2", "autoApprove": True})
    assert done.status_code == 200, done.text
    assert done.json()["record"]["version"] == "2.0.0"
    check = api.post(f"/api/dist/update/{app_id}", json={"to": "v1"})
    assert check.status_code == 400, check.text


def test_an_oci_latest_install_follows_as_today(
    api: httpx.Client, make_app: MakeApp, registry: Registry
) -> None:
    app_id = "com.example.latest"
    app = make_app(app_id)
    repo = f"oci://{registry.host}/pinned/{app_id}"
    publish(api, app, repo, "latest")
    installed_ok(api, f"{repo}:latest")
    assert record_of(api, app_id).get("pinned") is None
    refused = api.post(f"/api/dist/update/{app_id}", json={"to": "v2"})
    assert refused.status_code == 400, refused.text


def test_a_members_update_follows_the_member_fetch_rule(
    start_shell: StartShell,
    make_app: MakeApp,
    git_daemon: GitDaemon,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app_id = "com.example.memberpin"
    app = make_app(app_id)
    bare = git_daemon.base / f"{app_id}.git"
    monkeypatch.setenv("ATRIUM_MEMBER_FETCH_HOSTS", "127.0.0.1")
    shell = start_shell()
    token = shell.add_user("bea")
    with shell.client(timeout=60) as admin, shell.client(token, timeout=60) as bea:
        publish_v1_v2_v0(admin, app, str(bare))
        url = git_daemon.url(f"{app_id}.git")
        installed_ok(bea, f"{url}#v1", scope="user")
        answer = bea.post(f"/api/dist/update/{app_id}", json={}).json()
        assert answer["newerTags"] == ["v2"]
        done = bea.post(f"/api/dist/update/{app_id}", json={"to": "v2", "autoApprove": True})
        assert done.status_code == 200, done.text
        assert done.json()["record"]["scope"] == "user"
    shell.stop()
    monkeypatch.delenv("ATRIUM_MEMBER_FETCH_HOSTS")
    other = start_shell()  # no longer allowed: the member's check may not reach the host
    with other.client(token, timeout=60) as bea:
        refused = bea.post(f"/api/dist/update/{app_id}", json={})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "fetch_host_refused"
    assert (
        "v2"
        in subprocess.run(
            ["git", "--git-dir", str(bare), "tag"], capture_output=True, text=True, check=True
        ).stdout
    )


def test_a_git_publish_names_the_branch_that_follows_and_the_cli_prints_both(
    dist_shell: RunningShell,
    api: httpx.Client,
    make_app: MakeApp,
    git_daemon: GitDaemon,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app_id = "com.example.follow"
    app = make_app(app_id)
    bare = git_daemon.base / f"{app_id}.git"
    done = publish(api, app, str(bare), "v1")["events"][-1]
    assert done["followCommand"] == f"atrium install git+{bare.as_uri()}#main"
    monkeypatch.setenv("ATRIUM_URL", dist_shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", dist_shell.token)
    monkeypatch.setenv("COLUMNS", "300")
    cli = typer.Typer()
    cli.command()(publish_command)
    write_manifest(app, version="2.0.0")
    result = CliRunner().invoke(cli, [str(app), "--to", str(bare), "--tag", "v2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[-3:-2] == [f"  atrium install git+{bare.as_uri()}#main"]
    assert lines[-1] == f"  atrium install git+{bare.as_uri()}#v2"


def test_an_oci_publish_moves_latest_to_the_newest_version(
    api: httpx.Client, make_app: MakeApp, registry: Registry
) -> None:
    app_id = "com.example.movinglatest"
    app = make_app(app_id)
    repo = f"oci://{registry.host}/pinned/{app_id}"
    first = publish(api, app, repo, "v1")["events"][-1]
    assert first["followCommand"] == f"atrium install {repo}:latest"
    installed_ok(api, f"{repo}:latest")
    assert record_of(api, app_id).get("pinned") is None
    write_manifest(app, version="2.0.0")
    publish(api, app, repo, "v2")
    write_manifest(app, version="1.5.0")
    older = publish(api, app, repo, "v1.5")["events"][-1]  # a fix of an older line
    assert older["followCommand"] == f"atrium install {repo}:latest"
    answer = api.post(f"/api/dist/update/{app_id}", json={"autoApprove": True}).json()
    assert answer["record"]["version"] == "2.0.0"  # latest stayed on v2


def test_the_cli_says_pinned_lists_the_newer_tag_and_takes_it_with_to(
    dist_shell: RunningShell,
    api: httpx.Client,
    make_app: MakeApp,
    git_daemon: GitDaemon,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app_id = "com.example.pinnedcli"
    app = make_app(app_id)
    bare = git_daemon.base / f"{app_id}.git"
    publish_v1_v2_v0(api, app, str(bare))
    installed_ok(api, git_daemon.url(f"{app_id}.git") + "#v1")
    monkeypatch.setenv("ATRIUM_URL", dist_shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", dist_shell.token)
    monkeypatch.setenv("COLUMNS", "300")
    cli = typer.Typer()
    cli.command("update")(dist_cli.update)
    cli.command("installed")(dist_cli.installed)
    check = CliRunner().invoke(cli, ["update", app_id])
    assert check.exit_code == 0, check.output
    assert f"{app_id} is pinned to v1" in check.output
    assert check.output.splitlines()[-1] == f"  atrium update {app_id} --to v2"
    refused = CliRunner().invoke(cli, ["update", app_id, "--to", "v0.9", "--yes"])
    assert refused.exit_code != 0
    assert "'v0.9' is not a newer version tag" in refused.output
    taken = CliRunner().invoke(cli, ["update", app_id, "--to", "v2", "--yes"])
    assert taken.exit_code == 0, taken.output
    assert f"Updated {app_id} to 2.0.0" in taken.output
    listed = CliRunner().invoke(cli, ["installed"])
    assert "pinned to v2" in listed.output
