"""Shared fixtures.

- ``clean_environ`` (autouse): removes ATRIUM_*, proxy and registry-credential variables per test.
- ``apps_src``: the fixture apps folder ``tests/apps``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The shared runner contract asserts with plain ``assert``; its rewrite must be registered here,
# before any test module (the network tests import its probe too) imports it.
pytest.register_assert_rewrite("tests.runner_contract")

#: Debian's PostgreSQL (the ``postgres_server`` fixture), for every test folder
pytest_plugins = ["tests.postgres"]

# A terminal size inherited from the process that started pytest is no test's: a pytest-xdist
# worker was found with COLUMNS=80 and LINES=24 in its environment when it imports the test
# modules, and the CLI's rich console, made when a test module imports it, keeps a width it
# finds then for good, so the tables of every CLI test were cut at 80 columns even where the test
# set COLUMNS itself. Without them the console asks for the width each time it prints.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent
_CLEARED_PREFIXES = ("ATRIUM_", "OS_")
_CLEARED = {
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "DOCKER_CONFIG",
    "REGISTRY_AUTH_FILE",
}


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(_CLEARED_PREFIXES) or name in _CLEARED:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def apps_src() -> Path:
    return TESTS_DIR / "apps"
