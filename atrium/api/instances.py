"""The instances API (decisions.md "Lifecycle"), views and activities, and `/api/proxy/`."""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any, Final

from pydantic import Field
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, actor_of, audit_target, endpoint, shell_of
from atrium.api.bodies import bounded_body, read_model
from atrium.api.origins import Elsewhere, Looking, proxy_page
from atrium.errors import (
    InstanceElsewhere,
    InvalidRequest,
    NotFound,
    NotServing,
    PermissionDenied,
    ShellTimeout,
)
from atrium.identity import AppCaller, Caller, UserCaller
from atrium.lifecycle.asked import ACTIVITY, ACTIVITY_END, DELETE, DELETE_FORCE, RELEASE_VIEW
from atrium.lifecycle.instance import Instance
from atrium.lifecycle.states import SERVING, InstanceState
from atrium.lifecycle.views import TICKET_TTL, is_local_path
from atrium.manifest import APP_ID_RE
from atrium.shell import Shell
from atrium.state.instances import SHARED_NETWORK
from atrium.theme.prefs import html_transform_for
from atrium.users.grants import OWNER, access_to
from atrium.wire import WireModel

_LOGGER = logging.getLogger(__name__)

MAX_LOG_LINES: Final = 5000
#: the runner whose instances (pods) any shell acts on, by asking the shell that runs them
POD_RUNNER: Final = "kubernetes"
#: a log cursor: a local log's byte offset, a cluster log's RFC 3339 time
LOG_CURSOR: Final = re.compile(
    r"[0-9]{1,18}|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})"
)


class CreateBody(WireModel):
    """`POST /api/instances`."""

    app_id: str
    new: bool = False


class ActivityBody(WireModel):
    """`POST /api/instances/{id}/activities`."""

    extras: dict[str, Any] = Field(default_factory=dict)


class ViewBody(WireModel):
    """`POST /api/instances/{id}/views`."""

    path: str = "/"
    #: the host page's client id (its `/api/events?client=` stream keeps the view alive)
    client: str | None = None


def origin_url(shell: Shell, instance: Instance, path: str) -> str:
    return f"http://{instance.slug}.{shell.settings.app_domain}:{shell.settings.port}{path}"


def _wire(request: Request, instance: Instance, caller: Caller) -> dict[str, Any]:
    lifecycle = shell_of(request).lifecycle
    woken = lifecycle.headless.record(instance.id)
    return instance.wire(
        for_app=isinstance(caller, AppCaller),
        pooled=lifecycle.is_pooled(instance),
        wake=None
        if woken is None
        else {
            **woken.wire(),
            # the owner's own wakes: another user's are none of theirs
            "wakes": lifecycle.headless.wakes_of.get((instance.app_id, instance.owner), 0),
        },
    )


async def list_instances(request: Request, caller: Caller) -> Response:
    """The caller's own instances (an app's: its owner's); `?all=1` every user's, for an admin
    only (anyone else: 403); `?shared=1` those shared with the caller. With several shells,
    those other shells run too, from their rows (`elsewhere_wire`)."""
    shell = shell_of(request)
    if request.query_params.get("shared", "") in {"1", "true", "yes"}:
        return JSONResponse(shared_with(request, caller) + await listed_elsewhere(shell, caller))
    if request.query_params.get("all", "") in {"1", "true", "yes"}:
        if not (isinstance(caller, UserCaller) and caller.is_admin):
            raise PermissionDenied("?all=1 lists every user's instances: admins only")
        here = [_wire(request, i, caller) for i in shell.lifecycle.all()]
        return JSONResponse(here + await listed_elsewhere(shell, caller, every=True))
    mine = owner_of_caller(shell, caller)
    here = [_wire(request, i, caller) for i in shell.lifecycle.all() if i.owner == mine]
    return JSONResponse(here + await listed_elsewhere(shell, caller, own=True))


