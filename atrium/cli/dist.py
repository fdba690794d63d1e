"""CLI commands of the distribution API: install, preview, update, uninstall, installed, index.

Install and update stream the pipeline's events and draw them with Rich; when the permission diff
needs approval and ``--yes`` is absent, the diff is shown and a y/N prompt decides whether the
request is posted again with ``autoApprove`` (bound to the digest that was shown).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TaskID, TextColumn

from atrium.cli.client import ShellClient, fail
from atrium.cli.render import console, print_diff, print_json, print_table

JSON_OPT = typer.Option(False, "--json", help="print the shell's JSON answer")
YES_OPT = typer.Option(False, "--yes", "-y", help="approve the permission diff without asking")
SCOPE_HELP = "global (default) or user"
#: a per-app command's scope: the app's copy there; by default the visible one
VisibleScope = Annotated[str | None, typer.Option(help="global or user [the visible one]")]


def absolute_ref(ref: str) -> str:
    """``local:<path>`` with the path made absolute (decisions.md "Distribution")."""
    if not ref.startswith("local:"):
        return ref
    path = Path(ref.removeprefix("local:")).expanduser().absolute()
    return f"local:{os.path.normpath(path)}"


def _error_line(event: dict[str, Any]) -> str:
    line = f"{event.get('code')}: {event.get('message')}"
    for problem in event.get("problems") or []:
        if isinstance(problem, dict):
            line += f"\n  - {problem.get('field')}: {problem.get('message')}"
    return line


class _Board:
    """Rich progress lines driven by the pipeline's events."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._stage = progress.add_task("resolving", total=None)
        self._blobs: dict[str, TaskID] = {}

    def show(self, event: dict[str, Any]) -> None:
        kind, update = event["type"], self._progress.update
        if kind == "resolve.start":
            update(self._stage, description=f"resolving {event['ref']}")
        elif kind == "resolve.done":
            resolved = event["resolved"]
            update(self._stage, description=f"{resolved['source']} {resolved['digest'][:19]}")
        elif kind == "fetch.start":
            update(self._stage, description=f"fetching {event['address']}")
        elif kind == "fetch.progress":
            blob = str(event.get("digest", "blob"))
            if blob not in self._blobs:
                self._blobs[blob] = self._progress.add_task(blob[:19], total=event.get("total"))
            update(self._blobs[blob], completed=event.get("done", 0), total=event.get("total"))
        elif kind == "validate.done":
            update(self._stage, description=f"validated {event['appId']} {event['version']}")
        elif kind == "install.start":
            update(self._stage, description=f"installing into {event['scope']}")
        elif kind == "check.start":
            update(self._stage, description=f"trying {event['appId']} {event['version']}")
        elif kind == "rollback.start":
            update(self._stage, description=f"rolling back {event['from']} → {event['to']}")
        elif kind == "install.done":
            update(self._stage, description="installed", total=1, completed=1)


