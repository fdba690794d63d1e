"""`GET /api/openapi.json`: an OpenAPI 3.1 document of the JSON API, built from the routes.

Nothing in it is written twice: paths, methods and path parameters come from the Starlette
routes, who may call from each route's `Access`, request bodies from the pydantic models the
handlers parse (`Endpoint.body`), query parameters from `Endpoint.query`. Responses are described
as JSON (most are built by hand from domain objects, so no model exists to describe them) and
every failure as the error object. Routes that are not JSON API are left out, by path:
`NOT_JSON_API` (docs/api.md "OpenAPI document"). A test keeps the document and the endpoint
index of docs/api.md in step, and the test suite fuzzes the running shell from this document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium import API_VERSION, __version__
from atrium.api.actions import audit_action
from atrium.api.auth import Access, Endpoint, endpoint
from atrium.identity import SESSION_COOKIE, Caller

PATH: Final = "/api/openapi.json"
#: routes of the shell that are not part of the JSON API, and why (docs/api.md "OpenAPI document")
NOT_JSON_API: Final = {
    "/": "the host page (HTML)",
    "/login": "a browser redirect that sets the session cookie",
    "/static": "the host page's files",
    "/api/data/{authority}/{path}": "the data proxy: each provider app defines its own API",
    "/api/proxy/{instanceId}/{path}": "an instance's pages, forwarded as they are",
    "/api/events": "a server-sent event stream, not JSON",
    "/auth/oidc/{provider}/login": "a browser redirect to an OIDC provider",
    "/auth/oidc/{provider}/callback": "a browser redirect that sets the session cookie, or a page",
}
_PARAM: Final = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*)(?::[a-z]+)?\}")
_ERROR_REF: Final = {"$ref": "#/components/responses/Error"}


class ErrorObject(BaseModel):
    """`error` of every failure: a stable code, a sentence, and the code's own fields."""

    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class ErrorBody(BaseModel):
    """Every failure the shell produces itself (docs/api.md "Errors")."""

    error: ErrorObject


def api_path(route_path: str) -> str:
    """``/api/kv/app/{app_id}/{key:path}`` → ``/api/kv/app/{appId}/{key}``."""
    return _PARAM.sub(lambda m: "{" + to_camel(m.group(1)) + "}", route_path)


def _schema_ref(model: type[BaseModel], components: dict[str, Any]) -> dict[str, str]:
    schema = model.model_json_schema(
        by_alias=True, ref_template="#/components/schemas/{model}", mode="validation"
    )
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _security(access: Access) -> list[dict[str, list[str]]]:
    if access is Access.ANYONE:
        return [{}]
    return [{"bearer": []}, {"session": []}]


def _operation(
    route: Endpoint, method: str, path: str, components: dict[str, Any]
) -> dict[str, Any]:
    handler_doc = (route.handler.__doc__ or "").strip().split("\n\n")[0]
    callers = {
        Access.ANYONE: ["anyone"],
        Access.USER: ["user"],
        Access.ADMIN: ["admin"],
        Access.USER_OR_APP: ["user", "app"],
        Access.APP: ["app"],
    }[route.access]
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        for name in re.findall(r"\{([^}]+)\}", path)
    ]
    parameters += [
        {
            "name": name,
            "in": "query",
            "required": False,
            "description": text,
            "schema": {"type": "string"},
        }
        for name, text in route.query.items()
    ]
    media = "text/css" if path.endswith(".css") else "application/json"
    operation: dict[str, Any] = {
        "operationId": f"{method.lower()}_{route.name}",
        "summary": " ".join(handler_doc.split()) or route.name,
        "x-callers": callers,
        "security": _security(route.access),
        "parameters": parameters,
        "responses": {
            "200": {"description": "success", "content": {media: {"schema": {}}}},
            "4XX": _ERROR_REF,
            "5XX": _ERROR_REF,
        },
    }
    if route.audited:
        operation["x-audit-action"] = audit_action(route.name)
    if route.body is not None:
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": _schema_ref(route.body, components)}},
        }
    return operation


def build_document(routes: Iterable[BaseRoute]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (the Starlette application's)."""
    components: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, Endpoint):
            continue
        path = api_path(route.path)
        if path in NOT_JSON_API:
            continue
        for method in sorted(route.methods or ()):
            if method == "HEAD":
                continue  # every GET also answers HEAD (docs/api.md "Conventions")
            paths.setdefault(path, {})[method.lower()] = _operation(route, method, path, components)
    error_ref = _schema_ref(ErrorBody, components)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Atrium shell API",
            "version": f"{__version__} (api {API_VERSION})",
            "description": "The JSON API of the Atrium shell; docs/api.md is the reference.",
        },
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": components,
            "responses": {
                "Error": {
                    "description": 'an error object (docs/api.md "Errors")',
                    "content": {"application/json": {"schema": error_ref}},
                }
            },
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the user's token, or an app instance's OS_APP_TOKEN",
                },
                "session": {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE},
            },
        },
    }


async def openapi_document(request: Request, caller: Caller) -> Response:
    """The OpenAPI 3.1 document of the JSON API (open: it holds nothing but the API's shape)."""
    app = request.app
    document: dict[str, Any] | None = getattr(app.state, "openapi", None)
    if document is None:
        document = app.state.openapi = build_document(app.routes)
    return JSONResponse(document)


routes: list[BaseRoute] = [
    endpoint(PATH, openapi_document, methods=["GET"], access=Access.ANYONE),
]
