"""`GET /api/runner/source`: an app's files for its own pod's init container.

A pod on a cluster has no folder of the shell's machine: its init container fetches the app by
the digest its spec names (`atrium.lifecycle.runners.kubernetes.fetch`). The caller proves which
instance it is with that instance's app token, and gets only its own app's files, as the same
deterministic tar the runner took the digest of; the digest is in ``X-Atrium-Digest``.

Only while the instance is being made (``creating``: the init container runs once, before the
app), and one answer at a time per instance: the shell writes the whole folder out for each
answer (to an unnamed spool file, hashed as it is written, then sent in pieces), and a running
app asking again and again, or many times at once, would make it do so that many times over
(409 ``not_serving`` / ``busy``).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Final

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.errors import Busy, NotFound, NotServing, PermissionDenied
from atrium.identity import AppCaller, Caller
from atrium.lifecycle.runners.kubernetes.source import Tee, write_tar
from atrium.lifecycle.states import InstanceState

DIGEST_HEADER = "X-Atrium-Digest"
CHUNK: Final = 1 << 20
#: the instances whose source is being built or sent (by object: ids are per shell)
_SERVING: set[int] = set()


async def source(request: Request, caller: Caller) -> Response:
    """The caller's instance's app folder as a tar, its digest in a header."""
    if not isinstance(caller, AppCaller):  # pragma: no cover - Access.APP lets only apps in
        raise PermissionDenied("only an app's own pod may fetch its files")
    shell = shell_of(request)
    instance = shell.lifecycle.find(caller.instance_id)
    if instance is None or instance.app_id != caller.app_id or instance.owner != caller.owner:
        raise NotFound("instance", caller.instance_id)
    if instance.state is not InstanceState.CREATING:
        raise NotServing(
            instance.id, instance.app_id, instance.state, "its files are fetched only as it is made"
        )
    copy = instance.source or shell.registry.get(instance.app_id, instance.owner)
    if copy is None:
        raise NotFound("app", instance.app_id)
    if id(instance) in _SERVING:
        raise Busy(instance.app_id, "a fetch of its files")
    _SERVING.add(id(instance))
    spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed when the body has been sent
    try:
        digest = await asyncio.to_thread(_spooled, copy.path, spool)
    except BaseException:
        spool.close()
        raise
    finally:
        _SERVING.discard(id(instance))
    return StreamingResponse(
        _sent(spool),
        media_type="application/x-tar",
        headers={
            DIGEST_HEADER: digest,
            "Content-Length": str(spool.tell()),
            "Cache-Control": "no-store",
        },
    )


def _spooled(app_dir: Path, spool: IO[bytes]) -> str:
    """The tar written to ``spool`` (a file with no name: never the app whole in the shell's
    memory), its digest taken in the same pass."""
    tee = Tee(spool)
    write_tar(app_dir, tee)
    return tee.sink.digest


async def _sent(spool: IO[bytes]) -> AsyncIterator[bytes]:
    try:
        spool.seek(0)
        while chunk := await asyncio.to_thread(spool.read, CHUNK):
            yield chunk
    finally:
        spool.close()


routes: list[BaseRoute] = [
    endpoint("/api/runner/source", source, methods=["GET"], access=Access.APP),
]
