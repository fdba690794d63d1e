"""Rich tables for the CLI, and `--json` output."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console()


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


#: a word longer than this many cells (a path, a URL) may fold inside its column rather than
#: push every other column off the screen; shorter words are never cut
LONG_WORD: Final = 26

Cell = str | int | float | Text | None


def _text(value: Cell) -> Text:
    """A cell as shown: its text as it is (what a shell or an app wrote is never read as rich
    markup: ``[/x]`` in an app's log would stop the table), or a `Text` the caller styled."""
    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value))


def _widths(headers: Sequence[str], cells: Sequence[Sequence[Text]]) -> tuple[list[int], list[int]]:
    """Per column: the width that shows every cell on one line, and the least width that cuts
    no word (the first column, the ids, is never folded: its least is its whole width)."""
    whole, least = [], []
    for n, header in enumerate(headers):
        lines = [line for row in cells for line in row[n].plain.splitlines()]
        full = max([cell_len(header), *(cell_len(line) for line in lines)])
        longest = max([0, *(cell_len(word) for line in lines for word in line.split())])
        whole.append(full)
        least.append(full if n == 0 else max(cell_len(header), min(longest, LONG_WORD)))
    return whole, least


def print_table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    drop_first: Sequence[str] = (),
    below: Sequence[str] = (),
) -> None:
    """A table that fits the terminal without cutting an id or a word.

    The first column holds the ids: whole, on one line (a cut id cannot be pasted into the next
    command). The others fold their text at spaces onto more lines. When even that does not fit,
    whole columns are left out, those named in ``drop_first`` first, then from the right; a
    column named in ``below`` then shows under the table, one line per row that has a value
    (``<id>: <value>``, wrapped at spaces), and a line names the others (``--json`` has all).
    """
    cells = [[_text(value) for value in row] for row in rows]
    whole, least = _widths(columns, cells)
    room = console.width

    def width_of(kept: list[int]) -> int:  # each column: 1 cell of padding a side, 1 border
        return sum(least[n] + 3 for n in kept) + 1

    kept = list(range(len(columns)))
    order = [columns.index(c) for c in drop_first if c in columns[1:]]
    order += [n for n in reversed(kept) if n not in order and n != 0]
    left_out: list[int] = []
    for n in order:
        if width_of(kept) <= room:
            break
        kept.remove(n)
        left_out.append(n)
    # the room left goes first to the columns that need the least more to sit on one line
    widths = {n: least[n] for n in kept}
    spare = room - width_of(kept)
    for n in sorted(kept, key=lambda n: whole[n] - least[n]):
        extra = max(0, min(whole[n] - least[n], spare))
        widths[n] += extra
        spare -= extra
    table = Table(title=title, show_lines=False, header_style="bold")
    for n in kept:
        table.add_column(columns[n], width=widths[n], no_wrap=n == 0, overflow="fold")
    for row in cells:
        table.add_row(*(row[n] for n in kept))
    console.print(table)
    shown_below = [n for n in left_out if columns[n] in below]
    for n in shown_below:
        for row in cells:
            if row[n].plain:
                console.print(Text.assemble(row[0], f" {columns[n]}: ", row[n]))
    hidden = [columns[n] for n in sorted(left_out) if n not in shown_below]
    if hidden:
        console.print(Text(f"not shown at this width: {', '.join(hidden)} (--json has them)"))


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
    egress = diff.get("egressAdded")
    if egress is not None:
        reach = "the internet" if egress is True else ", ".join(egress)
        rows.append(("[bold]+ network[/bold]", f"can reach {reach}"))
    rows += [("- tool", t) for t in diff["toolsRemoved"]]
    rows += [("- permission", p) for p in diff["permissionsRemoved"]]
    if diff["dataProviderRemoved"]:
        rows.append(("- data provider", "no longer serves data"))
    for change, what in rows or [("(none)", "no permission changes")]:
        table.add_row(change, what)
    console.print(table)
    if not diff["toolsAdded"] and not diff["permissionsAdded"] and egress is None:
        offers = (["a data provider"] if diff["dataProviderAdded"] else []) + [
            f"intent {_filter_text(f)}" for f in diff["intentFiltersAdded"]
        ]
        said = f"; it offers {', '.join(offers)}" if offers else ""
        console.print(f"{diff['appId']} asks for no permissions{said}.", soft_wrap=True)
