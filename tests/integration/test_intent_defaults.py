"""Remembered default handlers (docs/api.md "Default handlers"): real shell, real installs."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell, wait_for

pytestmark = pytest.mark.integration

TIE = "test.intent.TIE"
VIEW = "test.intent.VIEW"


def handler_source(root: Path, app_id: str, filters: list[dict[str, Any]]) -> Path:
    """A stdlib app (no SDK) that answers every hook, with ``filters``."""
    target = root / app_id
    target.mkdir(parents=True)
    shutil.copy(TESTS_DIR / "apps" / "test.plain.stdlib" / "server.py", target / "server.py")
    manifest = {
        "id": app_id,
        "name": app_id,
        "version": "1.0.0",
        "entrypoint": ["python3", "server.py"],
        "intentFilters": filters,
    }
    (target / "app.manifest.json").write_text(json.dumps(manifest))
    return target


def install(api: httpx.Client, source: Path) -> None:
    answer = api.post(
        "/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True, "scope": "user"}
    )
    assert answer.status_code == 200, answer.text


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    return tmp_path / "sources"


@pytest.fixture
def defaults_shell(start_shell: StartShell, sources: Path) -> RunningShell:
    shell = start_shell()
    with shell.client(timeout=60) as api:
        for name in ("one", "two"):
            install(api, handler_source(sources, f"test.tie.{name}", [{"action": TIE}]))
        for name in ("a", "b"):
            filters = [{"action": VIEW, "dataMime": ["text/*"]}]
            install(api, handler_source(sources, f"test.view.{name}", filters))
    return shell


@pytest.fixture
def api(defaults_shell: RunningShell) -> Iterator[httpx.Client]:
    with defaults_shell.client(timeout=60) as client:
        yield client


def start(api: httpx.Client, **body: Any) -> dict[str, Any]:
    answer = api.post("/api/intents/start", json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_remembered_choice_wins_a_tie_from_then_on(api: httpx.Client) -> None:
    assert start(api, action=TIE)["status"] == "chooser"
    chosen = start(api, action=TIE, target="test.tie.two", remember=True)
    assert (chosen["status"], chosen["appId"], chosen["byDefault"]) == (
        "started",
        "test.tie.two",
        False,
    )
    [remembered] = api.get("/api/intents/defaults").json()
    assert {k: remembered[k] for k in ("action", "type", "appId")} == {
        "action": TIE,
        "type": None,
        "appId": "test.tie.two",
    }
    again = start(api, action=TIE)
    assert (again["status"], again["appId"], again["byDefault"]) == (
        "started",
        "test.tie.two",
        True,
    )
    resolved = {
        m["appId"]: m for m in api.post("/api/intents/resolve", json={"action": TIE}).json()
    }
    assert resolved["test.tie.one"]["default"] is False
    two = resolved["test.tie.two"]
    assert two["default"] is True
    assert two["defaultSince"] == remembered["since"]
    assert "remember" in two["explanation"]
    assert two["newSince"] == []
    # another target without remember starts it once and keeps the default
    assert start(api, action=TIE, target="test.tie.one")["appId"] == "test.tie.one"
    assert start(api, action=TIE)["appId"] == "test.tie.two"


def test_type_patterns_apply_most_specific_first(api: httpx.Client) -> None:
    assert start(api, action=VIEW, type="text/plain")["status"] == "chooser"
    start(api, action=VIEW, type="text/*", target="test.view.b", remember=True)
    start(
        api, action=VIEW, type="Text/Markdown; charset=utf-8", target="test.view.a", remember=True
    )
    assert start(api, action=VIEW, type="text/plain")["appId"] == "test.view.b"
    assert start(api, action=VIEW, type="text/markdown")["appId"] == "test.view.a"
    types = sorted(d["type"] for d in api.get("/api/intents/defaults").json())
    assert types == ["text/*", "text/markdown"]


def test_forgetting_brings_the_chooser_back(api: httpx.Client) -> None:
    start(api, action=TIE, target="test.tie.one", remember=True)
    missing = api.delete("/api/intents/defaults", params={"action": TIE, "type": "text/plain"})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    forgotten = api.delete("/api/intents/defaults", params={"action": TIE})
    assert forgotten.status_code == 200, forgotten.text
    assert forgotten.json()["forgotten"]["appId"] == "test.tie.one"
    assert api.get("/api/intents/defaults").json() == []
    assert start(api, action=TIE)["status"] == "chooser"
    no_action = api.delete("/api/intents/defaults")
    assert no_action.status_code == 400
    assert no_action.json()["error"]["problems"][0]["field"] == "action"


def test_only_the_user_remembers_or_forgets(
    defaults_shell: RunningShell, api: httpx.Client
) -> None:
    token = defaults_shell.shell.app_tokens.issue("test.tie.one", "test.tie.one-1", "default")
    with defaults_shell.client(token=token) as app:
        refused = app.post(
            "/api/intents/start", json={"action": TIE, "target": "test.tie.one", "remember": True}
        )
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        assert app.get("/api/intents/defaults").json() == []
        assert app.delete("/api/intents/defaults", params={"action": TIE}).status_code == 403
    no_target = api.post("/api/intents/start", json={"action": TIE, "remember": True})
    assert no_target.status_code == 400
    assert no_target.json()["error"]["problems"][0]["field"] == "remember"
    assert api.get("/api/intents/defaults").json() == []


@pytest.mark.parametrize(
    "value",
    [
        {"action": TIE},
        [{"action": TIE, "type": None, "appId": "test.tie.one"}],
        [{"action": TIE, "type": "text", "appId": "test.tie.one", "since": "2026-01-01T00:00:00Z"}],
        [{"action": TIE, "type": None, "appId": "NOT AN ID", "since": "2026-01-01T00:00:00Z"}],
        [{"action": TIE, "type": None, "appId": "test.tie.one", "since": "yesterday"}],
    ],
)
def test_a_raw_kv_write_must_be_a_valid_list(api: httpx.Client, value: Any) -> None:
    answer = api.put("/api/kv/os/intent.defaults", json={"value": value})
    assert answer.status_code == 400, answer.text
    assert "intent.defaults" in answer.json()["error"]["message"]
    assert api.get("/api/intents/defaults").json() == []


def test_a_raw_kv_write_of_a_valid_list_is_used(api: httpx.Client) -> None:
    value = [
        {"action": TIE, "type": None, "appId": "test.tie.one", "since": "2026-01-01T00:00:00Z"}
    ]
    assert api.put("/api/kv/os/intent.defaults", json={"value": value}).status_code == 200
    assert start(api, action=TIE)["appId"] == "test.tie.one"


def test_a_new_matching_app_is_reported_and_uninstalling_the_default_forgets_it(
    api: httpx.Client, sources: Path
) -> None:
    start(api, action=TIE, target="test.tie.one", remember=True)
    time.sleep(1.1)  # both times are whole seconds: "installed since" means a later second
    install(api, handler_source(sources, "test.tie.three", [{"action": TIE}]))
    resolved = {
        m["appId"]: m for m in api.post("/api/intents/resolve", json={"action": TIE}).json()
    }
    assert resolved["test.tie.one"]["newSince"] == ["test.tie.three"]
    assert start(api, action=TIE)["appId"] == "test.tie.one"  # the default is kept
    # uninstalling another app keeps it; uninstalling the default app forgets it
    assert api.delete("/api/dist/uninstall/test.tie.three").status_code == 200
    assert len(api.get("/api/intents/defaults").json()) == 1
    assert api.delete("/api/dist/uninstall/test.tie.one").status_code == 200
    wait_for(lambda: api.get("/api/intents/defaults").json() == [], "the default to go")
    install(api, handler_source(sources / "again", "test.tie.one", [{"action": TIE}]))
    assert start(api, action=TIE)["status"] == "chooser"
