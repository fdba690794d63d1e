"""The permission gate: needed, approved, denied and stale, over one JSON document and over SSE
(decisions.md "Distribution": the event orders)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_DIR
from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import (
    MakeApp,
    app_listing,
    install,
    installed_ok,
    sse,
    write_manifest,
)

pytestmark = pytest.mark.integration
PERMISSION = "com.atrium.notes.read"


@pytest.fixture
def asking(make_app: MakeApp) -> Path:
    """An app that asks for a permission, so its first install needs approval."""
    return make_app("com.example.asking", permissions=[PERMISSION])


def test_json_answers_needs_approval_with_the_diff_and_installs_nothing(
    api: httpx.Client, asking: Path
) -> None:
    response = install(api, f"local:{asking}")
    assert response.status_code == 200
    answer = response.json()
    assert set(answer) == {"ok", "needsApproval", "diff", "resolved", "permissions", "resources"}
    assert (answer["ok"], answer["needsApproval"]) == (False, True)
    assert answer["diff"]["permissionsAdded"] == [PERMISSION]
    # in the words of the app that defines it (Notes' permissionInfo)
    assert answer["permissions"] == [
        {
            "name": PERMISSION,
            "label": "Read your notes",
            "description": "See the text of every note in Notes.",
            "declaredBy": "com.atrium.notes",
        }
    ]
    assert answer["diff"]["versionFrom"] is None
    assert answer["resolved"]["source"] == "local"
    assert answer["resolved"]["manifestPreview"]["id"] == "com.example.asking"
    assert app_listing(api, "com.example.asking") is None


def test_json_auto_approve_installs(api: httpx.Client, asking: Path) -> None:
    answer = install(api, f"local:{asking}", autoApprove=True).json()
    assert answer["ok"] is True
    kinds = [e["type"] for e in answer["events"]]
    assert kinds[kinds.index("permission.needed") :] == [
        "permission.needed",
        "permission.approved",
        "install.start",
        "install.done",
    ]
    assert app_listing(api, "com.example.asking") is not None


def test_json_approve_false_is_403_approval_denied(api: httpx.Client, asking: Path) -> None:
    response = install(api, f"local:{asking}", approve=False)
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "approval_denied"
    assert error["diff"]["permissionsAdded"] == [PERMISSION]
    assert app_listing(api, "com.example.asking") is None


def test_json_a_source_that_moved_since_approval_is_409_stale(
    api: httpx.Client, asking: Path
) -> None:
    seen = install(api, f"local:{asking}").json()["resolved"]["digest"]
    write_manifest(asking, permissions=[PERMISSION, "com.atrium.notes.write"])
    response = install(api, f"local:{asking}", autoApprove=True, approvedDigest=seen)
    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["approvedDigest"]) == ("approval_stale", seen)
    assert error["digest"] != seen
    assert app_listing(api, "com.example.asking") is None
    current = install(api, f"local:{asking}").json()["resolved"]["digest"]
    approved = install(api, f"local:{asking}", autoApprove=True, approvedDigest=current)
    assert approved.json()["ok"] is True


def test_sse_not_approved_ends_with_a_result_needing_approval(
    api: httpx.Client, asking: Path
) -> None:
    events = sse(api, "POST", "/api/dist/install", json={"ref": f"local:{asking}"})
    assert [e["type"] for e in events] == [
        "resolve.start",
        "resolve.done",
        "fetch.start",
        "fetch.done",
        "validate.done",
        "permission.needed",
        "result",
    ]
    assert events[-2]["diff"]["permissionsAdded"] == [PERMISSION]
    result = events[-1]
    assert (result["ok"], result["needsApproval"]) == (False, True)
    assert result["diff"] == events[-2]["diff"]
    assert result["resolved"]["digest"].startswith("sha256:")
    assert app_listing(api, "com.example.asking") is None


def test_sse_auto_approve_runs_to_install_done(api: httpx.Client, asking: Path) -> None:
    events = sse(
        api, "POST", "/api/dist/install", json={"ref": f"local:{asking}", "autoApprove": True}
    )
    assert [e["type"] for e in events][5:] == [
        "permission.needed",
        "permission.approved",
        "install.start",
        "install.done",
        "result",
    ]
    assert events[-1]["ok"] is True
    assert events[-1]["record"]["id"] == "com.example.asking"
    assert app_listing(api, "com.example.asking") is not None


def test_sse_approve_false_is_denied_then_an_error_event(api: httpx.Client, asking: Path) -> None:
    events = sse(
        api, "POST", "/api/dist/install", json={"ref": f"local:{asking}", "approve": False}
    )
    assert [e["type"] for e in events][5:] == ["permission.needed", "permission.denied", "error"]
    assert events[-1]["code"] == "approval_denied"
    assert "denied" in events[-1]["message"]
    assert app_listing(api, "com.example.asking") is None


def test_sse_stale_approval_is_an_error_event_after_resolving(
    api: httpx.Client, asking: Path
) -> None:
    stale = "sha256:" + "0" * 64
    body = {"ref": f"local:{asking}", "autoApprove": True, "approvedDigest": stale}
    events = sse(api, "POST", "/api/dist/install", json=body)
    assert [e["type"] for e in events] == ["resolve.start", "resolve.done", "error"]
    assert (events[-1]["code"], events[-1]["approvedDigest"]) == ("approval_stale", stale)


def test_sse_request_errors_are_a_plain_status_before_any_stream(api: httpx.Client) -> None:
    response = api.post(
        "/api/dist/install",
        json={"ref": "nope://x"},
        headers={"Accept": "text/event-stream"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_ref"


def test_a_removal_alone_needs_no_approval(
    api: httpx.Client, asking: Path, make_app: MakeApp
) -> None:
    assert install(api, f"local:{asking}", autoApprove=True).json()["ok"]
    write_manifest(asking, version="1.1.0", permissions=[])
    answer = install(api, f"local:{asking}").json()
    assert answer["ok"] is True
    assert "permission.needed" not in [e["type"] for e in answer["events"]]


def test_preview_returns_the_diff_and_installs_nothing(api: httpx.Client, asking: Path) -> None:
    response = api.post("/api/dist/install/preview", json={"ref": f"local:{asking}"})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["requiresApproval"] is True
    assert answer["diff"]["permissionsAdded"] == [PERMISSION]
    assert answer["resolved"]["source"] == "local"
    assert app_listing(api, "com.example.asking") is None
    events = sse(api, "POST", "/api/dist/install/preview", json={"ref": f"local:{asking}"})
    assert [e["type"] for e in events][-2:] == ["validate.done", "result"]
    assert json.dumps(events[-1]["diff"]) == json.dumps(answer["diff"])


def test_an_answer_posted_the_moment_the_result_arrives_finds_the_app_unlocked(
    api: httpx.Client, asking: Path
) -> None:
    for _ in range(5):
        with api.stream(
            "POST",
            "/api/dist/install",
            json={"ref": f"local:{asking}"},
            headers={"Accept": "text/event-stream"},
        ) as response:
            lines = response.iter_lines()
            for line in lines:
                if line == "event: result":
                    next(lines)  # its data line: answer now, before reading the stream's end
                    break
            denied = api.post(
                "/api/dist/install", json={"ref": f"local:{asking}", "approve": False}
            )
        assert denied.status_code == 403
        assert denied.json()["error"]["code"] == "approval_denied"


def test_a_global_install_under_a_user_copy_still_asks(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    """The diff's baseline is never a copy in a higher scope: the user's copy holding a
    permission does not grant it to a global copy every user will get."""
    source = make_app("com.example.shared", permissions=["com.example.camera"])
    installed_ok(api, f"local:{source}", scope="user")
    answer = api.post("/api/dist/install", json={"ref": f"local:{source}", "scope": "global"})
    result = answer.json()
    assert result["needsApproval"] is True, result
    assert result["diff"]["versionFrom"] is None
    assert result["diff"]["permissionsAdded"] == ["com.example.camera"]
    # into the user scope over a global copy, only what is new is asked for (unchanged)
    installed_ok(api, f"local:{source}", scope="global")
    again = api.post("/api/dist/install/preview", json={"ref": f"local:{source}", "scope": "user"})
    assert again.json()["requiresApproval"] is False


def test_a_copy_in_another_scope_keeps_its_data_and_the_answer_says_so(
    api: httpx.Client, tmp_path: Path
) -> None:
    notes = "com.atrium.notes"
    assert api.post("/api/data/notes/notes", json={"text": "mine"}).status_code == 201
    source = tmp_path / "src" / notes
    shutil.copytree(REPO_DIR / "apps" / notes, source)
    preview = api.post(
        "/api/dist/install/preview", json={"ref": f"local:{source}", "scope": "user"}
    ).json()
    assert "stays with that copy" in preview["note"]
    assert "system scope" in preview["note"]
    installed = installed_ok(api, f"local:{source}", scope="user")
    assert "stays with that copy" in installed["note"]


def test_egress_asked_needs_approval_in_words_and_a_bad_one_names_the_field(
    api: httpx.Client, make_app: MakeApp
) -> None:
    reaching = make_app("com.example.reaching", network={"egress": True})
    answer = install(api, f"local:{reaching}").json()
    assert (answer["ok"], answer["needsApproval"]) == (False, True)
    assert answer["diff"]["egressAdded"] is True
    assert answer["egress"] == {"asked": True, "words": "Can reach the internet"}
    assert app_listing(api, "com.example.reaching") is None
    bad = make_app("com.example.badreach", network={"egress": ["api.example.com:99999"]})
    response = install(api, f"local:{bad}")
    assert response.status_code == 422, response.text
    problems = response.json()["error"]["problems"]
    assert [p["field"] for p in problems] == ["network.egress"], problems
    assert "1-65535" in problems[0]["message"]


def test_a_rollback_to_a_version_asking_more_keeps_the_revoke(
    api: httpx.Client, make_app: MakeApp
) -> None:
    """A revoke holds until an update asking more is approved: a rollback is approved by no one,
    so a version asking more that it puts back stays revoked (it got the internet back)."""
    app = "com.example.narrowing"
    source = make_app(app, network={"egress": True})
    installed_ok(api, f"local:{source}")
    write_manifest(source, version="2.0.0", network={"egress": ["api.example.com:443"]})
    updated = api.post(f"/api/dist/update/{app}", json={})
    assert updated.json()["ok"] is True, updated.text
    revoked = api.delete(f"/api/apps/{app}/egress")
    assert revoked.json()["network"]["egress"]["revoked"] is True, revoked.text
    rolled = api.post(f"/api/dist/rollback/{app}", json={"keepData": True})
    assert rolled.json()["ok"] is True, rolled.text
    egress = api.get(f"/api/apps/{app}").json()["network"]["egress"]
    assert (egress["asked"], egress["granted"], egress["revoked"]) == (True, False, True)


def test_an_install_after_an_uninstall_is_granted_what_its_review_asked(
    api: httpx.Client, make_app: MakeApp
) -> None:
    """The revoke goes with the last copy: the next install's review asks for the egress again
    and its approval is the grant (the copy stayed revoked after 'Can reach the internet' was
    approved)."""
    app = "com.example.again"
    source = make_app(app, network={"egress": True})
    installed_ok(api, f"local:{source}")
    assert api.delete(f"/api/apps/{app}/egress").status_code == 200
    assert api.delete(f"/api/dist/uninstall/{app}").status_code == 200
    answer = installed_ok(api, f"local:{source}")
    assert "permission.approved" in [e["type"] for e in answer["events"]]
    egress = api.get(f"/api/apps/{app}").json()["network"]["egress"]
    assert (egress["granted"], egress["revoked"]) == (True, False)


def test_an_uninstall_unmasking_a_system_copy_that_asks_more_keeps_the_revoke(
    start_shell: StartShell, system_apps: Path, make_app: MakeApp, tmp_path: Path
) -> None:
    """The revoke of a shared copy is every shared copy's: a system copy asking more that an
    uninstall unmasks was approved by no one then (it got the internet the revoke took back)."""
    app = "com.example.beneath"
    make_app(app, root=system_apps, network={"egress": True})
    source = make_app(
        app, root=tmp_path / "g", version="2.0.0", network={"egress": ["api.example.com:443"]}
    )
    with start_shell().client(timeout=60) as api:
        installed_ok(api, f"local:{source}")
        assert api.delete(f"/api/apps/{app}/egress").status_code == 200
        assert api.delete(f"/api/dist/uninstall/{app}").json()["unmasked"] == "system"
        egress = api.get(f"/api/apps/{app}").json()["network"]["egress"]
        assert (egress["asked"], egress["granted"], egress["revoked"]) == (True, False, True)
