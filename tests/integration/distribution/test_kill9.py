"""Real `kill -9` of a real `atrium serve` at moments of an update chosen by a clock, not by a fault
point: after a restart the app is at the old or the new version with its runtime data, its record
agrees, and nothing is left in the journal or (unquarantined) staging."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import MakeApp, installed_ok, write_manifest
from tests.integration.distribution.test_crash import (
    APP,
    DEADLINE,
    Served,
    crash,  # noqa: F401
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3])
def test_kill_9_at_any_moment_of_an_update_keeps_old_or_new_with_data(
    delay: float,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],  # noqa: F811
) -> None:
    source = make_app(APP)
    for i in range(300):  # enough files that copying, swapping and committing take a while
        (source / f"file{i}.txt").write_text(f"{i}\n" * 200)
    setup = start_shell(runner="process")
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
    setup.stop()
    scope = home / "scopes/global"
    data = scope / "apps" / APP / f"{APP}-1"
    data.mkdir()
    (data / "data.txt").write_text("precious")
    write_manifest(source, version="2.0.0")

    served = Served(home, system_apps, "")
    crash.append(served)

    def update() -> None:
        try:
            with served.client() as client:
                client.post(f"/api/dist/update/{APP}", json={})
        except httpx.TransportError:
            pass

    thread = threading.Thread(target=update)
    thread.start()
    time.sleep(delay)
    served.proc.send_signal(signal.SIGKILL)
    served.proc.wait(timeout=DEADLINE)
    thread.join(timeout=DEADLINE)

    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE) as api:
        app_dir = scope / "apps" / APP
        version = json.loads((app_dir / "app.manifest.json").read_text())["version"]
        assert version in ("1.0.0", "2.0.0")
        assert (app_dir / f"{APP}-1" / "data.txt").read_text() == "precious"
        record = json.loads((scope / "records" / f"{APP}.json").read_text())
        assert record["version"] == version
        listed = next(a for a in api.get("/api/apps").json() if a["id"] == APP)
        assert listed["version"] == version
        assert list((scope / ".journal").glob("*.json")) == []
        assert list((scope / ".staging").iterdir()) == []
