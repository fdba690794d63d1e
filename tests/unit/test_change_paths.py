"""Which watcher hears which change (docs/api.md "Change notifications"), and path checks."""

from __future__ import annotations

import pytest

from atrium.providers import canonical_path, related


@pytest.mark.parametrize(
    ("watched", "changed", "hears"),
    [
        ("/notes", "/notes", True),
        ("/notes", "/notes/5", True),
        ("/notes/5", "/notes", True),
        ("/notes", "/notesx", False),
        ("/notesx", "/notes", False),
        ("/notes/5", "/notes/6", False),
        ("/", "/anything/at/all", True),
        ("/notes/5", "/", True),
    ],
)
def test_a_watcher_hears_its_path_what_is_below_and_what_is_above(
    watched: str, changed: str, hears: bool
) -> None:
    assert related(watched, changed) is hears


@pytest.mark.parametrize(
    ("raw", "canonical"), [("/a/b/", "/a/b"), ("/", "/"), ("/a/b//", "/a/b"), ("///", "/")]
)
def test_canonical_paths(raw: str, canonical: str) -> None:
    assert canonical_path(raw) == canonical


@pytest.mark.parametrize(
    "raw", ["a", "", "/a/../b", "/./a", "/a/..", "/a\\b", "/a\x00", "/a//b", "//a"]
)
def test_non_canonical_paths_name_the_problem(raw: str) -> None:
    with pytest.raises(ValueError, match="must"):
        canonical_path(raw)
