"""`GET /api/audit`: the audit log (docs/api.md "Audit log"). An admin reads every record, a
member only those where they are the actor; apps never."""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.errors import InvalidRequest, PermissionDenied
from atrium.identity import Caller, UserCaller
from atrium.users.audit import DEFAULT_LIMIT, MAX_LIMIT, AuditQuery, stamp

QUERY = {
    "since": "only records at or after this time (ISO 8601, e.g. 2026-01-31T12:00:00Z)",
    "actor": "only this actor: a user id, app:<appId>/<instanceId> or anonymous",
    "action": 'only this action, such as kv.put or session.create (docs/api.md "Audit log")',
    "limit": f"at most this many records, newest first (1-{MAX_LIMIT}, default 100)",
}


def _bad(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", problems=[{"field": field, "message": message}])


def _since(value: str) -> str:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise _bad("since", "not an ISO 8601 time, e.g. 2026-01-31T12:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return stamp(when)


def _limit(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise _bad("limit", f"a whole number 1-{MAX_LIMIT}")
    return int(value)


def _text(field: str, value: str) -> str:
    if not value or len(value) > 200 or not value.isprintable():
        raise _bad(field, "1-200 printable characters")
    return value


def parse_query(request: Request, caller: UserCaller) -> AuditQuery:
    """The filters asked for; a member's are narrowed to records they are the actor of."""
    params = request.query_params
    query = AuditQuery(
        since=_since(params["since"]) if "since" in params else None,
        actor=_text("actor", params["actor"]) if "actor" in params else None,
        action=_text("action", params["action"]) if "action" in params else None,
        limit=_limit(params["limit"]) if "limit" in params else DEFAULT_LIMIT,
    )
    if caller.is_admin:
        return query
    if query.actor is not None and query.actor != caller.user_id:
        # another actor's records are as absent as if there were none
        return AuditQuery(since=query.since, actor="", action=query.action, limit=query.limit)
    return AuditQuery(
        since=query.since, actor=caller.user_id, action=query.action, limit=query.limit
    )


async def list_audit(request: Request, caller: Caller) -> Response:
    if not isinstance(caller, UserCaller):  # Access.USER lets no one else in
        raise PermissionDenied("only a user may read the audit log")
    query = parse_query(request, caller)
    records = await shell_of(request).audit.search(query)
    return JSONResponse([r.wire() for r in records], headers={"Cache-Control": "no-store"})


routes: list[BaseRoute] = [
    endpoint("/api/audit", list_audit, methods=["GET"], access=Access.USER, query=QUERY),
]
