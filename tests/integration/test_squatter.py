"""Issue 13 row 7: a process that binds an instance's port before the app gets nothing.

The squatter is a real separate process: it watches `GET /api/instances` (as the user, who sees
ports) for the instance, binds its port while the app (`test.fault.slowstart`) still sleeps, and
answers every request like a perfect impostor — `/health` with the right identity, every hook
`{ok: true}` — writing each request's headers to a file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell, wait_for

pytestmark = pytest.mark.integration

SQUATTER = r"""
import json, sys, time, urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

shell, token, app_id, log = sys.argv[1:5]
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    request = urllib.request.Request(shell + "/api/instances",
                                     headers={"Authorization": "Bearer " + token})
    found = [i for i in json.load(urllib.request.urlopen(request))
             if i["appId"] == app_id and i.get("port")]
    if found:
        break
    time.sleep(0.01)
target = found[0]

class Impostor(BaseHTTPRequestHandler):
    def answer(self):
        with open(log, "a") as out:
            out.write(json.dumps({"path": self.path, "headers": dict(self.headers)}) + "\n")
        if self.path == "/health":
            body = {"appId": target["appId"], "instanceId": target["instanceId"], "ok": True}
        else:
            body = {"ok": True}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    do_GET = do_POST = answer
    def log_message(self, *args):
        pass

server = HTTPServer((target.get("host") or "127.0.0.1", target["port"]), Impostor)
print("bound", flush=True)
server.serve_forever()
"""


@pytest.fixture
def squat_shell(start_shell: StartShell, system_apps: Path) -> RunningShell:
    shutil.copytree(
        TESTS_DIR / "apps" / "test.fault.slowstart", system_apps / "test.fault.slowstart"
    )
    # the host's network, where another process may bind the port first (in a network of its
    # own the instance's port is in its namespace, and the shell reaches it at its address)
    return start_shell(app_network_apps="images")


@pytest.fixture
def squatter(
    squat_shell: RunningShell, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    log = tmp_path / "squatter.log"
    script = tmp_path / "squatter.py"
    script.write_text(SQUATTER)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script),
            squat_shell.url,
            squat_shell.token,
            "test.fault.slowstart",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    yield proc, log
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_a_port_squatter_never_receives_the_shell_secret(
    squat_shell: RunningShell, squatter: tuple[subprocess.Popen[str], Path]
) -> None:
    proc, log = squatter
    answers: list[httpx.Response] = []

    def launch() -> None:
        with squat_shell.client(timeout=30) as api:
            answers.append(api.post("/api/instances", json={"appId": "test.fault.slowstart"}))

    launcher = threading.Thread(target=launch)
    launcher.start()
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "bound", "the squatter could not bind the port"
    launcher.join(30)
    assert answers, "the launch did not answer"
    answer = answers[0]
    with squat_shell.client(timeout=30) as api:
        instances: list[dict[str, Any]] = api.get("/api/instances").json()
    state = next(i for i in instances if i["appId"] == "test.fault.slowstart")
    received = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    leaked = [r for r in received if any(k.lower() == "x-os-shell-secret" for k in r["headers"])]
    assert leaked == [], f"the squatter received the secret: {leaked}"
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "spawn_failed"
    assert "not test.fault.slowstart's child" in answer.json()["error"]["message"]
    assert state["state"] == "error"
    wait_for(lambda: proc.poll() is None, "the squatter to keep running (it was never our child)")
