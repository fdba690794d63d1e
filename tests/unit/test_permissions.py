"""`atrium.permissions`: permission shapes, verbatim grants, and what a KV operation needs."""

from __future__ import annotations

import pytest

from atrium.permissions import (
    KV_KEY_RE,
    Verb,
    holds,
    kv_app_permission,
    kv_os_permission,
    kv_permission_needed,
    provider_permission,
)

NOTES = "com.example.notes"
TASKS = "com.example.tasks"


@pytest.mark.parametrize(("verb", "text"), [(Verb.READ, "read"), (Verb.WRITE, "write")])
def test_verbs_are_read_and_write(verb: Verb, text: str) -> None:
    assert verb == text
    assert str(verb) == text


@pytest.mark.parametrize(
    ("permission", "expected"),
    [
        (provider_permission(NOTES, Verb.READ), "com.example.notes.read"),
        (provider_permission(NOTES, Verb.WRITE), "com.example.notes.write"),
        (kv_os_permission("theme", Verb.READ), "system.kv.os.theme.read"),
        (kv_os_permission("theme", Verb.WRITE), "system.kv.os.theme.write"),
        (
            kv_app_permission(NOTES, "drafts", Verb.READ),
            "system.kv.app.com.example.notes.drafts.read",
        ),
        (
            kv_app_permission(NOTES, "drafts", Verb.WRITE),
            "system.kv.app.com.example.notes.drafts.write",
        ),
    ],
)
def test_permission_shapes_follow_the_spec_table(permission: str, expected: str) -> None:
    assert permission == expected


# --- holds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("granted", [[], ["com.example.notes.read"], set(), ("x",)])
def test_null_permission_is_open_to_anyone(granted: list[str] | set[str] | tuple[str]) -> None:
    assert holds(granted, None) is True


@pytest.mark.parametrize(
    ("granted", "permission", "expected"),
    [
        (["com.example.notes.read"], "com.example.notes.read", True),
        (["a.b.c", "com.example.notes.write"], "com.example.notes.write", True),
        ([], "com.example.notes.read", False),
        (["com.example.notes.write"], "com.example.notes.read", False),
        (["com.example.notes.read"], "com.example.notes.write", False),
        # verbatim only: no case folding, no prefixes, no wildcards, no whitespace trimming
        (["COM.EXAMPLE.NOTES.READ"], "com.example.notes.read", False),
        (["com.example.notes"], "com.example.notes.read", False),
        (["com.example.notes.read.all"], "com.example.notes.read", False),
        (["com.example.notes.*"], "com.example.notes.read", False),
        (["*"], "com.example.notes.read", False),
        ([" com.example.notes.read"], "com.example.notes.read", False),
        (["system.kv.os.*.read"], "system.kv.os.theme.read", False),
        ([""], "", True),
    ],
)
def test_holds_requires_a_verbatim_grant(
    granted: list[str], permission: str, expected: bool
) -> None:
    assert holds(granted, permission) is expected
    assert holds(frozenset(granted), permission) is expected


# --- kv_permission_needed ----------------------------------------------------------------------


@pytest.mark.parametrize("verb", list(Verb))
def test_own_kv_namespace_needs_no_permission(verb: Verb) -> None:
    assert kv_permission_needed(NOTES, f"app/{NOTES}", "drafts", verb) is None


@pytest.mark.parametrize("verb", list(Verb))
def test_os_kv_namespace_needs_system_kv_os_permission(verb: Verb) -> None:
    assert kv_permission_needed(NOTES, "os", "theme", verb) == f"system.kv.os.theme.{verb}"


@pytest.mark.parametrize("verb", list(Verb))
def test_other_app_kv_namespace_needs_system_kv_app_permission(verb: Verb) -> None:
    assert (
        kv_permission_needed(NOTES, f"app/{TASKS}", "list", verb)
        == f"system.kv.app.com.example.tasks.list.{verb}"
    )


def test_app_whose_id_prefixes_another_does_not_own_it() -> None:
    assert kv_permission_needed("com.example.note", f"app/{NOTES}", "k", Verb.READ) == (
        "system.kv.app.com.example.notes.k.read"
    )


def test_granting_the_needed_permission_allows_the_kv_operation() -> None:
    needed = kv_permission_needed(NOTES, f"app/{TASKS}", "list", Verb.WRITE)
    assert holds(["system.kv.app.com.example.tasks.list.write"], needed)
    assert not holds(["system.kv.app.com.example.tasks.list.read"], needed)
    assert holds([], kv_permission_needed(NOTES, f"app/{NOTES}", "list", Verb.WRITE))


# --- KV keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["theme", "a", "0", "Theme_Light", "drafts.v2", "a-b_c.d", "x" * 128, "9lives", "a..b"],
)
def test_kv_key_re_accepts_simple_keys(key: str) -> None:
    assert KV_KEY_RE.match(key)


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("", id="empty"),
        pytest.param("a:b", id="colon"),
        pytest.param("a b", id="space"),
        pytest.param("x" * 129, id="129-chars"),
        pytest.param(".hidden", id="leading-dot"),
        pytest.param("-flag", id="leading-dash"),
        pytest.param("_private", id="leading-underscore"),
        pytest.param("a/b", id="slash"),
        pytest.param("ключ", id="non-ascii"),
        pytest.param("a\x00", id="nul"),
        pytest.param(
            "theme\n",
            id="trailing-newline",
        ),
    ],
)
def test_kv_key_re_refuses_bad_keys(key: str) -> None:
    assert not KV_KEY_RE.match(key)
