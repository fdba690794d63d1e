"""An operation on an app's data still copying when `atrium serve` is told to stop (SIGTERM) ends
whole: the copy is not abandoned to its thread while the operation's staging folder is removed and
the app's lock released under it. A real `atrium serve` process, an app whose data is many small
files (a copy of several seconds, longer than the shutdown grace), SIGTERM in the middle of the
restore's copy, then a restart: the data folder is the backup's or today's, never a mix, and the
waiting client got the error shape."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.distribution.conftest import MakeApp, installed_ok
from tests.integration.distribution.test_crash import DEADLINE, Served

pytestmark = pytest.mark.integration
#: seconds the restore (a copy of FILES files) is given to end after the SIGTERM
LONG = 240
APP = "com.example.bigdata"
#: in one folder: the copy takes seconds, and a removal of it cannot keep up with it
FILES = 40_000


def data_dir(home: Path) -> Path:
    return home / "scopes/global/apps" / APP / f"{APP}-1"


def files_of(folder: Path) -> set[str]:
    return {
        str((Path(at) / name).relative_to(folder))
        for at, _, names in os.walk(folder)
        for name in names
    }


@pytest.mark.timeout(300)
def test_a_restore_copying_at_sigterm_leaves_the_data_whole(
    home: Path, system_apps: Path, make_app: MakeApp
) -> None:
    served = Served(home, system_apps, "")
    try:
        with served.client() as api:
            installed_ok(api, f"local:{make_app(APP)}")
            data = data_dir(home)
            (data / "many").mkdir(parents=True)
            for n in range(FILES):
                (data / "many" / f"f{n}").write_bytes(b"x" * 64)
            (data / "notes.txt").write_text("backed up")
            taken = api.post(f"/api/dist/backups/{APP}")
            assert taken.status_code == 200, taken.text
            (data / "notes.txt").write_text("today")
            (data / "new.txt").write_text("after the backup")
            answers: list[httpx.Response] = []
            restoring = threading.Thread(
                target=lambda: answers.append(
                    api.post(
                        f"/api/dist/restore/{APP}",
                        json={"backup": taken.json()["id"]},
                        timeout=LONG,
                    )
                )
            )
            restoring.start()  # a restore waits for its copy: long on a busy machine
            staging = home / "scopes/global/.staging"
            deadline = time.monotonic() + DEADLINE
            while not any(staging.glob(f"*/{APP}-1")):  # the restore is copying the backup
                assert time.monotonic() < deadline, "the restore never copied"
                time.sleep(0.01)
            served.proc.send_signal(signal.SIGTERM)
            restoring.join(LONG)
        assert served.proc.wait(timeout=LONG) == 0
        [answer] = answers
        assert answer.headers["content-type"] == "application/json", answer.text
        assert answer.status_code in {200, 503}, answer.text
    finally:
        served.close()
    before = {f"many/f{n}" for n in range(FILES)} | {"notes.txt"}
    found = files_of(data_dir(home))
    notes = (data_dir(home) / "notes.txt").read_text()
    if notes == "backed up":
        assert found == before
    else:
        assert (notes, found) == ("today", before | {"new.txt"})
    served = Served(home, system_apps, "")
    served.close()
    assert files_of(data_dir(home)) == found
    assert not any((home / "scopes/global/.staging").iterdir())
