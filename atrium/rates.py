"""How many views a caller may open, and actions they may ask of other shells' instances, per
minute on one shell (several shells on PostgreSQL only: decisions.md "Several shells: a rate on
views and asks").

On several shells each view is rows and an event every shell reads, and each ask is a row, its
events and work on the instance's shell (a pod started, stopped or deleted through the cluster's
API). Unbounded, one caller could push every other user's events out of the kept event log (their
streams then miss events) and keep other shells and the cluster busy. One shell's own views are
memory only: not counted there. The count is this shell's (behind a balancer each shell gives its
share: the aim is a bound, not an exact quota), by the caller as the audit log names it.
"""

from __future__ import annotations

import time
from typing import Final, Literal

from atrium.errors import TooManyAttempts
from atrium.users.throttle import RateLimit

#: views opened, or actions asked of another shell, per caller per `WINDOW` on one shell
PER_WINDOW: Final = 120
WINDOW: Final = 60.0

Kind = Literal["views", "asks"]


class SharedWrites:
    """The callers' views and asks counted (`take`)."""

    def __init__(self, limit: int = PER_WINDOW, window: float = WINDOW) -> None:
        self._limits: dict[Kind, RateLimit] = {
            "views": RateLimit(limit, window),
            "asks": RateLimit(limit, window),
        }

    def take(self, kind: Kind, caller: str) -> None:
        """Count one of ``caller``'s; `TooManyAttempts` (429, Retry-After) when they had their
        share of the window (and nothing is counted)."""
        wait = self._limits[kind].take(caller, time.monotonic())
        if wait is not None:
            raise TooManyAttempts(wait, limit=kind)
