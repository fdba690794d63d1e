"""The init container's fetch: the app's files from the shell, checked, unpacked (stdlib only).

``python -m atrium.lifecycle.runners.kubernetes.fetch --digest sha256:… --to /app``: asks
``$OS_SHELL_URL/api/runner/source`` with the app token read from ``$OS_SECRETS_DIR/OS_APP_TOKEN``,
spools the answer to an unnamed file on the target's disk (never whole in memory: the pod's
memory limit holds this container too) while hashing it, compares the sha256 with ``--digest``
before anything is unpacked, then unpacks only regular files and folders that stay inside the
target (no links, no absolute paths, no ``..``). It follows no redirect and no proxy.
Exit status 0 when done; 1 with one line on stderr saying what was wrong.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import IO

ATTEMPTS = 5
CHUNK = 1 << 20


def _token() -> str:
    folder = os.environ.get("OS_SECRETS_DIR", "")
    token = os.environ.get("OS_APP_TOKEN", "")
    if not token and folder:
        token = Path(folder, "OS_APP_TOKEN").read_text().strip()
    if not token:
        raise SystemExit("fetch: no app token (OS_SECRETS_DIR/OS_APP_TOKEN)")
    return token


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: urllib would follow it with every header, the token too."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _opener() -> urllib.request.OpenerDirector:
    """Straight to the shell: no redirect followed, no proxy from the image's environment
    (either would hand the instance's token to someone else)."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def download(url: str, token: str, into: IO[bytes]) -> str:
    """The tar written to ``into`` as it comes (never whole in memory: the init container runs
    under the pod's memory limit), retried a few times while the shell is not reachable yet;
    its ``sha256:`` digest."""
    if not url.startswith(("http://", "https://")):
        raise SystemExit(f"fetch: not an http(s) URL: {url!r}")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310 - http(s) only, checked above
    opener = _opener()
    for attempt in range(ATTEMPTS):
        try:
            with opener.open(request, timeout=30) as answer:
                into.seek(0)
                into.truncate()
                hasher = hashlib.sha256()
                while chunk := answer.read(CHUNK):
                    hasher.update(chunk)
                    into.write(chunk)
                into.flush()
                return "sha256:" + hasher.hexdigest()
        except urllib.error.HTTPError as err:
            raise SystemExit(f"fetch: {url} answered {err.code}: {err.read()[:300]!r}") from err
        except OSError as err:
            if attempt == ATTEMPTS - 1:
                raise SystemExit(f"fetch: {url} unreachable: {err}") from err
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def unpack(data: bytes | IO[bytes], target: Path) -> None:
    """Every member checked before any is written: a link, a device, an absolute name or one
    that climbs out of ``target`` refuses the whole archive. ``data``: the archive's bytes, or
    a file holding them (read in chunks)."""
    archive = io.BytesIO(data) if isinstance(data, bytes) else data
    archive.seek(0)
    with tarfile.open(fileobj=archive, mode="r:") as tar:
        members = tar.getmembers()
        for member in members:
            name = PurePosixPath(member.name)
            if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                raise SystemExit(f"fetch: refused archive member {member.name!r}")
        target.mkdir(parents=True, exist_ok=True)
        for member in members:
            path = target.joinpath(*PurePosixPath(member.name).parts)
            if member.isdir():
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            if source is None:  # pragma: no cover - a regular file always has content
                raise SystemExit(f"fetch: no content for {member.name!r}")
            with path.open("wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
            path.chmod(0o755 if member.mode & 0o100 else 0o644)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="atrium-fetch")
    parser.add_argument("--digest", required=True)
    parser.add_argument("--to", required=True, type=Path)
    parser.add_argument("--url", default=None, help="default: $OS_SHELL_URL/api/runner/source")
    args = parser.parse_args(argv)
    url = args.url or os.environ.get("OS_SHELL_URL", "").rstrip("/") + "/api/runner/source"
    # spooled on the target's own disk (the pod's /tmp is memory), as a file with no name
    spool_dir = args.to if args.to.is_dir() else args.to.parent
    with tempfile.TemporaryFile(dir=spool_dir) as spool:
        got = download(url, _token(), spool)
        if got != args.digest:
            sys.stderr.write(f"fetch: digest mismatch: wanted {args.digest}, got {got}\n")
            return 1
        unpack(spool, args.to)
    return 0


if __name__ == "__main__":
    sys.exit(main())
