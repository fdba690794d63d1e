"""CLI commands for instances and the toolchain: ps, launch, stop, destroy, logs, tools."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from atrium.cli.client import ShellClient
from atrium.cli.render import console, print_json, print_table

JSON_OPT = typer.Option(False, "--json", help="print the shell's JSON answer")
CHIPS = {"themed": "own palette", "override": "own look"}


def _uptime(started: str | None) -> str:
    if not started:
        return ""
    since = datetime.fromisoformat(started.replace("Z", "+00:00"))
    seconds = int((datetime.now(UTC) - since).total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _role(instance: dict[str, Any]) -> str:
    """What the instance is for: a view instance (blank), warm pool, or a woken provider."""
    wake = instance.get("wake")
    if wake is not None:
        took = "booting" if wake["wakeMs"] is None else f"woke in {wake['wakeMs']:.0f} ms"
        return f"provider (wake #{wake['wakes']}), {took}, {wake['requests']} req"
    return "warm pool" if instance.get("pooled") else ""


def _memory(instance: dict[str, Any], figures: dict[str, Any] | None) -> str:
    """``12.3 MiB of 64 MiB``: what it holds now beside its limit (blank until the shell has
    figures for it)."""
    if figures is None:
        return ""
    held = f"{figures['memoryBytes'] / (1 << 20):.1f} MiB"
    limit = (instance.get("limits") or {}).get("memoryMiB")
    return held if limit is None else f"{held} of {limit} MiB"


def _cpu(figures: dict[str, Any] | None) -> str:
    return "" if figures is None else f"{figures['cpuPercent']:.1f} %"


def ps(as_json: bool = JSON_OPT) -> None:
    """Instances with state, port, scope, uptime, memory (of its limit) and CPU, role (warm
    pool, woken provider), and a THEMED/OVERRIDE chip."""
    with ShellClient() as client:
        items = client.request("GET", "/api/instances")
        if as_json:
            print_json(items)
            return
        usage = client.request("GET", "/api/system/usage")
    figures = {u["instanceId"]: u for u in usage.get("instances", [])}
    rows = [
        (
            i["instanceId"],
            i["state"],
            i["port"],
            i["scope"],
            _uptime(i["startedAt"]),
            _memory(i, figures.get(i["instanceId"])),
            _cpu(figures.get(i["instanceId"])),
            i["views"],
            _role(i),
            CHIPS.get(i["themeStrategy"], ""),
            i["error"] or "",
        )
        for i in items
    ]
    print_table(
        "Instances",
        [
            "instance",
            "state",
            "port",
            "scope",
            "uptime",
            "memory",
            "cpu",
            "views",
            "role",
            "theme",
            "error",
        ],
        rows,
        # in a narrow terminal: an error is shown whole under the table, then the columns that
        # say least go first; the id and its state stay
        drop_first=["error", "theme", "views", "cpu", "uptime", "scope", "port", "memory", "role"],
        below=["error"],
    )


def launch(
    app_id: str,
    new: Annotated[bool, typer.Option("--new", help="a new instance, not the live one")] = False,
    as_json: bool = JSON_OPT,
) -> None:
    """Start (or reuse) an instance of APP_ID, resume it, and print a view URL for a browser.

    No host page will report the view as loaded and focused, so the CLI walks the instance to
    `resumed` itself (a headless resume): its content provider, if any, starts answering.
    """
    with ShellClient() as client:
        instance = client.request("POST", "/api/instances", json={"appId": app_id, "new": new})
        if instance["state"] in {"started", "paused", "resuming"}:
            instance = client.request("POST", f"/api/instances/{instance['instanceId']}/resumed")
        view = client.request(
            "POST", f"/api/instances/{instance['instanceId']}/views", json={"path": "/"}
        )
    if as_json:
        print_json({"instance": instance, "view": view})
        return
    console.print(f"{instance['instanceId']} {instance['state']} on port {instance['port']}")
    print(view["url"])


def _action(instance_id: str, action: str, as_json: bool) -> None:
    with ShellClient() as client:
        answer: Any = client.request("POST", f"/api/instances/{instance_id}/{action}")
    if as_json:
        print_json(answer)
    else:
        console.print(f"{answer['instanceId']} {answer['state']}")


def stop(instance_id: str, as_json: bool = JSON_OPT) -> None:
    """Stop an instance (its server stays up)."""
    _action(instance_id, "stop", as_json)


def destroy(
    instance_id: str,
    force: Annotated[bool, typer.Option("--force", help="kill without hooks")] = False,
    as_json: bool = JSON_OPT,
) -> None:
    """Walk an instance back to installed: hooks, then the child is killed and its port freed."""
    with ShellClient() as client:
        answer = client.request(
            "DELETE", f"/api/instances/{instance_id}", params={"force": "1"} if force else None
        )
    if as_json:
        print_json(answer)
    else:
        app_id = str(answer["instanceId"]).rsplit("-", 1)[0]
        console.print(
            f"{answer['instanceId']} stopped and destroyed; its runtime data is kept "
            f"(`atrium launch {app_id}` starts it again)",
            soft_wrap=True,
        )
        if answer.get("problem"):
            console.print(f"(without its hooks: {answer['problem']})", soft_wrap=True)


def logs(
    instance_id: str,
    lines: Annotated[int, typer.Option("--lines", "-n", help="how many lines")] = 200,
    as_json: bool = JSON_OPT,
) -> None:
    """Print the end of an instance's log (its stdout and stderr)."""
    with ShellClient() as client:
        text = client.request_text(
            "GET", f"/api/instances/{instance_id}/logs", params={"lines": str(lines)}
        )
    if as_json:
        print_json({"instanceId": instance_id, "lines": text.splitlines()})
        return
    if not text:
        typer.echo(
            f"(the log of {instance_id} is empty: the app has written nothing to stdout or "
            "stderr yet)",
            err=True,
        )
    print(text, end="")


tools_app = typer.Typer(help="The shared toolchain: binaries apps may declare in `tools`.")


@tools_app.command("list")
def tools_list(as_json: bool = JSON_OPT) -> None:
    """List the toolchain."""
    with ShellClient() as client:
        items = client.request("GET", "/api/tools")
    if as_json:
        print_json(items)
    else:
        print_table("Toolchain", ["tool", "path"], [(t["name"], t["path"]) for t in items])


@tools_app.command("add")
def tools_add(
    name: str,
    path: Annotated[str | None, typer.Option(help="the binary (default: NAME on PATH)")] = None,
    as_json: bool = JSON_OPT,
) -> None:
    """Expose a host binary to apps that declare it."""
    with ShellClient() as client:
        entry = client.request("PUT", f"/api/tools/{name}", json={"path": path} if path else None)
    if as_json:
        print_json(entry)
        return
    console.print(f"{entry['name']} → {entry['path']}", soft_wrap=True)


@tools_app.command("rm")
def tools_rm(name: str, as_json: bool = JSON_OPT) -> None:
    """Remove a tool from the toolchain."""
    with ShellClient() as client:
        answer = client.request("DELETE", f"/api/tools/{name}")
    if as_json:
        print_json(answer)
        return
    console.print(f"{name} removed from the toolchain")
