"""Actions asked of another shell's pod (docs/decisions.md "Several shells: a pod's actions
asked of its shell"): any shell answers `POST /api/instances/{id}/{action}`, `DELETE
/api/instances/{id}`, an instance's activities, the release of a view and the closing of a
revoked grantee's views, but only the shell that runs the instance acts on it.

The shell the request reached writes it to ``instance_requests`` with an `instance:routed`
naming it, in one transaction (`InstanceRows.ask`). The instance's shell hears the event, takes
the request (once: ``asked`` → ``taken``), does it at its one door under the instance's lock as
its own API would, writes the instance's row, then the answer with another `instance:routed`.
The asker answers from that. A request untaken after `TAKE_SECONDS` is withdrawn (``asked`` →
``withdrawn``, which the owner can no longer take): nothing was done, `504 shell_timeout`. One
its asker could not withdraw is never taken past `TAKE_WINDOW`. The instance's shell also looks
for the requests asked of it every `FIND_SECONDS` (`look`): one whose event it missed (behind on
the event log, a notification lost) is taken all the same, well before its asker gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any, Final, Protocol

from sqlalchemy.exc import SQLAlchemyError

from atrium.errors import AtriumError, ShellTimeout
from atrium.lifecycle.instance import Instance
from atrium.state.instances import InstanceRow, InstanceRows

_LOGGER = logging.getLogger(__name__)
#: seconds a shell that runs an instance has to take an action asked of it (a living shell
#: takes it within an event's delay); then it is withdrawn
TAKE_SECONDS: Final = 5.0
#: a request older than this (the asker's wall clock against the owner's; twice the time to
#: take, for clocks a few seconds apart) is never taken: a living asker has withdrawn it, and
#: one that could not (it died, or every shell lost the database at once) answered its caller
#: an error; done when a shell behind on the event log hears it, it was a stale move
TAKE_WINDOW: Final = 2 * TAKE_SECONDS
#: seconds the asker waits for the answer of a taken action (its hooks' time): with
#: `TAKE_SECONDS`, within the balancer's wait for an answer (deploy/haproxy.cfg `timeout server`,
#: 120 s), so that the caller hears `shell_timeout` (``taken``), not the balancer's own 504
ANSWER_SECONDS: Final = 110.0
#: seconds between reads of the request's row while no event came (one missed is not waited
#: for to the end)
LOOK_SECONDS: Final = 0.5
#: seconds between a shell's looks for the requests asked of its instances that it has not taken
#: (their events missed): well within `TAKE_SECONDS`
FIND_SECONDS: Final = 1.0
#: what ``delete`` asks: DELETE /api/instances/{id}; ``delete?force``: with ``?force=1``
DELETE: Final = "delete"
DELETE_FORCE: Final = "delete?force"
#: POST /api/instances/{id}/activities (body ``{extras}``); its DELETE (body ``{activityId}``)
ACTIVITY: Final = "activity"
ACTIVITY_END: Final = "activity-end"
#: DELETE /api/instances/{id}/grants/{grantId} made on another shell (body ``{user}``, the
#: grantee): the grantee's views closed where the instance runs (`ViewDesk.release_revoked`)
RELEASE_USER: Final = "release-user"
#: DELETE /api/instances/{id}/views/{viewId} made on another shell (body ``{viewId}``), its rows
#: deleted there: the view dropped from memory where the instance runs before the answer
#: (`ViewDesk.release_asked`), so that its cookie is refused on every shell once answered
RELEASE_VIEW: Final = "release-view"


class AskHost(Protocol):
    """What asked actions need of the lifecycle manager."""

    def find(self, instance_id: str) -> Instance | None: ...

    async def do_asked(self, instance_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """Do ``action`` as this shell's API would; what the answer says."""

    def spawn_task(self, coro: Any, name: str) -> Any: ...


