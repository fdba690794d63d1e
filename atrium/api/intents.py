"""`POST /api/intents/resolve` and `POST /api/intents/start` (decisions.md "Data proxy and intents")."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.api.instances import origin_url, owner_of_caller
from atrium.errors import InvalidRequest, PermissionDenied
from atrium.identity import AppCaller, Caller
from atrium.intentdefaults import dump
from atrium.intents import Intent
from atrium.launcher import Chooser
from atrium.wire import WireModel


class IntentBody(WireModel):
    """An intent (docs/api.md "Intents"), plus `target` for start."""

    action: str = Field(min_length=1, max_length=200)
    type: str | None = Field(default=None, max_length=200)
    uri: str | None = Field(default=None, max_length=8192)
    category: str | list[str] | None = None
    extras: dict[str, Any] = Field(default_factory=dict)
    target: str | None = None
    #: `start` only, with `target`, the user only: make `target` the default for (action, type)
    remember: bool = False

    @field_validator("type")
    @classmethod
    def _type(cls, value: str | None) -> str | None:
        if value is not None and "/" not in value.split(";", 1)[0]:
            raise ValueError(f"{value!r} is not a MIME type (type/subtype)")
        return value

    def intent(self) -> Intent:
        categories = [self.category] if isinstance(self.category, str) else self.category or []
        return Intent(self.action, self.type, self.uri, tuple(categories), self.extras)


async def resolve(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    body = await read_model(request, IntentBody)
    resolution = await shell.launcher.resolve(body.intent(), owner_of_caller(shell, caller))
    return JSONResponse(resolution.wire())


async def start(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    body = await read_model(request, IntentBody)
    if body.remember and body.target is None:
        raise InvalidRequest(
            "remember: true needs target: the app to use from now on",
            problems=[{"field": "remember", "message": "only together with target"}],
        )
    if body.remember and isinstance(caller, AppCaller):
        raise PermissionDenied(
            f"only the user chooses default handlers, not app {caller.app_id!r}",
            caller_app_id=caller.app_id,
        )
    result = await shell.launcher.start(
        body.intent(),
        body.target,
        remember=body.remember,
        caller_app_id=caller.app_id if isinstance(caller, AppCaller) else None,
        owner=owner_of_caller(shell, caller),
    )
    if isinstance(result, Chooser):
        return JSONResponse(
            {"status": "chooser", "candidates": [m.wire() for m in result.candidates]}
        )
    instance = shell.lifecycle.get(result.instance_id)
    return JSONResponse(
        {
            "status": "started",
            "appId": result.app_id,
            "instanceId": result.instance_id,
            "activityId": result.activity_id,
            "path": result.path,
            "title": result.title,
            "url": origin_url(shell, instance, result.path),
            "byDefault": result.by_default,
        }
    )


async def list_defaults(request: Request, caller: Caller) -> Response:
    """The caller's user's remembered default handlers (an app: its owner's), by action and type."""
    shell = shell_of(request)
    defaults = await shell.launcher.defaults(owner_of_caller(shell, caller))
    return JSONResponse(dump(defaults))


async def forget_default(request: Request, caller: Caller) -> Response:
    """Forget the default remembered for `action` and `type` (no `type`: the one without)."""
    params = request.query_params
    action = params.get("action")
    if not action:
        raise InvalidRequest(
            "DELETE /api/intents/defaults needs ?action=… (and &type=… for a typed default)",
            problems=[{"field": "action", "message": "required"}],
        )
    shell = shell_of(request)
    forgotten = await shell.launcher.forget(
        action, params.get("type") or None, owner_of_caller(shell, caller)
    )
    return JSONResponse({"ok": True, "forgotten": forgotten.wire()})


routes: list[BaseRoute] = [
    endpoint(
        "/api/intents/resolve",
        resolve,
        methods=["POST"],
        access=Access.USER_OR_APP,
        body=IntentBody,
    ),
    endpoint(
        "/api/intents/start", start, methods=["POST"], access=Access.USER_OR_APP, body=IntentBody
    ),
    endpoint("/api/intents/defaults", list_defaults, methods=["GET"], access=Access.USER_OR_APP),
    endpoint(
        "/api/intents/defaults",
        forget_default,
        methods=["DELETE"],
        access=Access.USER,
        name="forget_default",
        query={"action": "the intent action (required)", "type": "the MIME type, if any"},
    ),
]
