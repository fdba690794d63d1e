"""`atrium service install`: the systemd unit it prints and writes, checked by systemd's own
`systemd-analyze verify` where the machine has it."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_DIR

pytestmark = pytest.mark.integration


def service(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")}
    return subprocess.run(
        [sys.executable, "-m", "atrium", "service", "install", *args],
        env=clean,
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def parse(unit: str) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values]}}`` of a unit file."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        elif line and not line.startswith("#"):
            key, value = line.split("=", 1)
            current.setdefault(key, []).append(value)
    return sections


def test_a_user_unit_runs_this_atrium_on_its_home(tmp_path: Path) -> None:
    home = tmp_path / "a home" / "100%"
    printed = service("--user", "--print", "--home", str(home))
    assert printed.returncode == 0, printed.stderr
    unit = parse(printed.stdout)
    [exec_start] = unit["Service"]["ExecStart"]
    command = shlex.split(exec_start.replace("%%", "%"))
    assert Path(command[0]).is_absolute()
    assert os.access(command[0], os.X_OK)
    assert command[-1] == "serve"
    # the absolute command really is this checkout's atrium
    version = subprocess.run(
        [*command[:-1], "version"], capture_output=True, text=True, check=True, timeout=30
    )
    assert version.stdout.strip()
    assert unit["Service"]["Environment"] == [f'"ATRIUM_HOME={tmp_path}/a home/100%%"']
    assert unit["Service"]["Restart"] == ["on-failure"]
    assert unit["Service"]["KillMode"] == ["mixed"]
    assert unit["Install"]["WantedBy"] == ["default.target"]
    assert "User" not in unit["Service"]

    written = service("--user", "--home", str(home), "--dir", str(tmp_path / "units"))
    assert written.returncode == 0, written.stderr
    path = tmp_path / "units" / "atrium.service"
    assert path.read_text() == printed.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert "systemctl --user daemon-reload && systemctl --user enable --now atrium" in (
        written.stdout
    )
    verify(path)


def test_a_system_unit_names_its_user_and_keeps_what_bubblewrap_needs(tmp_path: Path) -> None:
    written = service("--system", "--dir", str(tmp_path))
    assert written.returncode == 0, written.stderr
    assert "systemctl daemon-reload && systemctl enable --now atrium" in written.stdout
    path = tmp_path / "atrium.service"
    unit = parse(path.read_text())
    assert unit["Service"]["Environment"] == ['"ATRIUM_HOME=/var/lib/atrium"']
    assert unit["Service"]["User"] == ["root"]  # each app then gets a uid of its own
    assert unit["Service"]["NoNewPrivileges"] == ["yes"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    # bubblewrap makes user, pid and mount namespaces for every app
    for breaks_bwrap in ("RestrictNamespaces", "PrivateUsers", "SystemCallFilter"):
        assert breaks_bwrap not in unit["Service"]
    verify(path)
    other = parse(service("--system", "--print", "--run-as", "atrium").stdout)
    assert other["Service"]["User"] == ["atrium"]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("--user", "--system", "--print"), "--user and --system: choose one"),
        (("--run-as", "bob", "--print"), "--run-as is for --system units"),
        (("--print", "--home", "/srv/a\nb"), "line break"),
    ],
)
def test_a_unit_that_cannot_be_right_is_refused(args: tuple[str, ...], problem: str) -> None:
    refused = service(*args)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert problem in refused.stderr
    assert refused.stderr.startswith("atrium service install: ")


def verify(path: Path) -> None:
    """systemd's own check of the unit, where the machine has systemd-analyze."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze (Debian package systemd) is not installed")
    checked = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert checked.returncode == 0, checked.stderr
    assert "atrium.service" not in checked.stderr, checked.stderr  # no warning about it


def test_json_says_what_was_written_and_how_to_enable_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    written = service("--user", "--json", "--home", str(home), "--dir", str(tmp_path / "units"))
    assert written.returncode == 0, written.stderr
    answer = json.loads(written.stdout)
    assert answer["path"] == str(tmp_path / "units" / "atrium.service")
    assert Path(answer["path"]).is_file()
    assert answer["home"] == str(home)
    assert (
        answer["enable"] == "systemctl --user daemon-reload && systemctl --user enable --now atrium"
    )
    printed = json.loads(service("--system", "--print", "--json").stdout)
    assert "[Service]" in printed["unit"]
    assert printed["enable"].startswith("systemctl daemon-reload")
