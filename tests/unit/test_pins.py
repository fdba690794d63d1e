"""atrium.distribution.pins: which refs pin an install, and which tags are newer."""

from __future__ import annotations

import semver

from atrium.distribution.pins import at_tag, baseline, newer_tags, pin_of, tag_version
from atrium.distribution.refs import GitRef, IndexRef, OciRef, parse_ref

DIGEST = "sha256:" + "a" * 64


def test_version_tags_read_as_versions() -> None:
    assert tag_version("v1") == semver.Version(1, 0, 0)
    assert tag_version("1.2") == semver.Version(1, 2, 0)
    assert tag_version("v2.0.1-rc.1") == semver.Version(2, 0, 1, "rc.1")
    for other in ("latest", "main", "v01", "sha256-abc.sig", "v1.2.3.4", ""):
        assert tag_version(other) is None, other


def test_a_digest_a_version_tag_and_a_git_tag_pin_an_install() -> None:
    assert pin_of(parse_ref(f"oci://r.example/a/b@{DIGEST}"), False) == DIGEST
    assert pin_of(parse_ref("oci://r.example/a/b:v1"), False) == "v1"
    assert pin_of(parse_ref("git://g.example/a/b.git#v1"), True) == "v1"
    assert pin_of(parse_ref("git://g.example/a/b.git#release"), True) == "release"


def test_moving_refs_follow_their_source() -> None:
    assert pin_of(parse_ref("oci://r.example/a/b:latest"), False) is None
    assert pin_of(parse_ref("oci://r.example/a/b:stable"), False) is None
    assert pin_of(parse_ref("git://g.example/a/b.git#main"), False) is None
    assert pin_of(parse_ref("git://g.example/a/b.git"), False) is None
    assert pin_of(IndexRef("com.example.app", "stable"), False) is None


def test_newer_is_measured_from_the_pin_else_the_installed_version() -> None:
    tags = ["v0.9", "v1", "v1.1", "v2", "latest", "sha256-x.sig", "v2"]
    assert newer_tags(tags, baseline(parse_ref("oci://r.example/a/b:v1"), "0.1.0")) == [
        "v1.1",
        "v2",
    ]
    digest = parse_ref(f"oci://r.example/a/b@{DIGEST}")
    assert newer_tags(tags, baseline(digest, "1.1.0")) == ["v2"]
    assert newer_tags(["v1", "v1.0.0"], semver.Version(0, 1, 0)) == ["v1", "v1.0.0"]


def test_the_same_source_at_another_tag() -> None:
    assert at_tag(OciRef("r.example", "a/b", None, DIGEST), "v2") == OciRef(
        "r.example", "a/b", "v2"
    )
    assert at_tag(GitRef("git://g.example/a/b.git", "v1"), "v2") == GitRef(
        "git://g.example/a/b.git", "v2"
    )
