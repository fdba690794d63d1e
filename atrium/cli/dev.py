"""`atrium dev <folder>`: run an app folder against the running shell while it is edited.

The folder becomes a dev copy in the user scope (`POST /api/dist/install` with `dev: true`):
installed as it is on disk, marked as a dev copy wherever apps are listed, its permissions
granted without asking (the author's own app). What it may reach (`network.egress`) is asked like
an install's: a save that asks to reach more is put to the author in the terminal (y/N), and
without a terminal to answer on it is not reloaded. Every save is validated first; a valid folder is
installed again, which restarts the app's running instance on the new files under the same id; a
folder with problems keeps the last good version running and lists what is wrong, in the terminal
and over the author's open tab (`dev:failed`). It prints the host page's address that opens the
app; a save reloads that tab in place (`dev:reloaded`). The instance's log is followed throughout.
Ctrl-C uninstalls the dev copy, its data and its backups.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import watchfiles
from rich.markup import escape

from atrium.cli.client import ShellClient, describe_error
from atrium.cli.render import console
from atrium.distribution.check import problems_of
from atrium.distribution.ignore import IGNORE_FILE
from atrium.distribution.tree import ignore_rule

#: quiet time after the last change before a sync (an editor writes a file in several steps)
STEP_MS = 30
#: how often the log is read when nothing changes
LOG_POLL_MS = 250


class DevSession:
    """One `atrium dev` run: the dev copy, its instance, and the log read so far."""

    def __init__(self, client: ShellClient, folder: Path) -> None:
        self.client = client
        self.folder = folder
        self.app_id = folder.name
        self.instance_id: str | None = None
        self.installed = False
        self.log_offset = 0
        self.shown_problems: list[dict[str, str]] | None = None
        #: where the shell runs the dev copy from: its log names files there
        self.installed_dir: str | None = None
        #: puts a question to the author (y/N); None: no one to ask (no terminal)
        self.ask: Callable[[str], bool] | None = ask_in_terminal if sys.stdin.isatty() else None

    def authors_paths(self, text: str) -> str:
        """``text`` naming the author's folder instead of the installed copy the app runs
        from, so a traceback points at the file to edit."""
        if self.installed_dir is None:
            return text
        return text.replace(f"{self.installed_dir}/", f"{self.folder}/")

    def sync(self) -> bool:
        """Validate, then install and (re)start; False when the folder has problems or the
        shell refused it (the last good version keeps running)."""
        problems = problems_of(self.folder)
        if problems:
            if problems != self.shown_problems:
                console.print(f"[yellow]{self.app_id}: {len(problems)} problem(s), not reloaded:")
                for p in problems:
                    console.print(f"  [yellow]{p['field']}: {p['message']}", soft_wrap=True)
                self.report("\n".join(f"{p['field']}: {p['message']}" for p in problems))
            self.shown_problems = problems
            return False
        self.shown_problems = None
        started = time.monotonic()
        body = {
            "ref": f"local:{self.folder}",
            "scope": "user",
            "autoApprove": True,
            "dev": True,
        }
        answer = self.client.send("POST", "/api/dist/install", json=body)
        if answer.status_code >= 400:
            console.print(f"[red]{self.app_id}: not installed: {describe_error(answer)}")
            if answer.json().get("error", {}).get("code") == "not_a_dev_copy":
                self.installed = False  # what is there now is not ours to remove
                raise typer.Exit(1)
            self.report(f"not installed: {describe_error(answer)}")
            return False
        result = answer.json()
        if result.get("needsApproval"):
            result = self.approve(body, result)
            if result is None:
                return False
        if not result.get("ok"):
            console.print(f"[red]{self.app_id}: not installed: {result}")
            return False
        first = not self.installed
        self.installed = True
        if self.installed_dir is None:
            listed = self.client.send("GET", f"/api/apps/{self.app_id}")
            if listed.status_code == 200:
                self.installed_dir = str(listed.json().get("path") or "").rstrip("/") or None
        instance = self.ensure_running()
        took = (time.monotonic() - started) * 1000
        verb = "installed as a dev copy" if first else "reloaded"
        if instance is not None:
            console.print(
                f"[green]{self.app_id} {result['record']['version']} {verb} in {took:.0f} ms: "
                f"{instance['instanceId']} {instance['state']}",
                soft_wrap=True,
            )
        return instance is not None

    def approve(self, body: dict[str, Any], result: dict[str, Any]) -> dict[str, Any] | None:
        """A save the shell holds for an answer (it asks to reach more: `network.egress`): asked
        in the terminal and sent again approved, or not reloaded (None)."""
        reach = (result.get("egress") or {}).get("words") or "more than before"
        question = f"{self.app_id} now asks: {reach}. Allow it?"
        if self.ask is None or not self.ask(question):
            why = (
                f"not reloaded: the save asks: {reach} (network.egress), which is approved like "
                "an install's; answer y when atrium dev asks (in a terminal), or remove it"
            )
            console.print(f"[red]{self.app_id}: {why}", soft_wrap=True)
            self.report(why)
            return None
        approved = {**body, "approve": True, "approvedDigest": result["resolved"]["digest"]}
        answer = self.client.send("POST", "/api/dist/install", json=approved)
        if answer.status_code >= 400:
            console.print(f"[red]{self.app_id}: not installed: {describe_error(answer)}")
            self.report(f"not installed: {describe_error(answer)}")
            return None
        answered: dict[str, Any] = answer.json()
        return answered

    def report(self, message: str) -> None:
        """Show ``message`` on the author's open tabs of the app, over its last good version
        (`dev:failed`); nothing to show it on before the first install."""
        if self.installed:
            self.client.send(
                "POST", f"/api/dist/dev/{self.app_id}/problems", json={"message": message[:4000]}
            )

    def ensure_running(self) -> dict[str, Any] | None:
        """The app's instance, started (or retried after a failed start); None when it failed."""
        if self.instance_id is not None:
            current = self.client.send("GET", f"/api/instances/{self.instance_id}")
            if current.status_code == 200 and current.json()["state"] == "error":
                retried = self.client.send("POST", f"/api/instances/{self.instance_id}/retry")
                return self._started(retried)
            if current.status_code == 200 and current.json()["state"] in {
                "started",
                "resuming",
                "resumed",
                "pausing",
                "paused",
            }:
                return dict(current.json())
        return self._started(
            self.client.send("POST", "/api/instances", json={"appId": self.app_id})
        )

    def _started(self, answer: httpx.Response) -> dict[str, Any] | None:
        if answer.status_code >= 400:
            self.follow_log()
            console.print(
                f"[red]{self.app_id} did not start: "
                f"{escape(self.authors_paths(describe_error(answer)))}",
                soft_wrap=True,
            )
            return None
        instance: dict[str, Any] = answer.json()
        if instance["instanceId"] != self.instance_id:
            self.instance_id = instance["instanceId"]
            self.log_offset = 0
        return instance

    def follow_log(self) -> None:
        """Print what the instance wrote since the last call."""
        if self.instance_id is None:
            return
        answer = self.client.send(
            "GET", f"/api/instances/{self.instance_id}/logs", params={"after": self.log_offset}
        )
        if answer.status_code != 200:
            return
        self.log_offset = int(answer.headers.get("X-Log-End", self.log_offset))
        for line in answer.text.splitlines():
            console.print(
                f"{self.instance_id} | {self.authors_paths(line)}",
                soft_wrap=True,
                markup=False,
                highlight=False,
            )

    def remove(self) -> None:
        """Uninstall the dev copy (its instances, data and backups go with it)."""
        if not self.installed:
            return
        answer = self.client.send(
            "DELETE",
            f"/api/dist/uninstall/{self.app_id}",
            params={"scope": "user", "devOnly": "1"},  # an install made over it meanwhile stays
        )
        if answer.status_code >= 400:
            console.print(
                f"[red]{self.app_id}: the dev copy was not removed: {describe_error(answer)}"
            )
            return
        console.print(f"{self.app_id}: the dev copy was removed")


