"""CLI commands for app authors: new, validate and pack (no shell needed), publish-examples."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape

from atrium.authoring.catalogue import publish_examples as publish_examples_to
from atrium.authoring.scaffold import TEMPLATES, ScaffoldError, create
from atrium.cli.client import ShellClient
from atrium.cli.render import console, print_json, print_table
from atrium.distribution.artifact import app_files, check_artifact_size, write_layer
from atrium.distribution.check import problems_of
from atrium.distribution.ignore import IGNORE_FILE, likely_secret
from atrium.errors import InvalidRequest

JSON_OPT = typer.Option(False, "--json", help="print the result as JSON")
FOLDER = Annotated[Path, typer.Argument(help="the app folder (named after the app id)")]


def new(
    app_id: Annotated[str, typer.Argument(help="the new app's id, such as com.example.hello")],
    template: Annotated[
        str,
        typer.Option(
            "--template",
            "-t",
            help="; ".join(f"{t.name}: {t.summary}" for t in TEMPLATES.values()),
        ),
    ] = "python",
    directory: Annotated[
        Path, typer.Option("--dir", help="where to create the folder <app-id>/")
    ] = Path(),
    as_json: bool = JSON_OPT,
) -> None:
    """Write a working app folder APP_ID/: manifest, server, a themed page, a content provider,
    an intent filter and a test that runs the app against a real shell."""
    try:
        folder = create(directory.absolute(), app_id, template)
    except ScaffoldError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    if as_json:
        print_json({"appId": app_id, "template": template, "path": str(folder), "files": files})
        return
    console.print(f"Created {folder} ({template}): {', '.join(files)}", soft_wrap=True)
    console.print(
        f"Next: atrium dev {folder.name}   (or: atrium validate {folder.name}; "
        f"cd {folder.name} && python -m pytest tests)",
        soft_wrap=True,
    )


def validate(folder: FOLDER, as_json: bool = JSON_OPT) -> None:
    """Every problem an install of FOLDER would refuse, in one list (exit 1 when any)."""
    folder = folder.absolute()
    problems = problems_of(folder)
    if as_json:
        print_json({"folder": str(folder), "ok": not problems, "problems": problems})
        raise typer.Exit(1 if problems else 0)
    if problems:
        print_table(
            f"{folder.name}: {len(problems)} problem{'s' if len(problems) > 1 else ''}",
            ["field", "problem"],
            [(p["field"], p["message"]) for p in problems],
        )
        raise typer.Exit(1)
    console.print(f"{folder.name}: nothing an install would refuse", soft_wrap=True)


def pack(
    folder: FOLDER,
    output: Annotated[Path, typer.Option("--output", "-o", help="the archive (.tar.gz)")],
    as_json: bool = JSON_OPT,
) -> None:
    """Validate FOLDER, then write it as the app layer `atrium publish` pushes (tar+gzip rooted
    at <appId>/, reproducible: fixed times, sorted names)."""
    folder = folder.absolute()
    problems = problems_of(folder)
    if problems:
        for p in problems:
            typer.echo(f"{p['field']}: {p['message']}", err=True)
        typer.echo(f"{folder.name}: not packed ({len(problems)} problems)", err=True)
        raise typer.Exit(1)
    try:
        check_artifact_size(folder, folder.name)
    except InvalidRequest as err:
        typer.echo(f"(files): {err.message}", err=True)
        typer.echo(f"{folder.name}: not packed", err=True)
        raise typer.Exit(1) from err
    shipped = [p for p in app_files(folder, folder.name) if p.is_file() or p.is_symlink()]
    names = [p.relative_to(folder).as_posix() for p in shipped]
    secrets = [n for n, p in zip(names, shipped, strict=True) if _looks_secret(n, p)]
    partial = output.with_name(f".{output.name}.partial")
    with partial.open("wb") as out:
        write_layer(folder, folder.name, out)
    partial.replace(output)
    digest = "sha256:" + hashlib.sha256(output.read_bytes()).hexdigest()
    size = output.stat().st_size
    if as_json:
        print_json(
            {
                "appId": folder.name,
                "path": str(output.absolute()),
                "bytes": size,
                "digest": digest,
                "files": names,
                "likelySecrets": secrets,
            }
        )
        return
    for name in names:
        console.print(f"  {name}", soft_wrap=True, markup=False, highlight=False)
    for name in secrets:
        console.print(
            f"[yellow]warning: {escape(name)} looks like a secret and is shipped; "
            f"list it in {IGNORE_FILE} to leave it out",
            soft_wrap=True,
        )
    console.print(
        f"Packed {folder.name} ({len(names)} files) into {output} ({size} bytes, {digest})",
        soft_wrap=True,
    )


def _looks_secret(name: str, path: Path) -> bool:
    """A secret's name, or a private key in the file's first 64 KiB."""
    try:
        with path.open("rb") as f:
            head = f.read(65536)
    except OSError:
        head = b""
    return likely_secret(name, head)


def run_tests(
    folder: Annotated[Path, typer.Argument(help="the app folder (default: this one)")] = Path(),
    pytest_args: Annotated[
        list[str] | None, typer.Argument(help="passed to pytest, after `--` (`-- -k health`)")
    ] = None,
) -> None:
    """Run FOLDER's tests with pytest under the Python that runs this command: the one Atrium
    (and its SDK and test harness) is installed in, whichever `python` is first on PATH."""
    folder = folder.absolute()
    if not (folder / "app.manifest.json").is_file():
        typer.echo(f"error: {folder} has no app.manifest.json", err=True)
        raise typer.Exit(2)
    argv = [sys.executable, "-m", "pytest", *(pytest_args or [])]
    # the folder's own pytest.ini (the templates carry one) applies from its folder
    code = subprocess.call(argv, cwd=folder)  # noqa: S603 (our interpreter, the author's args)
    raise typer.Exit(code)


def publish_examples(
    output: Annotated[Path, typer.Option("--output", "-o", help="the index file to write")],
    oci: Annotated[
        str | None, typer.Option(help="registry and path prefix, such as 127.0.0.1:5000/examples")
    ] = None,
    git_dir: Annotated[
        Path | None, typer.Option(help="a folder for the bare git repositories (made if missing)")
    ] = None,
    git_url: Annotated[
        str | None, typer.Option(help="where installs fetch that folder, such as git://host/")
    ] = None,
    as_json: bool = JSON_OPT,
) -> None:
    """Publish the example catalogue (three apps, one per template) through the running shell
    and write the index listing them: point ATRIUM_INDEX_URL at it."""
    with ShellClient() as client, tempfile.TemporaryDirectory() as tmp:

        def publish(folder: Path, target: str, tag: str) -> dict[str, Any]:
            body = {"path": str(folder), "to": target, "tag": tag}
            answer: dict[str, Any] = client.request(
                "POST", "/api/dist/publish", json=body, timeout=httpx.Timeout(30.0, read=None)
            )
            if not as_json:
                console.print(f"published {folder.name} to {target} as {tag}", soft_wrap=True)
            return answer

        try:
            index = publish_examples_to(
                publish,
                Path(tmp),
                oci=oci,
                git_dir=git_dir.absolute() if git_dir else None,
                git_url=git_url,
            )
        except ValueError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1) from None
    output.write_text(json.dumps(index, indent=2) + "\n")
    if as_json:
        print_json({"path": str(output.absolute()), "index": index})
        return
    console.print(
        f"Wrote {output} ({len(index['apps'])} apps): ATRIUM_INDEX_URL=file://{output.absolute()}",
        soft_wrap=True,
    )
