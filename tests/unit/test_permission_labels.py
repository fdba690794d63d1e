"""Permissions in a person's words (docs/api.md "Manifest" `permissionInfo`)."""

from __future__ import annotations

import pytest

from atrium.errors import ManifestInvalid
from atrium.manifest import parse_manifest
from atrium.permissions import describe

DECLARED = {"com.x.notes.read": ("Read your notes", "Every note's text.", "com.x.notes")}


def test_a_declared_permission_reads_as_its_label() -> None:
    assert describe("com.x.notes.read", DECLARED) == {
        "name": "com.x.notes.read",
        "label": "Read your notes",
        "description": "Every note's text.",
        "declaredBy": "com.x.notes",
    }


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("system.kv.os.theme.write", "Change the shell setting “theme”"),
        ("system.kv.app.com.x.notes.prefs.read", "Read “prefs” stored by com.x.notes"),
        ("com.y.unknown", "com.y.unknown"),
    ],
)
def test_the_shell_words_its_own_and_falls_back_to_the_name(name: str, label: str) -> None:
    assert describe(name, DECLARED)["label"] == label


def test_an_app_labels_only_its_own_permissions() -> None:
    base = {"id": "com.x.app", "name": "x", "version": "1.0.0"}
    own = parse_manifest(
        {**base, "permissionInfo": {"com.x.app.read": {"label": "Read"}}}, "com.x.app"
    )
    assert own.permission_info["com.x.app.read"].label == "Read"
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(
            {**base, "permissionInfo": {"system.kv.os.theme.write": {"label": "Harmless"}}},
            "com.x.app",
        )
    assert caught.value.fields["problems"][0]["field"] == "permissionInfo"
