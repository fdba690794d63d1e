"""The permission diff and when it needs approval (docs/api.md "Approval")."""

from __future__ import annotations

from typing import Any

import pytest

from atrium.distribution.diff import PermissionDiff, diff_manifests, requires_approval
from atrium.manifest import Manifest, parse_manifest


def manifest(**fields: Any) -> Manifest:
    return parse_manifest(
        {"id": "com.example.app", "name": "App", "version": "1.0.0", **fields}, None
    )


PROVIDER = {"authority": "things", "providers": [{"path": "/things"}]}
SHARE = {"action": "os.intent.action.SEND", "dataMime": ["text/plain"]}


def test_a_first_install_has_no_version_from_and_adds_everything_it_asks() -> None:
    new = manifest(
        version="2.0.0",
        tools=["git"],
        permissions=["com.example.notes.read"],
        dataProvider=PROVIDER,
        intentFilters=[SHARE],
    )
    diff = diff_manifests(None, new)
    assert diff.wire() == {
        "appId": "com.example.app",
        "versionFrom": None,
        "versionTo": "2.0.0",
        "toolsAdded": ["git"],
        "toolsRemoved": [],
        "permissionsAdded": ["com.example.notes.read"],
        "permissionsRemoved": [],
        "dataProviderAdded": True,
        "dataProviderRemoved": False,
        "intentFiltersAdded": [
            {
                "action": "os.intent.action.SEND",
                "category": [],
                "dataMime": ["text/plain"],
                "priority": 0,
            }
        ],
    }
    assert requires_approval(diff)


def test_a_first_install_asking_nothing_needs_no_approval() -> None:
    diff = diff_manifests(None, manifest())
    assert diff.version_from is None
    assert not requires_approval(diff)


@pytest.mark.parametrize(
    ("old", "new", "field", "value"),
    [
        ({"tools": ["git"]}, {"tools": ["git", "jq"]}, "tools_added", ["jq"]),
        ({"tools": ["git", "jq"]}, {"tools": ["jq"]}, "tools_removed", ["git"]),
        (
            {"permissions": ["a.read"]},
            {"permissions": ["b.read", "a.read"]},
            "permissions_added",
            ["b.read"],
        ),
        (
            {"permissions": ["a.read", "b.read"]},
            {"permissions": []},
            "permissions_removed",
            ["a.read", "b.read"],
        ),
        ({}, {"dataProvider": PROVIDER}, "data_provider_added", True),
        ({"dataProvider": PROVIDER}, {}, "data_provider_removed", True),
        ({"dataProvider": PROVIDER}, {"dataProvider": PROVIDER}, "data_provider_added", False),
    ],
)
def test_each_field_of_the_diff(
    old: dict[str, Any], new: dict[str, Any], field: str, value: object
) -> None:
    diff = diff_manifests(manifest(**old), manifest(version="1.1.0", **new))
    assert getattr(diff, field) == value
    assert (diff.version_from, diff.version_to) == ("1.0.0", "1.1.0")


def test_a_changed_authority_is_one_provider_removed_and_one_added() -> None:
    other = {"authority": "other", "providers": [{"path": "/x"}]}
    diff = diff_manifests(manifest(dataProvider=PROVIDER), manifest(dataProvider=other))
    assert (diff.data_provider_added, diff.data_provider_removed) == (True, True)


@pytest.mark.parametrize(
    ("changed", "added"),
    [
        ({}, False),
        ({"dataMime": ["TEXT/PLAIN"]}, False),  # MIME types compare case-insensitively
        ({"action": "os.intent.action.VIEW"}, True),
        ({"dataMime": ["text/html"]}, True),
        ({"dataScheme": ["https"]}, True),
        ({"category": ["os.intent.category.DEFAULT"]}, True),
        ({"priority": 5}, True),
    ],
)
def test_intent_filters_are_keyed_by_action_mime_scheme_categories_and_priority(
    changed: dict[str, Any], added: bool
) -> None:
    diff = diff_manifests(
        manifest(intentFilters=[SHARE]), manifest(intentFilters=[{**SHARE, **changed}])
    )
    assert bool(diff.intent_filters_added) is added


def base_diff(**fields: Any) -> PermissionDiff:
    values: dict[str, Any] = {
        "app_id": "com.example.app",
        "version_from": "1.0.0",
        "version_to": "1.0.1",
        "tools_added": [],
        "tools_removed": [],
        "permissions_added": [],
        "permissions_removed": [],
        "data_provider_added": False,
        "data_provider_removed": False,
        "intent_filters_added": [],
    }
    return PermissionDiff(**{**values, **fields})


@pytest.mark.parametrize(
    ("fields", "needed"),
    [
        ({}, False),
        ({"tools_added": ["git"]}, True),
        ({"permissions_added": ["x.read"]}, True),
        ({"data_provider_added": True}, True),
        ({"intent_filters_added": [SHARE]}, True),
        ({"tools_removed": ["git"]}, False),
        ({"permissions_removed": ["x.read"]}, False),
        ({"data_provider_removed": True}, False),
    ],
)
def test_requires_approval_for_additions_never_for_removals(
    fields: dict[str, Any], needed: bool
) -> None:
    assert requires_approval(base_diff(**fields)) is needed
