"""Rich tables for the CLI, and `--json` output."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title, show_lines=False, header_style="bold")
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    # the first column holds the ids: kept whole on one line (a cut id cannot be pasted into the
    # next command); the other columns fold onto more lines when the terminal is narrow
    first = max((len(c[0]) for c in cells if c), default=0)
    for n, column in enumerate(columns):
        if n == 0:
            width = min(max(first, len(column)), max(console.width - 8, 12))
            table.add_column(column, no_wrap=True, min_width=width, overflow="fold")
        else:
            table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    console.print(table)


def _filter_text(f: dict[str, Any]) -> str:
    parts = [str(f.get("action"))]
    if f.get("dataMime"):
        parts.append("type " + ", ".join(f["dataMime"]))
    if f.get("dataScheme"):
        parts.append("scheme " + ", ".join(f["dataScheme"]))
    if f.get("category"):
        parts.append("category " + ", ".join(f["category"]))
    if f.get("priority"):
        parts.append(f"priority {f['priority']}")
    return "; ".join(parts)


def print_diff(diff: dict[str, Any]) -> None:
    """A permission diff (docs/api.md "Approval") as a table: additions first, in bold."""
    table = Table(
        title=f"{diff['appId']}: {diff['versionFrom'] or 'new install'} → {diff['versionTo']}",
        header_style="bold",
    )
    table.add_column("change")
    table.add_column("what")
    rows: list[tuple[str, str]] = []
    rows += [("[bold]+ tool[/bold]", t) for t in diff["toolsAdded"]]
    rows += [("[bold]+ permission[/bold]", p) for p in diff["permissionsAdded"]]
    if diff["dataProviderAdded"]:
        rows.append(("[bold]+ data provider[/bold]", "serves data to other apps"))
    rows += [("[bold]+ intent filter[/bold]", _filter_text(f)) for f in diff["intentFiltersAdded"]]
    rows += [("- tool", t) for t in diff["toolsRemoved"]]
    rows += [("- permission", p) for p in diff["permissionsRemoved"]]
    if diff["dataProviderRemoved"]:
        rows.append(("- data provider", "no longer serves data"))
    for change, what in rows or [("(none)", "no permission changes")]:
        table.add_row(change, what)
    console.print(table)
