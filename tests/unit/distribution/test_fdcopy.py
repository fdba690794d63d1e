"""fdcopy: a tree copied through descriptors only; links kept as links and never followed,
special files skipped unopened, modes, set-ID bits, owners and times kept on the copy's own
descriptors. An entry swapped between the listing and the open (the `skip` hook runs in exactly
that gap) is copied as what it is then, never through the link."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from atrium.distribution.fdcopy import Copied, Rules, copy_bytes, copy_tree, open_regular

SECRET = b"host secret bytes"
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="owners are kept by a root shell only")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A folder outside the copied tree holding a 0600 file of secret bytes, ``f``."""
    folder = tmp_path / "host"
    folder.mkdir(mode=0o700)
    (folder / "f").write_bytes(SECRET)
    (folder / "f").chmod(0o600)
    return folder


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "notes.txt").write_bytes(b"one")
    (root / "sub" / "deeper" / "x.bin").write_bytes(b"\0" * 5000)
    return root


def _tree(root: Path) -> dict[str, tuple[str, int, bytes | str]]:
    """Every entry: kind, mode and content (bytes, a link's target, or "" for a folder)."""
    found: dict[str, tuple[str, int, bytes | str]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            info = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("l", 0, str(path.readlink()))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("d", stat.S_IMODE(info.st_mode), "")
            else:
                found[rel] = ("f", stat.S_IMODE(info.st_mode), path.read_bytes())
    return found


def _holds_secret(root: Path) -> bool:
    return any(entry[2] == SECRET for entry in _tree(root).values())


def test_a_copy_holds_the_tree_and_says_what_it_wrote(data: Path, tmp_path: Path) -> None:
    (data / "link").symlink_to("notes.txt")
    copied = copy_tree(data, tmp_path / "copy", prefix="app-1")
    assert _tree(tmp_path / "copy") == _tree(data)
    assert (copied.files, copied.bytes) == (2, 5003)
    assert copied.sizes == {"app-1/notes.txt": 3, "app-1/sub/deeper/x.bin": 5000}
    assert copied.method in {"reflink", "copy"}
    again = copy_tree(data, tmp_path / "again", into=copied, prefix="app-2")
    assert again is copied
    assert (copied.files, len(copied.sizes)) == (4, 4)


def test_a_link_at_the_root_is_refused_and_nothing_is_written(host: Path, tmp_path: Path) -> None:
    (tmp_path / "root-link").symlink_to(host)
    with pytest.raises(OSError, match=r"Not a directory|symbolic links") as caught:
        copy_tree(tmp_path / "root-link", tmp_path / "copy")
    assert caught.value.errno in {errno.ENOTDIR, errno.ELOOP}  # O_DIRECTORY|O_NOFOLLOW
    assert not (tmp_path / "copy").exists()
    # a path the user named may be a link, when the rules say so
    copy_tree(tmp_path / "root-link", tmp_path / "named", rules=Rules(follow_root=True))
    assert (tmp_path / "named" / "f").read_bytes() == SECRET


def test_links_in_the_middle_stay_links_and_are_never_followed(
    data: Path, host: Path, tmp_path: Path
) -> None:
    (data / "sub" / "to-file").symlink_to(host / "f")
    (data / "to-folder").symlink_to(host)
    (data / "dangling").symlink_to("/nowhere/at/all")
    before = host.joinpath("f").stat()
    state = (before.st_mode, before.st_uid, before.st_gid)
    copy_tree(data, tmp_path / "copy")
    assert (tmp_path / "copy" / "sub" / "to-file").readlink() == host / "f"
    assert (tmp_path / "copy" / "to-folder").readlink() == host
    assert (tmp_path / "copy" / "dangling").readlink() == Path("/nowhere/at/all")
    assert not _holds_secret(tmp_path / "copy")
    after = host.joinpath("f").stat()
    assert (after.st_mode, after.st_uid, after.st_gid) == state


def _swapping(swaps: dict[str, Callable[[], object]]) -> Rules:
    """Rules whose ``skip`` hook, called after the listing and before each entry is opened,
    swaps the entries named in ``swaps`` (what a racing app does in that gap)."""

    def skip(rel: str) -> bool:
        if rel in swaps:
            swaps.pop(rel)()
        return False

    return Rules(skip=skip)


def _into_link(path: Path, target: Path) -> None:
    aside = path.with_name(f"{path.name}.aside")
    path.rename(aside)
    path.symlink_to(target)


def test_a_file_swapped_for_a_link_after_the_listing_is_copied_as_the_link(
    data: Path, host: Path, tmp_path: Path
) -> None:
    (data / "notes.txt").chmod(0o6777)
    secret = host / "f"
    rules = _swapping({"notes.txt": lambda: _into_link(data / "notes.txt", secret)})
    copied = copy_tree(data, tmp_path / "copy", rules=rules)
    assert (tmp_path / "copy" / "notes.txt").readlink() == secret
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600  # no mode set through the link
    assert not _holds_secret(tmp_path / "copy")
    assert "notes.txt" not in copied.sizes


def test_a_folder_swapped_for_a_link_after_the_listing_is_never_entered(
    data: Path, host: Path, tmp_path: Path
) -> None:
    rules = _swapping({"sub": lambda: _into_link(data / "sub", host)})
    copy_tree(data, tmp_path / "copy", rules=rules)
    assert (tmp_path / "copy" / "sub").readlink() == host
    assert not _holds_secret(tmp_path / "copy")


def test_a_file_swapped_for_a_fifo_is_closed_unread(data: Path, tmp_path: Path) -> None:
    def fifo() -> None:
        (data / "notes.txt").unlink()
        os.mkfifo(data / "notes.txt")

    copied = copy_tree(data, tmp_path / "copy", rules=_swapping({"notes.txt": fifo}))
    assert not (tmp_path / "copy" / "notes.txt").exists()
    assert "notes.txt" not in copied.sizes


def test_fifos_are_skipped_unopened_or_refused_by_the_rules(data: Path, tmp_path: Path) -> None:
    os.mkfifo(data / "pipe")  # opening it to read would wait for a writer forever
    copy_tree(data, tmp_path / "copy")
    assert not (tmp_path / "copy" / "pipe").exists()

    def refuse(rel: str) -> None:
        raise ValueError(f"{rel} is special")

    with pytest.raises(ValueError, match="pipe is special"):
        copy_tree(data, tmp_path / "refused", rules=Rules(special=refuse))


@AS_ROOT
def test_a_device_is_skipped_unopened(data: Path, tmp_path: Path) -> None:
    os.mknod(data / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    copy_tree(data, tmp_path / "copy")
    assert not (tmp_path / "copy" / "null").exists()


@pytest.mark.parametrize(
    "mode",
    [pytest.param(0o000, marks=AS_ROOT), 0o400, 0o644, 0o755, 0o4755, 0o2711, 0o6777, 0o1644],
)
def test_file_modes_are_kept_exactly(data: Path, tmp_path: Path, mode: int) -> None:
    (data / "notes.txt").chmod(mode)
    copy_tree(data, tmp_path / "copy")
    assert stat.S_IMODE((tmp_path / "copy" / "notes.txt").stat().st_mode) == mode
    assert (tmp_path / "copy" / "notes.txt").read_bytes() == b"one"


def test_folder_modes_are_kept_even_when_the_copy_could_not_be_written_under_them(
    data: Path, tmp_path: Path
) -> None:
    (data / "sub").chmod(0o1750)
    (data / "sub" / "deeper").chmod(0o500)
    data.chmod(0o2750)
    copy_tree(data, tmp_path / "copy")
    copy = tmp_path / "copy"
    assert stat.S_IMODE((copy / "sub" / "deeper").stat().st_mode) == 0o500
    assert stat.S_IMODE((copy / "sub").stat().st_mode) == 0o1750
    assert stat.S_IMODE(copy.stat().st_mode) == 0o2750
    assert (copy / "sub" / "deeper" / "x.bin").stat().st_size == 5000


def test_set_id_bits_only_as_the_source_had_them(data: Path, tmp_path: Path) -> None:
    (data / "plain").write_bytes(b"#!/bin/sh\n")
    (data / "plain").chmod(0o755)
    (data / "setuid").write_bytes(b"#!/bin/sh\n")
    (data / "setuid").chmod(0o4755)
    copy_tree(data, tmp_path / "copy")
    assert stat.S_IMODE((tmp_path / "copy" / "plain").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "copy" / "setuid").stat().st_mode) == 0o4755


@AS_ROOT
def test_owners_are_kept_under_root_and_set_id_bits_survive_the_chown(
    data: Path, tmp_path: Path
) -> None:
    uid, gid = 1879048193, 1879048194
    for path in (data, data / "sub", data / "notes.txt"):
        os.chown(path, uid, gid)
    (data / "notes.txt").chmod(0o6755)  # a chown after a chmod would clear both bits
    (data / "link").symlink_to("notes.txt")
    os.chown(data / "link", uid + 7, gid + 7, follow_symlinks=False)
    copy_tree(data, tmp_path / "copy")
    copy = tmp_path / "copy"
    for rel in ("", "sub", "notes.txt"):
        info = (copy / rel).lstat()
        assert (info.st_uid, info.st_gid) == (uid, gid), rel
    assert stat.S_IMODE((copy / "notes.txt").stat().st_mode) == 0o6755
    assert (copy / "sub" / "deeper").stat().st_uid == 0  # as its source
    link = (copy / "link").lstat()
    assert (link.st_uid, link.st_gid) == (uid + 7, gid + 7)
    assert (copy / "notes.txt").stat().st_uid == uid  # the link's chown did not reach it
    # a source folder's copy (the local fetcher's rules) is the shell's own
    copy_tree(data, tmp_path / "shells", rules=Rules(owners=False))
    assert (tmp_path / "shells" / "notes.txt").stat().st_uid == os.geteuid()


def test_times_are_kept(data: Path, tmp_path: Path) -> None:
    os.utime(data / "notes.txt", ns=(1_000_000_000_123, 2_000_000_000_456))
    os.utime(data / "sub", ns=(3_000_000_000_000, 4_000_000_000_000))
    copy_tree(data, tmp_path / "copy")
    assert (tmp_path / "copy" / "notes.txt").stat().st_mtime_ns == 2_000_000_000_456
    assert (tmp_path / "copy" / "sub").stat().st_mtime_ns == 4_000_000_000_000


def test_the_rules_skip_entries_check_links_and_add_folder_bits(data: Path, tmp_path: Path) -> None:
    (data / ".git").mkdir()
    (data / "sub" / "up").symlink_to("../..")
    (data / "sub").chmod(0o500)

    def check(rel: str, target: str) -> None:
        if target.startswith("../.."):
            raise ValueError(f"{rel} leaves")

    rules = Rules(skip=lambda rel: rel == ".git", folder_bits=0o700, root_mode=0o755)
    (data / "sub" / "up").unlink()
    copy_tree(data, tmp_path / "copy", rules=rules)
    assert not (tmp_path / "copy" / ".git").exists()
    assert stat.S_IMODE((tmp_path / "copy" / "sub").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "copy").stat().st_mode) == 0o755
    (data / "sub").chmod(0o700)
    (data / "sub" / "up").symlink_to("../..")
    with pytest.raises(ValueError, match="sub/up leaves"):
        copy_tree(data, tmp_path / "refused", rules=Rules(check_link=check))


