"""Themes, palettes and the theme selection (docs/api.md "Themes").

Pure: `parse_theme` validates decoded JSON and reports every problem at once; `validate_catalogue`
checks the rule (docs/api.md "Themes") that the semantic colours are equal across all themes of one tone;
`active_theme_id` picks the light or dark slot by colour mode; `theme_contrast` gives the WCAG ratios the API reports.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Final

from pydantic import AfterValidator, Field, ValidationError

from atrium.theme.color import Rgba, check_shadow, contrast_ratio, over, parse_color
from atrium.wire import WireModel

THEME_ID_RE: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
FRAMEWORK_RE: Final = re.compile(r"^[a-z][a-z0-9-]{0,39}\Z")
TAG_RE: Final = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}\Z")


class Tone(StrEnum):
    """A theme's intrinsic tone."""

    LIGHT = "light"
    DARK = "dark"


class ColorMode(StrEnum):
    """The user's colour mode: a fixed tone, or `auto` (the browser's prefers-color-scheme)."""

    LIGHT = "light"
    DARK = "dark"
    AUTO = "auto"


def _color(value: str) -> str:
    parse_color(value)
    return value.strip()


def _theme_id(value: str) -> str:
    if not THEME_ID_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a theme id: 1-64 of a-z, 0-9, '.', '_', '-', starting with a letter "
            "or digit"
        )
    return value


def _framework(value: str) -> str:
    if not FRAMEWORK_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a framework name: 1-40 of a-z, 0-9 and '-'")
    return value


def _tag(value: str) -> str:
    if not TAG_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a tag: 1-32 of a-z, 0-9 and '-'")
    return value


Color = Annotated[str, AfterValidator(_color)]
Shadow = Annotated[str, AfterValidator(check_shadow)]
ThemeId = Annotated[str, AfterValidator(_theme_id)]


class ColorPalette(WireModel):
    """Exactly the 16 colours of docs/api.md "CSS variables", all required; wire keys camelCase (`textDim`, `glowPrimary`)."""

    primary: Color
    secondary: Color
    danger: Color
    info: Color
    warning: Color
    success: Color
    bg: Color
    surface: Color
    surface2: Color
    text: Color
    text_dim: Color
    border: Color
    glow_primary: Shadow
    glow_secondary: Shadow
    glow_danger: Shadow
    glow_subtle: Shadow


#: the palette table of docs/api.md "CSS variables", group by group, in wire names
PALETTE_GROUPS: Final[Mapping[str, tuple[str, ...]]] = {
    "accents": ("primary", "secondary", "danger", "info", "warning", "success"),
    "surfaces": ("bg", "surface", "surface2"),
    "text and lines": ("text", "textDim", "border"),
    "glows": ("glowPrimary", "glowSecondary", "glowDanger", "glowSubtle"),
}
PALETTE_KEYS: Final = tuple(key for group in PALETTE_GROUPS.values() for key in group)
GLOW_KEYS: Final = PALETTE_GROUPS["glows"]
SEMANTIC_KEYS: Final = ("danger", "warning", "info", "success")
CONTRAST_TEXT: Final = ("text", "textDim")
CONTRAST_BACKGROUNDS: Final = ("bg", "surface", "surface2")


class Theme(WireModel):
    """One theme (docs/api.md "Themes"): intrinsically light or dark."""

    id: ThemeId
    name: str = Field(min_length=1, max_length=80)
    description: str = Field(default="", max_length=500)
    tags: list[Annotated[str, AfterValidator(_tag)]] = Field(default_factory=list, max_length=16)
    tone: Tone
    framework: Annotated[str, AfterValidator(_framework)]
    palette: ColorPalette

    def color(self, key: str) -> str:
        """A palette value by its wire name (`textDim`, `glowPrimary`)."""
        value: str = self.palette.wire()[key]
        return value

    def summary(self) -> dict[str, object]:
        """The ThemeSummary item of `GET /api/os/themes` (decisions.md "Themes")."""
        return {
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "tags": list(self.tags),
            "tone": self.tone.value,
            "framework": self.framework,
        }


