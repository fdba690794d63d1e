"""Apps learn who is looking: `X-Os-User-Id`, `X-Os-User-Name` and `X-Os-User-Role` on every
page request, set by the shell from the view's user, never from what the browser sends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningShell
from tests.integration.instances import new_instance, view_client

pytestmark = pytest.mark.integration

FORGED = [
    ("X-Os-User-Id", "mallory"),
    ("X-Os-User-Name", "Mallory"),
    ("X-Os-User-Role", "owner"),
    ("x-os-user-role", "editor"),
    ("X-OS-USER-ID", "eve"),
]


@pytest.fixture
def api(echo_shell: RunningShell) -> Iterator[httpx.Client]:
    with echo_shell.client(timeout=30) as client:
        yield client


def whoami(
    shell: RunningShell,
    api: httpx.Client,
    instance_id: str,
    method: str = "GET",
    headers: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    with closing(view_client(shell, api, instance_id)) as client:
        answer = client.request(method, "/whoami", headers=headers or [])
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_the_owner_looking_is_named_to_the_app(echo_shell: RunningShell, api: httpx.Client) -> None:
    owner = echo_shell.settings.user
    seen = whoami(echo_shell, api, new_instance(api))
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
    instance_id = new_instance(api)
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
    instance_id = new_instance(api)
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
