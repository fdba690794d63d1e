"""The image store against a real docker-registry: images the test builds itself (stdlib tar and
json), pushed with the project's registry client (and read back by skopeo), pulled by digest,
verified and unpacked; then a hostile layer of each kind, a corrupt blob, a killed pull, and the
busybox httpd of the unpacked image run under bubblewrap with the image as a read-only ``/``."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import pytest
import zstandard

from atrium.distribution import artifact
from atrium.distribution.ociclient import RegistryClient
from atrium.distribution.reach import FetchPolicy, Reach
from atrium.errors import FetchHostRefused
from atrium.images.config import launch
from atrium.images.store import STAGING, ImageError, ImageStore, machine_arch
from atrium.manifest import Runtime
from tests.integration.registry import Registry, free_port, running_registry

pytestmark = pytest.mark.integration

BUSYBOX: Final = Path("/bin/busybox")
GZIP_LAYER: Final = "application/vnd.oci.image.layer.v1.tar+gzip"
ZSTD_LAYER: Final = "application/vnd.oci.image.layer.v1.tar+zstd"
TAR_LAYER: Final = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE: Final = "application/vnd.oci.image.config.v1+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("image-registry")) as started:
        yield started


# -- building images with the standard library ---------------------------------------------------


@dataclass
class Layer:
    """A tar layer under construction: add members, then ``blob()`` compresses it."""

    compression: str = "gzip"
    members: list[tuple[tarfile.TarInfo, bytes | None]] = field(default_factory=list)
    #: bytes written as they are before the members (headers tarfile cannot write)
    raw: bytes = b""

    def folder(self, name: str, mode: int = 0o755) -> Layer:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, mode
        self.members.append((info, None))
        return self

    def file(self, name: str, data: bytes, mode: int = 0o644) -> Layer:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        self.members.append((info, data))
        return self

    def padded(self, name: str, header_bytes: int) -> Layer:
        """A file whose PAX extended header carries ``header_bytes`` of comment."""
        info = tarfile.TarInfo(name)
        info.pax_headers = {"comment": "a" * header_bytes}
        self.members.append((info, b""))
        return self

    def link(self, name: str, target: str, *, hard: bool = False) -> Layer:
        info = tarfile.TarInfo(name)
        info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
        info.linkname = target
        self.members.append((info, None))
        return self

    def special(self, name: str, kind: bytes) -> Layer:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.devmajor, info.devminor = 1, 3
        self.members.append((info, None))
        return self

    def blob(self) -> tuple[str, bytes]:
        raw = io.BytesIO()
        raw.write(self.raw)
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in self.members:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        plain = raw.getvalue()
        if self.compression == "gzip":
            return GZIP_LAYER, gzip.compress(plain, compresslevel=1, mtime=0)
        if self.compression == "zstd":
            return ZSTD_LAYER, zstandard.ZstdCompressor().compress(plain)
        return TAR_LAYER, plain


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def push_image(
    registry: Registry,
    repository: str,
    tag: str,
    layers: list[Layer],
    config: dict[str, object],
    arch: str | None = None,
) -> tuple[str, list[str]]:
    """Push the image with the project's registry client; its manifest digest and layer digests."""
    config_body = json.dumps(
        {
            "architecture": arch or machine_arch(),
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": []},
        }
    ).encode()
    async with RegistryClient(registry.host, repository, docker_config=None, push=True) as client:
        descriptors, digests = [], []
        for layer in layers:
            media_type, body = layer.blob()
            digest = digest_of(body)
            with tempfile.TemporaryDirectory() as folder:
                (Path(folder) / "blob").write_bytes(body)  # aiohttp warns on large bytes bodies
                await client.push_blob(Path(folder) / "blob", digest)
            descriptors.append({"mediaType": media_type, "digest": digest, "size": len(body)})
            digests.append(digest)
        await client.push_blob(config_body, digest_of(config_body))
        manifest = {
            "schemaVersion": 2,
            "mediaType": artifact.OCI_MANIFEST,
            "config": {
                "mediaType": CONFIG_TYPE,
                "digest": digest_of(config_body),
                "size": len(config_body),
            },
            "layers": descriptors,
        }
        body = json.dumps(manifest).encode()
        return await client.put_manifest(tag, body, artifact.OCI_MANIFEST), digests