class ThemeInvalid(ValueError):
    """A theme document that is not valid; ``problems`` lists every one as ``field: message``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_theme(data: object) -> Theme:
    """Validate decoded theme JSON; raises ThemeInvalid listing every problem at once."""
    if not isinstance(data, dict):
        raise ThemeInvalid([f"(theme): must be a JSON object, not {type(data).__name__}"])
    try:
        return Theme.model_validate(data)
    except ValidationError as err:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or '(theme)'}: "
            + e["msg"].removeprefix("Value error, ")
            for e in err.errors(include_url=False)
        ]
        raise ThemeInvalid(problems) from err


class ThemePrefs(WireModel):
    """The selection stored at KV `os`/`theme`: one light slot, one dark slot and the colour mode."""

    theme_id_light: str
    theme_id_dark: str
    color_mode: ColorMode


def active_theme_id(prefs: ThemePrefs, prefers_dark: bool | None) -> str:
    """The active theme's id (docs/api.md "Themes"); ``prefers_dark`` None: the browser is unknown,
    which reads as light (decisions.md "Themes": `auto` names the light slot)."""
    if prefs.color_mode is ColorMode.DARK or (
        prefs.color_mode is ColorMode.AUTO and prefers_dark is True
    ):
        return prefs.theme_id_dark
    return prefs.theme_id_light


def semantic_colors(theme: Theme) -> tuple[tuple[int, int, int, int], ...]:
    """The semantic colours as browser values, so `#F00`, `#ff0000` and `red` compare equal."""
    return tuple(parse_color(theme.color(key)).key() for key in SEMANTIC_KEYS)


def validate_catalogue(themes: Iterable[Theme]) -> list[str]:
    """Every theme whose semantic colours differ from the first theme of its tone (docs/api.md
    "Themes": they are the same across all themes of one tone), one problem each."""
    reference: dict[Tone, Theme] = {}
    problems: list[str] = []
    for theme in themes:
        first = reference.setdefault(theme.tone, theme)
        differ = [
            key
            for key, mine, theirs in zip(
                SEMANTIC_KEYS, semantic_colors(theme), semantic_colors(first), strict=True
            )
            if mine != theirs
        ]
        if differ:
            problems.append(semantic_problem(theme, first, differ))
    return problems


def semantic_problem(theme: Theme, first: Theme, keys: Iterable[str]) -> str:
    listed = ", ".join(f"{k} {theme.color(k)!r} (expected {first.color(k)!r})" for k in keys)
    return (
        f"{theme.tone} theme {theme.id!r}: the semantic colours must equal those of every "
        f"{theme.tone} theme (as in {first.id!r}): {listed}"
    )


def _layers(theme: Theme) -> dict[str, Rgba]:
    bg = parse_color(theme.palette.bg)
    return {
        "bg": bg,
        "surface": over(parse_color(theme.palette.surface), bg),
        "surface2": over(parse_color(theme.palette.surface2), bg),
    }


def theme_contrast(theme: Theme, ndigits: int | None = 2) -> dict[str, dict[str, float]]:
    """WCAG ratios of `text`/`textDim` on `bg`/`surface`/`surface2` (surfaces laid on `bg`):
    ``{"text": {"bg": 15.2, …}, "textDim": {…}}``, rounded to ``ndigits`` places unless None."""
    layers = _layers(theme)
    table: dict[str, dict[str, float]] = {}
    for text in CONTRAST_TEXT:
        color = parse_color(theme.color(text))
        ratios = {name: contrast_ratio(color, layer) for name, layer in layers.items()}
        table[text] = {
            name: r if ndigits is None else round(r, ndigits) for name, r in ratios.items()
        }
    return table
