"""{{APP_NAME}} against a real Atrium shell: `python -m pytest tests` in the app folder.

`atrium.testing.RunningShell` starts a shell of its own (a temporary home, a free port, the best
sandbox this machine has). `check_contract` installs this folder into it and walks the contract
of the shell's docs/authoring.md: the start (health identity, hooks), the secret, the page and its
theme, the provider, an activity, stop and start again, destroy. The second test is this app's
own behaviour: write your own next to it.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from atrium.testing import RunningShell, check_contract

APP_DIR = Path(__file__).resolve().parent.parent
APP_ID = "{{APP_ID}}"
ITEMS = f"/api/data/{APP_ID}/items"


@pytest.fixture(scope="module")
def shell() -> Iterator[RunningShell]:
    with RunningShell() as running:
        yield running


def test_the_app_meets_the_contract(shell: RunningShell) -> None:
    report = check_contract(APP_DIR, shell)
    assert report.ok, report.text()


def test_items_are_shared_announced_and_kept(shell: RunningShell) -> None:
    shell.install(APP_DIR)
    instance = shell.launch(APP_ID)
    # the page greets whoever is looking: the shell names them on every page request
    page = shell.request("GET", f"/api/proxy/{instance['instanceId']}/")
    assert page.status_code == 200, page.text
    assert '<p class="status" id="who">Hello, ' in page.text
    with shell.watch("data:changed", dataPath=f"{APP_ID}/items") as events:
        added = shell.request("POST", ITEMS, json={"text": "milk"})
        assert added.status_code == 201, added.text
        assert events.wait("data:changed", lambda e: e["path"] == "/items") is not None
    assert shell.request("POST", ITEMS, json={"text": ""}).status_code == 400
    # the intent adds an item and opens the page; adding is a write, so only the user and apps
    # holding the write permission may start it (the shell refuses others: permission_denied)
    intent = {"action": f"{APP_ID}.action.ADD_ITEM", "type": "text/plain"}
    resolved = shell.call("POST", "/api/intents/resolve", json=intent)
    assert [(m["appId"], m.get("permission")) for m in resolved] == [(APP_ID, f"{APP_ID}.write")]
    started = shell.call("POST", "/api/intents/start", json={**intent, "extras": {"text": "eggs"}})
    assert started["status"] == "started", started
    assert started["path"] == "/"
    # kept across a stop and a start of the instance
    shell.act(instance["instanceId"], "stop")
    shell.act(instance["instanceId"], "start")
    texts = [item["text"] for item in shell.call("GET", ITEMS)]
    assert texts == ["milk", "eggs"]
