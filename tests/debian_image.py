"""A real server's root file system for image tests: Debian packages installed by ``mmdebstrap``
from the Debian mirror this machine's apt is configured with (not a conftest).

- ``configured_mirror()``: the mirror URI and suite of the machine's own release, read from
  ``/etc/apt/sources.list`` and ``/etc/apt/sources.list.d/*`` (one-line and deb822 styles).
- ``unreachable(mirror)``: why the mirror cannot be used from here (its ``InRelease`` does not
  answer), or None; a test that needs the mirror skips with that sentence.
- ``build_rootfs(mirror, packages, tar, log)``: ``mmdebstrap --variant=essential`` plus
  ``packages`` (their maintainer scripts run: users made, Python byte-compiled), documentation
  left out, written as an uncompressed tar; the seconds it took. About a minute on a quiet
  2-core machine, most of it dpkg and the packages' own scripts, so a session builds it once.
- ``TarLayer``: such a tar as one layer of an image pushed with
  `tests.integration.test_image_store.push_image` (compressed with zstd, which costs a tenth of
  gzip's time).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import zstandard

from tests.integration.test_image_store import ZSTD_LAYER, Layer

MMDEBSTRAP: Final = Path("/usr/bin/mmdebstrap")
SOURCES: Final = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
#: what a server's image needs none of
EXCLUDED: Final = ("doc", "man", "locale", "info")
#: merged /usr the way debootstrap makes it, with Debian's usr-is-merged (the usrmerge package
#: it would otherwise pick pulls in perl)
MERGED_USR: Final = Path("/usr/share/mmdebstrap/hooks/merged-usr")
BUILD_DEADLINE: Final = 900.0


@dataclass(frozen=True, slots=True)
class Mirror:
    uri: str
    suite: str
    #: the apt sources file it was read from
    source: Path


def _release() -> str:
    fields = dict(
        line.split("=", 1)
        for line in Path("/etc/os-release").read_text().splitlines()
        if "=" in line
    )
    return fields.get("VERSION_CODENAME", "").strip('"')


def _entries(path: Path) -> list[tuple[str, list[str], list[str]]]:
    """``(uri, suites, components)`` of the ``deb`` entries of one apt sources file."""
    found: list[tuple[str, list[str], list[str]]] = []
    text = path.read_text(errors="replace")
    if path.suffix == ".sources":
        for stanza in text.split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                for uri in fields.get("uris", "").split():
                    found.append(
                        (
                            uri,
                            fields.get("suites", "").split(),
                            fields.get("components", "").split(),
                        )
                    )
        return found
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) < 3 or words[0] != "deb":
            continue
        if words[1].startswith("["):  # options: [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words.pop(0)
            words = ["deb", *words[1:]]
        if len(words) >= 3:
            found.append((words[1], [words[2]], words[3:]))
    return found


def configured_mirror() -> Mirror | None:
    """The mirror apt takes this release's ``main`` from, or None."""
    release = _release()
    files: list[Path] = []
    for place in SOURCES:
        if place.is_dir():
            files += sorted(p for p in place.iterdir() if p.suffix in (".list", ".sources"))
        elif place.is_file():
            files.append(place)
    for path in files:
        for uri, suites, components in _entries(path):
            if release in suites and "main" in components and uri.startswith("http"):
                return Mirror(uri.rstrip("/"), release, path)
    return None


def unreachable(mirror: Mirror | None) -> str | None:
    """Why ``mirror`` cannot be used from here, or None."""
    if mirror is None:
        return (
            f"no Debian mirror for this release's main in {', '.join(map(str, SOURCES))} "
            "(the real server image is built from the configured mirror)"
        )
    url = f"{mirror.uri}/dists/{mirror.suite}/InRelease"
    try:
        answer = httpx.head(url, timeout=10, follow_redirects=True)
    except httpx.HTTPError as err:
        return f"the Debian mirror {mirror.uri} (from {mirror.source}) is unreachable: {err!r}"
    if answer.status_code != 200:
        return (
            f"the Debian mirror {mirror.uri} (from {mirror.source}) answers {answer.status_code} "
            f"for {url}"
        )
    return None


def build_rootfs(mirror: Mirror, packages: list[str], tar: Path, log: Path) -> float:
    """Install ``packages`` over Debian's essential set into the tar ``tar``; its seconds."""
    argv = [
        str(MMDEBSTRAP),
        "--variant=essential",
        f"--include={','.join(packages)}",
        f"--hook-dir={MERGED_USR}",
        "--dpkgopt=force-unsafe-io",
        *(f"--dpkgopt=path-exclude=/usr/share/{name}/*" for name in EXCLUDED),
        mirror.suite,
        str(tar),
        f"deb {mirror.uri} {mirror.suite} main",
    ]
    began = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            timeout=BUILD_DEADLINE, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"mmdebstrap failed ({done.returncode}): {log.read_text()[-3000:]}")
    return time.monotonic() - began


@dataclass
class TarLayer(Layer):
    """A layer that is a whole tar file already made (mmdebstrap's)."""

    tar: Path = field(default_factory=Path)

    def blob(self) -> tuple[str, bytes]:
        with self.tar.open("rb") as source:
            return ZSTD_LAYER, zstandard.ZstdCompressor(level=3).compress(source.read())
