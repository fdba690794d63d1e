"""`POST /api/data-changes`: a provider announces that data under its authority changed.

The shell publishes one `data:changed` per path; who hears it is the event stream's business
(`atrium.api.events`: it belongs to the announcing instance's owner, whose streams hear every
one, and whose apps only what they may read). The caller names
paths only: the authority is the one its manifest serves, so an app can never announce a change
in another app's data (docs/api.md "Change notifications").
"""

from __future__ import annotations

from typing import Final, Self

from pydantic import Field, field_validator, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.errors import PermissionDenied
from atrium.events import DataChanged
from atrium.identity import AppCaller, Caller
from atrium.providers import canonical_path
from atrium.wire import WireModel

MAX_PATHS: Final = 100
MAX_PATH: Final = 1024


class DataChangesBody(WireModel):
    """`{path}` or `{paths: [...]}` (1-100 paths of at most 1,024 characters)."""

    path: str | None = Field(default=None, max_length=MAX_PATH)
    paths: list[str] | None = Field(default=None, min_length=1, max_length=MAX_PATHS)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return None if value is None else canonical_path(value)

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for path in value:
            if len(path) > MAX_PATH:
                raise ValueError(f"a path is at most {MAX_PATH} characters")
        return [canonical_path(p) for p in value]

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.path is None) == (self.paths is None):
            raise ValueError("give exactly one of `path` and `paths`")
        return self

    def all_paths(self) -> list[str]:
        return [self.path] if self.path is not None else list(dict.fromkeys(self.paths or []))


async def announce(request: Request, caller: Caller) -> Response:
    """Announce changed data paths under the caller's own authority."""
    shell = shell_of(request)
    body = await read_model(request, DataChangesBody)
    if not isinstance(caller, AppCaller):  # pragma: no cover - Access.APP lets only apps in
        raise PermissionDenied("only an app may announce changes of its data")
    authority = shell.dataproxy.authority_of(caller.app_id, caller.owner)
    paths = body.all_paths()
    for path in paths:
        # the change is in the data of the caller's owner: only that user's streams hear it
        shell.bus.emit(DataChanged(authority, path, owner=caller.owner))
    return JSONResponse({"ok": True, "authority": authority, "paths": paths})


routes: list[BaseRoute] = [
    endpoint(
        "/api/data-changes", announce, methods=["POST"], access=Access.APP, body=DataChangesBody
    ),
]
