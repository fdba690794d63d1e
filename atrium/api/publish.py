"""`POST /api/dist/publish {path, to, tag}`: publish an app directory (an admin only: the path is
read with the shell's own rights; not gated).

Server-sent events when ``Accept`` names ``text/event-stream``, framed like install's (atrium.api.dist:
``event: <type>`` / ``data: <json with "type">``; a failure is one ``error`` event carrying the error
object, then the stream ends), else one JSON document ``{ok: true, ref, installCommand, events}``
(decisions.md "Distribution"). Everything
that can be checked before the first byte moves (body, directory, manifest, target, tag) is answered
with its own status.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.api.dist import SSE_HEADERS, stream
from atrium.distribution.publish import Publisher, PublishEvent
from atrium.events import PUBLISH_DONE
from atrium.identity import Caller


class PublishBody(BaseModel):
    """``{path, to, tag, sign?}``: an absolute app directory on the shell's machine, the target,
    the tag, and the private key file to sign with."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    path: str = Field(min_length=1, max_length=4096)
    to: str = Field(min_length=1, max_length=2048)
    tag: str = Field(min_length=1, max_length=128)
    #: an absolute path to the private key to sign with (`atrium keygen` writes one)
    sign: str | None = Field(default=None, min_length=1, max_length=4096)


def wants_event_stream(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


async def publish(request: Request, caller: Caller) -> Response:
    body = await read_model(request, PublishBody)
    shell = shell_of(request)
    publisher = Publisher(publish_event=shell.bus.emit)
    sign = Path(body.sign) if body.sign is not None else None
    plan = await publisher.plan(Path(body.path), body.to, body.tag, sign)
    events = publisher.run(plan)
    if wants_event_stream(request):
        return StreamingResponse(
            stream(events, request.scope), media_type="text/event-stream", headers=SSE_HEADERS
        )
    collected: list[PublishEvent] = []
    async with contextlib.aclosing(events) as running:
        async for event in running:
            collected.append(event)
    done = next(e for e in reversed(collected) if e["type"] == PUBLISH_DONE)
    return JSONResponse(
        {
            "ok": True,
            "ref": done["ref"],
            "installCommand": done["installCommand"],
            "events": collected,
        }
    )


routes: list[BaseRoute] = [
    endpoint("/api/dist/publish", publish, methods=["POST"], access=Access.ADMIN, body=PublishBody),
]
