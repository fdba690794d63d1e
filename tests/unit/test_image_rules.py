"""The pure rules of the image store: what each layer member becomes, and the image config laid
under the manifest's ``runtime``."""

from __future__ import annotations

import json
import tarfile
from typing import Any

import pytest

from atrium.images.config import (
    ConfigInvalid,
    ImageConfig,
    image_port,
    launch,
    parse_config,
    resolve_user,
)
from atrium.images.layers import (
    Kind,
    LayerRefused,
    Node,
    plan,
    resolve_link,
    symlink_stays_inside,
)
from atrium.manifest import Runtime


def member(name: str, kind: bytes = tarfile.REGTYPE, **extra: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in extra.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize(
    ("parts", "target", "inside"),
    [
        (("bin", "sh"), "/bin/busybox", True),
        (("bin", "sh"), "busybox", True),
        (("usr", "lib", "x"), "../../etc/x", True),
        (("usr", "lib", "x"), "../../../etc/x", False),
        (("x",), "..", False),
        (("a", "b"), "../../..", False),
        (("a",), "/../etc", False),
        (("a", "b"), "c/../../d", True),
        (("a",), "", False),
    ],
)
def test_a_symlink_stays_inside_read_as_the_image_sees_it(
    parts: tuple[str, ...], target: str, inside: bool
) -> None:
    assert symlink_stays_inside(parts, target) is inside


#: a tree: folders, files and links (a link's target), as `resolve_link` looks at it
TREE: dict[tuple[str, ...], tuple[Node, str]] = {
    ("usr",): (Node.FOLDER, ""),
    ("usr", "lib"): (Node.FOLDER, ""),
    ("lib",): (Node.LINK, "usr/lib"),
    ("d",): (Node.LINK, "."),
    ("etc",): (Node.FOLDER, ""),
    ("etc", "passwd"): (Node.OTHER, ""),
}


def look(parts: tuple[str, ...]) -> tuple[Node, str]:
    return TREE.get(parts, (Node.MISSING, ""))


@pytest.mark.parametrize(
    ("target", "lands"),
    [
        ("lib/..", ("usr",)),
        ("/lib/../../etc", ("etc",)),
        ("d/d/usr/lib", ("usr", "lib")),
        ("missing/x/..", ("missing",)),  # past a missing path the rest is read as written
        ("etc/passwd/..", ("etc",)),
    ],
)
def test_a_link_resolves_through_the_trees_own_links(target: str, lands: tuple[str, ...]) -> None:
    assert resolve_link(("x",), target, look) == lands


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("d/..", "leaves the image's root"),
        ("/d/../etc", "leaves the image's root"),
        # a folder made later where nothing is now (a data mount point) would be followed
        ("missing/../d/..", "leaves the image's root"),
        ("lib/../../..", "leaves the image's root"),
        ("self", "more than 40 links"),
    ],
)
def test_a_link_that_resolves_outside_is_refused(target: str, words: str) -> None:
    tree = {**TREE, ("self",): (Node.LINK, "self")}
    with pytest.raises(LayerRefused, match=words) as refused:
        resolve_link(("x",), target, lambda parts: tree.get(parts, (Node.MISSING, "")))
    assert "symbolic link /x " in str(refused.value)


def test_each_member_kind_becomes_its_step() -> None:
    assert plan(member("./www/index.html", size=3, mode=0o4755)).mode == 0o555
    assert plan(member("www/a.txt", mode=0o600)).mode == 0o444
    assert plan(member("www/", tarfile.DIRTYPE, mode=0o777)).mode == 0o755
    assert plan(member("www/.wh.old.html")).parts == ("www", "old.html")
    assert plan(member("www/.wh.old.html")).kind is Kind.WHITEOUT
    assert plan(member("www/.wh..wh..opq")).kind is Kind.OPAQUE
    assert plan(member("dev/null", tarfile.CHRTYPE)).kind is Kind.SKIP
    assert plan(member("dev/sda", tarfile.BLKTYPE)).kind is Kind.SKIP
    assert plan(member("run/fifo", tarfile.FIFOTYPE)).kind is Kind.SKIP
    assert plan(member("./", tarfile.DIRTYPE)).parts == ()
    hard = plan(member("bin/ls", tarfile.LNKTYPE, linkname="./bin/busybox"))
    assert (hard.kind, hard.target_parts) == (Kind.HARDLINK, ("bin", "busybox"))


