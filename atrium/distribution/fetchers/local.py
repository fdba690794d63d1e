"""The local fetcher: a recursive copy of a directory on the shell's machine into staging.

The directory's own top-level VCS folder (`.git`, `.hg`, …: the developer's checkout) is not
copied, nor what its `.atriumignore` over the defaults leaves out (an author's folder is installed
as `atrium pack` ships it; `LocalRef.whole` for an import's unpacked tree); the copy then goes through the one tree check of every fetcher
(atrium.distribution.tree.check_tree): VCS metadata deeper down, links that lead out (also through
a chain of links), devices, FIFOs and sockets are refused. The copy is hashed again, so what is
installed is exactly what was resolved (and approved).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from atrium.distribution.fetchers import ProgressEvent, ResolvedRef
from atrium.distribution.refs import LocalRef
from atrium.distribution.tree import UnsafeTree, content_hash, copy_tree, ignore_rule
from atrium.errors import FetchFailed

NO_PROGRESS: Final[tuple[ProgressEvent, ...]] = ()


def _copy(source: Path, target: Path, whole: bool) -> str:
    rule = None if whole else ignore_rule(source)
    copy_tree(source, target, rule)
    return content_hash(target, rule)


class LocalFetcher:
    """Copies ``resolved.address`` (an absolute directory) into ``staging / dir_name``."""

    async def fetch(self, resolved: ResolvedRef, staging: Path) -> AsyncIterator[ProgressEvent]:
        source = Path(resolved.address)
        try:
            whole = isinstance(resolved.ref, LocalRef) and resolved.ref.whole
            digest = await asyncio.to_thread(_copy, source, staging / resolved.dir_name, whole)
        except UnsafeTree as err:
            raise FetchFailed(str(resolved.ref), f"unsafe directory content: {err}") from err
        except OSError as err:
            raise FetchFailed(str(resolved.ref), f"copying {source} failed: {err}") from err
        if digest != resolved.digest:
            raise FetchFailed(
                str(resolved.ref),
                "the directory changed while it was being installed; try again",
            )
        for event in NO_PROGRESS:  # local yields no progress (docs/api.md "Progress events")
            yield event
