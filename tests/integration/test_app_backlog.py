"""An app takes what the shell sends: the shell's pool opens at most `MAX_PER_UPSTREAM`
connections to one instance at once, and every app server Atrium ships (the SDK's, the
templates', the stdlib fixture's) listens with room for all of them at once.

The listen backlog is read from the kernel (`ss -ltn`: a listening socket's Send-Q is its
backlog). A backlog smaller than a burst of new connections is not an error anyone sees: the
kernel drops the connections that do not fit and the client's TCP tries again after 1, 3, 7,
15 s..., so data requests under a burst took up to 30 s or timed out (504).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from atrium.authoring.scaffold import TEMPLATES
from atrium.cli.main import app as cli
from atrium.httppool import MAX_PER_UPSTREAM
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell, wait_for

pytestmark = pytest.mark.integration

CLIENTS = 200
#: generous: no request may fail, however slow the machine (the shell's own limit is 30 s)
CLIENT_TIMEOUT = 90.0


def listen_backlog(instance: dict[str, Any]) -> int:
    """The backlog of the socket ``instance`` listens on at its port, as the kernel holds it,
    read in the instance's network (its own namespace, or the host's)."""
    ss = shutil.which("ss")
    assert ss is not None, "`ss` (Debian package iproute2) is needed to read a listen backlog"
    port, where = instance["port"], f"--net=/proc/{instance['pid']}/ns/net"
    out = subprocess.run(
        ["nsenter", where, ss, "-ltnH", f"sport = :{port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert len(rows) == 1, f"expected one socket listening on port {port}, `ss` says:\n{out}"
    state, _recv_q, send_q, *_ = rows[0]
    assert state == "LISTEN"
    return int(send_q)


def launch(shell: RunningShell, app_id: str) -> dict[str, Any]:
    """Start and resume an instance of ``app_id``; the instance."""
    with shell.client(timeout=60) as api:
        created = api.post("/api/instances", json={"appId": app_id})
        assert created.status_code == 200, created.text
        instance = created.json()
        resumed = api.post(f"/api/instances/{instance['instanceId']}/resumed")
        assert resumed.status_code == 200, resumed.text
        answer: dict[str, Any] = resumed.json()
        return answer


async def burst(shell: RunningShell, path: str) -> list[int | str]:
    """``CLIENTS`` GETs of ``path`` at once, each on its own connection to the shell: the
    status of each, or the name of the error that ended it (a reset, a timeout)."""
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    headers = {"Authorization": f"Bearer {shell.token}"}
    async with httpx.AsyncClient(
        base_url=shell.url, headers=headers, limits=limits, timeout=CLIENT_TIMEOUT
    ) as client:

        async def one() -> int | str:
            try:
                return (await client.get(path)).status_code
            except httpx.HTTPError as err:
                return type(err).__name__

        return list(await asyncio.gather(*(one() for _ in range(CLIENTS))))


def test_a_burst_of_data_requests_to_an_sdk_provider_is_answered_whole(
    start_shell: StartShell, system_apps: Path
) -> None:
    """200 clients ask an SDK provider at once through a shell whose pool is cold: every one
    is answered 200 (none refused, reset, timed out or 5xx), and the app's listen backlog
    holds every connection the pool may open to it at once."""
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", system_apps / "test.sdk.echo")
    shell = start_shell()
    wait_for(lambda: shell.shell.dataproxy.registered("test.sdk.echo"), "the echo provider")
    with shell.client() as api:
        (instance,) = [i for i in api.get("/api/instances").json() if i["appId"] == "test.sdk.echo"]
    statuses = asyncio.run(burst(shell, "/api/data/echo/open/burst"))
    backlog = listen_backlog(instance)
    failed = Counter(status for status in statuses if status != 200)
    assert (dict(failed), backlog >= MAX_PER_UPSTREAM) == ({}, True), (
        f"of {CLIENTS} requests at once, failed: {dict(failed)}; the app listens with a "
        f"backlog of {backlog}, the shell opens up to {MAX_PER_UPSTREAM} connections to it"
    )


def scaffold(system_apps: Path, template: str) -> str:
    """`atrium new` an app of ``template`` into the system apps; its id."""
    app_id = f"com.example.backlog-{template}"
    answer = CliRunner().invoke(
        cli, ["new", app_id, "-t", template, "--dir", str(system_apps), "--json"]
    )
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.output)["path"] == str(system_apps / app_id)
    return app_id


def test_every_app_server_atrium_ships_listens_with_room_for_the_pool(
    start_shell: StartShell, system_apps: Path
) -> None:
    """The templates of `atrium new` (the SDK, stdlib http.server and node) and the stdlib
    fixture: each instance's backlog is at least what the shell may open to it at once."""
    shutil.copytree(TESTS_DIR / "apps" / "test.plain.stdlib", system_apps / "test.plain.stdlib")
    app_ids = ["test.plain.stdlib", *(scaffold(system_apps, t) for t in sorted(TEMPLATES))]
    shell = start_shell()
    backlogs = {app_id: listen_backlog(launch(shell, app_id)) for app_id in app_ids}
    short = {app_id: b for app_id, b in backlogs.items() if b < MAX_PER_UPSTREAM}
    assert not short, f"listen backlogs below the pool's {MAX_PER_UPSTREAM}: {short}"
