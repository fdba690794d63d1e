"""Archives in transit between a client and the shell: an import's upload in `cache/imports/`
and an export being sent from `cache/exports/` (docs/api.md "Export and import").

Each file lives as long as the request that made it, which removes it however it ends. A shell
killed meanwhile (SIGKILL, power) leaves it behind, up to 4 GiB that nothing would ever remove.
No request runs while the shell starts, so start-up removes every file in both folders;
`atrium doctor` reports them only when no shell holds the home (while one does, a file there is
a request in progress), and `--repair`, which holds the home itself, removes them.
"""

from __future__ import annotations

import asyncio
import errno
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from atrium.errors import InvalidRequest, StorageFailed, StorageFull

#: the folders under ``$ATRIUM_HOME/cache/`` and what a file there is
KINDS: Final = {"imports": "import upload", "exports": "export"}
#: errno values that mean the disk (or the owner's quota) is full
FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def folder(home: Path, kind: str) -> Path:
    """``$ATRIUM_HOME/cache/<kind>/`` (``imports`` or ``exports``)."""
    return home / "cache" / kind


async def receive(chunks: AsyncIterator[bytes], home: Path, limit: int) -> Path:
    """Write an import's body to a new file in ``cache/imports/`` and return it. Nothing is left
    when it fails: more than ``limit`` bytes or none (`400 bad_request`), a full disk
    (`507 storage_full`) or another write error (`503 storage_failed`), both naming the folder,
    or a client gone."""
    where = folder(home, "imports")
    archive = where / f"{secrets.token_hex(8)}.tar.zst"
    size = 0
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        with archive.open("wb") as file:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise InvalidRequest(f"the archive is larger than {limit} bytes")
                await asyncio.to_thread(file.write, chunk)
        if size == 0:
            raise InvalidRequest("the body must be the archive that `atrium export` wrote")
    except OSError as err:
        archive.unlink(missing_ok=True)
        error = StorageFull if err.errno in FULL else StorageFailed
        raise error(
            f"cannot store the uploaded archive in {where}: {err.strerror or err}", path=str(where)
        ) from err
    except BaseException:
        archive.unlink(missing_ok=True)
        raise
    return archive


def leftovers(home: Path) -> list[tuple[Path, str]]:
    """Every file in ``cache/imports/`` and ``cache/exports/``, with what it is. Only a shell
    that was killed leaves one when no shell holds the home."""
    found: list[tuple[Path, str]] = []
    for kind, what in KINDS.items():
        where = folder(home, kind)
        if where.is_dir() and not where.is_symlink():
            found += [(path, what) for path in sorted(where.iterdir())]
    return found


def sweep(home: Path) -> list[str]:
    """Remove every leftover (start-up, and `atrium doctor --repair`; both hold the home, so no
    request is using one); returns a line per file removed."""
    done: list[str] = []
    for path, what in leftovers(home):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
        except OSError as err:
            done.append(f"the {what} {path}, left by a shell that was killed, stays: {err}")
            continue
        done.append(f"removed the {what} {path}, left by a shell that was killed")
    return done