async def listed_elsewhere(
    shell: Shell, caller: Caller, *, own: bool = False, every: bool = False
) -> list[dict[str, Any]]:
    """Other shells' instances as their rows say: the caller's own (``own``), every one
    (``every``, an admin's), else those shared with the calling user (with ``owner`` and
    ``access``, as `shared_with`)."""
    rows = shell.lifecycle.rows
    if rows is None or shell.coordination.lost is not None:
        return []  # cut off, this shell lists what it knows: its own (the balancer drops it)
    owners: set[str] | None = None  # every owner's (an admin's ``every``)
    if own:
        owners = {owner_of_caller(shell, caller)}
    elif not every:
        # the owners of instances shared with the caller (an app is shared nothing)
        user = caller.user_id if isinstance(caller, UserCaller) else None
        owners = shell.grants.owners_sharing_with(user) if user is not None else set()
    try:
        others = await rows.others(owners)
    except SQLAlchemyError as err:
        _LOGGER.warning("other shells' instances not listed: %s", err)
        return []
    found = []
    for row in others:
        copy = shell.registry.get(row.app_id, row.owner)
        if copy is None or copy.manifest is None:
            continue
        held = Elsewhere(row, copy.manifest)
        if every:
            found.append(elsewhere_wire(held))
            continue
        access = access_to(caller, held, shell.grants)
        if own and access == OWNER:
            found.append(elsewhere_wire(held))
        elif not own and isinstance(caller, UserCaller) and access not in {None, OWNER}:
            # a grantee is told no machine, as with one shell (`grantee_reaches`)
            found.append({**elsewhere_wire(held), "access": access, "elsewhere": None})
    return found


def owner_of_caller(shell: Shell, caller: Caller) -> str:
    """The user a caller acts for: a user themselves, an app its instance's owner."""
    if isinstance(caller, AppCaller):
        return caller.owner
    if isinstance(caller, UserCaller):
        return caller.user_id
    raise PermissionDenied("instances belong to users")  # pragma: no cover - routes need one


def shared_with(request: Request, caller: Caller) -> list[dict[str, Any]]:
    """`?shared=1`: the live instances other users granted the calling user a role on, each
    with ``access`` (`viewer` or `editor`) and ``owner``. Apps are never granted anything."""
    if not isinstance(caller, UserCaller):
        return []
    shell = shell_of(request)
    found = []
    for instance in shell.lifecycle.all():
        access = access_to(caller, instance, shell.grants)
        if access is None or access == OWNER:
            continue
        found.append(
            {**_wire(request, instance, caller), "owner": instance.owner, "access": access}
        )
    return found


def owned(shell: Shell, caller: Caller, instance_id: str) -> Instance:
    """The caller's own instance (for an app: its owner's); anyone else's, shared with the
    caller or not, answers as a missing instance does."""
    instance, access = viewable(shell, caller, instance_id)
    if access != OWNER:
        raise NotFound("instance", instance_id)
    return instance


def viewable(shell: Shell, caller: Caller, instance_id: str) -> tuple[Instance, str]:
    """The instance ``caller`` may open views on (their own, or one shared with them) and their
    role on it; any other answers as a missing instance does."""
    instance = shell.lifecycle.get(instance_id)
    access = access_to(caller, instance, shell.grants)
    if access is None:
        raise NotFound("instance", instance_id)
    return instance, access


async def held_elsewhere(shell: Shell, caller: Caller, instance_id: str) -> tuple[Elsewhere, str]:
    """With several shells: the instance another shell runs in a pod (its row says so) that
    ``caller`` may see, and their role on it. Not found as with one shell when no other
    shell's row names it or the caller may not see it; for its owner, `instance_elsewhere`
    naming its shell when it runs on an address only that shell reaches (a grantee learns no
    more than with one shell: `grantee_reaches`)."""
    rows = shell.lifecycle.rows
    row = None if rows is None else await rows.by_id(instance_id)
    copy = None if row is None else shell.registry.get(row.app_id, row.owner)
    if row is None or copy is None or copy.manifest is None:
        raise NotFound("instance", instance_id)
    held = Elsewhere(row, copy.manifest)
    access = access_to(caller, held, shell.grants)
    if access is None:
        raise NotFound("instance", instance_id)
    if access == OWNER and row.network is not None and row.network != SHARED_NETWORK:
        # a server only its shell reaches (no server now: no view to make anyway)
        raise held.refusal()
    return held, access


