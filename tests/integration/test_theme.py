"""ThemeService on a real KV store (SQLite in tmp_path) and a real bus: the selection, its
validation on every write, `theme:changed`, the CSS, reload, and the proxy's HTML transform."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from atrium.bus import EventBus, Subscription
from atrium.errors import InvalidRequest, NotFound
from atrium.events import THEME_CHANGED
from atrium.kv import KvStore
from atrium.lifecycle.instance import Instance
from atrium.manifest import ThemeStrategy, parse_manifest
from atrium.scopes import Scope
from atrium.state.versions import open_checked
from atrium.theme.catalogue import ThemeCatalogue
from atrium.theme.model import ColorMode
from atrium.theme.prefs import ThemeService, html_transform_for
from tests.unit.theme.samples import theme_data

pytestmark = pytest.mark.integration

WAIT = 5.0
DEFAULT = {"themeIdLight": "atrium-light", "themeIdDark": "atrium-dark", "colorMode": "auto"}


@dataclass
class Themes:
    """A running theme service with what it was built from."""

    service: ThemeService
    kv: KvStore
    bus: EventBus
    events: Subscription
    user_dir: Path


@pytest.fixture
async def themes(tmp_path: Path) -> AsyncIterator[Themes]:
    user_dir = tmp_path / "themes"
    user_dir.mkdir()
    async with (
        EventBus() as bus,
        open_checked(f"sqlite+aiosqlite:///{tmp_path / 'state.sqlite3'}") as db,
        KvStore.open(db, bus=bus, user="default") as kv,
        ThemeService(kv, bus, ThemeCatalogue.load(user_dir)) as service,
    ):
        yield Themes(service, kv, bus, bus.subscribe((THEME_CHANGED,)), user_dir)


async def next_event(events: Subscription) -> dict[str, object]:
    frame = await events.next(WAIT)
    assert frame is not None
    data = next(line for line in frame.decode().splitlines() if line.startswith("data: "))
    payload: dict[str, object] = json.loads(data.removeprefix("data: "))
    return payload


def no_event(events: Subscription) -> bool:
    return events.queue.empty()


async def test_the_default_is_auto_with_the_first_bundled_light_and_dark(themes: Themes) -> None:
    assert (await themes.service.current()).wire() == DEFAULT
    assert await themes.kv.get("os", "theme") is None


async def test_select_merges_writes_and_announces(themes: Themes) -> None:
    stored = await themes.service.select({"themeIdDark": "fjord"})
    assert stored.wire() == {**DEFAULT, "themeIdDark": "fjord"}
    entry = await themes.kv.get("os", "theme")
    assert entry is not None
    assert entry.value == stored.wire()
    assert await next_event(themes.events) == {
        "type": "theme:changed",
        "themeId": "atrium-light",
        "themeName": "Atrium Light",
        "themeIdLight": "atrium-light",
        "themeIdDark": "fjord",
        "colorMode": "auto",
        "resolvedMode": None,
    }
    await themes.service.select({"colorMode": "dark"})
    event = await next_event(themes.events)
    assert (event["themeId"], event["themeName"], event["resolvedMode"]) == (
        "fjord",
        "Fjord",
        "dark",
    )
    assert no_event(themes.events)


async def test_a_refused_select_writes_nothing_and_says_nothing(themes: Themes) -> None:
    with pytest.raises(NotFound):
        await themes.service.select({"themeIdLight": "no-such"})
    with pytest.raises(InvalidRequest):
        await themes.service.select({"themeIdLight": "fjord"})
    with pytest.raises(InvalidRequest):
        await themes.service.select({"colorMode": "sepia"})
    assert await themes.kv.get("os", "theme") is None
    assert no_event(themes.events)


async def test_a_raw_kv_write_is_validated_like_a_select(themes: Themes) -> None:
    with pytest.raises(InvalidRequest, match="the dark slot needs a dark theme"):
        await themes.kv.set("os", "theme", {"themeIdDark": "paper"})
    with pytest.raises(NotFound):
        await themes.kv.set("os", "theme", {**DEFAULT, "themeIdLight": "nope"})
    with pytest.raises(InvalidRequest, match="is an object"):
        await themes.kv.set("os", "theme", "paper")
    assert await themes.kv.get("os", "theme") is None


async def test_a_raw_kv_write_is_merged_and_announced(themes: Themes) -> None:
    entry = await themes.kv.set("os", "theme", {"colorMode": "light", "themeIdLight": "paper"})
    assert entry.value == {**DEFAULT, "colorMode": "light", "themeIdLight": "paper"}
    event = await next_event(themes.events)
    assert (event["themeId"], event["resolvedMode"]) == ("paper", "light")
    assert themes.service.selection.theme_id_light == "paper"


async def test_deleting_the_key_returns_to_the_default_and_announces(themes: Themes) -> None:
    await themes.service.select({"colorMode": "dark"})
    await next_event(themes.events)
    assert await themes.kv.delete("os", "theme")
    event = await next_event(themes.events)
    assert event["colorMode"] == "auto"
    assert themes.service.selection.wire() == DEFAULT


async def test_css_follows_the_stored_mode_unless_forced(themes: Themes) -> None:
    auto = await themes.service.css()
    assert "@media (prefers-color-scheme: dark)" in auto.text
    assert "color-scheme: light dark;" in auto.text
    await themes.service.select({"colorMode": "dark", "themeIdDark": "ember"})
    dark = await themes.service.css()
    assert "@media" not in dark.text
    assert "--os-color-primary: #f59a3e;" in dark.text
    forced = await themes.service.css(ColorMode.LIGHT)
    assert "--os-color-primary: #4f46e5;" in forced.text
    assert len({auto.etag, dark.etag, forced.etag}) == 3


async def test_reload_adds_a_theme_and_a_vanished_selection_falls_back(themes: Themes) -> None:
    path = themes.user_dir / "mine.json"
    path.write_text(json.dumps(theme_data("mine", "dark")))
    report = await themes.service.reload()
    assert report.count == len(themes.service.catalogue.themes())
    assert report.problems == ()
    assert no_event(themes.events)  # the active themes did not change
    await themes.service.select({"themeIdDark": "mine", "colorMode": "dark"})
    await next_event(themes.events)
    path.write_text("{broken")
    report = await themes.service.reload()
    assert [p.file for p in report.problems] == [str(path)]
    assert (await next_event(themes.events))["themeId"] == "atrium-dark"
    assert themes.service.selection.theme_id_dark == "atrium-dark"


async def test_a_stored_id_that_vanished_reads_as_the_default(tmp_path: Path) -> None:
    async with (
        EventBus() as bus,
        open_checked(f"sqlite+aiosqlite:///{tmp_path / 'state.sqlite3'}") as db,
        KvStore.open(db, bus=bus, user="default") as kv,
    ):
        await kv.set("os", "theme", {**DEFAULT, "themeIdLight": "gone", "colorMode": "light"})
        async with ThemeService(kv, bus, ThemeCatalogue.load(None)) as service:
            assert service.selection.wire() == {**DEFAULT, "colorMode": "light"}


def instance_of(strategy: str, bus: EventBus, tmp_path: Path) -> Instance:
    app_id = "com.example.page"
    manifest = parse_manifest(
        {"id": app_id, "version": "1.0.0", "name": "Page", "themeStrategy": strategy}, app_id
    )
    return Instance(
        id="i1",
        app_id=app_id,
        scope=Scope.USER,
        app_dir=tmp_path,
        data_dir=tmp_path,
        manifest=manifest,
        slug="abcdefabcdef",
        bus=bus,
        owner="default",
    )


PAGE = b"<!doctype html><html><head><title>Page</title></head><body>hello</body></html>"


async def test_the_html_transform_injects_the_current_selection(
    themes: Themes, tmp_path: Path
) -> None:
    transform = html_transform_for(instance_of("themed", themes.bus, tmp_path), themes.service)
    assert transform is not None
    first = transform(PAGE, "text/html", None)
    assert b'<meta name="os-theme-id" content="atrium-light">' in first
    assert b'<meta name="os-design-framework" content="flat">' in first
    await themes.service.select({"colorMode": "dark", "themeIdDark": "midnight-neon"})
    second = gzip.decompress(transform(gzip.compress(PAGE), "text/html", "gzip"))
    assert b'<meta name="os-theme-id" content="midnight-neon">' in second
    assert b'<meta name="os-color-mode" content="dark">' in second
    assert b'<meta name="os-design-framework" content="neon">' in second


@pytest.mark.parametrize(
    ("strategy", "present", "absent"),
    [
        ("inherit", [b'href="/_os/api/os/theme.css"', b'src="/_os/client.js"'], []),
        ("themed", [b"os-design-framework"], [b"<link", b"<script"]),
        ("override", [b'<meta name="os-color-mode" content="auto">'], [b"os-theme-id", b"<link"]),
    ],
)
async def test_each_strategy_gets_its_tags(
    themes: Themes, tmp_path: Path, strategy: str, present: list[bytes], absent: list[bytes]
) -> None:
    instance = instance_of(strategy, themes.bus, tmp_path)
    assert instance.manifest.theme_strategy is ThemeStrategy(strategy)
    transform = html_transform_for(instance, themes.service)
    assert transform is not None
    page = transform(PAGE, "text/html; charset=utf-8", None)
    for tag in present:
        assert tag in page
    for tag in absent:
        assert tag not in page
