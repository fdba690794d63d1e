"""The index document: entries validated one by one, and the source a channel chooses."""

from __future__ import annotations

from typing import Any

import pytest

from atrium.distribution.index import IndexEntry, parse_index
from atrium.distribution.refs import GitRef, OciRef
from atrium.distribution.resolve import source_for
from atrium.errors import NotFound

BOTH: dict[str, Any] = {
    "id": "com.example.notes",
    "name": "Notes",
    "publisher": "Example",
    "categories": ["productivity"],
    "sources": {
        "git": {
            "ref": "git+https://git.example/apps/com.example.notes.git",
            "default-branch": "main",
        },
        "oci": {"ref": "registry.example/apps/notes"},
    },
    "channels": {
        "stable": {"git-tag": "v1.0.0", "oci-tag": "1.0.0"},
        "beta": {"git-tag": "v1.1.0-beta"},
    },
}


def entry(**changes: Any) -> IndexEntry:
    return IndexEntry.model_validate({**BOTH, **changes})


def test_a_bad_entry_is_reported_and_left_out_never_fatal() -> None:
    entries, problems = parse_index(
        {
            "schema": 1,
            "apps": [
                BOTH,
                {**BOTH, "id": "Not An Id"},
                {**BOTH, "id": "com.example.nosource", "sources": {}},
                {**BOTH, "id": "com.example.badchannel", "channels": {"stable": {}}},
                "not an object",
                BOTH,
            ],
        }
    )
    assert list(entries) == ["com.example.notes"]
    assert [(p["position"], p["field"]) for p in problems] == [
        (1, "id"),
        (2, "sources"),
        (3, "channels"),
        (4, "(entry)"),
        (5, "id"),
    ]
    assert "not a reverse-domain app id" in problems[0]["message"]
    assert "duplicate id" in problems[4]["message"]


@pytest.mark.parametrize("document", [[], {"apps": []}, {"schema": 2, "apps": []}, {"schema": 1}])
def test_a_document_that_is_not_an_index_is_refused(document: object) -> None:
    with pytest.raises(ValueError, match="index"):
        parse_index(document)


def test_unknown_keys_are_kept() -> None:
    assert entry(homepage="https://example.com").model_dump(by_alias=True)["homepage"] == (
        "https://example.com"
    )


def test_the_stable_channel_is_the_default_and_oci_is_preferred() -> None:
    source, channel = source_for(entry(), None)
    assert source == OciRef("registry.example", "apps/notes", "1.0.0")
    assert channel == "stable"


def test_a_channel_without_an_oci_tag_uses_git() -> None:
    source, channel = source_for(entry(), "beta")
    assert source == GitRef("https://git.example/apps/com.example.notes.git", "v1.1.0-beta")
    assert channel == "beta"


def test_an_entry_without_oci_uses_the_git_tag_of_the_channel() -> None:
    git_only = entry(sources={"git": BOTH["sources"]["git"]})
    assert source_for(git_only, None) == (
        GitRef("https://git.example/apps/com.example.notes.git", "v1.0.0"),
        "stable",
    )


def test_an_entry_without_channels_takes_the_latest_tag_or_the_default_branch() -> None:
    assert source_for(entry(channels={}), None) == (
        OciRef("registry.example", "apps/notes", "latest"),
        None,
    )
    git_only = entry(channels={}, sources={"git": BOTH["sources"]["git"]})
    assert source_for(git_only, None) == (
        GitRef("https://git.example/apps/com.example.notes.git", "main"),
        None,
    )


def test_an_unknown_channel_is_not_found_listing_the_channels() -> None:
    with pytest.raises(NotFound, match=r"no channel 'nightly' \(channels: beta, stable\)"):
        source_for(entry(), "nightly")


IMAGE: dict[str, Any] = {
    "id": "org.example.clock",
    "name": "Clock",
    "version": "1.0.0",
    "runtime": {"image": "registry.example/apps/clock:1", "health": {"path": "/"}},
}


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"runtime": {"image": "clock", "health": {"path": "/"}}}, "runtime.image", "OCI image"),
        ({"runtime": {"image": "oci:clock", "health": {"path": "/"}}}, "runtime.image", "carries"),
        ({"runtime": {"image": "r.example/c:1", "health": {}}}, "runtime.health.path", "required"),
        (
            {"runtime": {"image": "r.example/c:1", "health": {"path": "/"}, "comand": ["x"]}},
            "runtime.comand",
            "not permitted",
        ),
        ({"version": None}, "version", "needs a version"),
        ({"version": "2"}, "version", "semver"),
        ({"sources": BOTH["sources"]}, "runtime", "not both"),
        ({"channels": {"stable": {"oci-tag": "1"}}}, "channels", "no channels"),
        ({"icon": "https://example.org/i.png"}, "icon", "data:image/"),
        ({"icon": "data:image/png;base64,@@"}, "icon", "base64"),
        ({"icon": "data:text/html;base64,PGI+"}, "icon", "not an icon type"),
        ({"network": {"egress": ["127.0.0.1:80"]}}, "network.egress", "not an address"),
        ({"permissions": ["a b"]}, "permissions", "not a permission"),
        ({"name": "x" * 201}, "name", "200"),
    ],
)
def test_a_bad_image_entry_is_refused_by_the_field_it_got_wrong_alone(
    changes: dict[str, Any], field: str, words: str
) -> None:
    bad = {k: v for k, v in {**IMAGE, **changes}.items() if v is not None}
    entries, problems = parse_index({"schema": 1, "apps": [bad, {**IMAGE, "id": "org.example.ok"}]})
    assert list(entries) == ["org.example.ok"]
    assert [p["field"] for p in problems] == [field], problems
    assert words in problems[0]["message"], problems


def test_an_image_entry_is_an_app_tree_its_manifest_and_its_icon() -> None:
    icon = "data:image/svg+xml;base64,PHN2Zy8+"
    found = entry(**{**IMAGE, "sources": None, "channels": {}, "icon": icon})
    tree = found.app_tree()
    assert tree["icon.svg"] == b"<svg/>"
    manifest = found.manifest()
    assert manifest["icon"] == "icon.svg"
    assert manifest["runtime"]["image"] == "registry.example/apps/clock:1"
    assert (
        entry(**{**IMAGE, "sources": None, "channels": {}, "icon": "⏰"}).manifest()["icon"] == "⏰"
    )


def test_a_source_entry_keeps_its_version_hint_but_not_image_fields() -> None:
    assert parse_index({"schema": 1, "apps": [{**BOTH, "version": "v2"}]})[1] == []
    _, problems = parse_index({"schema": 1, "apps": [{**BOTH, "network": {"egress": True}}]})
    assert [p["field"] for p in problems] == ["network"]