class AskedActions:
    """Asks other shells' instances' actions of them, and does those asked of this shell's."""

    def __init__(self, host: AskHost, rows: InstanceRows) -> None:
        self._host = host
        self._rows = rows
        #: request id → set when its answer's event is heard
        self._waiting: dict[str, asyncio.Event] = {}
        #: the requests this shell is taking (heard, or found by a look, once each)
        self._taking: set[str] = set()
        self._finding: asyncio.Task[None] | None = None
        rows.on_request.append(self._heard)

    def start(self) -> None:
        """Look for the requests asked of this shell's instances every `FIND_SECONDS`."""
        if self._finding is None:
            self._finding = asyncio.get_running_loop().create_task(
                self._find(), name="asked actions looked for"
            )

    async def close(self) -> None:
        task, self._finding = self._finding, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _find(self) -> None:
        while True:
            await asyncio.sleep(FIND_SECONDS)
            try:
                await self.look()
            except SQLAlchemyError as err:  # cut off: the next look tries again
                _LOGGER.debug("could not look for the actions asked of this shell: %s", err)

    async def look(self) -> None:
        """Take the requests asked of this shell's instances that nobody took: their
        `instance:routed` was missed (this shell behind on the event log, or its notification
        lost), and the asker withdraws them after `TAKE_SECONDS`: a `504` for a living shell.
        One indexed read of the last `TAKE_WINDOW` seconds' requests, each then told as its
        event is (`InstanceRows.on_request`); taking stays the one conditional update, so a
        request heard and found is done once."""
        for request_id, instance_id, slug in await self._rows.untaken(time.time() - TAKE_WINDOW):
            for heard in tuple(self._rows.on_request):
                heard(instance_id, slug, request_id, False)

    def _heard(self, instance_id: str, slug: str, request_id: str, answered: bool) -> None:
        if answered:
            waiting = self._waiting.get(request_id)
            if waiting is not None:
                waiting.set()
            return
        instance = self._host.find(instance_id)
        if instance is None or instance.slug != slug or request_id in self._taking:
            return  # not this shell's (another numbered one alike), or being taken already
        self._taking.add(request_id)
        self._host.spawn_task(self._do(instance, request_id), f"asked of {instance_id}")

    async def _do(self, instance: Instance, request_id: str) -> None:
        try:
            await self._take(instance, request_id)
        finally:
            self._taking.discard(request_id)

    async def _take(self, instance: Instance, request_id: str) -> None:
        taken = await self._rows.take(request_id, instance.id, time.time() - TAKE_WINDOW)
        if taken is None:
            return  # withdrawn, or taken by a look of this shell or another's
        action, body = taken
        state = "done"
        try:
            done = await self._host.do_asked(instance.id, action, body)
            answer = {"status": 200, "body": done}
        except AtriumError as err:
            state = "failed"
            answer = {"status": err.http_status, "body": err.to_body()}
        except Exception:
            _LOGGER.exception("%s asked of %s failed", action, instance.id)
            state = "failed"
            failed = AtriumError("internal error")
            answer = {"status": failed.http_status, "body": failed.to_body()}
        # the row shows the outcome before the answer does
        await self._rows.flush()
        await self._rows.answer(request_id, instance, state, answer)

    async def ask(
        self, held: InstanceRow, action: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]] | None:
        """Have ``held``'s shell do ``action``: the status and body it answered (an error's
        as it raised it). None when its row no longer names that shell (moved or ended)."""
        request_id = secrets.token_hex(8)
        heard = self._waiting[request_id] = asyncio.Event()
        machine = held.shell.partition(":")[0]
        try:
            if not await self._rows.ask(held, request_id, action, body):
                return None
            state, answer = await self._wait(request_id, heard, TAKE_SECONDS, {"asked"})
            if state == "asked" and await self._rows.withdraw(request_id):
                raise ShellTimeout(
                    f"the shell that runs instance {held.id} (on {machine}) did not take the "
                    f"{action} within {TAKE_SECONDS:.0f} s: nothing was done; ask again",
                    instanceId=held.id,
                    shell=machine,
                    taken=False,
                )
            state, answer = await self._wait(request_id, heard, ANSWER_SECONDS, {"asked", "taken"})
            if state not in {"done", "failed"} or not isinstance(answer, dict):
                raise ShellTimeout(
                    f"the shell that runs instance {held.id} (on {machine}) took the {action} "
                    f"and has not finished it within {ANSWER_SECONDS:.0f} s: it goes on there "
                    "(the instance's state tells when it ends)",
                    instanceId=held.id,
                    shell=machine,
                    taken=True,
                )
            return int(answer.get("status", 500)), dict(answer.get("body") or {})
        finally:
            self._waiting.pop(request_id, None)

    async def _wait(
        self, request_id: str, heard: asyncio.Event, seconds: float, until_not: set[str]
    ) -> tuple[str, dict[str, Any] | None]:
        """The request's state once it is none of ``until_not``, or at the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            state, answer = await self._rows.request(request_id)
            left = deadline - loop.time()
            if state not in until_not or left <= 0:
                return state, answer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(heard.wait(), min(left, LOOK_SECONDS))
            heard.clear()