def grantee_reaches(held: Elsewhere, access: str) -> None:
    """A grantee's view of another shell's instance that only that shell reaches:
    `instance_elsewhere` naming no machine (with one shell they would not learn it; a route
    only the owner may use answers them not found, as with one shell)."""
    if access != OWNER and held.row.network is not None and held.row.network != SHARED_NETWORK:
        raise held.refusal(named=False)


async def owned_here(shell: Shell, caller: Caller, instance_id: str) -> Instance:
    """`owned`, and with several shells, for an instance of the caller's that another shell
    runs, `instance_elsewhere` naming that shell instead of not found: what only that shell
    answers (anything of a local runner's instance)."""
    try:
        return owned(shell, caller, instance_id)
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        held, access = await held_elsewhere(shell, caller, instance_id)
        if access != OWNER:
            raise
        machine = held.row.shell.partition(":")[0]
        raise InstanceElsewhere(
            f"{held.app_id}'s instance {held.id} runs on another shell (on {machine}), which "
            "alone answers this: ask that shell",
            instanceId=held.id,
            shell=machine,
        ) from None


async def owned_pod_elsewhere(shell: Shell, caller: Caller, instance_id: str) -> Elsewhere:
    """With several shells: the caller's own instance that another shell runs in a pod (the
    kubernetes runner's), whose actions that shell does when asked (`atrium.lifecycle.asked`).
    Not found as with one shell for anyone else; `instance_elsewhere` for a local runner's."""
    held, access = await held_elsewhere(shell, caller, instance_id)
    if access != OWNER:
        raise NotFound("instance", instance_id)
    if held.row.runner != POD_RUNNER:
        machine = held.row.shell.partition(":")[0]
        raise InstanceElsewhere(
            f"{held.app_id}'s instance {held.id} runs on another shell (on {machine}), on its "
            "machine: only that shell acts on it (a pod's instance is acted on from any shell)",
            instanceId=held.id,
            shell=machine,
        )
    return held


