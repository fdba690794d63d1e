"""`atrium.bus.EventBus`: SSE frames, topic filters, replay, slow subscribers, close, listeners."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from atrium.bus import HISTORY, QUEUE_SIZE, Event, EventBus, Subscription


@pytest.fixture
async def bus() -> AsyncIterator[EventBus]:
    async with EventBus() as bus:
        yield bus


def drain(sub: Subscription) -> list[bytes]:
    """Every frame queued right now (without waiting); fails on the end-of-stream sentinel."""
    frames: list[bytes] = []
    while not sub.queue.empty():
        frame = sub.queue.get_nowait()
        assert frame is not None, "the stream ended"
        frames.append(frame)
    return frames


def parse(frame: bytes) -> tuple[int, str, dict[str, Any]]:
    """``(id, event, data)`` of one SSE frame, checking its exact layout."""
    text = frame.decode()
    assert text.endswith("\n\n")
    id_line, event_line, data_line = text[:-2].split("\n")
    assert id_line.startswith("id: ")
    assert event_line.startswith("event: ")
    assert data_line.startswith("data: ")
    data = json.loads(data_line.removeprefix("data: "))
    assert isinstance(data, dict)
    return int(id_line.removeprefix("id: ")), event_line.removeprefix("event: "), data


async def collect(sub: Subscription) -> list[bytes]:
    """Iterate ``sub`` to its end (guarded, so a stream that never ends fails instead of hanging)."""
    async with asyncio.timeout(5):
        return [frame async for frame in sub]


async def test_publish_with_no_subscribers_returns_the_event(bus: EventBus) -> None:
    event = bus.publish("app:installed", {"appId": "com.example.notes"})
    assert isinstance(event, Event)
    assert event.topic == "app:installed"
    assert event.payload == {"appId": "com.example.notes"}
    assert bus.subscriber_count == 0


async def test_subscriber_receives_sse_frames(bus: EventBus) -> None:
    sub = bus.subscribe()
    event = bus.publish("app:installed", {"appId": "com.example.notes", "scope": "global"})
    frame = await sub.next(wait=1)
    assert frame == event.frame
    assert frame is not None
    event_id, topic, data = parse(frame)
    assert event_id == event.id
    assert topic == "app:installed"
    assert data == {"type": "app:installed", "appId": "com.example.notes", "scope": "global"}
    assert frame.startswith(f"id: {event.id}\nevent: app:installed\ndata: {{".encode())


def test_frame_type_is_the_topic_even_when_the_payload_has_a_type() -> None:
    bus = EventBus()
    _, _, data = parse(bus.publish("app:crashed", {"type": "oops"}).frame)
    assert data["type"] == "app:crashed"


async def test_subscriber_gets_only_matching_topics(bus: EventBus) -> None:
    apps = bus.subscribe(("app:*",))
    deep = bus.subscribe(("dist:**", "theme:changed"))
    everything = bus.subscribe()
    for topic in (
        "app:installed",
        "app:x:y",
        "theme:changed",
        "dist:install.complete",
        "kv:changed",
    ):
        bus.publish(topic, {})
    assert [parse(f)[1] for f in drain(apps)] == ["app:installed"]
    assert [parse(f)[1] for f in drain(deep)] == ["theme:changed", "dist:install.complete"]
    assert len(drain(everything)) == 5


async def test_event_ids_strictly_increase(bus: EventBus) -> None:
    sub = bus.subscribe()
    published = [bus.publish("kv:changed", {"n": n}).id for n in range(50)]
    assert published == sorted(set(published))
    assert [parse(f)[0] for f in drain(sub)] == published
    assert EventBus().publish("kv:changed", {}).id > 0


async def test_replay_after_last_event_id_sends_only_missed_matching_events(bus: EventBus) -> None:
    first = bus.publish("app:installed", {"n": 0})
    bus.publish("theme:changed", {"n": 1})
    bus.publish("app:removed", {"n": 2})
    bus.publish("theme:changed", {"n": 3})
    sub = bus.subscribe(("app:*",), last_event_id=first.id)
    frames = drain(sub)
    assert [(parse(f)[1], parse(f)[2]["n"]) for f in frames] == [("app:removed", 2)]
    # live events follow the replay
    bus.publish("app:installed", {"n": 4})
    assert [parse(f)[2]["n"] for f in drain(sub)] == [4]


async def test_subscribe_without_last_event_id_replays_nothing(bus: EventBus) -> None:
    bus.publish("app:installed", {})
    assert drain(bus.subscribe()) == []


async def test_replay_covers_only_the_last_history_events() -> None:
    """In memory the bus keeps as many events as the events table does (`HISTORY`)."""
    assert HISTORY == 10_000
    async with EventBus(history=100) as bus:
        events = [bus.publish("kv:changed", {"n": n}) for n in range(120)]
        sub = bus.subscribe(last_event_id=events[0].id - 1)
        replayed = [parse(f) for f in drain(sub)]
    assert len(replayed) == 100
    assert [data["n"] for _, _, data in replayed] == list(range(20, 120))
    assert [event_id for event_id, _, _ in replayed] == [e.id for e in events[20:]]


async def test_replay_from_the_latest_id_is_empty(bus: EventBus) -> None:
    last = [bus.publish("kv:changed", {"n": n}) for n in range(5)][-1]
    assert drain(bus.subscribe(last_event_id=last.id)) == []


async def test_full_subscriber_is_dropped_and_others_still_get_events(bus: EventBus) -> None:
    slow = bus.subscribe()
    fast = bus.subscribe()
    received = 0
    for n in range(QUEUE_SIZE + 1):
        bus.publish("kv:changed", {"n": n})  # synchronous: it never waits for a reader
        received += len(drain(fast))
    assert slow.dropped
    assert slow.closed
    assert not fast.dropped
    assert received == QUEUE_SIZE + 1
    assert bus.subscriber_count == 1
    # the dropped stream ends (its queued frames are discarded: the client replays them)
    assert await collect(slow) == []
    # publishing goes on for everyone else, and never again reaches the dropped subscriber
    bus.publish("kv:changed", {"n": "after"})
    assert [parse(f)[2]["n"] for f in drain(fast)] == ["after"]
    assert slow.queue.empty()


async def test_subscriber_that_does_not_match_is_never_dropped(bus: EventBus) -> None:
    idle = bus.subscribe(("theme:*",))
    for n in range(QUEUE_SIZE + 10):
        bus.publish("kv:changed", {"n": n})
    assert not idle.dropped
    assert bus.subscriber_count == 1


async def test_subscriber_at_exactly_queue_size_is_kept(bus: EventBus) -> None:
    sub = bus.subscribe()
    for n in range(QUEUE_SIZE):
        bus.publish("kv:changed", {"n": n})
    assert not sub.dropped
    assert len(drain(sub)) == QUEUE_SIZE


async def test_close_ends_every_subscription(bus: EventBus) -> None:
    subs = [bus.subscribe(), bus.subscribe(("app:*",))]
    bus.publish("app:installed", {})
    bus.close()
    assert bus.subscriber_count == 0
    for sub in subs:
        assert sub.closed
        assert not sub.dropped
        assert await collect(sub) == []


async def test_subscribe_after_close_returns_an_ended_subscription(bus: EventBus) -> None:
    bus.publish("app:installed", {})
    bus.close()
    sub = bus.subscribe(last_event_id=0)
    assert sub.closed
    assert await collect(sub) == []
    assert bus.subscriber_count == 0


async def test_close_wakes_a_reader_that_is_waiting(bus: EventBus) -> None:
    sub = bus.subscribe()
    reader = asyncio.create_task(collect(sub))
    await asyncio.sleep(0)  # a zero-delay yield: the reader runs until it waits on the queue
    bus.publish("app:installed", {})
    await asyncio.sleep(0)  # the reader takes the frame and waits again
    assert not reader.done()
    bus.close()
    frames = await reader
    assert [parse(f)[1] for f in frames] == ["app:installed"]


async def test_context_manager_closes_the_bus() -> None:
    async with EventBus() as bus:
        sub = bus.subscribe()
    assert sub.closed
    assert bus.subscribe().closed


async def test_next_times_out_when_nothing_comes(bus: EventBus) -> None:
    sub = bus.subscribe()
    with pytest.raises(TimeoutError):
        await sub.next(wait=0)


async def test_listener_is_called_synchronously_for_matching_events(bus: EventBus) -> None:
    seen: list[tuple[int, str]] = []
    remove = bus.listen(("app:*",), lambda event: seen.append((event.id, event.topic)))
    first = bus.publish("app:installed", {})
    assert seen == [(first.id, "app:installed")]  # before publish returned
    bus.publish("theme:changed", {})
    assert len(seen) == 1
    remove()
    bus.publish("app:removed", {})
    assert len(seen) == 1


async def test_listener_with_no_globs_hears_everything(bus: EventBus) -> None:
    seen: list[str] = []
    bus.listen(None, lambda event: seen.append(event.topic))
    bus.publish("app:installed", {})
    bus.publish("kv:changed", {})
    assert seen == ["app:installed", "kv:changed"]


async def test_raising_listener_does_not_break_publish(
    bus: EventBus, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    seen: list[str] = []
    bus.listen(None, broken)
    bus.listen(None, lambda event: seen.append(event.topic))
    sub = bus.subscribe()
    with caplog.at_level(logging.ERROR, logger="atrium.bus"):
        event = bus.publish("app:installed", {"appId": "com.example.notes"})
    assert seen == ["app:installed"]
    assert drain(sub) == [event.frame]
    (record,) = [r for r in caplog.records if r.name == "atrium.bus"]
    assert record.levelno == logging.ERROR
    assert "app:installed" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)


async def test_a_dropped_subscriber_has_its_on_drop_called_once(bus: EventBus) -> None:
    """The edge cuts the connection there: ending the queue alone wakes no writer stuck behind
    a client that does not read."""
    calls: list[str] = []
    slow = bus.subscribe(on_drop=lambda: calls.append("slow"))
    fast = bus.subscribe(on_drop=lambda: calls.append("fast"))
    for n in range(QUEUE_SIZE + 5):
        bus.publish("kv:changed", {"n": n})
        drain(fast)
    assert slow.dropped
    assert calls == ["slow"]
    bus.unsubscribe(fast)  # an ordinary end is not a drop
    bus.close()
    assert calls == ["slow"]


async def test_a_failing_on_drop_does_not_break_publishing(
    bus: EventBus, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("edge bug")

    bus.subscribe(on_drop=broken)
    fast = bus.subscribe()
    with caplog.at_level(logging.ERROR, logger="atrium.bus"):
        for n in range(QUEUE_SIZE + 1):
            bus.publish("kv:changed", {"n": n})
            drain(fast)
    assert "ending a dropped subscriber failed" in caplog.text
    assert bus.subscriber_count == 1


async def test_a_subscriber_too_full_for_its_heartbeat_is_dropped_with_on_drop() -> None:
    calls: list[str] = []
    async with EventBus(heartbeat=0.01) as bus:
        sub = bus.subscribe(on_drop=lambda: calls.append("dropped"))
        for _ in range(QUEUE_SIZE):
            assert sub.offer(b": filler\n\n")
        sub.last_offer = 0.0  # quiet for ages: the next beat goes to it, and does not fit
        for _ in range(200):
            if calls:
                break
            await asyncio.sleep(0.01)
    assert calls == ["dropped"]
    assert sub.dropped
