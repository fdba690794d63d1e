"""The shared toolchain `$ATRIUM_HOME/toolchain/bin`: binaries an app may declare in `tools`.

Each entry is a symlink to a binary of the host; inside the sandbox only the declared ones exist
(decisions.md "Lifecycle"). Not scoped: one toolchain for every scope (docs/api.md "Toolchain").
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from atrium.api.auth import Access, endpoint, shell_of
from atrium.api.bodies import bounded_body, read_model
from atrium.errors import InvalidRequest, NotFound
from atrium.identity import Caller
from atrium.manifest import TOOL_RE
from atrium.wire import WireModel

WILDCARD: Final = "*"


class ToolBody(WireModel):
    """`PUT /api/tools/{name}`: the binary to expose (default: `name` on the shell's PATH)."""

    path: str | None = None


def toolchain(request: Request) -> Path:
    return shell_of(request).settings.home / "toolchain" / "bin"


def _name(request: Request) -> str:
    name: str = request.path_params["name"]
    if name == WILDCARD or not TOOL_RE.fullmatch(name):
        raise InvalidRequest(f"{name!r} is not a tool name (a file name such as git)")
    return name


def _entry(link: Path) -> dict[str, str | None]:
    target = str(link.readlink()) if link.is_symlink() else str(link)
    return {"name": link.name, "path": target, "exists": str(link.exists()).lower()}


async def list_tools(request: Request, caller: Caller) -> Response:
    directory = toolchain(request)
    links = sorted(directory.iterdir()) if directory.is_dir() else []
    return JSONResponse([_entry(link) for link in links])


async def add_tool(request: Request, caller: Caller) -> Response:
    name = _name(request)
    body = await read_model(request, ToolBody) if await bounded_body(request) else ToolBody()
    return JSONResponse(link_tool(toolchain(request), name, body.path or shutil.which(name)))


def link_tool(directory: Path, name: str, source: str | None) -> dict[str, str | None]:
    """Point ``directory/name`` at ``source`` atomically (a symlink swapped into place)."""
    if source is None:
        raise InvalidRequest(f"{name!r} is not on the shell's PATH; give its path")
    resolved = Path(source)
    if not resolved.is_absolute() or not resolved.is_file() or not os.access(resolved, os.X_OK):
        raise InvalidRequest(f"{source!r} is not an absolute path to an executable file")
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / name
    tmp = directory / f".{name}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(resolved)
    tmp.replace(link)
    return _entry(link)


async def remove_tool(request: Request, caller: Caller) -> Response:
    name = _name(request)
    link = toolchain(request) / name
    if not link.is_symlink() and not link.exists():
        raise NotFound("tool", name)
    link.unlink()
    return JSONResponse({"ok": True, "name": name})


routes: list[BaseRoute] = [
    endpoint("/api/tools", list_tools, methods=["GET"], access=Access.USER_OR_APP),
    endpoint(
        "/api/tools/{name}",
        add_tool,
        methods=["PUT"],
        access=Access.ADMIN,  # the toolchain is the whole shell's
        body=ToolBody,
        body_required=False,
    ),
    endpoint("/api/tools/{name}", remove_tool, methods=["DELETE"], access=Access.ADMIN),
]
