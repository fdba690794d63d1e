"""`atrium intent resolve|start|defaults|forget`: intents and default handlers, through the
running shell."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from atrium.cli.client import ShellClient, fail
from atrium.cli.render import console, print_json, print_table

intent_app = typer.Typer(
    help="Resolve or start an intent (action, type, uri, category, extras); default handlers."
)

ACTION = Annotated[str, typer.Option("--action", "-a", help="the intent's action")]
TYPE = Annotated[str | None, typer.Option("--type", "-t", help="MIME type")]
URI = Annotated[str | None, typer.Option("--uri", "-u", help="data URI")]
CATEGORY = Annotated[list[str] | None, typer.Option("--category", "-c", help="a category")]
EXTRA = Annotated[list[str] | None, typer.Option("--extra", "-e", help="key=value (repeatable)")]
AS_JSON = Annotated[bool, typer.Option("--json", help="print the shell's JSON answer")]


def _intent(
    action: str,
    mime: str | None,
    uri: str | None,
    categories: list[str] | None,
    extras: list[str] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"action": action}
    if mime:
        body["type"] = mime
    if uri:
        body["uri"] = uri
    if categories:
        body["category"] = categories
    parsed: dict[str, str] = {}
    for item in extras or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--extra {item!r} is not key=value")
        parsed[key] = value
    if parsed:
        body["extras"] = parsed
    return body


def _table(matches: list[dict[str, Any]]) -> None:
    rows = [
        (
            m["appId"],
            m["scope"],
            m["filterIndex"],
            m["score"],
            m["breakdown"]["mime"],
            m["breakdown"]["scheme"],
            m["breakdown"]["categories"],
            m["breakdown"]["priority"],
            "yes" if m.get("default") else "",
        )
        for m in matches
    ]
    print_table(
        "Matches",
        ["app", "scope", "filter", "score", "mime", "scheme", "categories", "priority", "default"],
        rows,
    )
    for m in matches:
        if m.get("default"):
            console.print(m["explanation"])
            if m["newSince"]:
                console.print(
                    "installed since that choice: " + ", ".join(m["newSince"]) + " (choose again "
                    "with `atrium intent start … --target APP --remember`)"
                )


@intent_app.command("resolve")
def resolve(
    action: ACTION,
    mime: TYPE = None,
    uri: URI = None,
    category: CATEGORY = None,
    extra: EXTRA = None,
    as_json: AS_JSON = False,
) -> None:
    """Rank the apps that handle the intent, with each score's breakdown."""
    with ShellClient() as client:
        matches = client.request(
            "POST", "/api/intents/resolve", json=_intent(action, mime, uri, category, extra)
        )
    if as_json:
        print_json(matches)
    elif not matches:
        console.print("no app handles this intent")
    else:
        _table(matches)


@intent_app.command("start")
def start(
    action: ACTION,
    mime: TYPE = None,
    uri: URI = None,
    category: CATEGORY = None,
    extra: EXTRA = None,
    target: Annotated[str | None, typer.Option(help="the app to start on a tie")] = None,
    remember: Annotated[
        bool, typer.Option("--remember", help="use --target from now on for this action and type")
    ] = False,
    as_json: AS_JSON = False,
) -> None:
    """Start the best handler's activity. A tie starts nothing: it lists the candidates and exits
    with status 3; pick one with --target."""
    body = _intent(action, mime, uri, category, extra)
    if remember and not target:
        fail("--remember needs --target: the app to use from now on")
    if target:
        body["target"] = target
    if remember:
        body["remember"] = True
    with ShellClient() as client:
        answer = client.request("POST", "/api/intents/start", json=body)
    if as_json:
        print_json(answer)
        if answer["status"] == "chooser":
            raise typer.Exit(3)
    elif answer["status"] == "chooser":
        console.print("Nothing was started: several apps tie. Choose one with --target:")
        for candidate in answer["candidates"]:
            console.print(f"  {candidate['appId']}  (score {candidate['score']})", soft_wrap=True)
        raise typer.Exit(3)
    else:
        console.print(
            f"{answer['appId']} {answer['instanceId']} activity {answer['activityId']}"
            f" ({answer['title']})"
        )
        print(answer["url"])


@intent_app.command("defaults")
def defaults(as_json: AS_JSON = False) -> None:
    """The default handlers you chose with --remember (or "always use this" in the host page)."""
    with ShellClient() as client:
        items = client.request("GET", "/api/intents/defaults")
    if as_json:
        print_json(items)
    elif not items:
        console.print("no default handlers: every tie opens the chooser")
    else:
        print_table(
            "Default handlers",
            ["action", "type", "app", "since"],
            [(d["action"], d["type"] or "(none)", d["appId"], d["since"]) for d in items],
        )


@intent_app.command("forget")
def forget(action: ACTION, mime: TYPE = None, as_json: AS_JSON = False) -> None:
    """Forget the default handler of ACTION (and --type, when it was chosen for a type)."""
    params = {"action": action, **({"type": mime} if mime else {})}
    with ShellClient() as client:
        answer = client.request("DELETE", "/api/intents/defaults", params=params)
    if as_json:
        print_json(answer)
    else:
        gone = answer["forgotten"]
        console.print(f"forgot {gone['appId']} for {gone['action']} ({gone['type'] or 'no type'})")
