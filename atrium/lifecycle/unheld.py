"""Another shell's pod checked before this shell sends it anything (docs/decisions.md "Several
shells: a pod no shell holds is checked before it is sent anything").

Every shell reaches a pod at the address its row gives. While the row's shell lives it watches
the pod and writes the row when the pod goes, so the address is true within an event's delay.
A pod whose shell is gone and that no shell has taken over is watched by nobody: deleted or
evicted, its address may be given to another pod of the namespace (another user's app), and
every shell went on sending it the first instance's users' requests, with their identity and
the instance's shell secret. So, at most every `CHECK_FOR` s per row, the shell asks whether the
row's shell lives (`Coordination.shells_alive`), and when it does not, asks the cluster whether
the pod the row names still runs, with the same uid, at the row's address (the runner's
`runs_at`); until the answer is yes, the row's address is sent nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from atrium.lifecycle.runners import Runner
    from atrium.state.instances import InstanceRow
    from atrium.state.locks import Coordination

_LOGGER = logging.getLogger(__name__)
#: how long an answer is kept (s): a request costs no database read or API call within it
CHECK_FOR: Final = 2.0
#: how long the cluster's API is waited for before the pod counts as not known to run (s)
ASK_WITHIN: Final = 3.0
#: answers kept at most (rows of other shells' instances); more empties the map
KEPT: Final = 4096


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a row's address may be sent requests (``refusal`` None), until ``until``
    (`time.monotonic`)."""

    until: float
    refusal: str | None = None


def _key(row: InstanceRow) -> tuple[str, str, str | None, int | None, str]:
    """What the answer is about: the row as read (another shell, pod, uid or address is another
    question)."""
    ref = row.ref or {}
    return (row.id, row.shell, row.host, row.port, f"{ref.get('pod')}/{ref.get('uid')}")


class PodCheck:
    """The answers for other shells' rows, kept `CHECK_FOR` s; one question at a time per row."""

    def __init__(self, coordination: Coordination, runner: Runner) -> None:
        self._coordination = coordination
        self._runner = runner
        #: how long an answer is kept (s)
        self.every = CHECK_FOR
        self._known: dict[tuple[str, str, str | None, int | None, str], Verdict] = {}
        self._asking: dict[tuple[str, str, str | None, int | None, str], asyncio.Task[Verdict]] = {}

    async def verdict(self, row: InstanceRow) -> Verdict:
        """Whether ``row``'s address may be sent requests now (the answer kept, or asked)."""
        key = _key(row)
        known = self._known.get(key)
        if known is not None and known.until > time.monotonic():
            return known
        asking = self._asking.get(key)
        if asking is None:
            asking = asyncio.get_running_loop().create_task(self._ask(row, key))
            self._asking[key] = asking
            asking.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(asking)

    async def close(self) -> None:
        """The questions under way ended, and awaited: left running past the shell's close, one
        inside `shells_alive` held a connection of an engine disposed meanwhile."""
        asking = list(self._asking.values())
        for task in asking:
            task.cancel()
        await asyncio.gather(*asking, return_exceptions=True)

    async def _ask(self, row: InstanceRow, key: Any) -> Verdict:
        try:
            refusal = await self._refusal(row)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - not known to be true: nothing is sent there
            refusal = f"whether its pod still runs could not be learnt ({type(err).__name__})"
            _LOGGER.warning("%s: %s: %s", row.id, refusal, err)
        verdict = Verdict(time.monotonic() + self.every, refusal)
        if len(self._known) >= KEPT:
            self._known.clear()
        self._known[key] = verdict
        return verdict

    async def _refusal(self, row: InstanceRow) -> str | None:
        if await self._coordination.shells_alive({row.shell}):
            return None  # its shell watches the pod and writes the row when the pod goes
        runs_at = getattr(self._runner, "runs_at", None)
        ref = row.ref or {}
        if (
            runs_at is None
            or row.host is None
            or ref.get("namespace") != getattr(self._runner, "namespace", None)
        ):
            return (
                "its shell is gone and no shell holds its pod, whose running this shell cannot "
                "ask the cluster"
            )
        try:
            why: str | None = await asyncio.wait_for(runs_at(ref, row.host), ASK_WITHIN)
        except TimeoutError:
            return f"the cluster's API did not say within {ASK_WITHIN:.0f} s whether its pod runs"
        return None if why is None else f"its shell is gone and no shell holds its pod: {why}"


__all__ = ["CHECK_FOR", "PodCheck", "Verdict"]
