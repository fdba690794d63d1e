"""CLI commands that talk to the running shell: apps, scopes, kv, events."""

from __future__ import annotations

import json
from typing import Any

import typer

from atrium.cli.client import ShellClient, fail
from atrium.cli.render import console, print_json, print_table

JSON_OPT = typer.Option(False, "--json", help="print the shell's JSON answer")


def apps(as_json: bool = JSON_OPT) -> None:
    """List visible apps (with their scope) and app directories with problems."""
    with ShellClient() as client:
        items = client.request("GET", "/api/apps")
    if as_json:
        print_json(items)
        return
    rows = [
        (
            a["id"],
            a["name"],
            a["version"],
            a["scope"] + (" (dev copy)" if (a.get("record") or {}).get("dev") else ""),
            ", ".join(a["masks"]),
            "; ".join(f"{p['field']}: {p['message']}" for p in a["problems"]) or "ok",
        )
        for a in items
    ]
    print_table("Apps", ["id", "name", "version", "scope", "masks", "status"], rows)


scopes_app = typer.Typer(help="Install scopes: list them, set a scope repository's remote.")


@scopes_app.callback(invoke_without_command=True)
def scopes(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """List the scopes with their app counts and paths."""
    if ctx.invoked_subcommand is not None:
        return
    with ShellClient() as client:
        items = client.request("GET", "/api/scopes")
    if as_json:
        print_json(items)
        return
    rows = [
        (
            s["id"],
            s["priority"],
            "yes" if s["mutable"] else "no",
            s["appCount"],
            s["appsDir"],
            s["remote"] or "",
        )
        for s in items
    ]
    print_table("Scopes", ["scope", "priority", "mutable", "apps", "path", "remote"], rows)


@scopes_app.command("set-remote")
def set_remote(scope: str, url: str, as_json: bool = JSON_OPT) -> None:
    """Store the git remote of the global or user scope repository (nothing is pushed)."""
    with ShellClient() as client:
        answer = client.request("PUT", f"/api/scopes/{scope}/git-repo", json={"url": url})
    if as_json:
        print_json(answer)
    else:
        console.print(f"{answer['scope']} scope remote set to {answer['url']}")


kv_app = typer.Typer(help="The key-value store: ADDRESS is os/<key> or app/<appId>/<key>.")


def _kv_path(address: str) -> str:
    namespace, _, key = address.rpartition("/")
    if namespace != "os" and not (namespace.startswith("app/") and namespace.count("/") == 1):
        fail(f"{address!r} is not a KV address: use os/<key> or app/<appId>/<key>")
    return f"/api/kv/{namespace}/{key}"


@kv_app.command("get")
def kv_get(address: str, as_json: bool = JSON_OPT) -> None:
    """Print a value."""
    with ShellClient() as client:
        entry = client.request("GET", _kv_path(address))
    print_json(entry if as_json else entry["value"])


@kv_app.command("set")
def kv_set(
    address: str,
    value: str,
    as_string: bool = typer.Option(False, "--string", help="store VALUE as a string, not JSON"),
    as_json: bool = JSON_OPT,
) -> None:
    """Store VALUE (JSON; text that is not JSON is stored as a string)."""
    parsed: Any
    if as_string:
        parsed = value
    else:
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
    with ShellClient() as client:
        entry = client.request("PUT", _kv_path(address), json={"value": parsed})
    if as_json:
        print_json(entry)
    else:
        console.print(f"{address} set at {entry['updatedAt']}")


@kv_app.command("rm")
def kv_rm(address: str, as_json: bool = JSON_OPT) -> None:
    """Delete a key."""
    with ShellClient() as client:
        answer = client.request("DELETE", _kv_path(address))
    if as_json:
        print_json(answer)
    else:
        console.print(f"{address} deleted")


def events(
    topics: str = typer.Option("", "--topics", help="comma-separated globs, e.g. 'app:*,kv:**'"),
    limit: int = typer.Option(0, "--limit", help="stop after this many events (0: never)"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per line"),
) -> None:
    """Follow the shell's event bus."""
    params = {"topics": topics} if topics else {}
    seen = 0
    with ShellClient() as client:
        for event_id, topic, payload in client.stream_events("/api/events", params):
            if as_json:
                print(json.dumps({"id": event_id, **payload}), flush=True)
            else:
                body = {k: v for k, v in payload.items() if k != "type"}
                line = json.dumps(body, ensure_ascii=False)
                # one event, one line: the terminal may wrap it, rich must not break it up
                console.print(f"[bold]{topic}[/bold] {line}", soft_wrap=True, markup=True)
            seen += 1
            if limit and seen >= limit:
                return
