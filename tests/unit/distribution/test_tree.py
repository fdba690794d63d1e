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
        check_tree(app)
    with pytest.raises(UnsafeTree, match="escape"):
        copy_tree(app, tmp_path / "copy")


def test_a_fifo_is_refused(app: Path) -> None:
    os.mkfifo(app / "pipe")
    with pytest.raises(UnsafeTree, match="pipe is a device, FIFO or socket"):
        check_tree(app)
