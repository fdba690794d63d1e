"""`GET /api/system/usage` and `system:usage` through the real shell: plausible figures (an
instance holding 80 MiB in two processes shows at least that), a user's own instances only, the
event on the stream while someone listens (never to an app, never replayed), 401 without a caller."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, SseReader, StartShell, wait_for

pytestmark = pytest.mark.integration

LOAD = "test.load.memory"
ECHO = "test.sdk.echo"
MIB = 1 << 20


@pytest.fixture
def loaded(start_shell: StartShell, system_apps: Path) -> RunningShell:
    for app_id in (LOAD, ECHO):
        shutil.copytree(TESTS_DIR / "apps" / app_id, system_apps / app_id)
    return start_shell(usage_seconds=0.5)


@pytest.fixture
def api(loaded: RunningShell) -> Iterator[httpx.Client]:
    with loaded.client(timeout=30) as client:
        yield client


@pytest.fixture
def bob(loaded: RunningShell) -> Iterator[httpx.Client]:
    with loaded.client(loaded.add_user("bob"), timeout=30) as client:
        yield client


def start(client: httpx.Client, app_id: str) -> str:
    response = client.post("/api/instances", json={"appId": app_id, "new": True})
    assert response.status_code == 200, response.text
    instance_id: str = response.json()["instanceId"]
    return instance_id


def usage(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/api/system/usage")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def mine(body: dict[str, Any], instance_id: str) -> dict[str, Any] | None:
    return next((i for i in body["instances"] if i["instanceId"] == instance_id), None)


def test_the_machine_and_an_instances_tree_have_plausible_figures(
    loaded: RunningShell, api: httpx.Client
) -> None:
    instance_id = start(api, LOAD)
    body = usage(api)
    assert set(body) == {"machine", "instances", "at"}
    machine = body["machine"]
    assert 0 <= machine["cpuPercent"] <= 100
    assert machine["cores"] >= 1
    assert 0 < machine["memoryUsedBytes"] < machine["memoryTotalBytes"]
    assert 0 < machine["diskUsedBytes"] <= machine["diskTotalBytes"]
    item = mine(body, instance_id)
    assert item is not None
    assert set(item) == {"instanceId", "appId", "memoryBytes", "cpuPercent"}
    assert item["appId"] == LOAD
    # 48 MiB in the app, 32 MiB in its helper below it: the whole tree is counted
    assert item["memoryBytes"] >= 80 * MIB
    # a busy instance shows a share of the machine's CPU
    assert api.post(f"/api/proxy/{instance_id}/burn").status_code == 200
    wait_for(
        lambda: (found := mine(usage(api), instance_id)) is not None and found["cpuPercent"] > 0,
        "the burning instance's CPU share",
    )
    # a stopped instance keeps its process (and is listed); a destroyed one is gone
    assert api.post(f"/api/instances/{instance_id}/stop").status_code == 200
    assert mine(usage(api), instance_id) is not None
    assert api.post(f"/api/instances/{instance_id}/destroy").status_code == 200
    wait_for(lambda: mine(usage(api), instance_id) is None, "the destroyed instance gone")


def test_a_user_sees_only_their_own_instances(
    loaded: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    alices = start(api, ECHO)
    bobs = start(bob, ECHO)
    theirs = usage(bob)
    assert [i["instanceId"] for i in theirs["instances"]] == [bobs]
    assert theirs["machine"]["memoryTotalBytes"] > 0  # members see the machine's figures
    # alice's own (a pooled one of hers too), never bob's
    hers = [i["instanceId"] for i in usage(api)["instances"]]
    assert alices in hers
    assert bobs not in hers
    # shared with bob, alice's instance is still hers: not in his figures
    shared = api.post(f"/api/instances/{alices}/grants", json={"user": "bob", "role": "viewer"})
    assert shared.status_code in (200, 201), shared.text
    assert [i["instanceId"] for i in usage(bob)["instances"]] == [bobs]


def test_the_event_reaches_each_user_with_their_own_instances_and_never_an_app(
    loaded: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    alices = start(api, ECHO)
    bobs = start(bob, ECHO)
    alice_stream = SseReader(api, {"topics": "system:usage"})
    bob_stream = SseReader(bob, {"topics": "system:*,kv:changed"})
    token = loaded.shell.app_tokens.issue(ECHO, bobs, "bob")
    with loaded.client(token) as bobs_app:
        app_stream = SseReader(bobs_app)
        wait_for(lambda: alice_stream.of("system:usage"), "alice's figures")
        wait_for(lambda: bob_stream.of("system:usage"), "bob's figures")
        heard = alice_stream.of("system:usage")[-1].data
        assert set(heard) == {"type", "machine", "instances", "at"}
        assert alices in [i["instanceId"] for i in heard["instances"]]
        assert bobs not in [i["instanceId"] for i in heard["instances"]]
        assert set(heard["machine"]) == set(usage(api)["machine"])
        for event in bob_stream.of("system:usage"):
            assert [i["instanceId"] for i in event.data["instances"]] == [bobs]
        # the app's stream takes every topic, and hears bob's marker but no figures
        assert bob.put("/api/kv/app/test.sdk.echo/marker", json={"value": 1}).status_code == 200
        wait_for(lambda: app_stream.of("kv:changed"), "the marker on the app's stream")
        assert app_stream.of("system:usage") == []
    # figures are not replayed: a stream resuming from before them gets none
    first = alice_stream.of("system:usage")[0]
    replay = SseReader(
        api, {"topics": "system:usage,kv:changed"}, {"Last-Event-ID": str(int(first.id) - 1)}
    )
    assert api.put("/api/kv/os/after", json={"value": 1}).status_code == 200
    wait_for(lambda: replay.of("kv:changed"), "the marker after the replay")
    assert all(int(e.id) > int(first.id) for e in replay.of("system:usage"))


def test_no_figures_without_a_caller_and_none_for_an_app(
    loaded: RunningShell, api: httpx.Client
) -> None:
    with loaded.anonymous() as anonymous:
        response = anonymous.get("/api/system/usage")
        assert response.status_code == 401
        assert response.json()["error"]["code"]
    instance_id = start(api, ECHO)
    with loaded.client(loaded.shell.app_tokens.issue(ECHO, instance_id, "default")) as app:
        response = app.get("/api/system/usage")
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "permission_denied"
