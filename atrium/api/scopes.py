"""`GET /api/scopes`, `PUT /api/scopes/{global|user}/git-repo` (decisions.md "Registry and scopes")
and `GET/PUT /api/scopes/{global|user}/trust` (decisions.md "Signed apps")."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.distribution.signing import Trust
from atrium.distribution.trust import read_trust, write_trust
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


def _changeable_scope(request: Request, caller: Caller, action: str) -> Scope:
    raw = request.path_params["scope"]
    scope = parse_scope(raw)
    if scope is None:
        raise InvalidRequest(f"unknown scope {raw!r}; scopes are system, global and user")
    if scope is Scope.SYSTEM:
        raise SystemScopeImmutable(action)
    return scope


def _trust_answer(scope: Scope, trust: Trust) -> dict[str, Any]:
    return {"scope": scope.value, "policy": trust.policy, "keys": trust.describe()}


async def get_trust(request: Request, caller: Caller) -> Response:
    """The scope's trust policy and keys; the user scope is the caller's own."""
    shell = shell_of(request)
    scope = _changeable_scope(request, caller, "keep a trust store (its apps ship with Atrium)")
    user = user_id_of(caller) or shell.layout.user
    root = shell.user_scopes.layout_of(user).root(scope)
    return JSONResponse(_trust_answer(scope, await asyncio.to_thread(read_trust, root)))


async def set_trust(request: Request, caller: Caller) -> Response:
    """Replace the scope's trust store (policy and keys) and commit it in the scope's repository;
    the global scope's is an admin's to change, a user scope's its user's."""
    shell = shell_of(request)
    scope = _changeable_scope(request, caller, "keep a trust store (its apps ship with Atrium)")
    if scope is Scope.GLOBAL:
        require_admin(caller, "change the global scope's trust")
    body = await read_model(request, Trust)
    user = user_id_of(caller) or shell.layout.user
    await shell.user_scopes.open(user)  # a member's own user scope, created on first use
    repos = shell.user_scopes.repos(user) or shell.repos
    names = ", ".join(k.name for k in body.keys) or "no keys"
    await write_trust(repos[scope], body, f"trust: policy {body.policy}, {names}")
    return JSONResponse(_trust_answer(scope, body))


routes: list[BaseRoute] = [
    endpoint("/api/scopes", list_scopes, methods=["GET"], access=Access.USER_OR_APP),
    endpoint(
        "/api/scopes/{scope}/git-repo",
        set_git_repo,
        methods=["PUT"],
        access=Access.USER,
        body=GitRepoBody,
    ),
    endpoint("/api/scopes/{scope}/trust", get_trust, methods=["GET"], access=Access.USER),
    endpoint(
        "/api/scopes/{scope}/trust", set_trust, methods=["PUT"], access=Access.USER, body=Trust
    ),
]
