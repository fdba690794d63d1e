"""A bare clone stands alone: clone the repository into an empty folder and run its unit tests there.

Issue 9: the project once read its error table from a folder beside the checkout. This test clones
the repository with nothing next to it and runs `tests/unit` inside the clone, importing the clone's
own `atrium` and `tests` (never the editable install, which points at the checkout under test); a
pytest plugin loaded into that run records where they came from.

A clone sees what is committed (HEAD), not uncommitted edits: on a developer's machine this checks
the last commit; in CI, where the checkout is a fresh clone, it checks the whole tree. git is
required (`make test` installs it): without it the test fails rather than skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.conftest import REPO_DIR

pytestmark = pytest.mark.integration

PROBE_MODULE: Final = "atrium_standalone_probe"
PROBE_OUTPUT: Final = "STANDALONE_PROBE_OUTPUT"
PROBE_SOURCE: Final = f'''"""Records where the run imported `atrium` and `tests` from."""

import json
import os
import sys
from pathlib import Path


def pytest_sessionfinish(session, exitstatus):
    found = {{name: sys.modules[name].__file__ for name in ("atrium", "tests") if name in sys.modules}}
    Path(os.environ["{PROBE_OUTPUT}"]).write_text(json.dumps(found))
'''
#: the unit tier is pure and fast; this bounds a hang, not the expected time
RUN_TIMEOUT: Final = 300


def clean_environment(probe_dir: Path, output: Path) -> dict[str, str]:
    """The current environment with the probe importable and nothing pointing at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONSAFEPATH"}}
    env["PYTHONPATH"] = str(probe_dir)
    env[PROBE_OUTPUT] = str(output)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_a_bare_clone_passes_its_unit_tests_on_its_own(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    clone = tmp_path / "atrium"
    subprocess.run(
        ["git", "clone", "--quiet", str(REPO_DIR), str(clone)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert [p.name for p in tmp_path.iterdir()] == ["atrium"], "the clone must have no neighbours"

    probe_dir = tmp_path_factory.mktemp("probe")
    (probe_dir / f"{PROBE_MODULE}.py").write_text(PROBE_SOURCE)
    output = probe_dir / "imports.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            PROBE_MODULE,
            "tests/unit",
        ],
        cwd=clone,
        env=clean_environment(probe_dir, output),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert run.returncode == 0, (
        f"tests/unit failed in a bare clone of {REPO_DIR} (the clone holds HEAD only: commit first)"
        f"\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    )
    imported = {name: Path(file).resolve() for name, file in json.loads(output.read_text()).items()}
    assert imported == {
        "atrium": clone.resolve() / "atrium" / "__init__.py",
        "tests": clone.resolve() / "tests" / "__init__.py",
    }
