"""The key of the shared database: one random value, made by its migration, that every shell
of that database reads at start. It labels what those shells share outside the database, so
that they tell their own from another deployment's: a data claim in a Kubernetes namespace is
the user's data on every shell of the database (any of them mounts it), never a claim another
database's shell made under the same name (docs/decisions.md "Several shells: a user's data
claim is every shell's")."""

from __future__ import annotations

import sqlalchemy as sa

from atrium.state.database import Database
from atrium.state.schema import state_key


async def read_key(db: Database) -> str:
    """The database's key (its migration made it)."""
    async with db.connect() as conn:
        found = (await conn.execute(sa.select(state_key.c.key))).scalar_one()
    return str(found)
