"""Users, the last gaps: remembered intent defaults are each user's own, a `data:changed` belongs
to the owner of the provider that announced it, and nothing of a disabled user is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.errors import AtriumError
from tests.integration.conftest import RunningShell, SseReader, StartShell, wait_for
from tests.integration.test_intent_defaults import handler_source

pytestmark = pytest.mark.integration

TIE = "test.intent.TIE"
ECHO = "test.sdk.echo"


def start(client: httpx.Client, **body: Any) -> dict[str, Any]:
    answer = client.post("/api/intents/start", json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_a_remembered_default_is_its_users_own(start_shell: StartShell, tmp_path: Path) -> None:
    shell = start_shell()
    bob_token = shell.add_user("bob")
    with shell.client(timeout=60) as alice, shell.client(bob_token, timeout=60) as bob:
        for name in ("one", "two"):
            source = handler_source(tmp_path / "sources", f"test.tie.{name}", [{"action": TIE}])
            answer = alice.post(
                "/api/dist/install",
                json={"ref": f"local:{source}", "autoApprove": True, "scope": "global"},
            )
            assert answer.status_code == 200, answer.text
        start(alice, action=TIE, target="test.tie.two", remember=True)
        # alice's choice is not bob's: he still chooses
        assert start(bob, action=TIE)["status"] == "chooser"
        assert bob.get("/api/intents/defaults").json() == []
        resolved = bob.post("/api/intents/resolve", json={"action": TIE}).json()
        assert not any(m["default"] for m in resolved)
        # bob's own choice applies to his intents and leaves alice's alone
        start(bob, action=TIE, target="test.tie.one", remember=True)
        again = start(bob, action=TIE)
        assert (again["appId"], again["byDefault"]) == ("test.tie.one", True)
        assert start(alice, action=TIE)["appId"] == "test.tie.two"
        assert [d["appId"] for d in alice.get("/api/intents/defaults").json()] == ["test.tie.two"]
        assert [d["appId"] for d in bob.get("/api/intents/defaults").json()] == ["test.tie.one"]
        # an app's intent follows its owner's choice
        app_token = shell.shell.app_tokens.issue(ECHO, f"{ECHO}-bob", "bob")
        with shell.client(app_token, timeout=60) as bobs_app:
            assert start(bobs_app, action=TIE)["appId"] == "test.tie.one"
        # forgetting is one's own too
        assert bob.delete("/api/intents/defaults", params={"action": TIE}).status_code == 200
        assert start(alice, action=TIE)["appId"] == "test.tie.two"


def test_a_data_change_reaches_its_providers_owner_only(echo_shell: RunningShell) -> None:
    shell = echo_shell
    bob_token = shell.add_user("bob")
    alices_echo = shell.shell.app_tokens.issue(ECHO, f"{ECHO}-1", shell.settings.user)
    bobs_echo = shell.shell.app_tokens.issue(ECHO, f"{ECHO}-bob", "bob")
    topics = {"topics": "data:changed"}
    with (
        shell.client() as alice,
        shell.client(bob_token) as bob,
        shell.client(alices_echo) as alices_app,
        shell.client(bobs_echo) as bobs_app,
    ):
        alices_stream = SseReader(alice, topics)
        bobs_stream = SseReader(bob, topics)
        assert alices_app.post("/api/data-changes", json={"path": "/alice"}).status_code == 200
        assert bobs_app.post("/api/data-changes", json={"path": "/bob"}).status_code == 200

        def paths(stream: SseReader) -> list[str]:
            return [e.data["path"] for e in stream.of("data:changed")]

        assert alices_app.post("/api/data-changes", json={"path": "/end"}).status_code == 200
        # events reach a stream in order: each stream is caught up once it heard its last one
        wait_for(lambda: "/bob" in paths(bobs_stream), "bob's own change")
        assert paths(bobs_stream) == ["/bob"]
        wait_for(lambda: "/end" in paths(alices_stream), "alice's own changes")
        assert paths(alices_stream) == ["/alice", "/end"]


def test_nothing_is_started_for_a_disabled_user(echo_shell: RunningShell) -> None:
    """The race itself (a create under way while the user is disabled) cannot be timed from
    outside; what closes it is that create checks the owner once the instance booted, so a create
    for a disabled owner is refused and leaves nothing running."""
    shell = echo_shell
    shell.add_user("bob")
    shell.on_loop(shell.shell.users.update("bob", disabled=True))
    with pytest.raises(AtriumError) as refused:
        shell.on_loop(shell.shell.lifecycle.create(ECHO, owner="bob"))
    assert "bob" in str(refused.value)
    assert [
        i for i in shell.shell.lifecycle.of_owner(ECHO, "bob") if i.state.value != "destroyed"
    ] == []