@pytest.mark.parametrize(
    ("info", "words"),
    [
        (member("../x"), "climbs out"),
        (member("a/../../x"), "climbs out"),
        (member("/etc/passwd"), "is absolute"),
        (member("a\x00b"), "NUL"),
        (member("x", tarfile.SYMTYPE, linkname="../../etc"), "leaves the image's root"),
        (member("x", tarfile.LNKTYPE, linkname="/etc/passwd"), "is absolute"),
        (member("x", tarfile.LNKTYPE, linkname="../etc/passwd"), "climbs out"),
        (member("x", tarfile.LNKTYPE, linkname="."), "points at the root"),
        (member("a/.wh."), "names nothing"),
        (member("a/.wh..."), "names nothing"),
        (member("./", tarfile.SYMTYPE, linkname="/"), "would replace the root"),
    ],
)
def test_hostile_members_are_refused(info: tarfile.TarInfo, words: str) -> None:
    with pytest.raises(LayerRefused, match=words):
        plan(info)


def config(**inner: Any) -> bytes:
    return json.dumps({"architecture": "amd64", "os": "linux", "config": inner}).encode()


def runtime(**extra: Any) -> Runtime:
    return Runtime.model_validate(
        {"image": "r.example/web:1", "port": 8080, "health": {"path": "/"}, **extra}
    )


def test_the_manifest_overrides_the_image() -> None:
    image = parse_config(
        config(
            Entrypoint=["/bin/app"],
            Cmd=["--serve"],
            Env=["A=1", "B=x=y"],
            WorkingDir="/srv/",
            ExposedPorts={"80/tcp": {}, "53/udp": {}, "443": {}},
            User="1000",
        )
    )
    assert image == ImageConfig(
        entrypoint=("/bin/app",),
        cmd=("--serve",),
        env=(("A", "1"), ("B", "x=y")),
        working_dir="/srv",
        exposed_ports=(80, 443),
        user="1000",
        architecture="amd64",
        os="linux",
    )
    plain = launch(image, runtime())
    assert plain.argv == ("/bin/app", "--serve")
    assert plain.env["A"] == "1"
    assert plain.env["PATH"].startswith("/usr/local/sbin")
    assert (plain.cwd, plain.port, plain.uid, plain.gid) == ("/srv", 8080, 1000, 1000)
    over = launch(image, runtime(command=["/bin/other"], env={"A": "2", "PATH": "/bin"}))
    assert over.argv == ("/bin/other",)
    assert over.env == {"A": "2", "B": "x=y", "PATH": "/bin"}
    assert launch(parse_config(config()), runtime(command=["/x"])).cwd == "/"


def test_the_port_is_the_manifests_else_the_one_the_image_exposes() -> None:
    web = parse_config(config(Cmd=["/bin/app"], ExposedPorts={"8000/tcp": {}, "53/udp": {}}))
    assert image_port(web, runtime()) == 8080
    assert image_port(web, runtime(port=None)) == 8000
    both = parse_config(config(Cmd=["/bin/app"], ExposedPorts={"80/tcp": {}, "443/tcp": {}}))
    with pytest.raises(ConfigInvalid, match=r"several TCP ports \(80, 443\)"):
        image_port(both, runtime(port=None))
    with pytest.raises(ConfigInvalid, match="names no TCP port"):
        image_port(parse_config(config(Cmd=["/bin/app"])), runtime(port=None))


def test_an_image_with_nothing_to_run_needs_a_command() -> None:
    with pytest.raises(ConfigInvalid, match=r"no Entrypoint or Cmd"):
        launch(parse_config(config()), runtime())


PASSWD = "root:x:0:0::/root:/bin/sh\nwww-data:x:33:33::/var/www:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nwww-data:x:33:\nstaff:x:50:\n"


@pytest.mark.parametrize(
    ("user", "ids"),
    [
        ("", (0, 0)),
        ("33", (33, 33)),
        ("www-data", (33, 33)),
        ("www-data:staff", (33, 50)),
        ("33:50", (33, 50)),
        ("1000:www-data", (1000, 33)),
    ],
)
def test_user_is_resolved_from_the_images_own_files(user: str, ids: tuple[int, int]) -> None:
    assert resolve_user(user, PASSWD, GROUP) == ids


@pytest.mark.parametrize(
    ("user", "words"),
    [("nobody", "does not define"), ("33:wheel", "does not define"), ("70000", "beyond 65535")],
)
def test_an_unknown_user_is_refused(user: str, words: str) -> None:
    with pytest.raises(ConfigInvalid, match=words):
        resolve_user(user, PASSWD, GROUP)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (config(Entrypoint="/bin/sh -c x"), "Entrypoint is not a list of strings"),
        (config(Env=["NOEQUALS"]), "is not NAME=value"),
        (config(Env=["1A=x"]), "is not NAME=value"),
        (config(WorkingDir="relative"), "is not absolute"),
        (config(ExposedPorts={"http": {}}), "not <port>/tcp"),
        (config(ExposedPorts={"70000/tcp": {}}), "not <port>/tcp"),
        (config(User=0), "User is not a string"),
    ],
)
def test_a_bad_image_config_names_its_field(body: bytes, words: str) -> None:
    with pytest.raises(ConfigInvalid, match=words):
        parse_config(body)
