"""Request bodies: JSON parsed into a pydantic model; every problem is a 400 `bad_request`.

Bodies are decoded by pydantic's strict JSON parser, not `json.loads`: the standard library
accepts lone UTF-16 surrogates (``"\\ud800"``, or their raw UTF-8 bytes), which then reach a
handler as a `str` no UTF-8 encoder can write, and every answer echoing them was a 500 (issue 13,
row 9). Rejecting them where bodies enter keeps every route's data encodable.
"""

from __future__ import annotations

from typing import Final, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json
from starlette.requests import Request

from atrium.errors import InvalidRequest

MAX_BODY: Final = 2 << 20
M = TypeVar("M", bound=BaseModel)


def problems_of(err: ValidationError) -> list[dict[str, str]]:
    return [
        {
            "field": ".".join(str(p) for p in e["loc"]) or "(body)",
            "message": e["msg"].removeprefix("Value error, "),
        }
        for e in err.errors(include_url=False)
    ]


def _too_large() -> InvalidRequest:
    return InvalidRequest(f"the request body is larger than {MAX_BODY} bytes")


async def bounded_body(request: Request) -> bytes:
    """The whole body of a request to the shell's own API, refused past `MAX_BODY` as soon as
    that is known: a declared length is checked before anything is read, and a chunked body is
    counted while it arrives. (Starlette's `request.body()` read all of it first: any caller with
    a token could make the shell hold a body of any size.) The body is kept on the request, so
    `request.body()` afterwards answers the same bytes."""
    if hasattr(request, "_body"):
        cached: bytes = request._body
        return cached
    declared = request.headers.get("content-length")
    if (
        declared is not None
        and declared.isascii()
        and declared.isdigit()
        and int(declared) > MAX_BODY
    ):
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise _too_large()
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # what Starlette's own `body()` caches and answers from
    return body


async def read_json(request: Request) -> object:
    body = await bounded_body(request)
    if not body:
        raise InvalidRequest("the request needs a JSON body")
    try:
        return from_json(body)
    except ValueError as err:
        raise InvalidRequest(f"the body is not valid JSON: {err}") from err


async def read_model(request: Request, model: type[M]) -> M:
    data = await read_json(request)
    if not isinstance(data, dict):
        raise InvalidRequest(f"the body must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems = problems_of(err)
        listed = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        raise InvalidRequest(f"bad request body: {listed}", problems=problems) from err
