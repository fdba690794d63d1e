"""What the image runner reads and makes in an image's root resolves inside it: a link is
followed as the image sees it (never to the host's file of that name), and a data folder's
mount point is made only through real folders."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from atrium.lifecycle.runners.image import make_mount_points, read_inside


def image(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "usr" / "share").mkdir(parents=True)
    (root / "usr" / "share" / "passwd").write_text("www:x:33:33::/:/bin/sh\n")
    return root


def test_links_are_followed_inside_the_image_never_out_of_it(tmp_path: Path) -> None:
    root = image(tmp_path)
    (root / "etc" / "passwd").symlink_to("/usr/share/passwd")
    assert read_inside(root, "etc/passwd") == "www:x:33:33::/:/bin/sh\n"
    # absolute, and climbing: both stop at the image's root, which has no os-release (the host has)
    (root / "etc" / "group").symlink_to("/../../../../../../etc/os-release")
    (root / "etc" / "shadow").symlink_to("../../../../../../../etc/os-release")
    assert Path("/etc/os-release").read_text()
    assert read_inside(root, "etc/group") == ""
    assert read_inside(root, "etc/shadow") == ""
    (root / "etc" / "os-release").write_text("the image's\n")
    assert read_inside(root, "etc/shadow") == "the image's\n"
    (root / "etc" / "loop").symlink_to("loop")
    assert read_inside(root, "etc/loop") == ""


def test_a_data_folder_is_made_through_real_folders_only(tmp_path: Path) -> None:
    root = image(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "var").symlink_to(str(outside))
    with pytest.raises(OSError, match="link") as refused:
        make_mount_points(root, ["/var/lib/app"])
    assert refused.value.errno == errno.ELOOP
    assert not any(outside.iterdir())
    make_mount_points(root, ["/srv/app/data"])
    assert (root / "srv" / "app" / "data").is_dir()
    assert not (root / "srv").is_symlink()
