"""App trees: the content hash, the safety check and the safe copy."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from atrium.distribution.tree import UnsafeTree, check_tree, content_hash, copy_tree


@pytest.fixture
def app(tmp_path: Path) -> Path:
    root = tmp_path / "com.example.app"
    (root / "static").mkdir(parents=True)
    (root / "app.manifest.json").write_text("{}")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "static" / "index.html").write_text("<p>hi</p>")
    (root / "static" / "home.html").symlink_to("index.html")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return root


def test_a_copy_hashes_like_its_source_and_leaves_git_out(app: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy_tree(app, copy)
    assert content_hash(copy) == content_hash(app)
    assert not (copy / ".git").exists()
    assert (copy / "static" / "home.html").readlink() == Path("index.html")
    assert os.access(copy / "run.sh", os.X_OK)


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "static" / "index.html").write_text("<p>bye</p>"),
        lambda root: (root / "run.sh").chmod(0o644),
        lambda root: (root / "new.txt").write_text(""),
        lambda root: (root / "static" / "index.html").rename(root / "static" / "other.html"),
    ],
)
def test_the_hash_changes_with_content_modes_and_names(
    app: Path, change: Callable[[Path], object]
) -> None:
    before = content_hash(app)
    change(app)
    assert content_hash(app) != before


def test_the_hash_ignores_git(app: Path) -> None:
    before = content_hash(app)
    (app / ".git" / "HEAD").write_text("changed")
    assert content_hash(app) == before


@pytest.mark.parametrize("target", ["/etc/passwd", "../outside", "static/../../outside"])
def test_a_link_that_leaves_the_tree_is_refused(app: Path, tmp_path: Path, target: str) -> None:
    (app / "escape").symlink_to(target)
    with pytest.raises(UnsafeTree, match="escape"):
        check_tree(app, skip_top_vcs=True)
    with pytest.raises(UnsafeTree, match="escape"):
        copy_tree(app, tmp_path / "copy")


def test_a_fifo_is_refused(app: Path) -> None:
    os.mkfifo(app / "pipe")
    with pytest.raises(UnsafeTree, match="pipe is a device, FIFO or socket"):
        check_tree(app, skip_top_vcs=True)


def test_a_source_checkout_at_the_top_is_skipped_but_an_installed_tree_may_not_hold_it(
    app: Path, tmp_path: Path
) -> None:
    check_tree(app, skip_top_vcs=True)
    with pytest.raises(UnsafeTree, match=r"^\.git is version-control metadata"):
        check_tree(app)
    copy_tree(app, tmp_path / "copy")  # the checkout is left behind
    check_tree(tmp_path / "copy")


@pytest.mark.parametrize(
    "name",
    [
        "static/.git",
        "static/.GIT",
        "static/.Git. ",
        "static/.g\u200cit",
        "static/GIT~1",
        "static/.hg",
        "static/.svn",
        "static/.bzr",
        "static/_darcs",
        "static/CVS",
    ],
)
@pytest.mark.parametrize("as_file", [False, True])
def test_vcs_metadata_anywhere_is_refused_naming_it(
    app: Path, tmp_path: Path, name: str, as_file: bool
) -> None:
    path = app / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if as_file:
        path.write_text("gitdir: /elsewhere\n")
    else:
        path.mkdir()
        (path / "config").write_text("[core]\n\tfsmonitor = touch /tmp/x\n")
    with pytest.raises(UnsafeTree, match="version-control metadata") as caught:
        check_tree(app, skip_top_vcs=True)
    assert str(caught.value).startswith(name)
    with pytest.raises(UnsafeTree, match="version-control metadata"):
        copy_tree(app, tmp_path / "copy")


@pytest.mark.parametrize(
    ("links", "words"),
    [
        # issue 13 row 8: each link stays inside as written, the chain leads to $ATRIUM_HOME
        (
            {"p/q/r/s/b": "../../../..", "leak": "p/q/r/s/b/../../../../run/token"},
            "leak is a symlink whose chain of links reaches outside",
        ),
        ({"p/up": "..", "p/deeper": "up/../x"}, "chain of links reaches outside"),
        ({"a": "b", "b": "a"}, "loop of links"),
        ({"p/s": "../static", "p/x": "s/../s/../../etc"}, "chain of links reaches outside"),
    ],
)
def test_a_chain_of_links_that_leaves_is_refused(
    app: Path, tmp_path: Path, links: dict[str, str], words: str
) -> None:
    for name, target in links.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).symlink_to(target)
    with pytest.raises(UnsafeTree, match=words):
        check_tree(app, skip_top_vcs=True)
    with pytest.raises(UnsafeTree, match=words):
        copy_tree(app, tmp_path / "copy")


def test_links_that_stay_inside_through_a_chain_are_accepted(app: Path) -> None:
    (app / "p/q").mkdir(parents=True)
    (app / "p/q/top").symlink_to("../..")
    (app / "p/q/page").symlink_to("top/static/index.html")
    (app / "p/dangling").symlink_to("q/missing/../../static")
    check_tree(app, skip_top_vcs=True)


def test_an_apps_own_cvs_folder_in_lower_case_is_not_cvs_metadata(app: Path) -> None:
    (app / "static" / "cvs").mkdir()
    (app / "static" / "cvs" / "receipts.txt").write_text("")
    check_tree(app, skip_top_vcs=True)