def busybox_layers() -> list[Layer]:
    """Layer 1: busybox, a web root, a folder with two files; layer 2 whites out one page and
    makes the folder opaque, with one new file in it."""
    base = (
        Layer()
        .folder("bin")
        .file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
        .link("bin/sh", "/bin/busybox")
        .folder("etc")
        .file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nwww:x:33:34:www:/www:/bin/sh\n")
        .file("etc/group", b"root:x:0:\nweb:x:34:\n")
        .folder("www")
        .file("www/index.html", b"old index\n")
        .file("www/old.html", b"to be whited out\n")
        .folder("opq")
        .file("opq/a", b"a\n")
        .folder("opq/sub")
        .file("opq/sub/b", b"b\n")
    )
    top = (
        Layer(compression="zstd")
        .file("www/.wh.old.html", b"")
        .file("www/index.html", b"hello from the image\n")
        .file("opq/.wh..wh..opq", b"")
        .file("opq/c", b"c\n")
    )
    return [base, top]


BUSYBOX_CONFIG: Final[dict[str, object]] = {
    "Entrypoint": ["/bin/busybox", "httpd", "-f"],
    "Cmd": ["-p", "80", "-h", "/www"],
    "Env": ["PATH=/bin", "GREETING=hi"],
    "WorkingDir": "/www",
    "ExposedPorts": {"80/tcp": {}},
    "User": "www:web",
}


def runtime(registry: Registry, repository: str, digest: str, **extra: object) -> Runtime:
    return Runtime.model_validate(
        {
            "image": f"{registry.host}/{repository}@{digest}",
            "port": 8080,
            "health": {"path": "/"},
            **extra,
        }
    )


def store_entries(root: Path) -> list[str]:
    staging = root / STAGING
    return sorted(p.name for p in root.iterdir() if p.name != STAGING) + sorted(
        f"{STAGING}/{p.name}" for p in (staging.iterdir() if staging.is_dir() else [])
    )


# -- the busybox image ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def busybox(registry: Registry) -> str:
    push = push_image(registry, "apps/busybox", "1", busybox_layers(), BUSYBOX_CONFIG)
    digest, _ = asyncio.run(push)
    return digest


