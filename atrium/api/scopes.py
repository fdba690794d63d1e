"""`GET /api/scopes` and `PUT /api/scopes/{global|user}/git-repo` (decisions.md "Registry and scopes")."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.errors import InvalidRequest, SystemScopeImmutable
from atrium.git import is_remote_url
from atrium.identity import Caller, require_admin, user_id_of
from atrium.scopes import BY_PRIORITY, Scope, parse_scope
from atrium.wire import WireModel


class GitRepoBody(WireModel):
    """`PUT …/git-repo` body."""

    url: str

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not is_remote_url(value):
            raise ValueError(
                f"{value!r} is not a git remote URL (scheme://…, user@host:path or an absolute path)"
            )
        return value


async def list_scopes(request: Request, caller: Caller) -> Response:
    """The scopes as the caller's user sees them: the user scope is their own (an app's: its
    owner's), never another user's."""
    shell = shell_of(request)
    user = user_id_of(caller) or shell.layout.user
    layout = shell.user_scopes.layout_of(user)
    repos = shell.user_scopes.repos(user) or {}
    out: list[dict[str, Any]] = []
    for scope in reversed(BY_PRIORITY):
        repo = repos.get(scope) if scope is Scope.USER else shell.repos.get(scope)
        out.append(
            {
                "id": scope.value,
                "priority": scope.priority,
                "mutable": scope.is_mutable,
                "appsDir": str(layout.apps_dir(scope)),
                "dataDir": str(layout.data_dir(scope)),
                "appCount": shell.registry.count(scope, user),
                "remote": await repo.remote() if repo else None,
            }
        )
    return JSONResponse(out)


async def set_git_repo(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    raw = request.path_params["scope"]
    scope = parse_scope(raw)
    if scope is None:
        raise InvalidRequest(f"unknown scope {raw!r}; scopes are system, global and user")
    if scope is Scope.SYSTEM:
        raise SystemScopeImmutable("set a git remote for it")
    if scope is Scope.GLOBAL:
        require_admin(caller, "set the global scope's git remote")
    body = await read_model(request, GitRepoBody)
    user = user_id_of(caller) or shell.layout.user
    await shell.user_scopes.open(user)  # a member's own user scope, created on first use
    repos = shell.user_scopes.repos(user) or shell.repos
    await repos[scope].set_remote(body.url)
    return JSONResponse({"scope": scope.value, "url": body.url})


routes: list[BaseRoute] = [
    endpoint("/api/scopes", list_scopes, methods=["GET"], access=Access.USER_OR_APP),
    endpoint(
        "/api/scopes/{scope}/git-repo",
        set_git_repo,
        methods=["PUT"],
        access=Access.USER,
        body=GitRepoBody,
    ),
]
