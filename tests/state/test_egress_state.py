"""The revoked egress survives a restart (a new store on the same database) and a grant clears
it, on both databases."""

from __future__ import annotations

from atrium.state.database import Database
from atrium.state.egress import EgressRevokes


async def test_a_revoke_is_kept_and_a_grant_clears_it(db: Database) -> None:
    store = await EgressRevokes.open(db)
    assert store.get("com.example.web", "") is None
    await store.revoke("com.example.web", "", ("a.example.com:443",), "admin")
    await store.revoke("com.example.web", "ana", True, "ana")
    again = await EgressRevokes.open(db)
    assert again.get("com.example.web", "") == ("a.example.com:443",)
    assert again.get("com.example.web", "ana") is True
    await again.grant("com.example.web", "ana")
    await store.reload("com.example.web", "ana")
    assert store.get("com.example.web", "ana") is None
    assert (await EgressRevokes.open(db)).get("com.example.web", "ana") is None


async def test_a_widened_revoke_is_kept_with_its_new_ask_and_nothing_is_made_revoked(
    db: Database,
) -> None:
    store = await EgressRevokes.open(db)
    await store.revoke("com.example.web", "", ("a.example.com:443",), "admin")
    await store.widen("com.example.web", "", True)
    await store.widen("com.example.other", "", True)  # not revoked: stays granted
    again = await EgressRevokes.open(db)
    assert again.get("com.example.web", "") is True
    assert again.get("com.example.other", "") is None
    assert store.get("com.example.other", "") is None


async def test_a_start_drops_the_revokes_of_users_no_longer_there(db: Database) -> None:
    """Rows an older shell kept after removing their user go at the next start; a shared copy's
    (holder "") stays."""
    store = await EgressRevokes.open(db)
    await store.revoke("com.example.web", "", True, "admin")
    await store.revoke("com.example.web", "gone", True, "gone")
    await store.forget_missing()
    assert store.get("com.example.web", "gone") is None
    assert store.get("com.example.web", "") is True
    again = await EgressRevokes.open(db)
    assert (again.get("com.example.web", "gone"), again.get("com.example.web", "")) == (None, True)
