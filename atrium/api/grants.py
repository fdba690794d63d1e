"""Sharing an instance by grant (docs/api.md "Sharing"): its owner lists, grants and revokes;
anyone else, the grantee included, finds no instance here. With several shells, only the shell
that runs the instance does (it closes the grantee's views it holds): another answers its owner
`503 instance_elsewhere`, never the 404 that would tell a host page the instance is gone and
the revoke needless."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.api.instances import owned_here
from atrium.errors import InvalidRequest, NotFound
from atrium.events import GrantAdded, GrantRevoked
from atrium.identity import Caller
from atrium.shell import Shell
from atrium.users.grants import Grant, GrantRole
from atrium.users.model import USER_ID_RULE, valid_user_id
from atrium.wire import WireModel


class GrantBody(WireModel):
    """`POST /api/instances/{id}/grants`."""

    user: str
    role: GrantRole


def _wire(shell: Shell, grant: Grant) -> dict[str, object]:
    user = shell.users.get(grant.user_id)
    return grant.wire(user.name if user is not None else None)


async def list_grants(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    instance = await owned_here(shell, caller, request.path_params["instance_id"])
    return JSONResponse(
        [_wire(shell, g) for g in shell.grants.of_instance(instance.owner, instance.id)]
    )


async def add_grant(request: Request, caller: Caller) -> Response:
    """Grant a role to a user who exists and is enabled; granting again changes the role."""
    shell = shell_of(request)
    instance = await owned_here(shell, caller, request.path_params["instance_id"])
    body = await read_model(request, GrantBody)
    if not valid_user_id(body.user):
        raise InvalidRequest(
            f"user {body.user!r} is not a user id: {USER_ID_RULE}",
            problems=[{"field": "user", "message": USER_ID_RULE}],
        )
    if body.user == instance.owner:
        raise InvalidRequest(
            "the instance is yours: its owner needs no grant",
            problems=[{"field": "user", "message": "the instance's own user"}],
        )
    grantee = shell.users.get(body.user)
    if grantee is None or grantee.disabled:
        # the same answer for a disabled account as for none: the owner learns no more than
        # whether the id they typed can be shared with
        raise NotFound("user", body.user)
    grant, new = await shell.grants.put(
        instance.owner, instance.id, instance.app_id, grantee.id, body.role
    )
    shell.bus.emit(
        GrantAdded(
            grant.id,
            instance.id,
            instance.app_id,
            grantee.id,
            grant.role.value,
            owner=instance.owner,
        )
    )
    return JSONResponse(_wire(shell, grant), status_code=201 if new else 200)


async def revoke_grant(request: Request, caller: Caller) -> Response:
    """Revoke, and close the grantee's views of the instance at once: their cookies and unused
    tickets stop working, and their host page hears `grant:revoked`."""
    shell = shell_of(request)
    params = request.path_params
    instance = await owned_here(shell, caller, params["instance_id"])
    grant = shell.grants.get(instance.owner, instance.id, params["grant_id"])
    if grant is None:
        raise NotFound("grant", params["grant_id"])
    await shell.grants.revoke(grant)
    closed = await shell.lifecycle.views.release_user(instance.id, grant.user_id)
    shell.bus.emit(
        GrantRevoked(
            grant.id, instance.id, instance.app_id, grant.user_id, closed, owner=instance.owner
        )
    )
    return JSONResponse({"ok": True, "grantId": grant.id, "closedViews": len(closed)})


routes: list[BaseRoute] = [
    endpoint(
        "/api/instances/{instance_id}/grants", list_grants, methods=["GET"], access=Access.USER
    ),
    endpoint(
        "/api/instances/{instance_id}/grants",
        add_grant,
        methods=["POST"],
        access=Access.USER,
        body=GrantBody,
    ),
    endpoint(
        "/api/instances/{instance_id}/grants/{grant_id}",
        revoke_grant,
        methods=["DELETE"],
        access=Access.USER,
    ),
]
