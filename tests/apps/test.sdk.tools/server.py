"""Fixture `test.sdk.tools`: GET /run?cmd=<name> reports whether <name> can be run."""

from __future__ import annotations

import re
import subprocess

from atrium.sdk import App, HttpError, Request

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
RUN_TIMEOUT_SECONDS = 10

app = App()


def try_run(argv: list[str]) -> int | str:
    """The exit code, or the error that kept the command from running."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=RUN_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{type(err).__name__}: {err}"
    return done.returncode


@app.route("GET", "/run")
def run(request: Request) -> dict[str, int | str]:
    name = request.query.get("cmd", "")
    if not NAME_RE.fullmatch(name):
        raise HttpError(400, f"cmd must be a bare program name, not {name!r}")
    return {
        name: try_run([name, "--version"]),
        f"/usr/bin/{name}": try_run([f"/usr/bin/{name}", "--version"]),
    }


if __name__ == "__main__":
    app.run()
