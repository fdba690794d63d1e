"""`GET /api/events`: frames, topic globs, Last-Event-ID replay, heartbeats, shutdown."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from atrium.state.migrate import upgrade_now
from tests.integration.conftest import RunningShell, SseReader, StartShell, wait_for
from tests.postgres import new_database

pytestmark = pytest.mark.integration


def publish(shell: RunningShell, topic: str, **payload: object) -> None:
    """Publish on the shell's own loop, as a service would."""
    loop = shell.server._loop
    assert loop is not None
    done = threading.Event()

    def run() -> None:
        shell.shell.bus.publish(topic, payload)
        done.set()

    loop.call_soon_threadsafe(run)
    assert done.wait(5)


def test_frames_carry_id_event_and_data_with_the_type(
    shell: RunningShell, api: httpx.Client
) -> None:
    events = SseReader(api)
    publish(shell, "app:installed", appId="com.example.a")
    (event,) = events.wait(1)
    assert event.event == "app:installed"
    assert event.data == {"type": "app:installed", "appId": "com.example.a"}
    assert int(event.id) > 0


def test_topic_globs_filter_the_stream(shell: RunningShell, api: httpx.Client) -> None:
    single = SseReader(api, {"topics": "app:*"})
    deep = SseReader(api, {"topics": "dist:**,kv:changed"})
    for topic in (
        "app:installed",
        "app:lifecycle.error",
        "app:x:y",
        "dist:install.complete",
        "kv:changed",
        "theme:changed",
    ):
        publish(shell, topic)
    publish(shell, "test:end")
    everything = SseReader(api, {"topics": "test:end"})
    publish(shell, "test:end")
    everything.wait(1)
    wait_for(lambda: len(single.events) >= 2 and len(deep.events) >= 2, "filtered events")
    assert [e.event for e in single.events] == ["app:installed", "app:lifecycle.error"]
    assert [e.event for e in deep.events] == ["dist:install.complete", "kv:changed"]


def test_last_event_id_replays_what_was_missed(shell: RunningShell, api: httpx.Client) -> None:
    first = SseReader(api, {"topics": "t:*"})
    for n in range(5):
        publish(shell, "t:n", n=n)
    first.wait(5)
    seen = first.events[1].id
    replay = SseReader(api, {"topics": "t:*"}, headers={"Last-Event-ID": seen})
    replay.wait(3)
    assert [e.data["n"] for e in replay.events] == [2, 3, 4]
    publish(shell, "t:n", n=5)
    replay.wait(4)
    assert replay.events[-1].data["n"] == 5


def test_replay_is_limited_to_the_last_ten_thousand_events(
    shell: RunningShell, api: httpx.Client
) -> None:
    first = SseReader(api, {"topics": "r:first,r:last"})
    publish(shell, "r:first")
    first.wait(1)
    publish_many(shell, "r:n", 10_100)
    publish(shell, "r:last")
    first.wait(2)  # every one written
    replay = SseReader(api, {"topics": "r:*"}, headers={"Last-Event-ID": first.events[0].id})
    replay.wait(10_000)
    assert [e.data.get("n") for e in replay.events] == [*range(101, 10_100), None]
    assert replay.events[-1].id == first.events[1].id


def publish_many(shell: RunningShell, topic: str, count: int) -> None:
    """Publish ``count`` events in one turn of the shell's loop (``n``: 0, 1, …)."""
    loop = shell.server._loop
    assert loop is not None
    done = threading.Event()

    def run() -> None:
        for n in range(count):
            shell.shell.bus.publish(topic, {"n": n})
        done.set()

    loop.call_soon_threadsafe(run)
    assert done.wait(5)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_resume_after_a_restart_of_the_shell_misses_nothing(
    start_shell: StartShell, backend: str, request: pytest.FixtureRequest
) -> None:
    """The ids and the events to resume from are the database's: a stream resumed on the next
    shell (or another replica) gets every event after its id, once, in order."""
    options: dict[str, object] = {}
    if backend == "postgresql":
        url = new_database(request.getfixturevalue("postgres_server"))
        upgrade_now(url)
        options["database_url"] = url
    shell = start_shell(**options)
    with shell.client() as api:
        stream = SseReader(api, {"topics": "t:*"})
        for n in range(4):
            publish(shell, "t:n", n=n)
        seen = stream.wait(4)[1].id
        publish(shell, "t:n", n=4)  # emitted as the shell stops: written all the same
        shell.stop()
    shell = start_shell(**options)
    with shell.client() as api:
        publish(shell, "t:n", n=5)
        resumed = SseReader(api, {"topics": "t:*"}, headers={"Last-Event-ID": seen})
        publish(shell, "t:n", n=6)
        got = resumed.wait(5)
        assert [e.data["n"] for e in got] == [2, 3, 4, 5, 6]
        assert [int(e.id) for e in got] == list(range(int(seen) + 1, int(seen) + 6))


def test_a_heartbeat_comment_keeps_a_quiet_stream_alive(start_shell: StartShell) -> None:
    shell = start_shell(heartbeat_seconds=0.2)
    with shell.client() as api:
        events = SseReader(api)
        wait_for(lambda: events.comments.count("heartbeat") >= 2, "two heartbeats")


@pytest.mark.parametrize(
    ("params", "headers"),
    [({"topics": "app:(x)"}, {}), ({}, {"Last-Event-ID": "abc"})],
    ids=["bad-glob", "bad-last-event-id"],
)
def test_bad_stream_parameters_are_400(
    api: httpx.Client, params: dict[str, str], headers: dict[str, str]
) -> None:
    response = api.get("/api/events", params=params, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


def test_open_streams_do_not_hold_up_shutdown(start_shell: StartShell) -> None:
    shell = start_shell()
    with shell.client() as api:
        streams = [SseReader(api) for _ in range(5)]
        started = time.monotonic()
        shell.stop()
        elapsed = time.monotonic() - started
        for stream in streams:
            assert stream.ended.wait(5)
    # uvicorn's graceful timeout is 3 s: ending the streams first must beat it
    assert elapsed < 3
