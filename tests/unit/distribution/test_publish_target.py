"""`parse_target`: where a publish goes, from `to` and `tag`."""

from __future__ import annotations

import pytest

from atrium.distribution.publish import parse_target
from atrium.distribution.refs import GitRef, OciRef
from atrium.errors import BadRef, InvalidRequest


@pytest.mark.parametrize(
    ("to", "expected"),
    [
        (
            "oci://127.0.0.1:5000/apps/com.example.notes",
            OciRef("127.0.0.1:5000", "apps/com.example.notes", "v1"),
        ),
        ("registry.example.com/apps/notes", OciRef("registry.example.com", "apps/notes", "v1")),
        ("/srv/git/com.example.notes.git", GitRef("file:///srv/git/com.example.notes.git", "v1")),
        ("git+file:///srv/git/notes.git", GitRef("file:///srv/git/notes.git", "v1")),
        ("file:///srv/git/notes.git", GitRef("file:///srv/git/notes.git", "v1")),
        ("git://127.0.0.1/notes.git", GitRef("git://127.0.0.1/notes.git", "v1")),
        (
            "git+https://git.example.com/me/notes.git",
            GitRef("https://git.example.com/me/notes.git", "v1"),
        ),
        (
            "https://git.example.com/me/notes.git",
            GitRef("https://git.example.com/me/notes.git", "v1"),
        ),
    ],
)
def test_targets_name_an_oci_repository_or_a_git_repository(to: str, expected: object) -> None:
    assert parse_target(to, "v1") == expected


def test_the_install_command_forms_round_trip_through_str() -> None:
    assert str(parse_target("/srv/x/com.example.notes.git", "v1")) == (
        "git+file:///srv/x/com.example.notes.git#v1"
    )
    assert str(parse_target("host.example/apps/x", "stable")) == "oci://host.example/apps/x:stable"


@pytest.mark.parametrize(
    "to",
    [
        "oci://host.example/apps/x:v2",
        "host.example/apps/x@sha256:" + "0" * 64,
        "git://h.example/x.git#v2",
    ],
)
def test_a_tag_inside_the_target_is_refused(to: str) -> None:
    with pytest.raises(InvalidRequest, match="give the tag with"):
        parse_target(to, "v1")


@pytest.mark.parametrize("tag", ["", "a b", "-x", ".x", "a..b", "x.lock", "x.", "a/b", "x" * 129])
def test_bad_tags_are_refused(tag: str) -> None:
    with pytest.raises(InvalidRequest, match="is not a tag"):
        parse_target("/srv/x.git", tag)


@pytest.mark.parametrize("to", ["ftp://host.example/x", "oci://", "Host/UPPER"])
def test_other_targets_are_bad_refs(to: str) -> None:
    with pytest.raises(BadRef):
        parse_target(to, "v1")