class Unignored(watchfiles.DefaultFilter):
    """watchfiles' defaults, and what the folder's `.atriumignore` (over the defaults of
    `atrium.distribution.ignore`) leaves out: a test cache or an editor's swap file is no reason
    to reload. The rule is read again when `.atriumignore` itself changes."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.rule = ignore_rule(folder)

    def __call__(self, change: watchfiles.Change, path: str) -> bool:
        if not super().__call__(change, path):
            return False
        relative = Path(path).relative_to(self.folder).as_posix()
        if relative == IGNORE_FILE:
            self.rule = ignore_rule(self.folder)
            return True
        parts = relative.split("/")
        # a path is out when it or a folder above it is (a file inside `node_modules/`)
        return not any(
            self.rule.ignores("/".join(parts[: i + 1]), i < len(parts) - 1 or Path(path).is_dir())
            for i in range(len(parts))
        )


def ask_in_terminal(question: str) -> bool:
    """A y/N answer in the terminal; no answer (stdin at its end) is no."""
    try:
        return typer.confirm(question, default=False)
    except typer.Abort:
        return False


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def dev(
    folder: Annotated[Path, typer.Argument(help="the app folder (named after the app id)")],
) -> None:
    """Run FOLDER as a dev copy in the user scope of the running shell: reload on every save,
    follow its log, show validation problems; Ctrl-C removes it and leaves nothing behind."""
    folder = folder.absolute()
    if not (folder / "app.manifest.json").is_file():
        typer.echo(f"error: {folder} has no app.manifest.json", err=True)
        raise typer.Exit(1)
    with ShellClient() as client:
        client.request("GET", "/api/version")  # fails with a clear line when no shell runs
        session = DevSession(client, folder)
        # a terminal closed or a `kill` ends the session like Ctrl-C: the dev copy goes. SIGINT
        # is set too: started from a background job (`atrium dev … &`, then `fg`) it arrives
        # ignored, and Python keeps an inherited "ignore" rather than installing its own handler
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)
        try:
            session.sync()
            console.print(f"Open {client.url}/#app={session.app_id}", soft_wrap=True)
            console.print(f"Watching {folder} (Ctrl-C stops and removes the dev copy)")
            for changes in watchfiles.watch(
                folder,
                step=STEP_MS,
                rust_timeout=LOG_POLL_MS,
                yield_on_timeout=True,
                raise_interrupt=True,
                watch_filter=Unignored(folder),
            ):
                if changes:
                    session.sync()
                session.follow_log()
        except KeyboardInterrupt:
            console.print("")
        finally:
            session.remove()
