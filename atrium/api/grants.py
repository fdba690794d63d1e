"""Sharing an instance by grant (docs/api.md "Sharing"): its owner lists, grants and revokes;
anyone else, the grantee included, finds no instance here. With several shells, the grants of
an instance another shell runs in a pod answer on any shell (they are rows of the database); a
revoke there asks the instance's shell to close the grantee's views (`RELEASE_USER`), as its own
revoke does. A local runner's instance on another shell answers its owner `503
instance_elsewhere`, never the 404 that would tell a host page the instance is gone and the
revoke needless.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import read_model
from atrium.api.instances import ask_elsewhere, owned, owned_pod_elsewhere
from atrium.api.origins import Elsewhere
from atrium.errors import InstanceElsewhere, InvalidRequest, NotFound, ShellTimeout
from atrium.events import GrantAdded, GrantRevoked
from atrium.identity import Caller
from atrium.lifecycle.asked import RELEASE_USER
from atrium.lifecycle.instance import Instance
from atrium.shell import Shell
from atrium.users.grants import Grant, GrantRole
from atrium.users.model import USER_ID_RULE, valid_user_id
from atrium.wire import WireModel

_LOGGER = logging.getLogger(__name__)


class GrantBody(WireModel):
    """`POST /api/instances/{id}/grants`."""

    user: str
    role: GrantRole


def _wire(shell: Shell, grant: Grant) -> dict[str, object]:
    user = shell.users.get(grant.user_id)
    return grant.wire(user.name if user is not None else None)


async def owned_anywhere(shell: Shell, caller: Caller, instance_id: str) -> Instance | Elsewhere:
    """The caller's own instance: this shell's, or with several shells one another shell runs
    in a pod (`owned_pod_elsewhere`: anyone else's is not found; a local runner's is
    `instance_elsewhere`)."""
    try:
        return owned(shell, caller, instance_id)
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        return await owned_pod_elsewhere(shell, caller, instance_id)


async def list_grants(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    instance = await owned_anywhere(shell, caller, request.path_params["instance_id"])
    if shell.lifecycle.rows is not None:
        # a grant made or revoked on another shell is listed as the database has it, not as
        # this shell's memory will once it hears the change
        await shell.grants.reread(instance.owner)
    return JSONResponse(
        [_wire(shell, g) for g in shell.grants.of_instance(instance.owner, instance.id)]
    )


async def add_grant(request: Request, caller: Caller) -> Response:
    """Grant a role to a user who exists and is enabled; granting again changes the role."""
    shell = shell_of(request)
    instance = await owned_anywhere(shell, caller, request.path_params["instance_id"])
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
    tickets stop working, and their host page hears `grant:revoked`. For another shell's pod,
    that shell closes them (where they are held in memory) when asked."""
    shell = shell_of(request)
    params = request.path_params
    instance = await owned_anywhere(shell, caller, params["instance_id"])
    grant = shell.grants.get(instance.owner, instance.id, params["grant_id"])
    if grant is None and shell.lifecycle.rows is not None:
        await shell.grants.reread(instance.owner)  # made on another shell, not heard yet
        grant = shell.grants.get(instance.owner, instance.id, params["grant_id"])
    if grant is None:
        raise NotFound("grant", params["grant_id"])
    await shell.grants.revoke(grant)
    if isinstance(instance, Elsewhere):
        closed = await close_views_elsewhere(shell, instance, grant.user_id)
    else:
        closed = await shell.lifecycle.views.release_user(instance.id, grant.user_id)
    shell.bus.emit(
        GrantRevoked(
            grant.id, instance.id, instance.app_id, grant.user_id, closed, owner=instance.owner
        )
    )
    return JSONResponse({"ok": True, "grantId": grant.id, "closedViews": len(closed)})


async def close_views_elsewhere(shell: Shell, held: Elsewhere, user: str) -> list[str]:
    """The ids of ``user``'s views of another shell's pod, closed by that shell (it holds them
    in memory: asked, it reads the user's grants again and releases them as its own revoke
    does). Unanswered (that shell slow, cut off, or the instance moved), the grant is revoked
    all the same: the views' rows go here, each with an `instance:routed` that shell drops it
    by when it hears it, so that no other shell lets them in."""
    try:
        status, answer = await ask_elsewhere(shell, held, RELEASE_USER, {"user": user})
    except (ShellTimeout, InstanceElsewhere) as err:
        status, answer = err.http_status, err.to_body()
    closed = answer.get("closedViews")
    if status == 200 and isinstance(closed, list):
        return [str(view_id) for view_id in closed]
    _LOGGER.warning(
        "%s %s: its shell did not close %s's views (%s): their rows are dropped here",
        held.app_id,
        held.id,
        user,
        answer.get("error", status),
    )
    rows = shell.lifecycle.rows
    assert rows is not None  # noqa: S101 - owned_pod_elsewhere found its row
    return await rows.drop_user_views(held.row.slug, user, held.row)


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
