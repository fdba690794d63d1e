"""The init container's fetch (`atrium.lifecycle.runners.kubernetes.fetch`) and the tar it checks
(`source`): the same folder gives the same bytes, and nothing in an archive reaches outside its
target."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import threading
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from atrium.lifecycle.runners.kubernetes import fetch
from atrium.lifecycle.runners.kubernetes.source import digest_of, source_digest, source_tar


def app_folder(root: Path) -> Path:
    app = root / "app"
    (app / "static").mkdir(parents=True)
    (app / "server.py").write_text("print('hi')\n")
    (app / "static" / "index.html").write_text("<p>hi</p>")
    (app / "run.sh").write_text("#!/bin/sh\n")
    (app / "run.sh").chmod(0o755)
    (app / ".git").mkdir()
    (app / ".git" / "HEAD").write_text("ref: x")
    (app / "outside").symlink_to("/etc/passwd")
    return app


def tar_of(*members: tarfile.TarInfo) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


def test_the_digest_is_the_contents_not_the_copy(tmp_path: Path) -> None:
    app = app_folder(tmp_path)
    first = source_tar(app)
    (app / "server.py").touch()  # a newer time, the same bytes
    assert source_tar(app) == first
    (app / "server.py").write_text("print('changed')\n")
    assert source_digest(app) != digest_of(first)


def test_the_tar_holds_files_and_folders_only(tmp_path: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(source_tar(app_folder(tmp_path)))) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert set(names) == {"run.sh", "server.py", "static", "static/index.html"}
    assert names["run.sh"].mode == 0o755
    assert names["server.py"].mode == 0o644


def test_unpack_gives_the_same_files(tmp_path: Path) -> None:
    app = app_folder(tmp_path)
    fetch.unpack(source_tar(app), tmp_path / "to")
    assert (tmp_path / "to" / "static" / "index.html").read_text() == "<p>hi</p>"
    assert (tmp_path / "to" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert not (tmp_path / "to" / "outside").exists()


@pytest.mark.parametrize(
    "bad",
    [
        member("/etc/cron.d/x"),
        member("../escape"),
        member("a/../../escape"),
        member("link", tarfile.SYMTYPE, "/etc/passwd"),
        member("hard", tarfile.LNKTYPE, "server.py"),
        member("fifo", tarfile.FIFOTYPE),
    ],
)
def test_unpack_refuses_an_archive_with_a_member_that_leaves_or_links(
    tmp_path: Path, bad: tarfile.TarInfo
) -> None:
    data = tar_of(member("fine.txt"), bad)
    with pytest.raises(SystemExit, match="refused archive member"):
        fetch.unpack(data, tmp_path / "to")
    assert not (tmp_path / "to").exists()  # nothing written before every member was checked


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A server answering the app's tar, recording the Authorization headers it got."""
    data = source_tar(app_folder(tmp_path))
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api/runner/source", seen
    server.shutdown()
    server.server_close()


def test_fetch_checks_the_digest_before_it_unpacks(
    tmp_path: Path, served: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = served
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "OS_APP_TOKEN").write_text("token-from-the-secret\n")
    monkeypatch.delenv("OS_APP_TOKEN", raising=False)
    monkeypatch.setenv("OS_SECRETS_DIR", str(secrets))
    wrong = "sha256:" + "0" * 64
    assert fetch.main(["--digest", wrong, "--to", str(tmp_path / "bad"), "--url", url]) == 1
    assert not (tmp_path / "bad").exists()
    right = source_digest(tmp_path / "app")
    assert fetch.main(["--digest", right, "--to", str(tmp_path / "good"), "--url", url]) == 0
    assert (tmp_path / "good" / "server.py").exists()
    assert seen == ["Bearer token-from-the-secret"] * 2


def test_fetch_follows_no_redirect_with_the_token(
    tmp_path: Path, served: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """urllib follows a redirect with every header, Authorization too: whatever answered the
    shell's URL with a 302 (a proxy in front, a captured name) would send the instance's token
    to any host. The fetch refuses the redirect instead."""
    elsewhere, seen = served

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", elsewhere)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("OS_APP_TOKEN", "the-instance-token")
        url = f"http://127.0.0.1:{server.server_address[1]}/api/runner/source"
        right = source_digest(tmp_path / "app")
        with pytest.raises(SystemExit, match="302"):
            fetch.main(["--digest", right, "--to", str(tmp_path / "to"), "--url", url])
    finally:
        server.shutdown()
        server.server_close()
    assert seen == []  # the token never left for the place the redirect named
    assert not (tmp_path / "to").exists()


def test_fetch_streams_an_app_larger_than_its_memory(tmp_path: Path) -> None:
    """The init container runs under the pod's memory limit: the fetch held the whole tar, then
    each member whole again, so an app folder of half the limit could not start on a cluster
    though it ran locally. A 48 MiB app is fetched under a 64 MiB data limit (the archive is
    spooled to the target's disk and hashed as it comes)."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "big.bin").write_bytes(os.urandom(48 << 20))
    data = source_tar(app)
    (tmp_path / "source.tar").write_bytes(data)
    del data
    script = f"""
import functools, http.server, os, resource, sys, threading
from atrium.lifecycle.runners.kubernetes import fetch
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
handler = functools.partial(Quiet, directory={str(tmp_path)!r})
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ["OS_APP_TOKEN"] = "t"
resource.setrlimit(resource.RLIMIT_DATA, (64 << 20, 64 << 20))
url = f"http://127.0.0.1:{{server.server_address[1]}}/source.tar"
sys.exit(fetch.main(["--digest", sys.argv[1], "--to", sys.argv[2], "--url", url]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, source_digest(app), str(tmp_path / "to")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "to" / "big.bin").stat().st_size == 48 << 20
    assert sorted(p.name for p in (tmp_path / "to").iterdir()) == ["big.bin"]  # no spool left


def test_the_digest_is_taken_without_holding_the_app(tmp_path: Path) -> None:
    """The runner takes the digest at every spawn, on the shell's event loop's thread pool:
    the tar was built whole in memory (and each file read whole) to hash it, the app's size
    at every spawn. It is hashed as it is written now."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "big.bin").write_bytes(os.urandom(32 << 20))
    tracemalloc.start()
    try:
        digest = source_digest(app)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
    assert digest == digest_of(source_tar(app))
