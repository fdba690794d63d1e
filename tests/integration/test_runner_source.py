"""Attacks on `GET /api/runner/source` (what a pod's init container fetches) through a real shell:
an instance's token gets its own app's files while it is being made, never what lives beside
them in the app folder, and never again once it runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import RunningShell, StartShell
from tests.integration.instances import new_instance

pytestmark = pytest.mark.integration

PEEK = "test.source.peek"

#: an app that, before it answers its health check (its instance still `creating`), fetches its
#: own source as a pod's init container would, and keeps what it got in its data folder
PEEK_SERVER = """
import io, json, os, tarfile, urllib.error, urllib.request
from atrium.sdk import App

def fetch():
    request = urllib.request.Request(
        os.environ["OS_SHELL_URL"].rstrip("/") + "/api/runner/source",
        headers={"Authorization": "Bearer " + os.environ["OS_APP_TOKEN"]},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            with tarfile.open(fileobj=io.BytesIO(answer.read())) as tar:
                return {"status": answer.status, "names": tar.getnames()}
    except urllib.error.HTTPError as err:
        return {"status": err.code, "names": []}

seen = fetch()
with open(os.path.join(os.environ["OS_DATA_DIR"], "peek.json"), "w") as out:
    json.dump(seen, out)
App().run()
"""


@pytest.fixture
def peek_shell(start_shell: StartShell, tmp_path: Path) -> RunningShell:
    """A shell with the peek app installed in the admin's user scope, where the admin's
    instances keep their data inside the app folder (`<appId>-<n>`)."""
    source = tmp_path / "sources" / PEEK
    source.mkdir(parents=True)
    manifest = {
        "id": PEEK,
        "name": "Source peek",
        "version": "1.0.0",
        "description": "Fetches its own source while it starts.",
        "entrypoint": ["python3", "server.py"],
        "startTimeoutMs": 20000,
    }
    (source / "app.manifest.json").write_text(json.dumps(manifest))
    (source / "server.py").write_text(PEEK_SERVER)
    shell = start_shell()
    with shell.client(timeout=60) as api:
        answer = api.post(
            "/api/dist/install",
            json={"ref": f"local:{source}", "autoApprove": True, "scope": "user"},
        )
        assert answer.status_code == 200, answer.text
    return shell


def test_an_instances_source_holds_no_other_instances_data(peek_shell: RunningShell) -> None:
    """Another instance's data folder (and the headless provider's) sits in the app folder for
    the bootstrap admin: the local sandbox covers it, so the source tar must leave it out too."""
    lifecycle = peek_shell.shell.lifecycle
    with peek_shell.client(timeout=60) as api:
        other = lifecycle.find(new_instance(api, PEEK))
        assert other is not None
        assert other.data_dir.parent == other.app_dir  # the layout this attack is about
        (other.data_dir / "diary.txt").write_text("the other instance's secret\n")
        (other.app_dir / f"{PEEK}-provider").mkdir(exist_ok=True)
        (other.app_dir / f"{PEEK}-provider" / "lock").write_text("provider\n")
        mine = lifecycle.find(new_instance(api, PEEK))
    assert mine is not None
    seen = json.loads((mine.data_dir / "peek.json").read_text())
    assert seen["status"] == 200
    assert "server.py" in seen["names"]
    assert [n for n in seen["names"] if n.split("/")[0].startswith(f"{PEEK}-")] == []


def test_a_running_instances_token_fetches_no_source(peek_shell: RunningShell) -> None:
    """Only an instance being made needs its files (a pod's init container runs once, before
    the app): a running app asking again and again would have the shell build its whole folder
    in memory each time. Once it runs, the answer is 409 not_serving."""
    with peek_shell.client(timeout=60) as api:
        instance = peek_shell.shell.lifecycle.find(new_instance(api, PEEK))
    assert instance is not None
    assert instance.token is not None
    with peek_shell.client(token=instance.token) as app:
        answer = app.get("/api/runner/source")
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "not_serving"
    assert answer.json()["error"]["state"] == "started"
