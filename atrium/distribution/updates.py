"""Which installs have a newer version, found without changing anything (docs/api.md "Updates
that arrive", decisions.md "Home: the app grid, the phone's bottom bar and the update check").

An install that follows its source (a branch, a moving OCI tag, an index channel, a local folder)
has a newer version when its ref resolves to another digest than the one installed; a pinned
install (a version tag or a digest) when its source has version tags newer than the pin. Each
answer is kept for ``TTL`` seconds under the record's own key (scope, id, ref, digest), so an
install, update or rollback is checked afresh at once and the rest come from the cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from atrium.distribution.pins import baseline, newer_tags
from atrium.distribution.records import InstallRecord, source_of
from atrium.distribution.refs import GitRef, OciRef
from atrium.distribution.resolve import Resolver
from atrium.errors import AtriumError

#: how long a check's answer is kept (the sources are other machines: a page load asks again)
TTL: Final = 600.0
#: sources read at once
PARALLEL: Final = 4

Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class UpdateState:
    """One install and whether a newer version exists."""

    id: str
    scope: str
    version: str
    ref: str
    pinned: str | None
    available: bool
    newer_tags: tuple[str, ...] = ()
    problem: str | None = None

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope": self.scope,
            "version": self.version,
            "ref": self.ref,
            "pinned": self.pinned,
            "available": self.available,
            "newerTags": list(self.newer_tags),
            "problem": self.problem,
        }


def key_of(record: InstallRecord) -> Key:
    return (record.scope, record.id, record.ref, record.digest)


class UpdateChecks:
    """The update check of one user's pipeline: its resolver (their fetch reach) and cache."""

    def __init__(self, resolver: Resolver, clock: Callable[[], float] = time.monotonic) -> None:
        self._resolver = resolver
        self._clock = clock
        self._known: dict[Key, tuple[float, UpdateState]] = {}
        self._lock = asyncio.Lock()

    async def check(self, records: Sequence[InstallRecord], refresh: bool) -> list[UpdateState]:
        """An answer per record (dev copies are not updated: left out), in ``records``' order;
        ``refresh`` reads every source again. A source that cannot be read is ``problem``."""
        wanted = [r for r in records if not r.dev]
        async with self._lock:  # two page loads at once read each source once
            now = self._clock()
            stale = [
                r
                for r in wanted
                if refresh or (seen := self._known.get(key_of(r))) is None or now - seen[0] >= TTL
            ]
            gate = asyncio.Semaphore(PARALLEL)

            async def one(record: InstallRecord) -> None:
                async with gate:
                    state = await self._check_one(record)
                self._known[key_of(record)] = (self._clock(), state)

            await asyncio.gather(*(one(r) for r in stale))
            keys = {key_of(r) for r in wanted}
            for gone in [k for k in self._known if k not in keys]:
                del self._known[gone]  # an uninstalled or changed install
            return [self._known[key_of(r)][1] for r in wanted]

    async def _check_one(self, record: InstallRecord) -> UpdateState:
        base = UpdateState(
            id=record.id,
            scope=record.scope,
            version=record.version,
            ref=record.ref,
            pinned=record.pinned,
            available=False,
        )
        try:
            ref = source_of(record)
            if record.pinned is not None and isinstance(ref, GitRef | OciRef):
                newer = newer_tags(await self._resolver.tags(ref), baseline(ref, record.version))
                return replace(base, available=bool(newer), newer_tags=tuple(newer))
            resolved = await self._resolver.resolve(ref)
            return replace(base, available=resolved.digest != record.digest)
        except AtriumError as err:
            return replace(base, problem=err.message)
