"""`atrium.permissions`: permission shapes, verbatim grants, what a KV operation needs, one name
per KV grant, and the older KV names read once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atrium.ids import APP_ID_RE
from atrium.permissions import (
    KV_KEY_RE,
    KvPermission,
    Verb,
    holds,
    kv_app_permission,
    kv_os_permission,
    kv_permission_needed,
    legacy_kv_readings,
    migrate_grant,
    migrate_grants,
    parse_kv_permission,
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
            "system.kv.app/com.example.notes/drafts.read",
        ),
        (
            kv_app_permission(NOTES, "drafts", Verb.WRITE),
            "system.kv.app/com.example.notes/drafts.write",
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
        == f"system.kv.app/com.example.tasks/list.{verb}"
    )


def test_app_whose_id_prefixes_another_does_not_own_it() -> None:
    assert kv_permission_needed("com.example.note", f"app/{NOTES}", "k", Verb.READ) == (
        "system.kv.app/com.example.notes/k.read"
    )


def test_granting_the_needed_permission_allows_the_kv_operation() -> None:
    needed = kv_permission_needed(NOTES, f"app/{TASKS}", "list", Verb.WRITE)
    assert holds(["system.kv.app/com.example.tasks/list.write"], needed)
    assert not holds(["system.kv.app/com.example.tasks/list.read"], needed)
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


# --- KV permission names: one name per (namespace, key, verb) -------------------------------------

APP_IDS = st.from_regex(APP_ID_RE, fullmatch=True)
KEYS = st.from_regex(KV_KEY_RE, fullmatch=True)
VERBS = st.sampled_from(list(Verb))


@given(app_id=APP_IDS, key=KEYS, verb=VERBS)
def test_an_app_kv_name_parses_back_to_its_app_key_and_verb(
    app_id: str, key: str, verb: Verb
) -> None:
    name = kv_app_permission(app_id, key, verb)
    assert parse_kv_permission(name) == KvPermission(f"app/{app_id}", key, verb)
    assert parse_kv_permission(name) is not None
    assert KvPermission(f"app/{app_id}", key, verb).name == name


@given(key=KEYS, verb=VERBS)
def test_an_os_kv_name_parses_back_to_its_key_and_verb(key: str, verb: Verb) -> None:
    name = kv_os_permission(key, verb)
    assert parse_kv_permission(name) == KvPermission("os", key, verb)
    assert KvPermission("os", key, verb).name == name


NAMESPACES = st.one_of(st.just("os"), APP_IDS.map(lambda a: f"app/{a}"))


@given(first=st.tuples(NAMESPACES, KEYS, VERBS), second=st.tuples(NAMESPACES, KEYS, VERBS))
def test_no_two_namespace_key_verb_triples_share_a_name(
    first: tuple[str, str, Verb], second: tuple[str, str, Verb]
) -> None:
    if first != second:
        assert KvPermission(*first).name != KvPermission(*second).name


#: strings near the KV names: a prefix, a middle of the characters that matter, a last word
NEAR_NAMES = st.builds(
    "{}{}.{}".format,
    st.sampled_from(["system.kv.os.", "system.kv.app/", "system.kv.app.", "system.kv."]),
    st.text(alphabet="ab4.-_/A :", max_size=24),
    st.sampled_from(["read", "write", "delete", ""]),
)


@given(name=NEAR_NAMES)
def test_a_parsed_name_formats_back_to_itself(name: str) -> None:
    parsed = parse_kv_permission(name)
    if parsed is not None:
        assert parsed.name == name


def test_the_two_readings_of_the_older_name_have_two_names() -> None:
    bank = kv_app_permission("t4.bank", "acct.secret", Verb.READ)
    acct = kv_app_permission("t4.bank.acct", "secret", Verb.READ)
    assert bank == "system.kv.app/t4.bank/acct.secret.read"
    assert acct == "system.kv.app/t4.bank.acct/secret.read"
    assert parse_kv_permission(bank) == KvPermission("app/t4.bank", "acct.secret", Verb.READ)
    assert parse_kv_permission(acct) == KvPermission("app/t4.bank.acct", "secret", Verb.READ)


@pytest.mark.parametrize(
    "name",
    [
        "system.kv.app.t4.bank.acct.secret.read",  # the older form: never a grant as it stands
        "system.kv.app/t4.bank/acct.secret",  # no verb
        "system.kv.app/t4.bank/acct.secret.delete",
        "system.kv.app/T4.bank/k.read",  # not an app id
        "system.kv.app/t4.bank/.k.read",  # not a key
        "system.kv.app/t4.bank/a/b.read",  # a key holds no '/'
        "system.kv.app/t4.bank.read",
        "system.kv.os..read",
        "system.kv.os.a b.read",
        "system.kv.os.read",
        "com.atrium.notes.read",
    ],
)
def test_anything_else_is_no_kv_permission(name: str) -> None:
    assert parse_kv_permission(name) is None


# --- the older form, read once -------------------------------------------------------------------


def test_an_older_name_opened_every_split_of_its_middle() -> None:
    readings = legacy_kv_readings("system.kv.app.t4.bank.acct.secret.read")
    assert [(r.app_id, r.key) for r in readings] == [
        ("t4.bank.acct", "secret"),
        ("t4.bank", "acct.secret"),
    ]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # the reading its review showed: the last word is the key
        ("system.kv.app.t4.bank.acct.secret.read", "system.kv.app/t4.bank.acct/secret.read"),
        ("system.kv.app.com.x.notes.prefs.write", "system.kv.app/com.x.notes/prefs.write"),
        ("system.kv.app.t4.bank.acct.read", "system.kv.app/t4.bank/acct.read"),
        # that reading is no valid id and key: dropped, whatever else the name opened
        ("system.kv.app.t4.bank.Acct.secret.read", None),
        ("system.kv.app.com.x.1a.b.read", None),
        ("system.kv.app.com.x.y.z.-w.read", None),
        ("system.kv.app.t4.read", None),
        ("system.kv.app.t4.bank.k.delete", None),
    ],
)
def test_an_older_name_is_read_as_its_review_showed_it_or_dropped(
    old: str, new: str | None
) -> None:
    change = migrate_grant(old)
    assert change is not None
    assert change.new == new
    assert ("dropped" in change.why()) is (new is None)


def test_an_older_name_too_long_for_any_installed_app_is_dropped_without_a_scan_per_dot() -> None:
    change = migrate_grant("system.kv.app." + "a." * 100_000 + "k.read")
    assert change is not None
    assert (change.new, change.readings) == (None, ())


@given(name=NEAR_NAMES)
def test_a_migrated_name_never_opens_more_than_the_older_name_did(name: str) -> None:
    change = migrate_grant(name)
    if change is None:
        assert not name.startswith("system.kv.app.")
    elif change.new is not None:
        assert parse_kv_permission(change.new) in change.readings


def test_other_names_are_kept_and_duplicates_go() -> None:
    kept, changes = migrate_grants(
        [
            "com.example.notes.read",
            "system.kv.app.com.x.notes.prefs.read",
            "system.kv.app/com.x.notes/prefs.read",
            "system.kv.os.theme.read",
            "system.kv.app.t4.bank.Acct.secret.read",
        ]
    )
    assert kept == [
        "com.example.notes.read",
        "system.kv.app/com.x.notes/prefs.read",
        "system.kv.os.theme.read",
    ]
    assert [c.old for c in changes] == [
        "system.kv.app.com.x.notes.prefs.read",
        "system.kv.app.t4.bank.Acct.secret.read",
    ]
