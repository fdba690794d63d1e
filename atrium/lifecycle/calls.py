"""Calls the shell makes to an app's own server: the `/health` identity check and the hooks.

Every request carries the instance's `X-Os-Shell-Secret` (decisions.md "Who is calling").
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from atrium.errors import HookFailed
from atrium.lifecycle.owner import foreign_listener
from atrium.lifecycle.runners import ExitStatus

SECRET_HEADER: Final = "X-Os-Shell-Secret"  # noqa: S105 - a header name, not a secret
#: what a request from the shell is: `health`, `hook`, `data` or `page` (docs/api.md)
KIND_HEADER: Final = "X-Os-Request-Kind"
APP_ID_HEADER: Final = "X-Os-App-Id"


@dataclass(frozen=True, slots=True)
class AppAddress:
    """Where and how to reach one instance's server."""

    app_id: str
    instance_id: str
    host: str
    port: int
    secret: str
    #: the child's pid: health checks and hooks go only to a listener of its process tree
    pid: int | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def _foreign_listener(address: AppAddress) -> bool | None:
    """See `foreign_listener`; False when the address has no child to check against."""
    if address.pid is None:
        return False
    return foreign_listener(address.pid, address.host, address.port)


def _squatter_message(address: AppAddress) -> str:
    return (
        f"a process that is not {address.app_id}'s child listens on {address.host}:"
        f"{address.port}; the shell sends it nothing"
    )


class HealthMismatch(Exception):
    """The server on the port is not the instance we started (a squatter, or a confused app)."""


async def probe_health(
    session: aiohttp.ClientSession, address: AppAddress, wait: float = 2.0
) -> bool:
    """One `/health` probe: True when it answers with the right identity, False when not up yet.

    Raises HealthMismatch when something answers with another identity, or when a process that
    is not the child listens on the port (it never gets the secret).
    """
    squatted = _foreign_listener(address)
    if squatted is None:
        return False  # nothing listens yet: nobody to ask
    if squatted:
        raise HealthMismatch(_squatter_message(address))
    try:
        async with session.get(
            f"{address.base_url}/health",
            headers={SECRET_HEADER: address.secret, KIND_HEADER: "health"},
            timeout=aiohttp.ClientTimeout(total=wait),
        ) as response:
            claimed = response.headers.get(APP_ID_HEADER)
            if claimed is not None and claimed != address.app_id:
                raise HealthMismatch(f"the server on port {address.port} says it is {claimed!r}")
            if response.status != 200:
                return False
            body = await response.read()
    except (aiohttp.ClientConnectionError, TimeoutError):
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    if data.get("appId") != address.app_id or data.get("instanceId") != address.instance_id:
        raise HealthMismatch(
            f"/health on port {address.port} answered appId={data.get('appId')!r} "
            f"instanceId={data.get('instanceId')!r}, expected {address.app_id!r} "
            f"{address.instance_id!r}"
        )
    return True


async def wait_healthy(
    session: aiohttp.ClientSession,
    address: AppAddress,
    deadline_s: float,
    exited: asyncio.Future[ExitStatus] | asyncio.Task[ExitStatus],
) -> None:
    """Poll `/health` with backoff until it matches; raises TimeoutError, HealthMismatch, or
    ChildExited when the child dies first."""
    end = time.monotonic() + deadline_s
    delay = 0.005
    while True:
        if exited.done():
            status = exited.result() if not exited.cancelled() else ExitStatus(-1, "killed")
            raise ChildExited(status.code, status.reason)
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if await probe_health(session, address, wait=min(2.0, max(remaining, 0.05))):
            return
        await asyncio.wait({exited}, timeout=min(delay, max(end - time.monotonic(), 0)))
        delay = min(delay * 2, 0.1)


async def wait_answers(
    session: aiohttp.ClientSession,
    address: AppAddress,
    path: str,
    deadline_s: float,
    exited: asyncio.Future[ExitStatus] | asyncio.Task[ExitStatus],
) -> None:
    """An image app's health: poll ``GET path`` until it answers 200-399 (a redirect is not
    followed; answering one is healthy). An image does not speak the contract, so no identity is
    asked and no secret sent; the port is the shell's own forwarder (`runners.image`), so no
    other process can answer in its place. Raises as `wait_healthy` does."""
    end = time.monotonic() + deadline_s
    delay = 0.005
    while True:
        if exited.done():
            status = exited.result() if not exited.cancelled() else ExitStatus(-1, "killed")
            raise ChildExited(status.code, status.reason)
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            async with session.get(
                f"{address.base_url}{path}",
                headers={KIND_HEADER: "health"},
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=min(2.0, max(remaining, 0.05))),
            ) as response:
                if 200 <= response.status < 400:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.wait({exited}, timeout=min(delay, max(end - time.monotonic(), 0)))
        delay = min(delay * 2, 0.1)


class ChildExited(Exception):
    """The child exited before answering `/health`."""

    def __init__(self, code: int, reason: str = "exited") -> None:
        super().__init__(f"the app exited with status {code} before answering /health")
        self.code = code
        self.reason = reason


async def call_hook(
    session: aiohttp.ClientSession,
    address: AppAddress,
    hook: str,
    body: Mapping[str, Any],
    timeout_ms: int,
) -> dict[str, Any]:
    """POST `/api/lifecycle/<hook>`; a 2xx JSON object back, else HookFailed.

    A 2xx must hold `ok: true`, except onActivityCreate which answers `{path, title?}`.
    """
    url = f"{address.base_url}/api/lifecycle/{hook}"
    if _foreign_listener(address):
        raise HookFailed(f"{hook} not sent: {_squatter_message(address)}", hook=hook)
    try:
        async with session.post(
            url,
            json=dict(body),
            headers={SECRET_HEADER: address.secret, KIND_HEADER: "hook"},
            timeout=aiohttp.ClientTimeout(total=timeout_ms / 1000),
        ) as response:
            raw = await response.read()
            status = response.status
    except TimeoutError as err:
        raise HookFailed(
            f"{address.app_id} {hook} did not answer within {timeout_ms} ms", hook=hook
        ) from err
    except aiohttp.ClientError as err:
        raise HookFailed(f"{address.app_id} {hook} failed: {err}", hook=hook) from err
    if status >= 300:
        said = _said(raw)
        raise HookFailed(
            f"{address.app_id} {hook} answered HTTP {status}"
            + (f"; the app said {said}" if said else ""),
            hook=hook,
            status=status,
        )
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise HookFailed(
            f"{address.app_id} {hook} answered {status} without a JSON object",
            hook=hook,
            status=status,
        )
    base = hook.split("/", 1)[0]
    if base == "onActivityCreate":
        if not isinstance(data.get("path"), str) or not data["path"].startswith("/"):
            raise HookFailed(
                f"{address.app_id} onActivityCreate answered no path starting with /",
                hook=hook,
                status=status,
            )
    elif data.get("ok") is not True:
        raise HookFailed(
            f"{address.app_id} {hook} answered {status} without ok: true", hook=hook, status=status
        )
    return data


def _said(raw: bytes) -> str | None:
    """The ``error.message`` of an app's error answer, quoted, on one line and at most 200
    characters (it is the app's text, shown to the user as the app's)."""
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(message, str) or not message.strip():
        return None
    flat = " ".join("".join(c if c.isprintable() else " " for c in message).split())
    return json.dumps(flat[:200], ensure_ascii=False)
