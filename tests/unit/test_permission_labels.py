"""Permissions in a person's words (docs/api.md "Manifest" `permissionInfo`, "Permission strings")."""

from __future__ import annotations

from typing import Any

import pytest

from atrium.authoring.scaffold import ScaffoldError, render
from atrium.errors import ManifestInvalid
from atrium.manifest import parse_manifest
from atrium.permissions import PermissionWords, describe, permission_owner

WORDS = PermissionWords(
    declared={"com.x.notes.read": ("Read your notes", "Every note's text.", "com.x.notes")},
    app_names={"com.x.notes": "Notes", "t4.bank": "T4 Bank"},
)


def test_a_declared_permission_reads_as_its_label() -> None:
    assert describe("com.x.notes.read", WORDS) == {
        "name": "com.x.notes.read",
        "label": "Read your notes",
        "description": "Every note's text.",
        "declaredBy": "com.x.notes",
    }


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("system.kv.os.theme.write", "Change the shell setting “theme”"),
        ("system.kv.os.a.b.read", "Read the shell setting “a.b”"),
        ("system.kv.app/com.x.notes/prefs.read", "Read key “prefs” of app Notes (com.x.notes)"),
        (
            "system.kv.app/t4.bank/acct.secret.write",
            "Change key “acct.secret” of app T4 Bank (t4.bank)",
        ),
        ("system.kv.app/t4.bank.acct/secret.read", "Read key “secret” of app t4.bank.acct"),
        # the older, ambiguous form grants nothing: it shows as what it is
        ("system.kv.app.t4.bank.acct.secret.read", "system.kv.app.t4.bank.acct.secret.read"),
        ("system.kv.os.a/b.read", "system.kv.os.a/b.read"),
        ("com.y.unknown", "com.y.unknown"),
    ],
)
def test_the_shell_words_its_own_and_falls_back_to_the_name(name: str, label: str) -> None:
    assert describe(name, WORDS)["label"] == label


@pytest.mark.parametrize(
    ("name", "owner"),
    [
        ("com.atrium.notes.read", "com.atrium.notes"),
        ("com.atrium.read", "com.atrium"),
        ("com.atrium.notes.export.all", "com.atrium.notes.export"),
        ("system.kv.os.theme.write", None),
        ("system.kv.read", None),
        ("com.read", None),
        ("com.atrium.", None),
        ("com.atrium.re ad", None),
        ("Com.atrium.read", None),
    ],
)
def test_a_permission_is_owned_by_the_id_before_its_last_word(name: str, owner: str | None) -> None:
    assert permission_owner(name) == owner


def test_a_label_counts_only_from_the_exact_owner() -> None:
    lying = PermissionWords(
        declared={
            "com.atrium.notes.export": ("Harmless", "", "com.atrium"),
            "system.kv.os.theme.write": ("Harmless", "", "system.kv"),
        }
    )
    assert describe("com.atrium.notes.export", lying)["label"] == "com.atrium.notes.export"
    assert describe("system.kv.os.theme.write", lying)["declaredBy"] == "system"


BASE: dict[str, Any] = {"id": "com.x.app", "name": "x", "version": "1.0.0"}


def test_an_app_labels_only_its_own_permissions() -> None:
    own = parse_manifest({**BASE, "permissionInfo": {"com.x.app.read": {"label": "Read"}}}, None)
    assert own.permission_info["com.x.app.read"].label == "Read"


@pytest.mark.parametrize(
    ("app_id", "name"),
    [
        ("com.x.app", "system.kv.os.theme.write"),
        ("com.atrium", "com.atrium.notes.read"),  # an id that prefixes another's
        ("com.x.app", "com.x.app.notes.read"),
        ("com.x.app", "com.x.apps.read"),
        ("com.x.app", "com.x.app.re ad"),
    ],
)
def test_a_label_on_another_owners_permission_is_refused(app_id: str, name: str) -> None:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(
            {**BASE, "id": app_id, "permissionInfo": {name: {"label": "Harmless"}}}, None
        )
    problems = caught.value.fields["problems"]
    assert [p["field"] for p in problems] == ["permissionInfo"]
    assert repr(name) in problems[0]["message"]


@pytest.mark.parametrize("app_id", ["system.kv", "system.kv.os.theme", "system.x"])
def test_the_system_prefix_is_the_shells(app_id: str) -> None:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest({**BASE, "id": app_id}, app_id)
    problems = caught.value.fields["problems"]
    assert problems[0]["field"] == "id"
    assert repr(app_id) in problems[0]["message"]
    assert "reserved for the shell" in problems[0]["message"]


def test_a_manifest_reads_older_kv_grants_once() -> None:
    manifest = parse_manifest(
        {
            **BASE,
            "permissions": [
                "system.kv.app.t4.bank.acct.secret.read",
                "system.kv.app.t4.bank.Acct.secret.read",
                "com.x.notes.read",
            ],
        },
        None,
    )
    assert manifest.permissions == ["system.kv.app/t4.bank.acct/secret.read", "com.x.notes.read"]


def test_atrium_new_refuses_a_system_id() -> None:
    with pytest.raises(ScaffoldError, match=r"'system\.notes'.*reserved for the shell"):
        render("system.notes", "python")
