"""The storage an app's data takes, as the app detail shows it (docs/api.md "Apps and scopes":
`dataBytes` of `GET /api/apps/{appId}`): the caller's own instances' data folders only, every
user's their own, links not followed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell
from tests.integration.distribution.conftest import MakeApp, installed_ok

pytestmark = pytest.mark.integration
APP = "com.example.sized"


def launched(client: httpx.Client) -> str:
    answer = client.post("/api/instances", json={"appId": APP, "new": True})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["instanceId"])


def data_bytes(client: httpx.Client, field: str = "dataBytes") -> object:
    answer = client.get(f"/api/apps/{APP}")
    assert answer.status_code == 200, answer.text
    return answer.json().get(field, "missing")


def test_the_detail_says_how_much_data_each_user_keeps_of_an_app(
    dist_shell: RunningShell, api: httpx.Client, make_app: MakeApp, home: Path, tmp_path: Path
) -> None:
    installed_ok(api, f"local:{make_app(APP)}")
    assert data_bytes(api) == 0  # no instance yet: no data
    mine = home / "scopes/global/apps" / APP / launched(api)
    (mine / "notes.txt").write_bytes(b"a" * 1000)
    (mine / "deep").mkdir()
    (mine / "deep" / "more.bin").write_bytes(b"b" * 234)
    # a link is counted as nothing: what it points to is not the app's data
    big = tmp_path / "elsewhere.bin"
    big.write_bytes(b"c" * 100_000)
    (mine / "link").symlink_to(big)
    (mine / "dirlink").symlink_to(tmp_path)
    with dist_shell.client(dist_shell.add_user("bob"), timeout=60) as bob:
        assert data_bytes(bob) == 0  # the admin's data is not bob's
        theirs = home / "scopes/users/bob/runtime/global" / APP / launched(bob)
        (theirs / "notes.txt").write_bytes(b"x" * 77)
        assert data_bytes(bob) == 77
        # what an uninstall does to it: the admin's goes with the app, bob's stays in his folder
        assert data_bytes(bob, "dataWithApp") is False
    assert data_bytes(api) == 1234
    assert data_bytes(api, "dataWithApp") is True
