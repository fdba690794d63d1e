"""The client commands answer at once: they never import the server, the web stack or the
distribution code (pinned by what ``python -X importtime`` lists, not by a clock)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.conftest import RunningShell

pytestmark = pytest.mark.integration

#: modules a client command must not load: the server and what only the server needs
FORBIDDEN = (
    "starlette",
    "uvicorn",
    "uvloop",
    "aiohttp",
    "authlib",
    "watchfiles",
    "atrium.api",
    "atrium.shell",
    "atrium.distribution",
    "atrium.authoring",
    # the settings model (pydantic-settings): a client given ATRIUM_URL and a token needs none
    "atrium.settings",
    "pydantic_settings",
)
CLIENT_COMMANDS = (
    ["version"],
    ["ps"],
    ["apps"],
    ["kv", "get", "os/greeting"],
    ["logs", "no-such-instance"],
)


def imported_by(argv: list[str], env: dict[str, str]) -> tuple[set[str], str]:
    """Modules ``python -m atrium <argv>`` imports, and its stderr without the import lines."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "atrium", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    names: set[str] = set()
    other: list[str] = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:"):
            names.add(line.rsplit("|", 1)[1].strip())
        else:
            other.append(line)
    return names, "\n".join(other)


@pytest.mark.parametrize("argv", CLIENT_COMMANDS, ids=lambda a: " ".join(a))
def test_a_client_command_loads_no_server_code(shell: RunningShell, argv: list[str]) -> None:
    env = {"ATRIUM_URL": shell.url, "ATRIUM_TOKEN": shell.token, "PATH": "/usr/bin:/bin"}
    names, stderr = imported_by(argv, env)
    assert "atrium.cli.main" in names
    assert "Traceback" not in stderr, stderr
    loaded = sorted(n for n in names if any(n == f or n.startswith(f"{f}.") for f in FORBIDDEN))
    assert loaded == [], f"atrium {' '.join(argv)} imported {loaded}"


def test_version_loads_no_http_client(shell: RunningShell) -> None:
    """`atrium version` talks to no shell: it loads no HTTP client either (httpx alone was
    about a third of its imports when the CLI's client module imported it at its top)."""
    env = {"ATRIUM_URL": shell.url, "ATRIUM_TOKEN": shell.token, "PATH": "/usr/bin:/bin"}
    names, stderr = imported_by(["version"], env)
    assert "Traceback" not in stderr, stderr
    loaded = sorted(n for n in names if n.split(".")[0] in {"httpx", "httpcore"})
    assert loaded == [], f"atrium version imported {loaded}"
