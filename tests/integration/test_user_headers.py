"""Apps learn who is looking: `X-Os-User-Id`, `X-Os-User-Name` and `X-Os-User-Role` on every
page request, set by the shell from the view's user, never from what the browser sends."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell
from tests.integration.test_origins import enter

pytestmark = pytest.mark.integration

ECHO = "test.sdk.echo"
FORGED = [
    ("X-Os-User-Id", "mallory"),
    ("X-Os-User-Name", "Mallory"),
    ("X-Os-User-Role", "owner"),
    ("x-os-user-role", "editor"),
    ("X-OS-USER-ID", "eve"),
]


@pytest.fixture
def echo_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    shutil.copytree(TESTS_DIR / "apps" / ECHO, system_apps / ECHO)
    return start_shell()


@pytest.fixture
def api(echo_shell: RunningShell) -> Iterator[httpx.Client]:
    with echo_shell.client(timeout=30) as client:
        yield client


def launch(api: httpx.Client) -> str:
    answer = api.post("/api/instances", json={"appId": ECHO, "new": True})
    assert answer.status_code == 200, answer.text
    instance_id: str = answer.json()["instanceId"]
    return instance_id


def whoami(
    shell: RunningShell,
    api: httpx.Client,
    instance_id: str,
    method: str = "GET",
    headers: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    view = api.post(f"/api/instances/{instance_id}/views", json={})
    assert view.status_code == 200, view.text
    client, _ = enter(shell, view.json()["url"])
    with closing(client):
        origin = f"http://{client.headers['Host']}"
        answer = client.request(method, "/whoami", headers=[("Origin", origin), *(headers or [])])
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_the_owner_looking_is_named_to_the_app(echo_shell: RunningShell, api: httpx.Client) -> None:
    owner = echo_shell.settings.user
    seen = whoami(echo_shell, api, launch(api))
    assert seen["kind"] == "page"
    assert seen["headers"] == {
        "X-Os-User-Id": [owner],
        "X-Os-User-Name": [owner],
        "X-Os-User-Role": ["owner"],
    }
    assert seen["user"] == {"id": owner, "name": owner, "role": "owner"}


def test_forged_user_headers_never_reach_the_app(
    echo_shell: RunningShell, api: httpx.Client
) -> None:
    owner = echo_shell.settings.user
    instance_id = launch(api)
    for method in ("GET", "POST"):
        seen = whoami(echo_shell, api, instance_id, method, headers=FORGED)
        assert seen["headers"] == {
            "X-Os-User-Id": [owner],
            "X-Os-User-Name": [owner],
            "X-Os-User-Role": ["owner"],
        }, method
    # the user's bearer /api/proxy/ names them too, and drops the same forgeries
    proxied = api.get(f"/api/proxy/{instance_id}/whoami", headers=FORGED)
    assert proxied.status_code == 200, proxied.text
    assert proxied.json()["kind"] == "user"
    assert proxied.json()["user"] == {"id": owner, "name": owner, "role": "owner"}


def test_a_name_beyond_ascii_arrives_percent_encoded_and_the_sdk_decodes_it(
    echo_shell: RunningShell, api: httpx.Client
) -> None:
    token = echo_shell.add_user("zoe", name="Zoë 100% «ok»")
    instance_id = launch(api)
    granted = api.post(
        f"/api/instances/{instance_id}/grants", json={"user": "zoe", "role": "viewer"}
    )
    assert granted.status_code == 201, granted.text
    with echo_shell.client(token, timeout=30) as zoe:
        seen = whoami(echo_shell, zoe, instance_id)
    assert seen["headers"] == {
        "X-Os-User-Id": ["zoe"],
        "X-Os-User-Name": ["Zo%C3%AB 100%25 %C2%ABok%C2%BB"],
        "X-Os-User-Role": ["viewer"],
    }
    assert seen["user"] == {"id": "zoe", "name": "Zoë 100% «ok»", "role": "viewer"}
