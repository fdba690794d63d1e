"""`PUT /api/dist/index {url}`: an admin sets the store's catalogue, remembered across restarts
(docs/api.md "The store's catalogue"; decisions.md "The store's catalogue"). The catalogue
itself is read with `GET /api/dist/index` (atrium.api.dist)."""

from __future__ import annotations

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.identity import Caller
from atrium.wire import WireModel


class CatalogueBody(WireModel):
    """``url``: the index's address (file://, http:// or https://); null forgets it."""

    url: str | None = Field(min_length=1, max_length=2048)


async def set_catalogue(request: Request, caller: Caller) -> Response:
    """Fetch and read the index at ``url``, then remember it: answered as GET /api/dist/index."""
    body = await read_model(request, CatalogueBody)
    client = shell_of(request).dist.index
    snapshot = await client.set_url(body.url)
    return JSONResponse(snapshot.wire(client.ttl))


routes: list[BaseRoute] = [
    endpoint(
        "/api/dist/index",
        set_catalogue,
        methods=["PUT"],
        access=Access.ADMIN,
        body=CatalogueBody,
    ),
]
