"""The index fetcher: an image app described by its catalogue entry (docs/api.md "The store's
catalogue") becomes an app tree the shell writes itself: the entry's manifest, and its icon when
the entry carries one. Nothing is downloaded here; the image is pulled and pinned by the
pipeline, as for an image app from any source."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final

from atrium.distribution.fetchers import ProgressEvent, ResolvedRef
from atrium.distribution.index import tree_digest
from atrium.errors import FetchFailed

NO_PROGRESS: Final[tuple[ProgressEvent, ...]] = ()


def _write(files: Mapping[str, bytes], target: Path) -> None:
    target.mkdir(mode=0o755)
    for name, data in files.items():
        (target / name).write_bytes(data)
        (target / name).chmod(0o644)


class IndexFetcher:
    """Writes ``resolved.tree`` into ``staging / dir_name``."""

    async def fetch(self, resolved: ResolvedRef, staging: Path) -> AsyncIterator[ProgressEvent]:
        files = dict(resolved.tree or {})
        if not files or tree_digest(files) != resolved.digest:
            raise FetchFailed(
                str(resolved.ref), "the index entry's app tree is not what was resolved"
            )
        try:
            await asyncio.to_thread(_write, files, staging / resolved.dir_name)
        except OSError as err:
            raise FetchFailed(str(resolved.ref), f"writing the app tree failed: {err}") from err
        for event in NO_PROGRESS:  # nothing is downloaded (docs/api.md "Progress events")
            yield event