def run_pipeline(client: ShellClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Post ``body``, draw the events, and return the ``result`` event (fails on ``error``)."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        board = _Board(progress)
        for event in client.stream_progress("POST", path, json=body):
            if event["type"] == "error":
                progress.stop()
                fail(_error_line(event))
            if event["type"] == "result":
                return event
            board.show(event)
    return fail("the shell ended the stream without a result")


def print_signature(signature: dict[str, Any] | None) -> None:
    """Who signed what is about to be installed (absent when the scope's policy is off)."""
    if signature is None:
        return
    status = signature["status"]
    line = {
        "signed": f"signed by {signature.get('signer')}",
        "unsigned": "NOT SIGNED",
        "unknown_signer": "signed by a key this scope does not trust",
        "invalid": "its signature does not sign this artifact",
    }.get(status, status)
    if signature.get("signerChanged"):
        line += " (the signer changed since the installed version)"
    console.print(f"Signature: {line}", highlight=False)


def print_image(image: dict[str, Any] | None) -> None:
    """An image app's review (docs/api.md "Image apps"): that it is a container image and
    whose, its size, the folders it keeps, what of the network it may reach."""
    for line in (image or {}).get("words", []):
        console.print(f"{line}.", soft_wrap=True, highlight=False, markup=False)


def ask(question: str) -> bool:
    """A y/N answer; with no one to answer (stdin at its end: a script, a pipe, CI), the
    command ends saying how to approve instead of a bare "Aborted!"."""
    try:
        return typer.confirm(question, default=False)
    except typer.Abort:
        console.print("\nNothing was approved: no answer came (not a terminal?); add --yes.")
        raise typer.Exit(1) from None


def approve_and_run(
    client: ShellClient, path: str, body: dict[str, Any], yes: bool
) -> dict[str, Any]:
    """Run once; when approval is needed, show the diff, ask, and run again approved."""
    result = run_pipeline(client, path, {**body, "autoApprove": yes})
    if not result.get("needsApproval"):
        return result
    print_diff(result["diff"])
    print_image(result.get("image"))
    print_signature(result.get("signature"))
    if not ask("Grant these permissions and install?"):
        console.print("Not installed: the permissions were not approved.")
        raise typer.Exit(1)
    approved = {**body, "autoApprove": True, "approvedDigest": result["resolved"]["digest"]}
    return run_pipeline(client, path, approved)


def install(
    ref: Annotated[str, typer.Argument(help="oci://…, git+https://…, an app id, or local:<dir>")],
    scope: Annotated[str, typer.Option(help=SCOPE_HELP)] = "global",
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Install an app from a registry, a git repository, the index or a local directory."""
    body = {"ref": absolute_ref(ref), "scope": scope}
    with ShellClient() as client:
        if as_json:
            print_json(
                client.request("POST", "/api/dist/install", json={**body, "autoApprove": yes})
            )
            return
        result = approve_and_run(client, "/api/dist/install", body, yes)
    record = result["record"]
    console.print(f"Installed {record['id']} {record['version']} into the {record['scope']} scope")
    if result.get("note"):
        console.print(f"Note: {result['note']}", soft_wrap=True)


def preview(
    ref: Annotated[str, typer.Argument(help="what `atrium install` would install")],
    scope: Annotated[str, typer.Option(help=SCOPE_HELP)] = "global",
    as_json: bool = JSON_OPT,
) -> None:
    """Resolve, fetch and validate without installing; show the permission diff."""
    with ShellClient() as client:
        answer = client.request(
            "POST", "/api/dist/install/preview", json={"ref": absolute_ref(ref), "scope": scope}
        )
    if as_json:
        print_json(answer)
        return
    print_diff(answer["diff"])
    print_image(answer.get("image"))
    if answer.get("note"):
        console.print(f"Note: {answer['note']}", soft_wrap=True)
    needed = "needs your approval" if answer["requiresApproval"] else "needs no approval"
    console.print(f"{answer['resolved']['source']} {answer['resolved']['digest']}: {needed}")


def update(
    app_id: Annotated[str, typer.Argument(help="the installed app's id")],
    yes: bool = YES_OPT,
    check: Annotated[
        bool | None,
        typer.Option(
            "--check/--no-check",
            help="start the new version once before switching [only when the app is running]",
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option("--to", help="take this newer version tag of the app's source (e.g. v2)"),
    ] = None,
    as_json: bool = JSON_OPT,
) -> None:
    """Re-resolve an installed app's ref and install it again if the source changed; a running
    app's new version must start before it replaces the old one. An app pinned to a tag or digest
    lists the newer version tags of its source; --to takes one."""
    path = f"/api/dist/update/{app_id}"
    body: dict[str, Any] = {} if check is None else {"check": check}
    if to is not None:
        body["to"] = to
    with ShellClient() as client:
        if as_json:
            print_json(client.request("POST", path, json={**body, "autoApprove": yes}))
            return
        result = approve_and_run(client, path, body, yes)
    if result.get("upToDate"):
        print_up_to_date(app_id, result)
        return
    record = result["record"]
    if result.get("restored"):
        console.print(
            f"{record['id']} {record['version']} was changed on disk "
            f"({len(result['restored'])} files); installed it again"
        )
        return
    console.print(f"Updated {record['id']} to {record['version']} in the {record['scope']} scope")


def print_up_to_date(app_id: str, result: dict[str, Any]) -> None:
    """Up to date, or pinned: to what, and the newer tags it could take."""
    pinned = result.get("pinned")
    if pinned is None:
        console.print(f"{app_id} is up to date")
        return
    newer = result.get("newerTags") or []
    console.print(f"{app_id} is pinned to {pinned}: it gets no newer version by itself")
    if newer:
        console.print(f"Newer tags of its source: {', '.join(newer)}", highlight=False)
        print(f"  atrium update {app_id} --to {newer[-1]}")
    else:
        console.print("Its source has no newer version tag.")


def history(
    app_id: Annotated[str, typer.Argument(help="the installed app's id")],
    scope: VisibleScope = None,
    as_json: bool = JSON_OPT,
) -> None:
    """The app's versions in a scope: one line per install, update, rollback or uninstall."""
    params = {"scope": scope} if scope else {}
    with ShellClient() as client:
        answer = client.request("GET", f"/api/dist/history/{app_id}", params=params)
    if as_json:
        print_json(answer)
        return
    rows = [
        (
            e["commit"][:12],
            e["when"],
            e["operation"],
            e["version"] or "",
            f"from {e['rollbackOf']}" if e["rollbackOf"] else "",
            e["ref"] or "",
        )
        for e in answer["entries"]
    ]
    columns = ["commit", "when", "operation", "version", "rollback", "ref"]
    print_table(f"{app_id} in the {answer['scope']} scope (now {answer['current']})", columns, rows)


def rollback(
    app_id: Annotated[str, typer.Argument(help="the installed app's id")],
    to: Annotated[
        str | None, typer.Option("--to", help="an earlier version or commit [the previous one]")
    ] = None,
    scope: VisibleScope = None,
    keep_data: Annotated[
        bool, typer.Option("--keep-data", help="keep today's data, not the old version's backup")
    ] = False,
    as_json: bool = JSON_OPT,
) -> None:
    """Put an earlier version back from the scope's history (see `atrium history`), with the data
    it had (its newest backup) unless --keep-data."""
    body: dict[str, Any] = {k: v for k, v in {"to": to, "scope": scope}.items() if v is not None}
    if keep_data:
        body["keepData"] = True
    path = f"/api/dist/rollback/{app_id}"
    with ShellClient() as client:
        if as_json:
            print_json(client.request("POST", path, json=body))
            return
        result = run_pipeline(client, path, body)
    record = result["record"]
    console.print(
        f"Rolled {record['id']} back to {record['version']} (from {record['rollbackOf']}) "
        f"in the {record['scope']} scope"
    )
    if result["stopped"]:
        console.print("Restarted on the old version: " + ", ".join(result["stopped"]))
    if result["dataRestored"]:
        console.print(f"Its data is back as of backup {result['dataRestored']}")
    if result["backup"]:
        console.print(f"Today's data is kept in backup {result['backup']}")


def _backup_rows(backups: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (b["id"], b["version"], b["reason"], b["files"], b["bytes"], b["method"]) for b in backups
    ]


def backup(
    app_id: Annotated[str, typer.Argument(help="the installed app's id")],
    scope: VisibleScope = None,
    as_json: bool = JSON_OPT,
) -> None:
    """Back up the app's runtime data now (its instances stop for the copy)."""
    with ShellClient() as client:
        taken = client.request("POST", f"/api/dist/backups/{app_id}", json={"scope": scope})
    if as_json:
        print_json(taken)
        return
    console.print(f"Backed up {taken['files']} files ({taken['bytes']} bytes) as {taken['id']}")


def backups(
    app_id: Annotated[str, typer.Argument(help="the installed app's id")],
    scope: VisibleScope = None,
    as_json: bool = JSON_OPT,
) -> None:
    """The app's data backups, newest first."""
    params = {"scope": scope} if scope else {}
    with ShellClient() as client:
        items = client.request("GET", f"/api/dist/backups/{app_id}", params=params)
    if as_json:
        print_json(items)
        return
    columns = ["backup", "version", "reason", "files", "bytes", "method"]
    print_table(f"Backups of {app_id}", columns, _backup_rows(items))


def restore(
    app_id: Annotated[str, typer.Argument(help="the installed app's id")],
    backup_id: Annotated[str, typer.Argument(metavar="BACKUP", help="see `atrium backups`")],
    scope: VisibleScope = None,
    as_json: bool = JSON_OPT,
) -> None:
    """Put a backup's data back (today's data is backed up first)."""
    body = {"backup": backup_id, **({"scope": scope} if scope else {})}
    with ShellClient() as client:
        answer = client.request("POST", f"/api/dist/restore/{app_id}", json=body)
    if as_json:
        print_json(answer)
        return
    console.print(f"Restored {app_id}'s data from {answer['restored']['id']}")
    if answer["backup"]:
        console.print(f"The data it replaced is kept in backup {answer['backup']}")


def uninstall(
    app_id: Annotated[str, typer.Argument(help="the installed app's id")],
    scope: VisibleScope = None,
    as_json: bool = JSON_OPT,
) -> None:
    """Remove an app (with its runtime data) from a scope."""
    params = {"scope": scope} if scope else {}
    with ShellClient() as client:
        answer = client.request("DELETE", f"/api/dist/uninstall/{app_id}", params=params)
    if as_json:
        print_json(answer)
        return
    console.print(f"Uninstalled {answer['id']} from the {answer['scope']} scope")
    if answer["unmasked"]:
        console.print(f"{answer['id']} is now visible from the {answer['unmasked']} scope")


def installed(as_json: bool = JSON_OPT) -> None:
    """List install records, with their scope."""
    with ShellClient() as client:
        records = client.request("GET", "/api/dist/installed")
    if as_json:
        print_json(records)
        return
    rows = [
        (
            r["id"],
            r["version"],
            r["scope"],
            r["source"],
            r["ref"],
            f"pinned to {r['pinned']}" if r.get("pinned") else (r["channel"] or "follows"),
            r.get("signedBy") or "",
            r["updatedAt"],
        )
        for r in records
    ]
    columns = ["id", "version", "scope", "source", "ref", "updates", "signed by", "updated"]
    print_table("Installed", columns, rows)


def index(
    refresh: Annotated[bool, typer.Option("--refresh", help="fetch the index again")] = False,
    as_json: bool = JSON_OPT,
) -> None:
    """Show the app index (cached; --refresh fetches it again)."""
    with ShellClient() as client:
        answer = client.request(
            "GET", "/api/dist/index", params={"refresh": "1"} if refresh else {}
        )
    if as_json:
        print_json(answer)
        return
    if answer["url"] is None:
        console.print(
            "No index is configured: ATRIUM_INDEX_URL, `atrium serve --index-url`, or an admin's "
            "PUT /api/dist/index {url}."
        )
        return
    rows = [
        (
            e["id"],
            e["name"],
            (e.get("publisher") or {}).get("name", ""),
            ", ".join(sorted(e.get("channels", {}))),
            ", ".join(sorted(e["sources"])),
        )
        for e in answer["index"]["apps"]
    ]
    print_table("Index", ["id", "name", "publisher", "channels", "sources"], rows)
    stale = " (stale: use --refresh)" if answer["stale"] else ""
    console.print(f"{answer['url']}, fetched {answer['fetchedAt']}{stale}")
    for problem in answer["problems"]:
        console.print(
            f"skipped entry {problem['position']} ({problem['id']}): "
            f"{problem['field']}: {problem['message']}"
        )


def export(
    app_id: Annotated[str, typer.Argument(help="the installed app's id")],
    output: Annotated[Path, typer.Option("--output", "-o", help="the archive to write (.tar.zst)")],
    scope: VisibleScope = None,
    as_json: bool = JSON_OPT,
) -> None:
    """Write one app (tree, install record, runtime data) to a portable archive."""
    params = {"scope": scope} if scope else {}
    with ShellClient() as client:
        size = client.download(f"/api/dist/export/{app_id}", output, params=params)
    if as_json:
        print_json({"appId": app_id, "path": str(output.absolute()), "bytes": size})
        return
    console.print(f"Exported {app_id} to {output} ({size} bytes)", soft_wrap=True)


def _import_run(client: ShellClient, archive: Path, params: dict[str, str]) -> dict[str, Any]:
    with archive.open("rb") as body:
        for event in client.stream_progress(
            "POST", "/api/dist/import", params=params, content=body
        ):
            if event["type"] == "error":
                fail(_error_line(event))
            if event["type"] == "result":
                return event
    return fail("the shell ended the stream without a result")


def import_app(
    archive: Annotated[Path, typer.Argument(help="an archive `atrium export` wrote")],
    scope: Annotated[str, typer.Option(help=SCOPE_HELP)] = "global",
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Install an exported app with its data (on this or another machine)."""
    if not archive.is_file():
        fail(f"{archive} is not a file")
    params = {"scope": scope, **({"autoApprove": "1"} if yes else {})}
    with ShellClient() as client:
        result = _import_run(client, archive, params)
        if result.get("needsApproval"):
            print_diff(result["diff"])
            if not ask("Grant these permissions and import?"):
                console.print("Not imported: the permissions were not approved.")
                raise typer.Exit(1)
            result = _import_run(client, archive, {**params, "autoApprove": "1"})
    if as_json:
        print_json(result)
        return
    record = result["record"]
    console.print(f"Imported {record['id']} {record['version']} into the {record['scope']} scope")