async def ask_elsewhere(
    shell: Shell, held: Elsewhere, action: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """The answer of the shell that runs ``held`` to ``action`` (`atrium.lifecycle.asked`)."""
    asked = shell.lifecycle.asked
    assert asked is not None  # noqa: S101 - held_elsewhere found its row
    answer = await asked.ask(held.row, action, body)
    if answer is None:
        raise InstanceElsewhere(
            f"instance {held.id} moved to another shell or ended while it was asked: ask again",
            instanceId=held.id,
        )
    return answer


def elsewhere_wire(held: Elsewhere) -> dict[str, Any]:
    """Another shell's instance as its row tells it: never its address, port, pid or secret."""
    return {
        "instanceId": held.id,
        "appId": held.app_id,
        "owner": held.owner,
        "name": held.manifest.name,
        "state": held.row.state,
        "port": None,
        "pid": None,
        "network": held.row.network,
        "backgroundService": held.manifest.background_service,
        "elsewhere": held.row.shell.partition(":")[0],
    }


async def get_instance(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    instance_id = request.path_params["instance_id"]
    try:
        instance = owned(shell, caller, instance_id)
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        held, access = await held_elsewhere(shell, caller, instance_id)
        if access != OWNER:
            raise
        return JSONResponse(elsewhere_wire(held))
    return JSONResponse(_wire(request, instance, caller))


async def create_instance(request: Request, caller: Caller) -> Response:
    body = await read_model(request, CreateBody)
    if not APP_ID_RE.fullmatch(body.app_id):
        raise InvalidRequest(f"{body.app_id!r} is not an app id (reverse-domain, lowercase)")
    audit_target(request, app_id=body.app_id)
    shell = shell_of(request)
    owner = owner_of_caller(shell, caller)
    if not body.new and (held := await opened_elsewhere(shell, body.app_id, owner)) is not None:
        audit_target(request, instance_id=held.id)
        if held.row.state != InstanceState.STOPPED.value:
            return JSONResponse(elsewhere_wire(held))
        shell.rates.take("asks", actor_of(caller))
        status, answer = await ask_elsewhere(shell, held, "start")
        if status != 200:
            return JSONResponse(answer, status_code=status)
        return JSONResponse({**elsewhere_wire(held), "state": answer.get("state", "started")})
    instance = await shell.lifecycle.create(body.app_id, new=body.new, owner=owner)
    audit_target(request, instance_id=instance.id)
    return JSONResponse(_wire(request, instance, caller))


async def opened_elsewhere(shell: Shell, app_id: str, owner: str) -> Elsewhere | None:
    """With several shells, when this shell runs no instance of the app for ``owner``: the one
    another shell runs for them in a pod that a page opened, which a launch hands out as one
    shell hands out its own (a second instance would have a claim of its own: the owner's data
    split between two). A local runner's is not handed out: no other shell serves it."""
    rows = shell.lifecycle.rows
    if rows is None or shell.lifecycle.live_of(app_id, owner) is not None:
        return None
    if shell.coordination.lost is not None:
        return None
    try:
        row = await rows.opened_elsewhere(app_id, owner, shell.lifecycle.id_prefix(app_id, owner))
    except SQLAlchemyError as err:  # this shell's own launch says what the database does
        _LOGGER.warning("other shells' instances not looked at: %s", err)
        return None
    copy = None if row is None else shell.registry.get(row.app_id, row.owner)
    if row is None or copy is None or copy.manifest is None:
        return None
    return Elsewhere(row, copy.manifest)


async def instance_action(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    instance_id, action = request.path_params["instance_id"], request.path_params["action"]
    try:
        owned(shell, caller, instance_id)
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        held = await owned_pod_elsewhere(shell, caller, instance_id)
        if not shell.lifecycle.is_action(action):
            await shell.lifecycle.act(instance_id, action)  # raises its 400, naming them
        shell.rates.take("asks", actor_of(caller))
        status, body = await ask_elsewhere(shell, held, action)
        if status != 200:
            return JSONResponse(body, status_code=status)
        return JSONResponse({**elsewhere_wire(held), "state": body.get("state", held.row.state)})
    instance = await shell.lifecycle.act(instance_id, action)
    return JSONResponse(_wire(request, instance, caller))


async def delete_instance(request: Request, caller: Caller) -> Response:
    force = request.query_params.get("force", "") in {"1", "true", "yes"}
    instance_id = request.path_params["instance_id"]
    shell = shell_of(request)
    try:
        owned(shell, caller, instance_id)
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        held = await owned_pod_elsewhere(shell, caller, instance_id)
        shell.rates.take("asks", actor_of(caller))
        status, body = await ask_elsewhere(shell, held, DELETE_FORCE if force else DELETE)
        return JSONResponse(body, status_code=status)
    problem = await shell.lifecycle.remove(instance_id, force=force)
    answer: dict[str, object] = {"ok": True, "instanceId": instance_id, "state": "installed"}
    if problem is not None:
        answer["problem"] = problem  # the orderly walk failed; the instance ended without it
    return JSONResponse(answer)


async def instance_logs(request: Request, caller: Caller) -> Response:
    """The last ``lines`` of the log; with ``after=<cursor>``, what was written since
    (``X-Log-End`` is the cursor to ask after next: how ``atrium dev`` follows a log). The
    runner reads it: a local log file, or a pod's log (any shell of the pod's namespace reads
    it from the cluster's API)."""
    shell = shell_of(request)
    instance_id = request.path_params["instance_id"]
    instance: Instance | Elsewhere
    try:
        instance = owned(shell, caller, instance_id)
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        instance = await owned_pod_elsewhere(shell, caller, instance_id)
    raw = request.query_params.get("lines", "200")
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) <= MAX_LOG_LINES:
        raise InvalidRequest(f"lines must be a whole number from 1 to {MAX_LOG_LINES}")
    after = request.query_params.get("after")
    if after is not None and not LOG_CURSOR.fullmatch(after):
        raise InvalidRequest(
            "after must be the X-Log-End of an earlier answer (a byte offset, or a time)"
        )
    if isinstance(instance, Elsewhere):
        found = await shell.lifecycle.logs_elsewhere(instance.row, int(raw), after)
        if found is None:
            await owned_here(shell, caller, instance_id)  # raises instance_elsewhere
            raise NotFound("instance", instance_id)  # pragma: no cover - owned_here raised
        chunk = found
    else:
        chunk = await shell.lifecycle.logs(instance, int(raw), after)
    return PlainTextResponse(chunk.text, headers={"X-Log-End": chunk.cursor})


async def create_activity(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    body = (
        await read_model(request, ActivityBody) if await bounded_body(request) else ActivityBody()
    )
    instance_id = request.path_params["instance_id"]
    try:
        instance = owned(shell, caller, instance_id)
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        held = await owned_pod_elsewhere(shell, caller, instance_id)
        shell.rates.take("asks", actor_of(caller))
        status, made = await ask_elsewhere(shell, held, ACTIVITY, {"extras": body.extras})
        if status != 200:
            return JSONResponse(made, status_code=status)
        path = str(made.get("path", "/"))
        origin = f"http://{held.row.slug}.{shell.settings.app_domain}:{shell.settings.port}"
        return JSONResponse(
            {
                "activityId": made.get("activityId"),
                "instanceId": held.id,
                "appId": held.app_id,
                "path": path,
                "title": made.get("title"),
                "url": origin + path,
            }
        )
    activity = await shell.lifecycle.create_activity(instance.id, body.extras)
    return JSONResponse(
        {
            "activityId": activity.id,
            "instanceId": instance.id,
            "appId": instance.app_id,
            "path": activity.path,
            "title": activity.title,
            "url": origin_url(shell, instance, activity.path),
        }
    )


async def delete_activity(request: Request, caller: Caller) -> Response:
    params = request.path_params
    shell = shell_of(request)
    try:
        owned(shell, caller, params["instance_id"])
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        held = await owned_pod_elsewhere(shell, caller, params["instance_id"])
        ended = {"activityId": params["activity_id"]}
        shell.rates.take("asks", actor_of(caller))
        status, answer = await ask_elsewhere(shell, held, ACTIVITY_END, ended)
        if status != 200:
            return JSONResponse(answer, status_code=status)
        return JSONResponse({"ok": True, "activityId": params["activity_id"]})
    await shell.lifecycle.destroy_activity(params["instance_id"], params["activity_id"])
    return JSONResponse({"ok": True, "activityId": params["activity_id"]})


async def create_view(request: Request, caller: Caller) -> Response:
    shell = shell_of(request)
    body = await read_model(request, ViewBody) if await bounded_body(request) else ViewBody()
    instance_id = request.path_params["instance_id"]
    if shell.lifecycle.rows is not None:  # rows and an event every shell reads
        shell.rates.take("views", actor_of(caller))
    try:
        return await _create_view(shell, caller, instance_id, body)
    except NotFound as err:
        if (
            shell.lifecycle.rows is None
            or not isinstance(caller, UserCaller)
            or err.fields.get("kind") != "instance"
        ):
            raise
        # a grant made on another shell a moment ago is known here once its event is heard:
        # the database says before the grantee is refused (nothing was written: try again)
        await shell.grants.reread(caller.user_id)
        return await _create_view(shell, caller, instance_id, body)


async def _create_view(shell: Shell, caller: Caller, instance_id: str, body: ViewBody) -> Response:
    try:
        instance, access = viewable(shell, caller, instance_id)
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        return await create_view_elsewhere(shell, caller, instance_id, body)
    if access != OWNER and instance.state is InstanceState.STOPPED:
        # a grantee cannot start it, and the owner closing their last view stopped it
        instance = await shell.lifecycle.act(instance.id, "start")
    client = shell.presence.client_id(body.client)
    user = caller.user_id if isinstance(caller, UserCaller) else None
    view, ticket = await shell.lifecycle.views.create(instance.id, body.path, client, user)
    url = origin_url(shell, instance, "/_os/enter")
    return JSONResponse(
        {"viewId": view.id, "instanceId": instance.id, "url": f"{url}?ticket={ticket}"}
    )


async def create_view_elsewhere(
    shell: Shell, caller: Caller, instance_id: str, body: ViewBody
) -> Response:
    """A view of another shell's pod, written to the database as its shell writes one; that
    shell hears of it and holds it in memory as its own (docs/deploying.md "Several shells").
    Its host page's going releases it as one made on its shell (`Presence`)."""
    held, access = await held_elsewhere(shell, caller, instance_id)
    grantee_reaches(held, access)
    if not is_local_path(body.path):
        raise InvalidRequest(
            f"view path {body.path[:200]!r} must start with a single '/' and hold no '\\' "
            "or control character (a browser would read it as another site's address)"
        )
    if held.state not in SERVING:
        raise NotServing(
            held.id,
            held.app_id,
            held.state,
            "a view needs an instance in started, resuming, resumed, pausing or paused "
            "(it runs on another shell, which alone starts it)",
        )
    rows = shell.lifecycle.rows
    assert rows is not None  # noqa: S101 - held_elsewhere found its row
    view_id, ticket = secrets.token_hex(6), secrets.token_urlsafe(24)
    user = caller.user_id if isinstance(caller, UserCaller) else held.owner
    client = shell.presence.client_id(body.client)
    state = await rows.add_view_elsewhere(
        held.row, view_id, body.path, user, ticket, TICKET_TTL, client
    )
    if state is None:
        raise InstanceElsewhere(
            f"instance {held.id} moved or ended while its view was made: ask again",
            instanceId=held.id,
        )
    if state not in SERVING:  # it stopped since its row was read
        raise NotServing(
            held.id,
            held.app_id,
            state,
            "a view needs an instance in started, resuming, resumed, pausing or paused "
            "(it runs on another shell, which alone starts it)",
        )
    url = f"http://{held.row.slug}.{shell.settings.app_domain}:{shell.settings.port}/_os/enter"
    return JSONResponse({"viewId": view_id, "instanceId": held.id, "url": f"{url}?ticket={ticket}"})


async def delete_view(request: Request, caller: Caller) -> Response:
    params = request.path_params
    shell = shell_of(request)
    try:
        instance, access = viewable(shell, caller, params["instance_id"])
    except NotFound:
        if shell.lifecycle.rows is None:
            raise
        return await delete_view_elsewhere(shell, caller, params["instance_id"], params["view_id"])
    view = instance.views.get(params["view_id"])
    if access != OWNER and (view is None or view.user != getattr(caller, "user_id", None)):
        raise NotFound("view", params["view_id"])  # a grantee closes their own views only
    instance = await shell.lifecycle.views.release(instance.id, params["view_id"])
    return JSONResponse(_wire(request, instance, caller))


async def delete_view_elsewhere(
    shell: Shell, caller: Caller, instance_id: str, view_id: str
) -> Response:
    """Release a view of another shell's pod (made on any shell): its rows go here, so every
    other shell refuses it at once; then its own shell, which alone holds it in memory, is
    asked to drop it (and stop the instance if it was its last view), and the answer waits for
    it: once answered, the view's cookie is refused on every shell."""
    held, access = await held_elsewhere(shell, caller, instance_id)
    grantee_reaches(held, access)
    rows = shell.lifecycle.rows
    assert rows is not None  # noqa: S101 - held_elsewhere found its row
    view = await rows.view_by_id(held.row.slug, view_id)
    if view is None or (access != OWNER and view.user != getattr(caller, "user_id", None)):
        raise NotFound("view", view_id)  # a grantee closes their own views only
    if not await rows.drop_view_elsewhere(held.row, view_id):
        raise NotFound("view", view_id)
    wire = elsewhere_wire(held)
    if held.row.runner == POD_RUNNER:
        wire["state"] = await view_dropped_elsewhere(shell, held, view_id)
    if access != OWNER:  # a grantee is told no machine (`grantee_reaches`)
        return JSONResponse({**wire, "elsewhere": None})
    return JSONResponse(wire)


async def view_dropped_elsewhere(shell: Shell, held: Elsewhere, view_id: str) -> str:
    """The instance's state once its shell has dropped the released view (asked through the
    database, `RELEASE_VIEW`). Unanswered (that shell slow, cut off, or the instance moved),
    the release stands: its rows are gone, which every other shell checks on each request,
    and that shell drops it when it hears the release's `instance:routed`."""
    try:
        status, answer = await ask_elsewhere(shell, held, RELEASE_VIEW, {"viewId": view_id})
    except (ShellTimeout, InstanceElsewhere) as err:
        status, answer = err.http_status, err.to_body()
    state = answer.get("state")
    if status == 200 and isinstance(state, str):
        return state
    _LOGGER.warning(
        "%s %s: its shell did not drop released view %s (%s): it does when it hears of it",
        held.app_id,
        held.id,
        view_id,
        answer.get("error", status),
    )
    return held.row.state


async def proxy(request: Request, caller: Caller) -> Response:
    """Pages of an instance for bearer-token clients (CLI, tests); never the cookie."""
    if not isinstance(caller, UserCaller) or caller.via_cookie:
        raise PermissionDenied("/api/proxy/ takes the user's bearer token only")
    shell = shell_of(request)
    instance = owned(shell, caller, request.path_params["instance_id"])  # grantees: views only
    if instance.host is None or instance.port is None:
        raise InvalidRequest(f"instance {instance.id} is {instance.state}: no server to proxy")
    user = shell.users.require(caller.user_id)
    return await proxy_page(
        shell,
        instance,
        request,
        "/" + request.path_params["path"],
        html_transform_for(instance, shell.theme, user.id),
        kind="user",
        looking=Looking(user, OWNER),
    )


ALL_METHODS: Final = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

routes: list[BaseRoute] = [
    endpoint(
        "/api/instances",
        list_instances,
        methods=["GET"],
        access=Access.USER_OR_APP,
        query={
            "shared": "1, true or yes: the instances other users shared with the caller",
            "all": "1, true or yes: every user's instances (admins only)",
        },
    ),
    endpoint(
        "/api/instances", create_instance, methods=["POST"], access=Access.USER, body=CreateBody
    ),
    endpoint(
        "/api/instances/{instance_id}", get_instance, methods=["GET"], access=Access.USER_OR_APP
    ),
    endpoint(
        "/api/instances/{instance_id}",
        delete_instance,
        methods=["DELETE"],
        access=Access.USER,
        query={"force": "1, true or yes: kill without hooks"},
    ),
    endpoint(
        "/api/instances/{instance_id}/logs",
        instance_logs,
        methods=["GET"],
        access=Access.USER,
        query={"lines": "how many lines, 1-5000 (default 200)"},
    ),
    endpoint(
        "/api/instances/{instance_id}/activities",
        create_activity,
        methods=["POST"],
        access=Access.USER,
        body=ActivityBody,
        body_required=False,
    ),
    endpoint(
        "/api/instances/{instance_id}/activities/{activity_id}",
        delete_activity,
        methods=["DELETE"],
        access=Access.USER,
    ),
    endpoint(
        "/api/instances/{instance_id}/views",
        create_view,
        methods=["POST"],
        access=Access.USER,
        body=ViewBody,
        body_required=False,
    ),
    endpoint(
        "/api/instances/{instance_id}/views/{view_id}",
        delete_view,
        methods=["DELETE"],
        access=Access.USER,
    ),
    endpoint(
        "/api/instances/{instance_id}/{action}",
        instance_action,
        methods=["POST"],
        access=Access.USER,
    ),
    endpoint(
        "/api/proxy/{instance_id}/{path:path}", proxy, methods=ALL_METHODS, access=Access.USER
    ),
]
