"""The event stream with several users, through the real shell: a stream hears its own user's
events and the platform's, an app its owner's, and replay (`Last-Event-ID`) obeys the same rule."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, SseEvent, SseReader, StartShell, wait_for

pytestmark = pytest.mark.integration

ECHO = "test.sdk.echo"


@pytest.fixture
def two(start_shell: StartShell, system_apps: Path) -> RunningShell:
    shutil.copytree(TESTS_DIR / "apps" / ECHO, system_apps / ECHO)
    return start_shell()


@pytest.fixture
def api(two: RunningShell) -> Iterator[httpx.Client]:
    with two.client(timeout=30) as client:
        yield client


@pytest.fixture
def bob(two: RunningShell) -> Iterator[httpx.Client]:
    with two.client(two.add_user("bob"), timeout=30) as client:
        yield client


def alices(events: list[SseEvent], instance_id: str) -> list[SseEvent]:
    """Events about alice's own things: her KV row, her instance."""
    return [
        e
        for e in events
        if (e.event == "kv:changed" and e.data["namespace"] == "os")
        or e.data.get("instanceId") == instance_id
    ]


def act_as_alice(api: httpx.Client) -> str:
    """Alice writes her own row, starts and stops an instance of her own; then an admin writes a
    platform default (the marker every stream hears)."""
    assert api.put("/api/kv/os/secret", json={"value": "alice's"}).status_code == 200
    started = api.post("/api/instances", json={"appId": ECHO, "new": True})
    assert started.status_code == 200, started.text
    instance_id: str = started.json()["instanceId"]
    assert api.post(f"/api/instances/{instance_id}/stop").status_code == 200
    assert api.put("/api/kv/global/marker", json={"value": 1}).status_code == 200
    return instance_id


def hears(stream: SseReader, key: str) -> bool:
    return any(e.data.get("key") == key for e in stream.of("kv:changed"))


def marker(stream: SseReader) -> SseEvent:
    wait_for(
        lambda: any(e.data.get("key") == "marker" for e in stream.of("kv:changed")),
        "the platform's marker event",
    )
    return next(e for e in stream.of("kv:changed") if e.data.get("key") == "marker")


def test_a_stream_hears_its_own_users_events_and_the_platforms(
    two: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    alice_stream = SseReader(api)
    bob_stream = SseReader(bob)
    with two.client(two.shell.app_tokens.issue(ECHO, f"{ECHO}-bob", "bob")) as bobs_app:
        app_stream = SseReader(bobs_app)
        instance_id = act_as_alice(api)
        for stream in (alice_stream, bob_stream, app_stream):
            assert marker(stream).data == {
                "namespace": "global",
                "key": "marker",
                "type": "kv:changed",
            }
        assert alices(bob_stream.events, instance_id) == []
        assert alices(app_stream.events, instance_id) == []
        heard = alices(alice_stream.events, instance_id)
        assert {e.event for e in heard} >= {"kv:changed", "app:state"}
        # bob's own row is heard by bob and his app, not by alice
        assert bob.put("/api/kv/os/mine", json={"value": 2}).status_code == 200
        wait_for(lambda: hears(bob_stream, "mine"), "bob's row, by bob")
        wait_for(lambda: hears(app_stream, "mine"), "bob's row, by his app")
        assert api.put("/api/kv/global/marker", json={"value": 2}).status_code == 200
        wait_for(lambda: len(alice_stream.of("kv:changed")) >= 3, "the second marker")
        assert not any(e.data.get("key") == "mine" for e in alice_stream.events)


def test_replay_obeys_the_same_rule(
    two: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    first = SseReader(api)
    instance_id = act_as_alice(api)
    start = marker(first)
    before = int(first.events[0].id) - 1
    # bob reconnects as if he had seen everything up to before alice acted
    replayed = SseReader(bob, headers={"Last-Event-ID": str(before)})
    marker(replayed)
    assert alices(replayed.events, instance_id) == []
    assert replayed.events[-1].id == start.id
    with two.client(two.shell.app_tokens.issue(ECHO, f"{ECHO}-bob", "bob")) as bobs_app:
        app_replay = SseReader(bobs_app, params={"lastEventId": str(before)})
        marker(app_replay)
        assert alices(app_replay.events, instance_id) == []
    # alice's own replay has them all
    again = SseReader(api, headers={"Last-Event-ID": str(before)})
    marker(again)
    assert {e.event for e in alices(again.events, instance_id)} >= {"kv:changed", "app:state"}


def test_a_row_this_shell_cannot_read_still_reaches_only_its_owner(
    two: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    """Another shell (a newer version, in a rolling upgrade) may write a payload this one cannot
    read as its class: the row's owner still decides who hears it, and a private topic is heard
    by nobody rather than by everyone."""
    from atrium.state import events

    topics = {"topics": "kv:*,system:*,grant:*,test:*"}
    alice_stream = SseReader(api, topics)
    bob_stream = SseReader(bob, topics)
    bobs_app = two.client(two.shell.app_tokens.issue(ECHO, f"{ECHO}-bob", "bob"))
    # an app hears a data:changed only under paths it may read: one it cannot read is none
    app_stream = SseReader(bobs_app, {"topics": "data:*,test:*"})

    async def foreign() -> None:
        async with two.shell.db.transaction() as tx:
            await events.append(tx, "kv:changed", "bob", {"namespace": "os"})
            await events.append(tx, "system:usage", "bob", {"machine": {}})
            await events.append(tx, "grant:added", "bob", {"grantId": "g"})
            await events.append(tx, "data:changed", "bob", {"authority": "notes.secret"})
        two.shell.bus.publish("test:end", {})  # the reader reads what follows its last id

    two.on_loop(foreign())
    wait_for(lambda: any(e.event == "test:end" for e in alice_stream.events), "alice's end")
    wait_for(lambda: any(e.event == "test:end" for e in bob_stream.events), "bob's end")
    wait_for(lambda: any(e.event == "test:end" for e in app_stream.events), "the app's end")
    bobs_app.close()
    assert [e.event for e in alice_stream.events] == ["test:end"]
    assert [e.event for e in bob_stream.events] == ["kv:changed", "test:end"]
    assert [e.event for e in app_stream.events] == ["test:end"]


def test_an_account_made_again_under_a_removed_ones_id_inherits_nothing(
    two: RunningShell, api: httpx.Client
) -> None:
    """A user id may be reused after its account is removed (the scope is set aside for that):
    the new account must neither read the old one's KV rows nor replay its events
    (`Last-Event-ID: 0` read the old account's `kv:changed` rows from the events table)."""
    with two.client(two.add_user("bob"), timeout=30) as old:
        assert old.put("/api/kv/os/diary", json={"value": "old bob's"}).status_code == 200
    assert api.delete("/api/users/bob").status_code == 200
    with two.client(two.add_user("bob"), timeout=30) as new:
        assert new.get("/api/kv/os/diary").status_code == 404
        replayed = SseReader(new, headers={"Last-Event-ID": "0"})
        assert api.put("/api/kv/global/marker", json={"value": 1}).status_code == 200
        marker(replayed)
        assert [e for e in replayed.of("kv:changed") if e.data.get("key") != "marker"] == []
