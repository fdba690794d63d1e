"""`atrium theme list|show|set`: the theme catalogue and the selection, over the shell's HTTP API."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import typer
from rich.text import Text

from atrium.cli.client import ShellClient, fail
from atrium.cli.render import console, print_json, print_table

JSON_OPT = typer.Option(False, "--json", help="print the shell's JSON answer")
_HEX6 = re.compile(r"#[0-9a-fA-F]{6}")

theme_app = typer.Typer(help="Themes: list the catalogue, show a theme, set the selection.")


def _slots(selection: dict[str, Any], theme_id: str) -> str:
    marks = [
        slot
        for slot, key in (("light", "themeIdLight"), ("dark", "themeIdDark"))
        if selection.get(key) == theme_id
    ]
    return ", ".join(marks)


@theme_app.command("list")
def list_themes(as_json: bool = JSON_OPT) -> None:
    """List the themes; the selected light and dark themes are marked."""
    with ShellClient() as client:
        items = client.request("GET", "/api/os/themes")
        selection = client.request("GET", "/api/os/theme")
    if as_json:
        print_json(items)
        return
    rows = [
        (
            t["id"],
            t["name"],
            t["tone"],
            t["framework"],
            ", ".join(t["tags"]),
            _slots(selection, t["id"]),
        )
        for t in items
    ]
    print_table(
        f"Themes (mode {selection['colorMode']})",
        ["id", "name", "tone", "framework", "tags", "selected"],
        rows,
    )


def _swatch(value: str) -> Text:
    return Text("    ", style=f"on {value}") if _HEX6.fullmatch(value) else Text("")


@theme_app.command("show")
def show(theme_id: str = typer.Argument(..., metavar="ID"), as_json: bool = JSON_OPT) -> None:
    """Show one theme: its palette and the WCAG contrast of its text."""
    with ShellClient() as client:
        theme = client.request("GET", f"/api/os/themes/{quote(theme_id, safe='')}")
    if as_json:
        print_json(theme)
        return
    console.print(
        f"[bold]{theme['name']}[/bold] ({theme['id']}), {theme['tone']}, {theme['framework']}"
    )
    if theme["description"]:
        console.print(theme["description"])
    palette = theme["palette"]
    print_table("Palette", ["key", "value", ""], [(k, v, _swatch(v)) for k, v in palette.items()])
    contrast = theme["contrast"]
    rows = [(text, *(f"{r:.2f}" for r in ratios.values())) for text, ratios in contrast.items()]
    print_table("WCAG contrast", ["text", *next(iter(contrast.values()))], rows)


@theme_app.command("set")
def set_selection(
    light: str | None = typer.Option(None, "--light", metavar="ID", help="the light slot's theme"),
    dark: str | None = typer.Option(None, "--dark", metavar="ID", help="the dark slot's theme"),
    mode: str | None = typer.Option(None, "--mode", help="auto, light or dark"),
    as_json: bool = JSON_OPT,
) -> None:
    """Change the selection; what is not given stays as it is."""
    body = {
        k: v
        for k, v in (("themeIdLight", light), ("themeIdDark", dark), ("colorMode", mode))
        if v is not None
    }
    if not body:
        fail("give at least one of --light ID, --dark ID, --mode auto|light|dark")
    with ShellClient() as client:
        stored = client.request("POST", "/api/os/themes/select", json=body)
    if as_json:
        print_json(stored)
    else:
        console.print(
            f"theme: light {stored['themeIdLight']}, dark {stored['themeIdDark']}, "
            f"mode {stored['colorMode']}"
        )
