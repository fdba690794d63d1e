"""The theme API and `atrium theme` over HTTP, on real uvicorn with a real ThemeService.

Until `Shell` carries its `theme` field (wired by the lead), the app here is the theme and KV
routes over a stand-in that holds exactly what those routes read from the shell; the services
behind it are the real ones. Once wired, the `server` fixture becomes the `shell` fixture.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from typer.testing import CliRunner

from atrium.api import kv as kv_api
from atrium.api import theme as theme_api
from atrium.api.errors import InternalErrorMiddleware, atrium_error_handler, http_error_handler
from atrium.bus import Event, EventBus
from atrium.cli.theme import theme_app
from atrium.errors import AtriumError
from atrium.events import THEME_CHANGED
from atrium.identity import AppTokens, UserAuth, new_token
from atrium.kv import KvStore
from atrium.state.versions import open_checked
from atrium.theme.catalogue import ThemeCatalogue
from atrium.theme.prefs import ThemeService
from atrium.users.audit import AuditLog
from atrium.users.store import UserStore
from tests.integration.conftest import DEADLINE, wait_for
from tests.unit.theme.samples import theme_data

pytestmark = pytest.mark.integration


@dataclass
class ThemeShell:
    """What the theme and KV routes read from `Shell` (auth, the KV store, the theme service,
    the audit log every change is recorded in)."""

    user_auth: UserAuth
    app_tokens: AppTokens
    kv: KvStore
    theme: ThemeService
    users: UserStore
    settings: SimpleNamespace
    audit: AuditLog
    host_origins: frozenset[str] = frozenset()


@dataclass
class Server:
    """The theme API on 127.0.0.1:<ephemeral>, with every `theme:changed` payload it published."""

    url: str
    token: str
    home: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    shell: ThemeShell | None = None

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=DEADLINE,
        )


def build_app(server: Server) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            EventBus() as bus,
            open_checked(f"sqlite+aiosqlite:///{server.home / 'state.sqlite3'}") as db,
            KvStore.open(db, bus=bus, user="default") as kv,
            UserStore.open(db, bootstrap_admin="default", bus=bus) as users,
            AuditLog.open(db, retention_days=90) as audit,
        ):
            catalogue = await asyncio.to_thread(ThemeCatalogue.load, server.home / "themes")
            async with ThemeService(kv, bus, catalogue) as theme:

                def record(event: Event) -> None:
                    server.events.append(dict(event.payload))

                bus.listen((THEME_CHANGED,), record)
                server.shell = ThemeShell(
                    UserAuth(server.token),
                    AppTokens(),
                    kv,
                    theme,
                    users,
                    SimpleNamespace(user="default"),
                    audit,
                )
                app.state.shell = server.shell
                yield

    return Starlette(
        routes=[*theme_api.routes, *kv_api.routes],
        middleware=[Middleware(InternalErrorMiddleware)],
        exception_handlers={AtriumError: atrium_error_handler, HTTPException: http_error_handler},
        lifespan=lifespan,
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    srv = Server(f"http://127.0.0.1:{sock.getsockname()[1]}", new_token(), tmp_path)
    (tmp_path / "themes").mkdir()
    config = uvicorn.Config(build_app(srv), lifespan="on", log_config=None, access_log=False)
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(uv.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE
    while not uv.started:
        assert thread.is_alive(), "the server failed to start"
        assert time.monotonic() < deadline, "the server did not start in time"
        time.sleep(0.01)
    yield srv
    uv.should_exit = True
    thread.join(DEADLINE)
    sock.close()


@pytest.fixture
def api(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def app_token(server: Server) -> str:
    assert server.shell is not None
    return server.shell.app_tokens.issue("com.example.reader", "instance-1", "default")


def test_the_list_is_open_and_summarises(server: Server) -> None:
    with httpx.Client(base_url=server.url) as anonymous:
        items = anonymous.get("/api/os/themes").json()
    assert items[0] == {
        "id": "atrium-light",
        "name": "Atrium Light",
        "description": items[0]["description"],
        "tags": ["default", "neutral", "cool"],
        "tone": "light",
        "framework": "flat",
    }
    assert len(items) >= 10


def test_one_theme_has_its_palette_and_contrast(server: Server, api: httpx.Client) -> None:
    theme = api.get("/api/os/themes/high-contrast-dark").json()
    assert theme["tone"] == "dark"
    assert len(theme["palette"]) == 16
    assert theme["contrast"]["text"]["bg"] == 21.0
    assert set(theme["contrast"]["textDim"]) == {"bg", "surface", "surface2"}
    with server.client(app_token(server)) as app:
        assert app.get("/api/os/themes/paper").status_code == 200
    with httpx.Client(base_url=server.url) as anonymous:
        assert anonymous.get("/api/os/themes/paper").status_code == 401
    missing = api.get("/api/os/themes/nope")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "code": "not_found",
        "message": "no theme 'nope'",
        "kind": "theme",
        "id": "nope",
    }


def test_select_answers_the_stored_selection_and_emits(server: Server, api: httpx.Client) -> None:
    answer = api.post("/api/os/themes/select", json={"themeIdDark": "ember", "colorMode": "dark"})
    assert answer.status_code == 200
    assert answer.json() == {
        "themeIdLight": "atrium-light",
        "themeIdDark": "ember",
        "colorMode": "dark",
    }
    assert api.get("/api/kv/os/theme").json()["value"] == answer.json()
    assert api.get("/api/os/theme").json() == {
        "themeId": "ember",
        "themeName": "Ember",
        **answer.json(),
        "resolvedMode": "dark",
    }
    assert server.events == [api.get("/api/os/theme").json()]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"themeIdLight": "nope"}, 404, "not_found"),
        ({"themeIdLight": "ember"}, 400, "bad_request"),
        ({"colorMode": "sepia"}, 400, "bad_request"),
        ({"colorMode": 3}, 400, "bad_request"),
        ({"accent": "red"}, 400, "bad_request"),
    ],
)
def test_bad_selections_are_refused(
    server: Server, api: httpx.Client, body: dict[str, object], status: int, code: str
) -> None:
    answer = api.post("/api/os/themes/select", json=body)
    assert answer.status_code == status
    assert answer.json()["error"]["code"] == code
    assert api.get("/api/kv/os/theme").status_code == 404
    assert server.events == []


def test_select_and_reload_are_the_users(server: Server) -> None:
    with server.client(app_token(server)) as app:
        assert app.post("/api/os/themes/select", json={"colorMode": "dark"}).status_code == 403
        assert app.post("/api/os/themes/reload").status_code == 403
        assert app.get("/api/os/theme").status_code == 200


def test_a_raw_kv_write_is_validated_and_announced(server: Server, api: httpx.Client) -> None:
    refused = api.put("/api/kv/os/theme", json={"value": {"themeIdDark": "paper"}})
    assert refused.status_code == 400
    stored = api.put("/api/kv/os/theme", json={"value": {"colorMode": "light"}})
    assert stored.json()["value"]["colorMode"] == "light"
    assert wait_for(lambda: server.events, "theme:changed")[0]["resolvedMode"] == "light"


def test_theme_css_is_open_cached_by_etag_and_forced_by_mode(server: Server) -> None:
    with httpx.Client(base_url=server.url) as anonymous:
        css = anonymous.get("/api/os/theme.css")
        assert css.status_code == 200
        assert css.headers["content-type"] == "text/css; charset=utf-8"
        assert css.headers["cache-control"] == "no-cache"
        assert "@media (prefers-color-scheme: dark)" in css.text
        etag = css.headers["etag"]
        again = anonymous.get("/api/os/theme.css", headers={"If-None-Match": etag})
        assert again.status_code == 304
        assert again.headers["etag"] == etag
        assert again.content == b""
        dark = anonymous.get("/api/os/theme.css", params={"mode": "dark"})
        assert "color-scheme: dark;" in dark.text
        assert dark.headers["etag"] != etag
        bad = anonymous.get("/api/os/theme.css", params={"mode": "auto"})
        assert bad.status_code == 400
        assert bad.json()["error"]["code"] == "bad_request"


def test_reload_reports_count_and_problems(server: Server, api: httpx.Client) -> None:
    before = len(api.get("/api/os/themes").json())
    (server.home / "themes" / "mine.json").write_text(json.dumps(theme_data("mine")))
    (server.home / "themes" / "bad.json").write_text("[]")
    report = api.post("/api/os/themes/reload").json()
    assert report == {
        "count": before + 1,
        "problems": [
            {
                "file": str(server.home / "themes" / "bad.json"),
                "message": "(theme): must be a JSON object, not list",
            }
        ],
    }
    assert api.get("/api/os/themes").json()[-1]["id"] == "mine"


@pytest.fixture
def cli(server: Server, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("ATRIUM_URL", server.url)
    monkeypatch.setenv("ATRIUM_TOKEN", server.token)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def test_cli_list_marks_the_selected_themes(cli: CliRunner) -> None:
    result = cli.invoke(theme_app, ["list"])
    assert result.exit_code == 0, result.output
    assert "mode auto" in result.output
    light = next(line for line in result.output.splitlines() if "atrium-light" in line)
    assert light.rstrip(" │").endswith("light")
    listed = json.loads(cli.invoke(theme_app, ["list", "--json"]).output)
    assert listed[0]["id"] == "atrium-light"


def test_cli_show_prints_the_palette_and_contrast(cli: CliRunner) -> None:
    result = cli.invoke(theme_app, ["show", "fjord"])
    assert result.exit_code == 0, result.output
    assert "Fjord" in result.output
    assert "surface2" in result.output
    assert "#88c0d0" in result.output
    assert "WCAG contrast" in result.output
    shown = json.loads(cli.invoke(theme_app, ["show", "fjord", "--json"]).output)
    assert shown["contrast"]["text"]["bg"] > 4.5
    missing = cli.invoke(theme_app, ["show", "nope"])
    assert missing.exit_code == 1
    assert "not_found: no theme 'nope'" in missing.output


def test_cli_set_changes_only_what_is_given(cli: CliRunner, server: Server) -> None:
    result = cli.invoke(theme_app, ["set", "--dark", "fjord", "--mode", "dark"])
    assert result.exit_code == 0, result.output
    assert "theme: light atrium-light, dark fjord, mode dark" in result.output
    again = cli.invoke(theme_app, ["set", "--light", "paper", "--json"])
    assert json.loads(again.output) == {
        "themeIdLight": "paper",
        "themeIdDark": "fjord",
        "colorMode": "dark",
    }
    wrong = cli.invoke(theme_app, ["set", "--light", "fjord"])
    assert wrong.exit_code == 1
    assert "the light slot needs a light theme" in wrong.output
    nothing = cli.invoke(theme_app, ["set"])
    assert nothing.exit_code == 1
    assert "give at least one of" in nothing.output
