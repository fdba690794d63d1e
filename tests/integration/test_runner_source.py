"""Attacks on `GET /api/runner/source` (what a pod's init container fetches) through a real shell:
an instance's token gets its own app's files, never what lives beside them in the app folder."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import ECHO, RunningShell, StartShell
from tests.integration.instances import new_instance

pytestmark = pytest.mark.integration


@pytest.fixture
def user_echo(start_shell: StartShell, tmp_path: Path) -> RunningShell:
    """A shell with the echo app installed in the admin's user scope, where the admin's
    instances keep their data inside the app folder (`<appId>-<n>`)."""
    source = tmp_path / "sources" / ECHO
    shutil.copytree(TESTS_DIR / "apps" / ECHO, source)
    shell = start_shell()
    with shell.client(timeout=60) as api:
        answer = api.post(
            "/api/dist/install",
            json={"ref": f"local:{source}", "autoApprove": True, "scope": "user"},
        )
        assert answer.status_code == 200, answer.text
    return shell


def test_an_instances_source_holds_no_other_instances_data(user_echo: RunningShell) -> None:
    """Another instance's data folder (and the headless provider's) sits in the app folder for
    the bootstrap admin: the local sandbox covers it, so the source tar must leave it out too."""
    with user_echo.client(timeout=60) as api:
        first, second = new_instance(api), new_instance(api)
    lifecycle = user_echo.shell.lifecycle
    mine, other = lifecycle.find(first), lifecycle.find(second)
    assert mine is not None
    assert other is not None
    assert mine.token is not None
    assert other.data_dir.parent == mine.app_dir  # the layout this attack is about
    (other.data_dir / "diary.txt").write_text("the other instance's secret\n")
    (mine.app_dir / f"{ECHO}-provider").mkdir(exist_ok=True)
    (mine.app_dir / f"{ECHO}-provider" / "lock").write_text("provider\n")
    with user_echo.client(token=mine.token) as app:
        answer = app.get("/api/runner/source")
    assert answer.status_code == 200, answer.text
    with tarfile.open(fileobj=io.BytesIO(answer.content)) as tar:
        names = tar.getnames()
    assert "server.py" in names
    leaked = [n for n in names if n.split("/")[0].startswith(f"{ECHO}-")]
    assert leaked == []
