"""Change notifications (docs/api.md "Change notifications"): providers announce, the shell
delivers `data:changed` to the streams that may read there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, SseReader, StartShell, wait_for

pytestmark = pytest.mark.integration

ECHO = "test.sdk.echo"
READER = "test.changes.reader"
NOBODY = "test.changes.nobody"
ANNOUNCED = ["/open/1", "/closed/2", "/closed/deeper/3", "/nowhere"]


def caller_app(system_apps: Path, app_id: str, permissions: list[str]) -> None:
    target = system_apps / app_id
    target.mkdir()
    (target / "entrypoint.sh").write_text("#!/bin/sh\n")
    (target / "app.manifest.json").write_text(
        json.dumps({"id": app_id, "name": app_id, "version": "1.0.0", "permissions": permissions})
    )


@pytest.fixture
def changes_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    shutil.copytree(TESTS_DIR / "apps" / ECHO, system_apps / ECHO)
    caller_app(system_apps, READER, ["test.sdk.echo.read"])
    caller_app(system_apps, NOBODY, [])
    return start_shell()


def as_app(shell: RunningShell, app_id: str) -> httpx.Client:
    return shell.client(token=shell.shell.app_tokens.issue(app_id, f"{app_id}-1", "default"))


def announce(shell: RunningShell, body: dict[str, Any], app_id: str = ECHO) -> httpx.Response:
    with as_app(shell, app_id) as app:
        return app.post("/api/data-changes", json=body)


def heard(reader: SseReader, count: int) -> list[tuple[str, str]]:
    events = reader.wait(count, "data:changed events")
    return [(e.data["authority"], e.data["path"]) for e in events if e.event == "data:changed"]


def test_every_stream_hears_what_it_may_read(changes_shell: RunningShell) -> None:
    shell = changes_shell
    topics = {"topics": "data:changed"}
    with (
        shell.client() as user,
        as_app(shell, READER) as reader,
        as_app(shell, NOBODY) as nobody,
        as_app(shell, ECHO) as provider,
    ):
        streams = {
            "user": SseReader(user, topics),
            "reader": SseReader(reader, topics),
            "nobody": SseReader(nobody, topics),
            "provider": SseReader(provider, topics),
        }
        answer = announce(shell, {"paths": ANNOUNCED})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"ok": True, "authority": "echo", "paths": ANNOUNCED}
        # a marker every stream may hear, so the streams are known to be caught up
        assert announce(shell, {"path": "/open/end"}).status_code == 200
        every = [("echo", p) for p in [*ANNOUNCED, "/open/end"]]
        assert heard(streams["user"], 5) == every
        assert heard(streams["provider"], 5) == every
        assert heard(streams["reader"], 3) == [
            ("echo", "/open/1"),
            ("echo", "/closed/2"),
            ("echo", "/open/end"),
        ]
        assert heard(streams["nobody"], 2) == [("echo", "/open/1"), ("echo", "/open/end")]


def test_a_data_path_watches_a_subtree_and_its_parents(changes_shell: RunningShell) -> None:
    shell = changes_shell
    with shell.client() as user, as_app(shell, READER) as reader:
        subtree = SseReader(user, {"topics": "data:changed", "dataPath": "echo/closed"})
        item = SseReader(reader, {"topics": "data:changed,kv:*", "dataPath": "echo/closed/2"})
        for path in ["/open/1", "/closed/2", "/closed/deeper/3", "/closedx", "/closed", "/"]:
            assert announce(shell, {"path": path}).status_code == 200
        assert user.put("/api/kv/os/marker", json={"value": 1}).status_code == 200
        assert heard(subtree, 4) == [
            ("echo", "/closed/2"),
            ("echo", "/closed/deeper/3"),
            ("echo", "/closed"),
            ("echo", "/"),
        ]
        # other topics pass the dataPath filter; the reader may read /closed and /closed/2, and
        # `/` matches no entry of echo: only the user and the provider hear of it
        events = item.wait(3)
        assert [(e.event, e.data.get("path")) for e in events] == [
            ("data:changed", "/closed/2"),
            ("data:changed", "/closed"),
            ("kv:changed", None),
        ]


def test_replay_applies_the_same_filters(changes_shell: RunningShell) -> None:
    shell = changes_shell
    with shell.client() as user, as_app(shell, NOBODY) as nobody:
        before = SseReader(user, {"topics": "kv:changed"})
        assert user.put("/api/kv/os/marker", json={"value": 1}).status_code == 200
        since = before.wait(1)[0].id
        assert announce(shell, {"paths": ["/closed/2", "/open/1"]}).status_code == 200
        replayed = SseReader(nobody, {"topics": "data:changed", "lastEventId": since})
        assert heard(replayed, 1) == [("echo", "/open/1")]


@pytest.mark.parametrize(
    ("body", "status", "code", "words"),
    [
        ({"path": "notes"}, 400, "bad_request", "must start with '/'"),
        ({"path": "/a/../b"}, 400, "bad_request", "canonical"),
        ({"path": "/a", "paths": ["/b"]}, 400, "bad_request", "exactly one"),
        ({}, 400, "bad_request", "exactly one"),
        ({"paths": []}, 400, "bad_request", "paths"),
        ({"paths": [f"/{n}" for n in range(101)]}, 400, "bad_request", "paths"),
        ({"path": "/" + "x" * 1024}, 400, "bad_request", "path"),
        ({"path": "/ok", "authority": "other"}, 400, "bad_request", "authority"),
    ],
)
def test_bad_announcements_are_refused_and_publish_nothing(
    changes_shell: RunningShell, body: dict[str, Any], status: int, code: str, words: str
) -> None:
    with changes_shell.client() as user:
        stream = SseReader(user, {"topics": "data:changed"})
        answer = announce(changes_shell, body)
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert error["code"] == code
        assert words in json.dumps(error)
        assert announce(changes_shell, {"path": "/marker"}).status_code == 200
        assert heard(stream, 1) == [("echo", "/marker")]


def test_only_a_provider_announces_and_only_its_own_authority(changes_shell: RunningShell) -> None:
    shell = changes_shell
    with shell.client() as user, shell.anonymous() as anonymous:
        as_user = user.post("/api/data-changes", json={"path": "/x"})
        assert as_user.status_code == 403
        assert as_user.json()["error"]["code"] == "permission_denied"
        assert anonymous.post("/api/data-changes", json={"path": "/x"}).status_code == 401
    not_a_provider = announce(shell, {"path": "/x"}, app_id=READER)
    assert not_a_provider.status_code == 403
    assert "declares no dataProvider" in not_a_provider.json()["error"]["message"]
    with shell.client() as user:
        bad_stream = user.get("/api/events", params={"dataPath": "Echo/x"})
    assert bad_stream.status_code == 400
    assert bad_stream.json()["error"]["problems"][0]["field"] == "dataPath"


def test_notes_announces_every_write_and_a_watcher_hears_it(shell: RunningShell) -> None:
    with shell.client() as user:
        stream = SseReader(user, {"topics": "data:changed", "dataPath": "notes/notes"})
        created = user.post("/api/data/notes/notes", json={"text": "hello"})
        assert created.status_code == 201, created.text
        note = created.json()["id"]
        assert user.put(f"/api/data/notes/notes/{note}", json={"text": "again"}).status_code == 200
        assert user.delete(f"/api/data/notes/notes/{note}").status_code == 200
        wait_for(lambda: len(heard(stream, 3)) == 3, "three notices")
        assert heard(stream, 3) == [("notes", f"/notes/{note}")] * 3
