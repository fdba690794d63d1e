"""The wheel is what `pipx install .` installs: it must carry the host page and the system apps,
run `atrium serve` on its own, and ask for what running needs, not the dev toolchain."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import REPO_DIR
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

#: the test and lint tools (`make test`), which `make run` and `pipx install .` must not bring
DEV_TOOLS = ("pytest", "mypy", "ruff", "playwright", "schemathesis", "hypothesis", "coverage")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel, the way pip and pipx build it (isolated build backend)."""
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO_DIR), "--no-deps", "-q", "-w", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [found] = out.glob("atrium-*.whl")
    return found


def test_the_wheel_asks_for_what_running_needs_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    needs = [
        line.removeprefix("Requires-Dist: ")
        for line in lines
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    ]
    assert any(need.startswith("uvicorn") for need in needs)
    names = {re.split(r"[\[=<>~; ]", need, maxsplit=1)[0].lower() for need in needs}
    assert not names & {*DEV_TOOLS, "pytest-asyncio", "import-linter"}, names


@pytest.fixture
def installed(wheel: Path, tmp_path: Path) -> Path:
    """A fresh virtualenv with the wheel installed: its own `atrium`, the dependencies read
    from the project's virtualenv (a plain path line: its editable checkout is not loaded)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        timeout=120,
    )  # fmt: skip
    site = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "project_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


@pytest.fixture
def served_from_wheel(installed: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ATRIUM_", "PYTHON"))}
    env = {**clean, "ATRIUM_HOME": str(tmp_path / "home"), "ATRIUM_PORT": "0"}
    proc = subprocess.Popen(
        [installed / "bin" / "atrium", "serve"],
        env=env,
        cwd=tmp_path,  # nowhere near the checkout
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        while not any("login?token=" in line for line in lines):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, f"serve ended: {lines}"
            lines.append(line)
        match = re.search(r"(http://\S+)/login\?token=(\S+)", "".join(lines))
        assert match is not None
        yield match.group(1), match.group(2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_the_installed_wheel_serves_the_host_page_and_a_system_app(
    installed: Path, served_from_wheel: tuple[str, str]
) -> None:
    where = subprocess.run(
        [installed / "bin" / "python", "-c", "import atrium; print(atrium.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=installed,
    ).stdout.strip()
    assert where.startswith(str(installed))  # the wheel's copy, not the checkout
    url, token = served_from_wheel
    with httpx.Client(base_url=url, timeout=60, follow_redirects=True) as page:
        host = page.get(f"/login?token={token}")
        assert host.status_code == 200
        assert "<title>Atrium</title>" in host.text
        assert page.get("/static/host.js").status_code == 200
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as api:
        apps = {app["id"] for app in api.get("/api/apps").json()}
        assert {"com.atrium.notes", "com.atrium.console", "com.atrium.viewer"} <= apps
        made = api.post("/api/instances", json={"appId": "com.atrium.notes", "new": True})
        assert made.status_code in {200, 201}, made.text
        instance = made.json()["instanceId"]
        view = api.post(f"/api/instances/{instance}/views", json={"path": "/"}).json()
    parts = urlsplit(view["url"])
    with httpx.Client(base_url=url, headers={"Host": parts.netloc}, timeout=60) as origin:
        entered = origin.get(f"{parts.path}?{parts.query}")
        assert entered.status_code == 303
        cookie = entered.headers["set-cookie"].split(";", 1)[0]
        notes = wait_for(
            lambda: (r := origin.get("/", headers={"Cookie": cookie})).status_code == 200 and r,
            "the notes app's page",
        )
        assert "<html" in notes.text.lower()
