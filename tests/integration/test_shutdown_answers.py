"""A request in flight when `atrium serve` is told to stop still gets an answer in the error shape
(docs/api.md "Errors": `503 shutting_down`), never the server's plain-text `Internal Server
Error`: a real `atrium serve` process, an update held by a version that takes its time to start,
then SIGTERM."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import StartShell, serving, wait_for

pytestmark = pytest.mark.integration
APP = "com.example.slowupdate"
#: the new version sleeps this long before it serves: the update is still in flight at SIGTERM
SLOW_START = """import runpy, time
time.sleep(60)
runpy.run_path("server.py", run_name="__main__")
"""


def write_manifest(source: Path, **fields: Any) -> None:
    manifest = {
        "id": APP,
        "name": "Slow update",
        "version": "1.0.0",
        "entrypoint": ["python3", "server.py"],
        "startTimeoutMs": 5000,
        "hookTimeoutMs": 5000,
        **fields,
    }
    (source / "app.manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], httpx.Client]]:
    """`atrium serve` as a process, with 1.0.0 of APP installed from a local folder; its source
    then holds 2.0.0, which sleeps a minute before it serves."""
    source = tmp_path / "src" / APP
    source.mkdir(parents=True)
    (source / "server.py").write_bytes(
        (TESTS_DIR / "apps/test.plain.stdlib/server.py").read_bytes()
    )
    write_manifest(source)
    with serving(tmp_path / "home") as shell, shell.client(timeout=60) as api:
        installed = api.post(
            "/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True}
        ).json()
        assert installed["ok"] is True, installed
        (source / "slow.py").write_text(SLOW_START)
        write_manifest(
            source, version="2.0.0", entrypoint=["python3", "slow.py"], startTimeoutMs=120_000
        )
        try:
            yield shell.proc, api
        finally:
            if shell.proc.poll() is None:
                shell.proc.kill()
                shell.proc.wait()
            # the log goes to the report when the test fails
            assert shell.proc.stdout is not None
            sys.stderr.write(shell.proc.stdout.read())


def sigterm_while_checking(proc: subprocess.Popen[str], api: httpx.Client) -> None:
    """SIGTERM once the update's trial of 2.0.0 is booting (it will not be done for a minute)."""
    wait_for(
        lambda: any(i["instanceId"] == f"{APP}-check" for i in api.get("/api/instances").json()),
        "the update's check instance",
    )
    proc.send_signal(signal.SIGTERM)


def test_an_update_in_flight_at_sigterm_is_answered_503_shutting_down(
    served: tuple[subprocess.Popen[str], httpx.Client],
) -> None:
    proc, api = served
    answers: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: answers.append(api.post(f"/api/dist/update/{APP}", json={"check": True}))
    )
    waiting.start()
    sigterm_while_checking(proc, api)
    waiting.join(60)
    assert proc.wait(timeout=60) == 0
    [answer] = answers
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == "shutting_down"
    assert "shutting down" in error["message"]


def test_a_progress_stream_in_flight_at_sigterm_ends_with_a_shutting_down_event(
    served: tuple[subprocess.Popen[str], httpx.Client],
) -> None:
    proc, api = served
    events: list[dict[str, Any]] = []
    ended: list[BaseException | None] = []

    def follow() -> None:
        headers = {"Accept": "text/event-stream"}
        try:
            with api.stream(
                "POST", f"/api/dist/update/{APP}", json={"check": True}, headers=headers
            ) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        events.append(json.loads(line[5:]))
            ended.append(None)
        except httpx.HTTPError as err:
            ended.append(err)

    reader = threading.Thread(target=follow)
    reader.start()
    sigterm_while_checking(proc, api)
    reader.join(60)
    assert proc.wait(timeout=60) == 0
    assert ended == [None]  # the stream ended as a stream ends, not cut off
    assert [e["type"] for e in events][-2:] == ["check.start", "error"]
    assert events[-1]["code"] == "shutting_down"


def test_a_data_request_in_flight_at_shutdown_is_answered_503_shutting_down(
    start_shell: StartShell, system_apps: Path
) -> None:
    """The data proxy, served before Starlette, answers the same way."""
    shutil.copytree(TESTS_DIR / "apps/test.plain.stdlib", system_apps / "test.plain.stdlib")
    shell = start_shell()
    answers: list[httpx.Response] = []
    with shell.client(timeout=60) as api:
        plain = api.post("/api/instances", json={"appId": "test.plain.stdlib"}).json()
        api.post(f"/api/instances/{plain['instanceId']}/resumed")
        # the provider answers after 30 s: still in flight when the shutdown grace ends
        waiting = threading.Thread(
            target=lambda: answers.append(
                api.get("/api/data/plain/items/slow", params={"seconds": "30"})
            )
        )
        waiting.start()
        pool = shell.shell.upstream.pool
        wait_for(lambda: sum(pool._active.values()) > 0, "the request forwarded to the provider")
        shell.stop()
        waiting.join(60)
    [answer] = answers
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "shutting_down"
