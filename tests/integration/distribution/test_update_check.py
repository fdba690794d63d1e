"""The update check behind the home's "Updates available (N)": `GET /api/dist/updates` says, per
install the caller sees, whether a newer version exists, and changes nothing. Published through the
running shell to a real `git daemon`; a member sees their own user scope and the global one only."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import (
    GitDaemon,
    MakeApp,
    installed_ok,
    write_manifest,
)
from tests.integration.distribution.test_pinned_updates import publish, record_of

pytestmark = pytest.mark.integration


def states(client: httpx.Client, **params: str) -> dict[str, dict[str, Any]]:
    response = client.get("/api/dist/updates", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    listed = {u["id"]: u for u in body["updates"]}
    assert body["available"] == sum(u["available"] for u in listed.values())
    return listed


def test_the_check_lists_newer_versions_and_changes_nothing(
    api: httpx.Client, make_app: MakeApp, git_daemon: GitDaemon
) -> None:
    pinned, follows = "com.example.checkpin", "com.example.checkfollow"
    for app_id in (pinned, follows):
        publish(api, make_app(app_id), str(git_daemon.base / f"{app_id}.git"), "v1")
    installed_ok(api, git_daemon.url(f"{pinned}.git") + "#v1")
    installed_ok(api, git_daemon.url(f"{follows}.git") + "#main")
    first = states(api)
    assert (first[pinned]["available"], first[pinned]["pinned"]) == (False, "v1")
    assert first[pinned]["newerTags"] == []
    assert first[follows]["available"] is False
    assert first[follows]["problem"] is None

    for app_id in (pinned, follows):
        app = make_app(app_id)
        write_manifest(app, version="2.0.0")
        publish(api, app, str(git_daemon.base / f"{app_id}.git"), "v2")
    # the answer is kept a while; refresh reads the sources again
    assert states(api)[pinned]["available"] is False
    fresh = states(api, refresh="1")
    assert (fresh[pinned]["available"], fresh[pinned]["newerTags"]) == (True, ["v2"])
    assert fresh[follows]["available"] is True
    assert fresh[follows]["newerTags"] == []
    for app_id in (pinned, follows):
        assert record_of(api, app_id)["version"] == "1.0.0"  # nothing was updated

    # an update is checked afresh at once (its record changed): no longer listed as newer
    done = api.post(f"/api/dist/update/{follows}", json={"autoApprove": True})
    assert done.status_code == 200, done.text
    after = states(api)
    assert after[follows]["available"] is False
    assert after[follows]["version"] == "2.0.0"
    assert after[pinned]["available"] is True


def test_an_unreadable_source_is_a_problem_of_its_row_only(
    api: httpx.Client, make_app: MakeApp, git_daemon: GitDaemon
) -> None:
    gone, kept = "com.example.checkgone", "com.example.checkkept"
    for app_id in (gone, kept):
        publish(api, make_app(app_id), str(git_daemon.base / f"{app_id}.git"), "v1")
        installed_ok(api, git_daemon.url(f"{app_id}.git") + "#main")
    (git_daemon.base / f"{gone}.git").rename(git_daemon.base / "moved.git")
    listed = states(api, refresh="1")
    assert listed[gone]["available"] is False
    assert listed[gone]["problem"]
    assert listed[kept]["problem"] is None


def test_a_member_sees_their_own_scope_and_the_global_one(
    start_shell: StartShell,
    make_app: MakeApp,
    git_daemon: GitDaemon,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ATRIUM_MEMBER_FETCH_HOSTS", "127.0.0.1")
    shell = start_shell()
    bea_token, cal_token = shell.add_user("bea"), shell.add_user("cal")
    with (
        shell.client(timeout=60) as admin,
        shell.client(bea_token, timeout=60) as bea,
        shell.client(cal_token, timeout=60) as cal,
    ):
        for app_id in ("com.example.everyone", "com.example.beas"):
            publish(admin, make_app(app_id), str(git_daemon.base / f"{app_id}.git"), "v1")
        installed_ok(admin, git_daemon.url("com.example.everyone.git") + "#main")
        installed_ok(bea, git_daemon.url("com.example.beas.git") + "#main", scope="user")
        assert set(states(bea)) == {"com.example.everyone", "com.example.beas"}
        assert states(bea)["com.example.beas"]["scope"] == "user"
        assert set(states(cal)) == {"com.example.everyone"}
        assert set(states(admin)) == {"com.example.everyone"}