def test_the_target_must_not_exist(data: Path, tmp_path: Path) -> None:
    (tmp_path / "copy").mkdir()
    with pytest.raises(FileExistsError):
        copy_tree(data, tmp_path / "copy")


def test_open_regular_opens_no_link_and_no_fifo(data: Path, host: Path) -> None:
    fd = open_regular(data / "notes.txt")
    os.close(fd)
    (data / "link").symlink_to(host / "f")
    with pytest.raises(OSError, match="symbolic links") as caught:
        open_regular(data / "link")
    assert caught.value.errno == errno.ELOOP
    os.mkfifo(data / "pipe")
    with pytest.raises(OSError, match="not a regular file"):
        open_regular(data / "pipe")


def test_an_empty_result_counts_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert copy_tree(tmp_path / "empty", tmp_path / "copy") == Copied()


def test_bytes_are_copied_hole_for_hole_up_to_the_length_seen_at_the_open(tmp_path: Path) -> None:
    # a file lengthened after its fstat (here: the length passed is shorter than the file) is
    # copied as long as it was; holes stay holes, and the regions holding data keep their bytes
    source = tmp_path / "sparse"
    with source.open("wb") as file:
        file.truncate(64 << 20)
        file.seek(8 << 20)
        file.write(b"middle")
        file.seek((64 << 20) - 3)
        file.write(b"end")
    target = tmp_path / "copy"
    src = os.open(source, os.O_RDONLY)
    dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        copy_bytes(src, dst, 32 << 20)
    finally:
        os.close(src)
        os.close(dst)
    copied = target.read_bytes()
    assert len(copied) == 32 << 20
    assert copied[8 << 20 : (8 << 20) + 6] == b"middle"
    assert copied.count(0) == len(copied) - 6
    assert target.stat().st_blocks * 512 < 1 << 20


