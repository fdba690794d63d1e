"""The active palette as CSS (docs/api.md "CSS variables"; decisions.md "Themes").

Pure. One `:root {…}` block holding `color-scheme` and one custom property per palette key:
`--os-color-<key in kebab-case>` (`surface2` → `surface-2`, `textDim` → `text-dim`), and the four
glows as `--os-glow-primary|secondary|danger|subtle`. In `auto` mode the light theme is in `:root`
and one `@media (prefers-color-scheme: dark)` block holds the dark one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Final

from atrium.theme.model import GLOW_KEYS, PALETTE_KEYS, ColorMode, ColorPalette, Theme

_BOUNDARY: Final = re.compile(r"(?<=[a-z])(?=[A-Z0-9])|(?<=[0-9])(?=[A-Za-z])")


def kebab(key: str) -> str:
    """camelCase to kebab-case, splitting letters from digits: `surface2` → `surface-2`."""
    return _BOUNDARY.sub("-", key).lower()


def css_property(key: str) -> str:
    """The custom property of a palette key (wire name)."""
    if key in GLOW_KEYS:
        return f"--os-glow-{kebab(key.removeprefix('glow'))}"
    return f"--os-color-{kebab(key)}"


#: palette key → custom property, the naming rule of docs/api.md "CSS variables" as a table
CSS_PROPERTIES: Final[Mapping[str, str]] = {key: css_property(key) for key in PALETTE_KEYS}


def _declarations(palette: ColorPalette, indent: str) -> str:
    values = palette.wire()
    return "".join(f"{indent}{CSS_PROPERTIES[k]}: {values[k]};\n" for k in PALETTE_KEYS)


def palette_to_css(palette: ColorPalette, color_scheme: str) -> str:
    """One `:root {…}` block: `color-scheme` then the 16 custom properties."""
    return f":root {{\n  color-scheme: {color_scheme};\n{_declarations(palette, '  ')}}}\n"


def theme_css(light: Theme, dark: Theme, mode: ColorMode) -> str:
    """The CSS document for a selection: one tone when ``mode`` is fixed, both in `auto`."""
    header = f"/* Atrium theme: mode {mode}, light {light.id}, dark {dark.id} */\n"
    if mode is ColorMode.LIGHT:
        return header + palette_to_css(light.palette, "light")
    if mode is ColorMode.DARK:
        return header + palette_to_css(dark.palette, "dark")
    return (
        header
        + palette_to_css(light.palette, "light dark")
        + "@media (prefers-color-scheme: dark) {\n  :root {\n"
        + _declarations(dark.palette, "    ")
        + "  }\n}\n"
    )


def css_etag(text: str) -> str:
    """A strong ETag from the content hash."""
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """True when an `If-None-Match` header names ``etag`` (weak comparison, `*` matches)."""
    if not if_none_match:
        return False
    candidates = [c.strip().removeprefix("W/") for c in if_none_match.split(",")]
    return "*" in candidates or etag.removeprefix("W/") in candidates
