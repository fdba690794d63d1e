"""Theme documents for tests: a valid light and dark theme as decoded JSON, built fresh per call."""

from __future__ import annotations

from typing import Any

from atrium.theme.model import Theme, parse_theme

LIGHT_SEMANTIC = {
    "danger": "#c62828",
    "warning": "#a35f00",
    "info": "#0369a1",
    "success": "#2e7d32",
}
DARK_SEMANTIC = {"danger": "#f87171", "warning": "#fbbf24", "info": "#38bdf8", "success": "#4ade80"}


def palette(tone: str = "light", **overrides: str) -> dict[str, str]:
    light = tone == "light"
    values = {
        "primary": "#4f46e5" if light else "#818cf8",
        "secondary": "#0d9488" if light else "#2dd4bf",
        **(LIGHT_SEMANTIC if light else DARK_SEMANTIC),
        "bg": "#ffffff" if light else "#000000",
        "surface": "#f6f7fb" if light else "#171a23",
        "surface2": "#eceff5" if light else "#1f2330",
        "text": "#000000" if light else "#ffffff",
        "textDim": "#555e70" if light else "#9aa3b5",
        "border": "#d8dde7" if light else "#2c3242",
        "glowPrimary": "0 0 0 3px rgba(79, 70, 229, 0.35)",
        "glowSecondary": "0 0 12px 2px #0d9488",
        "glowDanger": "inset 0 0 0 1px red",
        "glowSubtle": "0 1px 3px rgba(0, 0, 0, 0.12), 0 1px 2px rgba(0, 0, 0, 0.08)",
    }
    values.update(overrides)
    return values


def theme_data(
    theme_id: str = "sample-light", tone: str = "light", **fields: Any
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": theme_id,
        "name": theme_id.replace("-", " ").title(),
        "description": f"A {tone} theme for tests.",
        "tags": ["test"],
        "tone": tone,
        "framework": "flat",
        "palette": palette(tone),
    }
    data.update(fields)
    return data


def theme(theme_id: str = "sample-light", tone: str = "light", **fields: Any) -> Theme:
    return parse_theme(theme_data(theme_id, tone, **fields))