async def test_busybox_is_pulled_verified_and_unpacked_with_whiteouts(
    registry: Registry, busybox: str, tmp_path: Path
) -> None:
    raw = subprocess.run(
        [
            "skopeo",
            "inspect",
            "--raw",
            "--tls-verify=false",
            f"docker://{registry.host}/apps/busybox@{busybox}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout
    assert digest_of(raw) == busybox  # what the client pushed is a standard image to skopeo

    store = ImageStore(tmp_path / "images")
    image = await store.pull(registry.host, "apps/busybox", busybox)
    rootfs = image.rootfs
    assert image.path == tmp_path / "images" / busybox.replace(":", "-")
    assert not image.reused
    assert (rootfs / "www/index.html").read_text() == "hello from the image\n"
    assert not (rootfs / "www/old.html").exists()  # whiteout applied
    assert sorted(p.name for p in (rootfs / "opq").iterdir()) == ["c"]  # opaque folder applied
    assert (rootfs / "bin/sh").readlink() == Path("/bin/busybox")
    assert (rootfs / "bin/busybox").read_bytes() == BUSYBOX.read_bytes()
    assert stat.S_IMODE((rootfs / "bin/busybox").stat().st_mode) == 0o555
    assert stat.S_IMODE((rootfs / "etc/passwd").stat().st_mode) == 0o444
    assert stat.S_IMODE((rootfs / "www").stat().st_mode) == 0o755
    assert image.files >= 10
    assert image.size > BUSYBOX.stat().st_size
    assert store_entries(tmp_path / "images") == [busybox.replace(":", "-")]
    for mount_point in ("proc", "dev", "sys", "tmp", "run"):
        assert list((rootfs / mount_point).iterdir()) == []

    plan = launch(
        image.config,
        runtime(registry, "apps/busybox", busybox, env={"GREETING": "hello"}),
        passwd=(rootfs / "etc/passwd").read_text(),
        group=(rootfs / "etc/group").read_text(),
    )
    assert plan.argv == ("/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www")
    assert plan.env == {"PATH": "/bin", "GREETING": "hello"}
    assert (plan.cwd, plan.port, plan.uid, plan.gid) == ("/www", 8080, 33, 34)
    assert image.config.exposed_ports == (80,)

    again = await ImageStore(tmp_path / "images").pull(registry.host, "apps/busybox", busybox)
    assert again.reused
    assert again.rootfs == rootfs
    assert again.files == image.files


async def test_a_second_pull_asks_the_registry_unless_its_copy_already_runs_it(
    registry: Registry, busybox: str, tmp_path: Path
) -> None:
    store = ImageStore(tmp_path / "images")
    first = await store.pull(registry.host, "apps/busybox", busybox)
    inode = first.rootfs.stat().st_ino
    # an address where nothing listens: the stored entry is used without asking by the copy
    # that already runs it, and refused to anyone else (a digest is no proof of access)
    again = await store.pull(f"127.0.0.1:{free_port()}", "apps/busybox", busybox, known=True)
    assert again.reused
    assert again.rootfs.stat().st_ino == inode
    with pytest.raises(ImageError, match="cannot reach the registry"):
        await store.pull(f"127.0.0.1:{free_port()}", "apps/busybox", busybox)
    # a repository that does not serve the digest gives nothing, though the store holds it
    with pytest.raises(ImageError):
        await store.pull(registry.host, "apps/elsewhere", busybox)
    again = await store.pull(registry.host, "apps/busybox", busybox)
    assert again.reused
    assert again.rootfs.stat().st_ino == inode


async def test_a_corrupt_layer_is_refused_and_nothing_is_stored(
    registry: Registry, tmp_path: Path
) -> None:
    layer = Layer().file("hello.txt", b"original content\n")
    digest, (layer_digest,) = await push_image(registry, "apps/corrupt", "1", [layer], {})
    data = registry.blob_data(layer_digest)
    body = bytearray(data.read_bytes())
    body[-20] ^= 0xFF  # same size, other bytes: only the digest can tell
    data.write_bytes(bytes(body))
    store = ImageStore(tmp_path / "images")
    with pytest.raises(ImageError, match="digest mismatch"):
        await store.pull(registry.host, "apps/corrupt", digest)
    assert store_entries(tmp_path / "images") == []


HOSTILE: Final[list[tuple[str, Layer, str]]] = [
    ("dotdot", Layer().file("../x", b"escaped\n"), "climbs out with '..'"),
    ("absolute-name", Layer().file("/etc/x", b"x\n"), "is absolute"),
    ("relative-link-out", Layer().folder("a").link("a/up", "../../etc"), "leaves the image's root"),
    ("hard-link-absolute", Layer().link("pw", "/etc/passwd", hard=True), "is absolute"),
    ("hard-link-out", Layer().link("pw", "../../etc/passwd", hard=True), "climbs out"),
    ("hard-link-missing", Layer().link("pw", "etc/passwd", hard=True), "not in the image"),
]


@pytest.mark.parametrize(("name", "layer", "words"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_a_hostile_layer_is_refused_and_nothing_is_stored(
    registry: Registry, tmp_path: Path, name: str, layer: Layer, words: str
) -> None:
    digest, _ = await push_image(registry, f"apps/hostile-{name}", "1", [layer], {})
    store = ImageStore(tmp_path / "images")
    with pytest.raises(ImageError, match="is refused") as refused:
        await store.pull(registry.host, f"apps/hostile-{name}", digest)
    assert words in refused.value.reason
    assert store_entries(tmp_path / "images") == []


async def test_an_absolute_link_stays_inside_and_nothing_is_written_through_a_link(
    registry: Registry, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    # the link itself is kept (inside the sandbox it names the image's own folder), but a later
    # member under it would land on the host's folder: refused
    layer = Layer().link("evil", str(outside)).file("evil/planted", b"planted\n")
    digest, _ = await push_image(registry, "apps/through-link", "1", [layer], {})
    store = ImageStore(tmp_path / "images")
    with pytest.raises(ImageError, match="through the symbolic link /evil"):
        await store.pull(registry.host, "apps/through-link", digest)
    assert list(outside.iterdir()) == []
    assert store_entries(tmp_path / "images") == []

    # the same through a later layer (the link came from a lower one)
    lower = Layer().link("evil", str(outside))
    upper = Layer(compression="none").file("evil/planted", b"planted\n")
    digest, _ = await push_image(registry, "apps/through-link", "2", [lower, upper], {})
    with pytest.raises(ImageError, match="through the symbolic link /evil"):
        await store.pull(registry.host, "apps/through-link", digest)
    assert list(outside.iterdir()) == []

    # a folder the unpacker already walked through, replaced by a link in the same layer
    swapped = (
        Layer()
        .folder("evil")
        .file("evil/first", b"first\n")
        .link("evil", str(outside))
        .file("evil/planted", b"planted\n")
    )
    digest, _ = await push_image(registry, "apps/through-link", "3", [swapped], {})
    with pytest.raises(ImageError, match="through the symbolic link /evil"):
        await store.pull(registry.host, "apps/through-link", digest)
    assert list(outside.iterdir()) == []
    assert store_entries(tmp_path / "images") == []

    kept = Layer().folder("bin").link("bin/sh", "/bin/busybox").link("up", "a/../b")
    digest, _ = await push_image(registry, "apps/abs-link", "1", [kept], {})
    image = await store.pull(registry.host, "apps/abs-link", digest)
    assert (image.rootfs / "bin/sh").readlink() == Path("/bin/busybox")


#: links whose every target reads as inside, one by one, yet resolve outside the rootfs through
#: the tree's own links (the unpacked entry's parent, the store, the host)
ESCAPING_LINKS: Final[list[tuple[str, list[Layer], str]]] = [
    ("dot-then-up", [Layer().link("d", ".").link("x", "d/..")], "/x"),
    ("absolute-dot", [Layer().link("d", "/").link("x", "/d/../etc")], "/x"),
    ("deeper", [Layer().folder("a").link("a/d", "..").link("a/x", "d/a/d/..")], "/a/x"),
    (
        "across-layers",
        [Layer().folder("d").link("x", "d/.."), Layer().link("d", ".")],
        "/x",
    ),
    ("chain", [Layer().link("d", ".").link("e", "d").link("x", "e/../y")], "/x"),
]


@pytest.mark.parametrize(
    ("name", "layers", "path"), ESCAPING_LINKS, ids=[e[0] for e in ESCAPING_LINKS]
)
async def test_a_link_resolved_through_the_trees_own_links_may_not_leave_the_rootfs(
    registry: Registry, tmp_path: Path, name: str, layers: list[Layer], path: str
) -> None:
    digest, _ = await push_image(registry, f"apps/escape-{name}", "1", layers, {})
    store = ImageStore(tmp_path / "images")
    with pytest.raises(ImageError, match="is refused") as refused:
        await store.pull(registry.host, f"apps/escape-{name}", digest)
    assert f"symbolic link {path} " in refused.value.reason
    assert "leaves the image's root" in refused.value.reason
    assert store_entries(tmp_path / "images") == []


async def test_links_that_resolve_inside_are_kept_and_a_loop_is_refused(
    registry: Registry, tmp_path: Path
) -> None:
    store = ImageStore(tmp_path / "images")
    kept = (
        Layer()
        .folder("usr")
        .folder("usr/lib")
        .link("lib", "usr/lib")
        .link("up", "lib/..")  # /usr
        .link("abs", "/lib/../bin")  # /usr/bin, missing: a dangling link is kept
        .link("d", ".")
        .link("self", "d/d/d/usr")
    )
    digest, _ = await push_image(registry, "apps/links-inside", "1", [kept], {})
    image = await store.pull(registry.host, "apps/links-inside", digest)
    assert (image.rootfs / "up").readlink() == Path("lib/..")

    # an entry unpacked before every pull resolved its links is checked once when next used:
    # kept and marked when its links stay inside, else retired (never launched again)
    meta_path = image.path / "image.json"
    meta = json.loads(meta_path.read_text())
    assert meta.pop("links") == "resolved"
    meta_path.chmod(0o644)
    meta_path.write_text(json.dumps(meta))
    assert store.get(digest) is not None
    assert json.loads(meta_path.read_text())["links"] == "resolved"
    meta_path.chmod(0o644)
    meta_path.write_text(json.dumps(meta))
    (image.rootfs / "out").symlink_to("d/..")
    assert store.get(digest) is None
    assert not image.path.exists()
    store.sweep()
    assert store_entries(tmp_path / "images") == []

    loop = Layer().link("a", "b").link("b", "a/x")
    digest, _ = await push_image(registry, "apps/links-loop", "1", [loop], {})
    with pytest.raises(ImageError, match="more than 40 links"):
        await store.pull(registry.host, "apps/links-loop", digest)
    # a hard link or a whiteout through such a link is never followed either
    for tag, member in (
        ("2", Layer().link("d/f", "f", hard=True)),
        ("3", Layer().file("d/.wh.f", b"")),
    ):
        layers = [Layer().file("f", b"f\n").link("d", "."), member]
        digest, _ = await push_image(registry, "apps/links-loop", tag, layers, {})
        with pytest.raises(ImageError, match="through the symbolic link /d"):
            await store.pull(registry.host, "apps/links-loop", digest)


async def test_devices_and_fifos_are_skipped_and_setid_bits_cleared(
    registry: Registry, tmp_path: Path
) -> None:
    layer = (
        Layer(compression="none")
        .folder("dev")
        .special("dev/null", tarfile.CHRTYPE)
        .special("dev/sda", tarfile.BLKTYPE)
        .special("pipe", tarfile.FIFOTYPE)
        .file("su", b"#!/bin/sh\n", 0o6755)
        .file("data", b"rw\n", 0o666)
        .link("su-again", "su", hard=True)
    )
    digest, _ = await push_image(registry, "apps/specials", "1", [layer], {})
    image = await ImageStore(tmp_path / "images").pull(registry.host, "apps/specials", digest)
    assert list((image.rootfs / "dev").iterdir()) == []
    assert not (image.rootfs / "pipe").exists()
    assert image.skipped == 3
    assert image.setid_cleared == 1
    assert stat.S_IMODE((image.rootfs / "su").stat().st_mode) == 0o555
    assert stat.S_IMODE((image.rootfs / "data").stat().st_mode) == 0o444
    assert (image.rootfs / "su-again").stat().st_ino == (image.rootfs / "su").stat().st_ino


async def test_size_and_file_limits_refuse_with_a_clear_error(
    registry: Registry, tmp_path: Path
) -> None:
    layer = Layer().file("big", b"\0" * (2 << 20)).file("a", b"a").file("b", b"b")
    digest, _ = await push_image(registry, "apps/limits", "1", [layer], {})
    small = ImageStore(tmp_path / "images", max_bytes=1 << 20)
    with pytest.raises(ImageError, match=r"unpacks to more than 1\.0 MiB .* at /big"):
        await small.pull(registry.host, "apps/limits", digest)
    few = ImageStore(tmp_path / "images", max_files=2)
    with pytest.raises(ImageError, match="more than 2 files"):
        await few.pull(registry.host, "apps/limits", digest)
    assert store_entries(tmp_path / "images") == []


async def test_an_index_picks_this_machines_platform(registry: Registry, tmp_path: Path) -> None:
    mine = [Layer().file("which", b"mine\n")]
    digest, _ = await push_image(registry, "apps/multi", "mine", mine, {})
    other = [Layer().file("which", b"other\n")]
    other_digest, _ = await push_image(registry, "apps/multi", "other", other, {}, "s390x")
    async with RegistryClient(registry.host, "apps/multi", docker_config=None, push=True) as c:
        entries = []
        for pushed, arch in ((other_digest, "s390x"), (digest, machine_arch())):
            body = (await c.manifest(pushed)).body
            entries.append(
                {
                    "mediaType": artifact.OCI_MANIFEST,
                    "digest": pushed,
                    "size": len(body),
                    "platform": {"os": "linux", "architecture": arch},
                }
            )
        index = {"schemaVersion": 2, "mediaType": artifact.OCI_INDEX, "manifests": entries}
        index_digest = await c.put_manifest("multi", json.dumps(index).encode(), artifact.OCI_INDEX)
    image = await ImageStore(tmp_path / "images").pull(registry.host, "apps/multi", index_digest)
    assert image.manifest_digest == digest
    assert image.path.name == index_digest.replace(":", "-")
    assert (image.rootfs / "which").read_text() == "mine\n"
    with pytest.raises(ImageError, match="no linux/riscv64 build"):
        await ImageStore(tmp_path / "other", arch="riscv64").pull(
            registry.host, "apps/multi", index_digest
        )
    # pinned to the other platform's manifest directly: its config says so
    with pytest.raises(ImageError, match="built for linux/s390x"):
        await ImageStore(tmp_path / "third").pull(registry.host, "apps/multi", other_digest)
    assert store_entries(tmp_path / "third") == []


FILES: Final = 1_000
PULL_SCRIPT: Final = """
import asyncio, sys
from pathlib import Path
from atrium.images.store import ImageStore
asyncio.run(ImageStore(Path(sys.argv[1])).pull(sys.argv[2], sys.argv[3], sys.argv[4]))
"""


async def test_a_killed_pull_leaves_no_entry_and_its_staging_is_swept(
    registry: Registry, tmp_path: Path
) -> None:
    many = Layer(compression="gzip")  # many small files: slow to unpack, quick to build
    for number in range(FILES):
        many.file(f"f{number}", b"")
    digest, _ = await push_image(registry, "apps/slow", "1", [many], {})
    root = tmp_path / "images"
    child = subprocess.Popen(
        [sys.executable, "-c", PULL_SCRIPT, str(root), registry.host, "apps/slow", digest]
    )
    try:
        deadline = time.monotonic() + 60
        while not list((root / STAGING).glob("*/rootfs/f20")):
            assert child.poll() is None, "the pull ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert [p.name for p in root.iterdir()] == [STAGING]  # no entry, half or whole
    (left,) = (root / STAGING).iterdir()
    assert f"-{child.pid}-" in left.name

    store = ImageStore(root)
    image = await store.pull(registry.host, "apps/slow", digest)
    assert not left.exists()
    assert store_entries(root) == [digest.replace(":", "-")]
    assert image.files == FILES


def test_the_unpacked_busybox_serves_under_bwrap_with_a_read_only_root(
    registry: Registry, busybox: str, tmp_path: Path
) -> None:
    image = asyncio.run(
        ImageStore(tmp_path / "images").pull(registry.host, "apps/busybox", busybox)
    )
    port = free_port()
    server = subprocess.Popen(
        [
            shutil.which("bwrap") or "bwrap",
            "--ro-bind",
            str(image.rootfs),
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",  # noqa: S108 - the sandbox's own /tmp, a fresh tmpfs
            "--unshare-pid",
            "--unshare-ipc",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            "/bin",
            "--chdir",
            "/www",
            "--",
            "/bin/busybox",
            "httpd",
            "-f",
            "-p",
            f"127.0.0.1:{port}",
            "-h",
            "/www",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                assert time.monotonic() < deadline
                time.sleep(0.02)
        response = httpx.get(f"http://127.0.0.1:{port}/index.html", timeout=10)
        assert response.status_code == 200
        assert response.text == "hello from the image\n"
        assert httpx.get(f"http://127.0.0.1:{port}/old.html", timeout=10).status_code == 404
        # the root is read-only inside the sandbox
        touch = subprocess.run(
            [
                "bwrap",
                "--ro-bind",
                str(image.rootfs),
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--",
                "/bin/busybox",
                "touch",
                "/www/new",
            ],
            capture_output=True,
            timeout=20,
        )
        assert touch.returncode != 0
        assert b"Read-only file system" in touch.stderr
    finally:
        server.terminate()
        server.wait(timeout=20)
        if server.stdout is not None:
            server.stdout.close()


async def test_what_the_disk_refuses_is_an_image_error_and_nothing_is_stored(
    registry: Registry, tmp_path: Path
) -> None:
    layer = Layer().file("n" * 300, b"a name longer than a file system allows\n")
    digest, _ = await push_image(registry, "apps/long-name", "1", [layer], {})
    with pytest.raises(ImageError, match="could not be unpacked"):
        await ImageStore(tmp_path / "images").pull(registry.host, "apps/long-name", digest)
    assert store_entries(tmp_path / "images") == []


async def test_skipped_members_count_toward_the_limits(registry: Registry, tmp_path: Path) -> None:
    # entries that leave nothing behind still cost the unpacker: a layer of nothing but fifos and
    # whiteouts is bounded like one of files
    layer = Layer(compression="zstd")
    for number in range(5):
        layer.special(f"pipe{number}", tarfile.FIFOTYPE).file(f".wh.gone{number}", b"")
    digest, _ = await push_image(registry, "apps/only-skipped", "1", [layer], {})
    with pytest.raises(ImageError, match="more than 4 files"):
        await ImageStore(tmp_path / "images", max_files=4).pull(
            registry.host, "apps/only-skipped", digest
        )
    big_whiteout = Layer().file(".wh.big", b"\0" * (2 << 20))
    digest, _ = await push_image(registry, "apps/big-whiteout", "1", [big_whiteout], {})
    with pytest.raises(ImageError, match=r"more than 1\.0 MiB"):
        await ImageStore(tmp_path / "images", max_bytes=1 << 20).pull(
            registry.host, "apps/big-whiteout", digest
        )
    assert store_entries(tmp_path / "images") == []


async def test_a_huge_extended_header_is_refused_before_it_is_read(
    registry: Registry, tmp_path: Path
) -> None:
    """tarfile reads a PAX (or GNU long name) header whole into memory before the store sees
    the member: a layer of a few hundred KiB could make the shell hold gigabytes (a 200 MiB
    header took 700 MiB), no limit of the store's counting it. A header past 1 MiB refuses the
    image before it is read."""
    layer = Layer().file("fine.txt", b"fine\n").padded("padded.txt", 4 << 20)
    digest, _ = await push_image(registry, "apps/huge-header", "1", [layer], {})
    with pytest.raises(ImageError, match="extended header") as refused:
        await ImageStore(tmp_path / "images").pull(registry.host, "apps/huge-header", digest)
    assert "is refused" in refused.value.reason
    assert store_entries(tmp_path / "images") == []
    # a header of a usual size (a long name, a few attributes) is read as before
    usual = Layer().padded("usual.txt", 64 << 10)
    digest, _ = await push_image(registry, "apps/usual-header", "1", [usual], {})
    entry = await ImageStore(tmp_path / "images").pull(registry.host, "apps/usual-header", digest)
    assert (entry.rootfs / "usual.txt").is_file()


def old_gnu_sparse(name: str, extensions: int) -> bytes:
    """An old GNU sparse member (type S) whose map goes on for ``extensions`` 512-byte blocks of
    21 entries each: tarfile keeps every entry in memory as it reads the header."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.GNUTYPE_SPARSE
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    header[482] = 1  # isextended
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header[:512]):06o}".encode() + b"\0 "
    block = bytearray(512)
    for number in range(21):
        block[number * 24 : number * 24 + 24] = b"00000000001\0" * 2
    block[504] = 1
    last = bytearray(block)
    last[504] = 0
    return bytes(header) + bytes(block) * (extensions - 1) + bytes(last)


async def test_a_sparse_member_is_refused_before_its_map_is_read(
    registry: Registry, tmp_path: Path
) -> None:
    """A GNU sparse member's map is read whole into memory as its header is parsed: a 350 KiB
    gzip layer whose map goes on for 200,000 blocks made the process hold 300 MiB. No image
    builder writes sparse members; one refuses the image."""
    layer = Layer(raw=old_gnu_sparse("holes", 3)).file("fine.txt", b"fine\n")
    digest, _ = await push_image(registry, "apps/sparse", "1", [layer], {})
    with pytest.raises(ImageError, match="sparse") as refused:
        await ImageStore(tmp_path / "images").pull(registry.host, "apps/sparse", digest)
    assert "is refused" in refused.value.reason
    assert store_entries(tmp_path / "images") == []


async def test_a_pull_under_way_is_not_swept_by_another_store_of_this_process(
    registry: Registry, tmp_path: Path
) -> None:
    many = Layer(compression="gzip")
    for number in range(FILES):
        many.file(f"f{number}", b"")
    digest, _ = await push_image(registry, "apps/slow", "1", [many], {})
    root = tmp_path / "images"
    pulling = asyncio.create_task(ImageStore(root).pull(registry.host, "apps/slow", digest))
    deadline = time.monotonic() + 60
    while not list((root / STAGING).glob("*/rootfs/f20")):
        assert not pulling.done(), "the pull ended before the other store could sweep"
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    assert ImageStore(root).sweep() == []
    image = await pulling
    assert image.files == FILES


async def test_a_members_pull_reaches_only_where_a_members_fetch_may(
    registry: Registry, busybox: str, tmp_path: Path
) -> None:
    # the registry is on loopback: the shell's own pull may go there, a member's may not
    member = Reach(FetchPolicy())
    with pytest.raises(FetchHostRefused):
        await ImageStore(tmp_path / "images").pull(
            registry.host, "apps/busybox", busybox, reach=member
        )
    assert store_entries(tmp_path / "images") == []
    allowed = Reach(FetchPolicy.parse(["127.0.0.1"]))
    image = await ImageStore(tmp_path / "images").pull(
        registry.host, "apps/busybox", busybox, reach=allowed
    )
    assert (image.rootfs / "www/index.html").is_file()


async def test_a_docker_format_image_written_by_skopeo_is_pulled(
    registry: Registry, tmp_path: Path
) -> None:
    layers = [Layer().folder("etc").file("etc/hello", b"from a docker v2 image\n")]
    layers.append(Layer().file("etc/.wh.hello", b"").file("etc/other", b"other\n"))
    oci_digest, _ = await push_image(registry, "apps/oci-src", "1", layers, {"Cmd": ["/x"]})
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            "--format",
            "v2s2",
            f"docker://{registry.host}/apps/oci-src@{oci_digest}",
            f"docker://{registry.host}/apps/docker-format:1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    async with RegistryClient(registry.host, "apps/docker-format", docker_config=None) as client:
        pulled = await client.manifest("1")
    assert pulled.media_type == artifact.DOCKER_MANIFEST
    image = await ImageStore(tmp_path / "images").pull(
        registry.host, "apps/docker-format", pulled.digest
    )
    assert sorted(p.name for p in (image.rootfs / "etc").iterdir()) == ["other"]
    assert image.config.cmd == ("/x",)
