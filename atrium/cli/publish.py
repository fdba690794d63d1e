"""`atrium publish <dir> --to <target> --tag <tag>`: publish through the running shell, show progress."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer

from atrium.cli.client import ShellClient, fail
from atrium.cli.render import console, print_json

SCHEMES = ("oci://", "git://", "git+https://", "git+file://", "file://", "https://")


def absolute_target(to: str) -> str:
    """A target that names a local path is made absolute (the shell does not share our cwd)."""
    if to.startswith(SCHEMES) or to.startswith("/"):
        return to
    if to.startswith(("./", "../", "~")) or Path(to).expanduser().exists():
        return str(Path(to).expanduser().resolve())
    return to


def publish(
    directory: Annotated[Path, typer.Argument(help="the app directory (its name is the app id)")],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="oci://host/repo or host/repo (OCI), or a git repository: git://…, "
            "git+https://…, git+file://…, a path",
        ),
    ],
    tag: Annotated[str, typer.Option("--tag", help="the tag to publish under")],
    as_json: Annotated[bool, typer.Option("--json", help="print the shell's JSON answer")] = False,
    sign: Annotated[
        Path | None,
        typer.Option(
            "--sign",
            help="the private key to sign with (`atrium keygen`): a cosign-style signature "
            "beside an OCI artifact, an SSH-signed git tag",
        ),
    ] = None,
) -> None:
    """Publish the app in DIRECTORY to a git repository or an OCI registry under TAG."""
    body = {"path": str(directory.expanduser().resolve()), "to": absolute_target(to), "tag": tag}
    if sign is not None:
        body["sign"] = str(sign.expanduser().resolve())
    with ShellClient() as client:
        if as_json:
            answer = client.request(
                "POST", "/api/dist/publish", json=body, timeout=client.unhurried
            )
            print_json(answer)
            return
        _render(client.stream_progress("POST", "/api/dist/publish", json=body))


def _render(events: Iterable[dict[str, Any]]) -> None:
    for event in events:
        if event["type"] == "publish.progress":
            console.print(f"  {event['message']}", highlight=False)
        elif event["type"] == "publish.done":
            console.print(f"published {event['id']} {event['version']} to {event['ref']}")
            follow = event.get("followCommand")
            if follow and follow != event["installCommand"]:
                console.print("install it following updates (each publish arrives) with:")
                print(f"  {follow}")
                console.print("or pinned to this version (`atrium update` lists newer tags):")
                print(f"  {event['installCommand']}")
                return
            console.print("install it with:")
            print(f"  {event['installCommand']}")
            return
        elif event["type"] == "error":
            fail(f"{event['code']}: {event['message']}")
    fail("the shell ended the publish stream without a result")
