"""The state tests run on both databases: ``database_url`` is parametrised over SQLite (a file
in the test's folder) and PostgreSQL (a fresh database on the session's server, `tests.postgres`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from atrium.state.database import Database
from atrium.state.migrate import upgrade
from tests.postgres import new_database


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'state.sqlite3'}"
    return new_database(request.getfixturevalue("postgres_server"))


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    """An open database, migrated to this shell's schema."""
    async with Database.open(database_url) as opened:
        await upgrade(opened)
        yield opened