def _exchange(one: Path, other: Path) -> None:
    """`renameat2(RENAME_EXCHANGE)`: both names always exist, each now naming the other's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, bytes(one), -100, bytes(other), 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
        raise OSError(ctypes.get_errno(), f"renameat2 {one} {other}")


def test_an_app_that_swaps_an_entry_before_every_look_cannot_fail_the_copy(
    data: Path, host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A racing app of the data's uid wins each race when the copier is slow beside it (a shell
    under load, a thread waiting for the GIL): each name is swapped with a link to a host file
    (its folder) just before every call that names it. Real files, real exchanges; only the
    timing is forced, which a racing process gives only now and then. The copy is made whatever
    the order, never through a link (the racer is beaten by looking once, not by retrying)."""
    (data / "notes.l").symlink_to(host / "f")
    (data / "sub.l").symlink_to(host)
    file_mode = stat.S_IMODE((data / "notes.txt").stat().st_mode)
    folder_mode = stat.S_IMODE((data / "sub").stat().st_mode)
    pairs = {"notes.txt": "notes.l", "sub": "sub.l"}
    pairs |= {link: name for name, link in pairs.items()}
    swaps = 0

    def racing(call: Callable[..., object]) -> Callable[..., object]:
        def named(path: object, *args: object, **kwargs: object) -> object:
            nonlocal swaps
            if isinstance(path, str) and path in pairs and kwargs.get("dir_fd") is not None:
                _exchange(data / path, data / pairs[path])
                swaps += 1
            return call(path, *args, **kwargs)

        return named

    for name in ("open", "stat", "lstat", "readlink"):
        monkeypatch.setattr(os, name, racing(getattr(os, name)))
    copied = copy_tree(data, tmp_path / "copy")
    monkeypatch.undo()
    assert swaps >= 4
    tree = _tree(tmp_path / "copy")
    for name in ("notes.txt", "notes.l"):
        assert tree[name] in {("f", file_mode, b"one"), ("l", 0, str(host / "f"))}, tree
    for name in ("sub", "sub.l"):
        assert tree[name] in {("d", folder_mode, ""), ("l", 0, str(host))}, tree
    assert not _holds_secret(tmp_path / "copy")
    assert stat.S_IMODE((host / "f").stat().st_mode) == 0o600
    assert copied.files == sum(1 for kind, _, _ in tree.values() if kind == "f")
