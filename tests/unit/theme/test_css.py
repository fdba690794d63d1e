"""theme.css: the custom property names (docs/api.md "CSS variables"), the auto media block, forced modes."""

from __future__ import annotations

import re

import pytest

from atrium.theme.css import CSS_PROPERTIES, css_etag, etag_matches, kebab, theme_css
from atrium.theme.model import PALETTE_KEYS, ColorMode
from tests.unit.theme.samples import palette, theme

LIGHT = theme("day", palette=palette(primary="#111111", glowSubtle="0 0 1px #222"))
DARK = theme("night", "dark", palette=palette("dark", primary="#eeeeee", glowSubtle="none"))

# the names written out: a reader checks them against docs/api.md "CSS variables" by eye
SPEC_NAMES = {
    "primary": "--os-color-primary",
    "secondary": "--os-color-secondary",
    "danger": "--os-color-danger",
    "info": "--os-color-info",
    "warning": "--os-color-warning",
    "success": "--os-color-success",
    "bg": "--os-color-bg",
    "surface": "--os-color-surface",
    "surface2": "--os-color-surface-2",
    "text": "--os-color-text",
    "textDim": "--os-color-text-dim",
    "border": "--os-color-border",
    "glowPrimary": "--os-glow-primary",
    "glowSecondary": "--os-glow-secondary",
    "glowDanger": "--os-glow-danger",
    "glowSubtle": "--os-glow-subtle",
}


@pytest.mark.parametrize(("key", "name"), SPEC_NAMES.items())
def test_each_palette_key_has_its_spec_property(key: str, name: str) -> None:
    assert CSS_PROPERTIES[key] == name


def test_the_table_covers_exactly_the_16_keys() -> None:
    assert tuple(CSS_PROPERTIES) == PALETTE_KEYS == tuple(SPEC_NAMES)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("surface2", "surface-2"),
        ("textDim", "text-dim"),
        ("glowPrimary", "glow-primary"),
        ("bg", "bg"),
        ("layer12Top", "layer-12-top"),
        ("h1", "h-1"),
    ],
)
def test_kebab_splits_words_and_letters_from_digits(key: str, expected: str) -> None:
    assert kebab(key) == expected


def declarations(block: str) -> dict[str, str]:
    return dict(re.findall(r"(--[a-z0-9-]+|color-scheme): ([^;]+);", block))


def test_light_mode_is_one_root_block_with_the_light_palette() -> None:
    css = theme_css(LIGHT, DARK, ColorMode.LIGHT)
    assert css.count(":root {") == 1
    assert "@media" not in css
    values = declarations(css)
    assert values["color-scheme"] == "light"
    assert values["--os-color-primary"] == "#111111"
    assert values["--os-glow-subtle"] == "0 0 1px #222"
    assert len(values) == 17


def test_dark_mode_forces_the_dark_palette() -> None:
    css = theme_css(LIGHT, DARK, ColorMode.DARK)
    values = declarations(css)
    assert values["color-scheme"] == "dark"
    assert values["--os-color-primary"] == "#eeeeee"
    assert values["--os-glow-subtle"] == "none"


def test_auto_mode_puts_light_in_root_and_dark_in_one_media_block() -> None:
    css = theme_css(LIGHT, DARK, ColorMode.AUTO)
    root, media = css.split("@media (prefers-color-scheme: dark) {")
    assert css.count("@media") == 1
    assert declarations(root)["color-scheme"] == "light dark"
    assert declarations(root)["--os-color-primary"] == "#111111"
    assert ":root {" in media
    dark = declarations(media)
    assert dark["--os-color-primary"] == "#eeeeee"
    assert len(dark) == 16
    assert css.count("{") == css.count("}") == 3


def test_glows_are_not_colour_properties() -> None:
    css = theme_css(LIGHT, DARK, ColorMode.AUTO)
    assert "--os-color-glow" not in css
    assert css.count("--os-glow-") == 8


def test_the_etag_is_a_quoted_content_hash() -> None:
    light = theme_css(LIGHT, DARK, ColorMode.LIGHT)
    etag = css_etag(light)
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag)
    assert css_etag(light) == etag
    assert css_etag(theme_css(LIGHT, DARK, ColorMode.DARK)) != etag


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        (None, False),
        ("", False),
        ('"abc"', True),
        ('W/"abc"', True),
        ('"x", "abc"', True),
        ("*", True),
        ('"abd"', False),
    ],
)
def test_if_none_match(header: str | None, matches: bool) -> None:
    assert etag_matches(header, '"abc"') is matches
