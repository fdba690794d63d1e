"""`GET /api/runner/source`: an app's files for its own pod's init container.

A pod on a cluster has no folder of the shell's machine: its init container fetches the app by
the digest its spec names (`atrium.lifecycle.runners.kubernetes.fetch`). The caller proves which
instance it is with that instance's app token, and gets only its own app's files, as the same
deterministic tar the runner took the digest of; the digest is in ``X-Atrium-Digest``.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.errors import NotFound, PermissionDenied
from atrium.identity import AppCaller, Caller
from atrium.lifecycle.runners.kubernetes.source import digest_of, source_tar

DIGEST_HEADER = "X-Atrium-Digest"


async def source(request: Request, caller: Caller) -> Response:
    """The caller's instance's app folder as a tar, its digest in a header."""
    if not isinstance(caller, AppCaller):  # pragma: no cover - Access.APP lets only apps in
        raise PermissionDenied("only an app's own pod may fetch its files")
    shell = shell_of(request)
    instance = shell.lifecycle.find(caller.instance_id)
    if instance is None or instance.app_id != caller.app_id or instance.owner != caller.owner:
        raise NotFound("instance", caller.instance_id)
    copy = instance.source or shell.registry.get(instance.app_id, instance.owner)
    if copy is None:
        raise NotFound("app", instance.app_id)
    data = await asyncio.to_thread(source_tar, copy.path)
    return Response(
        data,
        media_type="application/x-tar",
        headers={DIGEST_HEADER: digest_of(data), "Cache-Control": "no-store"},
    )


routes: list[BaseRoute] = [
    endpoint("/api/runner/source", source, methods=["GET"], access=Access.APP),
]
