"""Theme validation (every problem at once), the semantic-colour rule, Theme rule 1, contrast."""

from __future__ import annotations

import pytest

from atrium.theme.catalogue import BUNDLED_DIR, ThemeCatalogue
from atrium.theme.model import (
    PALETTE_KEYS,
    ColorMode,
    Theme,
    ThemeInvalid,
    ThemePrefs,
    Tone,
    active_theme_id,
    parse_theme,
    theme_contrast,
    validate_catalogue,
)
from tests.unit.theme.samples import palette, theme, theme_data


def problems_of(data: object) -> list[str]:
    with pytest.raises(ThemeInvalid) as caught:
        parse_theme(data)
    return caught.value.problems


def test_a_valid_theme_round_trips_with_the_spec_keys() -> None:
    data = theme_data()
    parsed = parse_theme(data)
    assert parsed.wire() == data
    assert tuple(parsed.palette.wire()) == PALETTE_KEYS
    assert len(PALETTE_KEYS) == 16


def test_a_missing_palette_key_is_named() -> None:
    data = theme_data()
    del data["palette"]["textDim"]
    assert problems_of(data) == ["palette.textDim: Field required"]


def test_an_extra_palette_key_is_refused() -> None:
    data = theme_data(palette=palette(accent="#123456"))
    assert problems_of(data) == ["palette.accent: Extra inputs are not permitted"]


def test_a_bad_colour_names_the_key_and_the_value() -> None:
    (problem,) = problems_of(theme_data(palette=palette(surface2="#12345")))
    assert problem.startswith("palette.surface2: '#12345' is not a CSS colour")


def test_a_bad_glow_is_refused() -> None:
    (problem,) = problems_of(theme_data(palette=palette(glowPrimary="0 0 2px red blue")))
    assert problem.startswith("palette.glowPrimary: '0 0 2px red blue' is not a box-shadow value")


def test_a_bad_tone_is_refused() -> None:
    (problem,) = problems_of(theme_data(tone="sepia"))
    assert problem.startswith("tone: Input should be 'light' or 'dark'")


def test_every_problem_is_reported_at_once() -> None:
    data = theme_data(theme_id="Bad Id", framework="Not A Slug", palette=palette(text="nope"))
    del data["name"]
    fields = [p.split(":")[0] for p in problems_of(data)]
    assert fields == ["id", "name", "framework", "palette.text"]


def test_a_theme_must_be_an_object() -> None:
    assert problems_of(["not", "a", "theme"]) == ["(theme): must be a JSON object, not list"]


def test_semantic_colours_compare_as_browser_values() -> None:
    first = theme("one")
    same = theme("two", palette=palette(danger="rgb(198, 40, 40)", info="#0369A1"))
    assert validate_catalogue([first, same]) == []


def test_a_semantic_mismatch_within_a_tone_is_reported() -> None:
    first = theme("one")
    odd = theme("odd", palette=palette(warning="orange"))
    other_tone = theme("night", "dark")
    (problem,) = validate_catalogue([first, odd, other_tone])
    assert "'odd'" in problem
    assert "warning 'orange' (expected '#a35f00')" in problem


@pytest.mark.parametrize(
    ("mode", "prefers_dark", "active"),
    [
        (ColorMode.LIGHT, None, "day"),
        (ColorMode.LIGHT, True, "day"),
        (ColorMode.DARK, None, "night"),
        (ColorMode.DARK, False, "night"),
        (ColorMode.AUTO, True, "night"),
        (ColorMode.AUTO, False, "day"),
        (ColorMode.AUTO, None, "day"),
    ],
)
def test_active_theme_follows_rule_1(
    mode: ColorMode, prefers_dark: bool | None, active: str
) -> None:
    prefs = ThemePrefs(theme_id_light="day", theme_id_dark="night", color_mode=mode)
    assert active_theme_id(prefs, prefers_dark) == active


def test_contrast_reports_text_and_text_dim_on_each_background() -> None:
    table = theme_contrast(theme(palette=palette(bg="#ffffff", surface="#ffffff", text="#000")))
    assert set(table) == {"text", "textDim"}
    assert set(table["text"]) == {"bg", "surface", "surface2"}
    assert table["text"]["bg"] == 21.0
    assert table["text"]["surface"] == 21.0


def test_translucent_surfaces_are_laid_on_bg() -> None:
    dark = theme("night", "dark", palette=palette("dark", surface="rgba(255, 255, 255, 0)"))
    assert theme_contrast(dark)["text"]["surface"] == 21.0


BUNDLED = ThemeCatalogue.load(None).themes()


def test_the_bundled_catalogue_has_the_promised_themes() -> None:
    tones = [t.tone for t in BUNDLED]
    assert len(BUNDLED) >= 10
    assert tones.count(Tone.LIGHT) >= 4
    assert tones.count(Tone.DARK) >= 4
    for tone in Tone:
        assert any("high-contrast" in t.tags for t in BUNDLED if t.tone is tone)
    assert len({t.id for t in BUNDLED}) == len(list(BUNDLED_DIR.glob("*.json")))


def test_bundled_semantic_colours_are_equal_within_each_tone() -> None:
    assert validate_catalogue(BUNDLED) == []


@pytest.mark.parametrize("bundled", BUNDLED, ids=lambda t: t.id)
def test_bundled_text_reaches_wcag_aa_on_every_surface(bundled: Theme) -> None:
    ratios = theme_contrast(bundled, ndigits=None)["text"]
    assert min(ratios.values()) >= 4.5, ratios
