"""`atrium.identity`: the bootstrap token and its link key, and per-instance app tokens."""

from __future__ import annotations

import pytest

from atrium.identity import AppCaller, AppTokens, UserAuth, new_token

TOKEN = "t" * 16
OTHER_TOKEN = "u" * 16


def test_link_key_reveals_nothing_of_the_token() -> None:
    auth = UserAuth(TOKEN)
    assert auth.token == TOKEN
    assert TOKEN not in auth.link_key


def test_link_key_is_deterministic_for_one_token_and_differs_for_another() -> None:
    assert UserAuth(TOKEN).link_key == UserAuth(TOKEN).link_key
    assert UserAuth(TOKEN).link_key != UserAuth(OTHER_TOKEN).link_key


@pytest.mark.parametrize("token", ["", "short", "x" * 15])
def test_short_user_token_is_refused(token: str) -> None:
    with pytest.raises(ValueError, match="at least 16"):
        UserAuth(token)


def test_sixteen_character_token_is_accepted() -> None:
    assert UserAuth("x" * 16).is_token("x" * 16)


def test_is_token_accepts_only_the_token() -> None:
    auth = UserAuth(TOKEN)
    assert auth.is_token(TOKEN)
    assert not auth.is_token(OTHER_TOKEN)
    assert not auth.is_token(TOKEN[:-1])
    assert not auth.is_token(TOKEN + "t")
    assert not auth.is_token("")
    assert not auth.is_token(auth.link_key)
    assert not auth.is_token("é" * 16)


def test_new_token_is_random_and_long_enough_for_user_auth() -> None:
    first, second = new_token(), new_token()
    assert first != second
    assert len(first) >= 32
    UserAuth(first)


# --- app tokens ----------------------------------------------------------------------------------


@pytest.fixture
def tokens() -> AppTokens:
    return AppTokens()


def test_issued_token_looks_up_its_instance(tokens: AppTokens) -> None:
    token = tokens.issue("com.example.notes", "com.example.notes-0", "default")
    assert tokens.lookup(token) == AppCaller("com.example.notes", "com.example.notes-0", "default")


def test_unknown_token_looks_up_nothing(tokens: AppTokens) -> None:
    tokens.issue("com.example.notes", "com.example.notes-0", "default")
    assert tokens.lookup("not-a-token") is None
    assert tokens.lookup("") is None


def test_revoked_token_looks_up_nothing(tokens: AppTokens) -> None:
    token = tokens.issue("com.example.notes", "com.example.notes-0", "default")
    tokens.revoke("com.example.notes-0")
    assert tokens.lookup(token) is None


def test_revoking_an_unknown_instance_is_harmless(tokens: AppTokens) -> None:
    token = tokens.issue("com.example.notes", "com.example.notes-0", "default")
    tokens.revoke("com.example.notes-9")
    tokens.revoke("com.example.notes-0")
    tokens.revoke("com.example.notes-0")
    assert tokens.lookup(token) is None


def test_reissue_for_the_same_instance_revokes_the_old_token(tokens: AppTokens) -> None:
    old = tokens.issue("com.example.notes", "com.example.notes-0", "default")
    new = tokens.issue("com.example.notes", "com.example.notes-0", "default")
    assert new != old
    assert tokens.lookup(old) is None
    assert tokens.lookup(new) == AppCaller("com.example.notes", "com.example.notes-0", "default")
    tokens.revoke("com.example.notes-0")
    assert tokens.lookup(new) is None


def test_each_instance_has_its_own_token(tokens: AppTokens) -> None:
    first = tokens.issue("com.example.notes", "com.example.notes-0", "default")
    second = tokens.issue("com.example.notes", "com.example.notes-1", "default")
    other_app = tokens.issue("com.example.tasks", "com.example.tasks-0", "default")
    assert len({first, second, other_app}) == 3
    tokens.revoke("com.example.notes-0")
    assert tokens.lookup(first) is None
    assert tokens.lookup(second) == AppCaller("com.example.notes", "com.example.notes-1", "default")
    assert tokens.lookup(other_app) == AppCaller(
        "com.example.tasks", "com.example.tasks-0", "default"
    )
