"""`atrium audit`: the audit log (an admin's, or one's own records as a member)."""

from __future__ import annotations

from typing import Any

import typer

from atrium.cli.client import ShellClient
from atrium.cli.render import print_json, print_table


def audit(
    since: str | None = typer.Option(
        None, "--since", help="only records at or after this time (ISO 8601)"
    ),
    actor: str | None = typer.Option(
        None, "--actor", help="only this actor: a user id, app:<appId>/<instanceId> or anonymous"
    ),
    action: str | None = typer.Option(
        None, "--action", help="only this action, e.g. kv.put or session.create"
    ),
    limit: int | None = typer.Option(None, "--limit", help="at most this many, newest first"),
    as_json: bool = typer.Option(False, "--json", help="print the shell's JSON answer"),
) -> None:
    """Who changed what, and every sign-in attempt (an admin sees all, a member their own)."""
    params: dict[str, Any] = {
        k: v
        for k, v in {"since": since, "actor": actor, "action": action, "limit": limit}.items()
        if v is not None
    }
    with ShellClient() as client:
        records = client.request("GET", "/api/audit", params=params)
    if as_json:
        print_json(records)
        return
    rows = [
        (
            r["time"],
            r["actor"],
            r["action"],
            r["target"],
            f"{r['outcome']} {r['status']}"
            + (f" {r['error']}" if r["error"] else "")
            + (f" ({r['count']} calls)" if r.get("count", 1) > 1 else ""),
            r["address"],
        )
        for r in records
    ]
    print_table("Audit log", ["time", "actor", "action", "target", "outcome", "address"], rows)
