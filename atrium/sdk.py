"""The app SDK: a small HTTP server an Atrium app runs as its own process (``python3 server.py``).

It answers what the shell calls on every app (decisions.md "Who is calling", docs/api.md "What
the shell calls on an app"): ``GET /health`` with the instance's identity, every lifecycle hook
``POST /api/lifecycle/<hook>`` (``{"ok": true}`` unless overridden), provider routes under
``/api/data/<path>``, the app's own routes and static files. Every request must carry the shell's
per-instance secret (``X-Os-Shell-Secret``), else 403; every response names the app
(``X-Os-App-Id``).

Limits: stdlib only, and nothing imported that the first request does not need — this module's
import time is part of every app's cold start. It must never import another ``atrium`` module
(``atrium/__init__.py`` is a version string only). Request bodies are read whole (up to
``MAX_BODY``); response bodies may stream.

    from atrium.sdk import App

    app = App()

    @app.hook("onCreate")
    def created(body):
        return {"ok": True}

    @app.provider("/notes")
    def notes(request):
        return {"subpath": request.subpath}

    app.static("/", "static")
    app.run()
"""

from __future__ import annotations

import json
import os
import signal
import sys

# hmac.compare_digest is this very function; importing hmac would also import hashlib (~1.5 ms).
from _operator import _compare_digest as compare_digest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, unquote

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~3 ms at import; the annotations are strings at run time
    from collections.abc import Callable, Iterable, Mapping
    from email.message import Message
    from typing import Any, TypeAlias, TypeVar

    Handler: TypeAlias = Callable[["Request"], object]
    HookHandler: TypeAlias = Callable[[dict[str, Any]], "Mapping[str, object] | None"]
    H = TypeVar("H", bound=Handler)
    K = TypeVar("K", bound=HookHandler)

__all__ = ["HOOKS", "App", "HttpError", "Request", "Response", "User"]

#: every hook the shell calls (``onActivityDestroy`` is called as ``onActivityDestroy/<activityId>``)
HOOKS = (
    "onCreate",
    "onStart",
    "onResume",
    "onPause",
    "onStop",
    "onDestroy",
    "onActivityCreate",
    "onActivityDestroy",
)
MAX_BODY = 64 * 1024 * 1024
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_ANY = "*"


class HttpError(Exception):
    """Raise from a handler or hook to answer ``status`` with ``{"error": {code, message}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _CODES.get(status, "bad_request" if status < 500 else "internal")
        self.headers = dict(headers or {})

    def response(self) -> Response:
        body = {"error": {"code": self.code, "message": self.message}}
        return Response.json(body, self.status, self.headers)


_CODES = {400: "bad_request", 403: "permission_denied", 404: "not_found", 500: "internal"}


def _is_shell_route(path: str) -> bool:
    """Routes only the shell itself calls: ``/health``, the hooks and the provider routes."""
    return path == "/health" or any(
        path == prefix or path.startswith(prefix + "/")
        for prefix in ("/api/lifecycle", "/api/data")
    )


class User:
    """Who is looking at the app through the shell: the user's ``id``, display ``name`` and
    ``role`` on this instance: ``owner`` (it is theirs), ``editor`` or ``viewer`` (it was shared
    with them). A viewer's changes never reach the app unless its manifest says
    ``sharing.enforcesRoles``; then the app refuses them itself (``user.can_change``)."""

    __slots__ = ("id", "name", "role")

    def __init__(self, id: str, name: str, role: str) -> None:
        self.id = id
        self.name = name
        self.role = role

    @property
    def can_change(self) -> bool:
        """The owner and an editor may change the instance's data; a viewer only looks."""
        return self.role in ("owner", "editor")

    def __repr__(self) -> str:
        return f"User(id={self.id!r}, name={self.name!r}, role={self.role!r})"


class Request:
    """One request as a handler sees it.

    ``path`` is the path as sent (percent-encoding kept, no query); ``query`` the decoded query
    (the last value of a repeated name wins); ``subpath`` what a prefix route or provider matched
    beyond its prefix, without the leading ``/`` (``""`` for the prefix itself).
    """

    __slots__ = ("body", "headers", "method", "path", "query", "query_string", "subpath")

    def __init__(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: Message,
        body: bytes,
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.query: dict[str, str] = dict(parse_qsl(query_string, keep_blank_values=True))
        self.headers = headers
        self.body = body
        self.subpath = ""

    def json(self) -> Any:
        """The body decoded as JSON (``None`` when empty); malformed JSON answers 400."""
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError as err:
            raise HttpError(400, f"the request body is not JSON: {err}") from None

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object; anything else (empty, an array, malformed) answers 400
        naming what was expected."""
        body = self.json()
        if not isinstance(body, dict):
            raise HttpError(400, f"the request body must be a JSON object, not {_kind_of(body)}")
        return body

    @property
    def kind(self) -> str | None:
        """What the shell says this request is (``X-Os-Request-Kind``): ``page`` (a browser
        request forwarded from the app's origin), ``data`` (the data proxy), ``hook`` or
        ``health``; callers cannot set it, the shell drops every inbound ``X-Os-*`` header."""
        return self.headers.get("X-Os-Request-Kind")

    @property
    def user(self) -> User | None:
        """The user looking, on a ``page`` (and ``user``) request: ``X-Os-User-Id``,
        ``X-Os-User-Name`` (percent-decoded UTF-8) and ``X-Os-User-Role``, which the shell sets
        and callers cannot (inbound ``X-Os-*`` headers are dropped). None on the shell's own
        calls (health, hooks, data)."""
        user_id = self.headers.get("X-Os-User-Id")
        if not user_id:
            return None
        name = unquote(self.headers.get("X-Os-User-Name") or user_id, errors="replace")
        return User(user_id, name, self.headers.get("X-Os-User-Role") or "viewer")

    @property
    def caller_app_id(self) -> str | None:
        """The app calling through the data proxy (absent when the user calls)."""
        return self.headers.get("X-Os-Caller-App-Id")

    @property
    def permission(self) -> str | None:
        """The permission the shell checked for this call (``X-Os-Permission``)."""
        return self.headers.get("X-Os-Permission")


class Response:
    """An answer: ``body`` is bytes, text (UTF-8) or an iterable of byte chunks (streamed).

    A streamed body is sent with ``Content-Length: length`` when ``length`` is given (it must then
    be exact), chunked otherwise.
    """

    __slots__ = ("body", "content_type", "headers", "length", "status")

    def __init__(
        self,
        body: bytes | str | Iterable[bytes] = b"",
        status: int = 200,
        *,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        length: int | None = None,
    ) -> None:
        if isinstance(body, str):
            body = body.encode()
            content_type = content_type or "text/plain; charset=utf-8"
        elif isinstance(body, bytearray | memoryview):
            body = bytes(body)
        self.body = body
        self.status = status
        self.content_type = content_type or "application/octet-stream"
        self.headers = dict(headers or {})
        self.length = len(body) if isinstance(body, bytes) else length

    @classmethod
    def json(
        cls, data: object, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> Response:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        return cls(body, status, content_type="application/json", headers=headers)

    @classmethod
    def html(cls, text: str, status: int = 200) -> Response:
        return cls(text.encode(), status, content_type="text/html; charset=utf-8")


def error_response(status: int, message: str, code: str | None = None) -> Response:
    """``{"error": {"code", "message"}}`` (decisions.md "Errors"); code from status if not given."""
    return HttpError(status, message, code).response()


def _to_response(result: object) -> Response:
    """A handler's return value as a Response (see ``App.route``)."""
    if isinstance(result, Response):
        return result
    if result is None:
        return Response(b"", 204)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], int):
        response = _to_response(result[1])
        response.status = result[0]
        return response
    if isinstance(result, bytes | str):
        return Response(result)
    return Response.json(result)


class _Route:
    __slots__ = ("handler", "method", "prefix")

    def __init__(self, method: str, prefix: str, handler: Handler) -> None:
        self.method = method
        self.prefix = prefix
        self.handler = handler


class _Stop(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT to leave ``serve_forever`` at once."""


def app_secret(name: str) -> str:
    """``OS_APP_TOKEN`` or ``OS_SHELL_SECRET``: from the environment (a local runner), else the
    file ``$OS_SECRETS_DIR/<name>`` (a pod reads its Secret as files, never as env)."""
    value = os.environ.get(name, "")
    folder = os.environ.get("OS_SECRETS_DIR", "")
    if not value and folder:
        try:
            value = Path(folder, name).read_text().strip()
        except OSError:
            value = ""
    return value


class App:
    """One app instance's server, configured from the shell's environment (decisions.md "Manifest").

    ``name`` defaults to the ``name`` of ``app.manifest.json`` in the working directory (the shell
    runs the entrypoint in the app directory), then to the app id.
    """

    def __init__(self, name: str | None = None) -> None:
        env = os.environ
        manifest = _read_manifest() if name is None or not env.get("OS_APP_ID") else {}
        self.app_id: str = env.get("OS_APP_ID") or str(manifest.get("id") or "")
        self.instance_id: str = env.get("OS_INSTANCE_ID", "")
        self.name: str = name or str(manifest.get("name") or self.app_id or "app")
        self.host: str = env.get("OS_HOST") or "127.0.0.1"
        self.port: int = int(env.get("OS_PORT") or env.get("PORT") or "0")
        self.shell_url: str = (env.get("OS_SHELL_URL") or "").rstrip("/")
        self.app_token: str = app_secret("OS_APP_TOKEN")
        self._secret = app_secret("OS_SHELL_SECRET").encode()
        #: ``OS_DATA_DIR``: the instance's runtime data directory (``/data`` in a sandbox)
        self.data_dir = Path(env.get("OS_DATA_DIR") or ".")
        #: the onActivityCreate body of every live activity, by activity id
        self.activities: dict[str, dict[str, Any]] = {}
        self._exact: dict[tuple[str, str], Handler] = {}
        self._prefixes: list[_Route] = []
        self._hooks: dict[str, HookHandler] = {}
        self.server: ThreadingHTTPServer | None = None
        self._exact[("GET", "/health")] = self._health
        self._add_prefix(_Route("POST", "/api/lifecycle", self._lifecycle))

    # -- registration -------------------------------------------------------------------------

    def route(self, method: str, path: str) -> Callable[[H], H]:
        """Register ``handler(request)`` for ``method`` (or ``"*"``: every method) and ``path``.

        ``path`` is exact, or a prefix route ending in ``/*`` (``"/files/*"`` matches ``/files``
        and everything below it; ``request.subpath`` is the rest). Exact routes win over prefix
        routes, longer prefixes over shorter. A handler returns a Response, a dict or list (JSON
        200), ``str``/``bytes``, ``None`` (204) or ``(status, body)``; raise HttpError to answer
        an error; any other exception answers 500. ``HEAD`` falls back to the ``GET`` route.
        Registering ``GET /health`` replaces the built-in health answer.
        """
        method = method.upper()
        if method != _ANY and method not in METHODS:
            raise ValueError(f"unknown method {method!r}: one of {', '.join(METHODS)} or '*'")
        if not path.startswith("/"):
            raise ValueError(f"route path {path!r} must start with '/'")

        def register(handler: H) -> H:
            if path.endswith("/*"):
                self._add_prefix(_Route(method, path[:-2], handler))
            else:
                self._exact[(method, path)] = handler
            return handler

        return register

    def provider(self, path: str) -> Callable[[H], H]:
        """Register a provider entry's handler: ``/api/data<path>`` and below, every verb.

        The shell has already checked the caller's permission; ``request.caller_app_id`` and
        ``request.permission`` say who asked and what was checked.
        """
        if not path.startswith("/"):
            raise ValueError(f"provider path {path!r} must start with '/'")
        return self.route(_ANY, "/api/data" + path.rstrip("/") + "/*")

    def hook(self, name: str) -> Callable[[K], K]:
        """Override a lifecycle hook: ``handler(body) -> dict | None`` (None: the default answer).

        ``body`` is the shell's JSON (``instanceId``, ``appId``, ``activityId``, and for
        ``onActivityCreate`` also ``extras`` and, when an intent started it, ``intent``). The
        default answer is ``{"ok": true}``, and ``{"path": "/", "title": <name>}`` for
        ``onActivityCreate``. Raising answers 500 (HttpError: its status), which halts the move.
        """
        if name not in HOOKS:
            raise ValueError(f"unknown hook {name!r}: one of {', '.join(HOOKS)}")

        def register(handler: K) -> K:
            self._hooks[name] = handler
            return handler

        return register

    def static(self, url_prefix: str, directory: str | os.PathLike[str]) -> None:
        """Serve the files of ``directory`` under ``url_prefix`` (GET/HEAD; ``index.html`` for dirs).

        A relative ``directory`` is taken from the working directory (the app directory).
        Paths with a ``..`` segment, or that resolve outside ``directory``, answer 404.
        """
        root = Path(directory).resolve()

        def serve_file(request: Request) -> Response:
            return _file_response(root, request.subpath)

        self.route("GET", url_prefix.rstrip("/") + "/*")(serve_file)

    def _add_prefix(self, route: _Route) -> None:
        self._prefixes.append(route)
        self._prefixes.sort(key=lambda r: len(r.prefix), reverse=True)

    # -- calling the shell --------------------------------------------------------------------

    def call_shell(
        self, method: str, path: str, json: object = None, timeout: float = 30.0
    ) -> tuple[int, Any]:
        """Call the shell's API as this app (``Authorization: Bearer $OS_APP_TOKEN``).

        Returns ``(status, body)``: the body decoded as JSON when it is JSON, else text. An error
        status is returned, not raised; a shell that cannot be reached raises ``OSError``.
        """
        import urllib.error  # urllib.request costs ~5 ms: only the apps that call the shell pay
        import urllib.request

        if not self.shell_url.startswith(("http://", "https://")):
            raise RuntimeError(f"OS_SHELL_URL {self.shell_url!r} is not the shell's http(s) URL")
        data = None if json is None else _dumps(json)
        url = self.shell_url + path
        request = urllib.request.Request(url, data=data, method=method.upper())  # noqa: S310 - http(s) checked
        request.add_header("Authorization", f"Bearer {self.app_token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        # no proxies: the shell is reached directly, whatever HTTP_PROXY says
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=timeout) as answer:
                return answer.status, _decode(answer.read(), answer.headers.get_content_type())
        except urllib.error.HTTPError as err:
            with err:
                return err.code, _decode(err.read(), err.headers.get_content_type())

    def notify_change(self, *paths: str) -> bool:
        """Tell watchers that data under this app's authority changed at ``paths`` (each starting
        with ``/``, as in the provider's entries): the shell publishes ``data:changed`` to those
        who may read there (docs/api.md "Change notifications"). Call it after the write is
        durable. False (and a line on stderr) when the shell refused or could not be reached: a
        lost notice must not fail the write that caused it."""
        if not paths:
            return True
        body = {"path": paths[0]} if len(paths) == 1 else {"paths": list(paths)}
        try:
            status, answer = self.call_shell("POST", "/api/data-changes", body, timeout=5.0)
        except (OSError, RuntimeError) as err:
            sys.stderr.write(f"{self.name}: notify_change{paths!r} failed: {err}\n")
            return False
        if status != 200:
            sys.stderr.write(f"{self.name}: notify_change{paths!r} refused: {status} {answer}\n")
            return False
        return True

    def theme(self) -> dict[str, Any] | None:
        """The user's theme selection, as ``GET /api/os/theme`` answers it (the shape of the
        ``theme:changed`` event: the light and dark themes, the color mode); None when the shell
        cannot say (a line on stderr). For ``themed`` apps that draw with their own colours."""
        try:
            status, answer = self.call_shell("GET", "/api/os/theme", timeout=5.0)
        except (OSError, RuntimeError) as err:
            sys.stderr.write(f"{self.name}: theme() failed: {err}\n")
            return None
        if status != 200 or not isinstance(answer, dict):
            sys.stderr.write(f"{self.name}: theme() refused: {status} {answer}\n")
            return None
        return answer

    # -- serving ------------------------------------------------------------------------------

    def run(self) -> None:
        """Serve on ``(OS_HOST, OS_PORT)`` until SIGTERM or SIGINT, then return."""
        server = self.make_server()
        if not (os.environ.get("OS_PORT") or os.environ.get("PORT")):
            sys.stderr.write(f"{self.name}: serving on http://{self.host}:{server.server_port}\n")
        main = _is_main_thread()
        if main:
            previous = {
                sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)
            }
        try:
            server.serve_forever()
        except _Stop:
            pass
        finally:
            if main:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
            server.server_close()

    def make_server(self) -> ThreadingHTTPServer:
        """Bind the server without serving (``run`` does both); ``server_port`` is the real port."""
        handler = type("RequestHandler", (_RequestHandler,), {"app": self})
        self.server = _Server((self.host, self.port), handler)
        return self.server

    def handle(self, request: Request) -> Response:
        """Route one request that passed the secret check; never raises."""
        try:
            return _to_response(self._dispatch(request))
        except HttpError as err:
            return err.response()
        except Exception:  # noqa: BLE001 - a handler bug answers 500 and is printed, the server lives on
            _print_exception(f"{request.method} {request.path}")
            return error_response(500, f"{request.method} {request.path} failed; see the app's log")

    def _dispatch(self, request: Request) -> object:
        method, path = request.method, request.path
        if request.kind == "page" and _is_shell_route(path):
            # the shell never forwards these from a browser; refuse them anyway (defence in depth)
            raise HttpError(403, f"{path} is for the shell, not for a page request")
        methods = (method, _ANY, "GET") if method == "HEAD" else (method, _ANY)
        for candidate in methods:
            exact = self._exact.get((candidate, path))
            if exact is not None:
                return exact(request)
        for route in self._prefixes:
            prefix = route.prefix
            if route.method in methods and (
                path == prefix or path.startswith(prefix + "/") or not prefix
            ):
                request.subpath = path[len(prefix) :].lstrip("/")
                return route.handler(request)
        allowed = {m for m, p in self._exact if p == path}
        if allowed:
            listed = ", ".join(sorted(allowed | {"HEAD"} if "GET" in allowed else allowed))
            message = f"{method} is not allowed on {path}; allowed: {listed}"
            raise HttpError(405, message, headers={"Allow": listed})
        raise HttpError(404, f"no route for {method} {path}")

    def _health(self, request: Request) -> dict[str, object]:
        return {"appId": self.app_id, "instanceId": self.instance_id, "ok": True}

    def _lifecycle(self, request: Request) -> object:
        hook, _, activity_id = request.subpath.partition("/")
        if hook not in HOOKS or bool(activity_id) != (hook == "onActivityDestroy"):
            raise HttpError(404, f"no lifecycle hook {request.subpath!r}")
        body = request.json()
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise HttpError(400, "a lifecycle hook body must be a JSON object")
        if activity_id:
            body.setdefault("activityId", unquote(activity_id))
        handler = self._hooks.get(hook)
        try:
            answer = handler(body) if handler is not None else None
        except HttpError:
            raise
        except Exception as err:  # noqa: BLE001 - the hook's failure is the answer to the shell
            _print_exception(f"hook {hook}")
            return error_response(500, f"{hook} failed: {type(err).__name__}: {err}")
        if answer is None:
            answer = (
                {"path": "/", "title": self.name} if hook == "onActivityCreate" else {"ok": True}
            )
        if hook == "onActivityCreate" and isinstance(body.get("activityId"), str):
            self.activities[body["activityId"]] = body
        elif hook == "onActivityDestroy":
            self.activities.pop(body["activityId"], None)
        return dict(answer)

    def is_trusted(self, headers: Message) -> bool:
        """Exactly one ``X-Os-Shell-Secret`` equal to ``OS_SHELL_SECRET`` (never when it is unset)."""
        given = headers.get_all("X-Os-Shell-Secret") or []
        if not self._secret or len(given) != 1:
            return False
        return compare_digest(given[0].encode("utf-8", "surrogateescape"), self._secret)


class _Server(ThreadingHTTPServer):
    """One thread per connection (no cap of its own: the shell opens at most 64 connections to an
    instance at once, docs/api.md "What the shell calls on an app")."""

    daemon_threads = True
    block_on_close = False
    #: the listen backlog (`http.server`'s is 5): a burst of the shell's connections must all
    #: fit, or the kernel drops the rest and their requests wait for TCP's retries (1, 3, 7 s...)
    request_queue_size = 1024

    def handle_error(self, request: object, client_address: object) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            return  # a client that went away is not the app's error
        _print_exception(f"connection from {client_address}")


class _RequestHandler(BaseHTTPRequestHandler):
    """Parses HTTP/1.1 (keep-alive), checks the secret, hands the request to ``App.handle``."""

    app: App
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall
    server_version = "atrium-sdk"
    timeout = 300  # an idle keep-alive connection is closed after this many seconds

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: errors go to stderr through _print_exception

    def log_error(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.app.name}: {format % args}\n")

    def _serve(self) -> None:
        if not self.app.is_trusted(self.headers):
            self.close_connection = True  # the body is left unread
            self._send(error_response(403, "this app only answers the Atrium shell"))
            return
        target = self.path
        if not target.startswith("/"):
            self.close_connection = True
            self._send(error_response(400, f"unsupported request target {target!r}"))
            return
        path, _, query = target.partition("?")
        try:
            body = self._read_body()
        except HttpError as err:
            self.close_connection = True
            self._send(err.response())
            return
        request = Request(self.command, path, query, self.headers, body)
        self._send(self.app.handle(request))

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _serve

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        if not (raw.isascii() and raw.isdigit()):
            raise HttpError(400, f"bad Content-Length {raw!r}")
        length = int(raw)
        if length > MAX_BODY:
            raise HttpError(413, f"the body exceeds {MAX_BODY} bytes", "bad_request")
        body = self.rfile.read(length)
        if len(body) != length:
            raise HttpError(400, "the body ended early")
        return body

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                length = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HttpError(400, "malformed chunked body") from None
            size += length
            if size > MAX_BODY:
                raise HttpError(413, f"the body exceeds {MAX_BODY} bytes", "bad_request")
            if length == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(self.rfile.read(length))
            self.rfile.readline(1024)

    def _send(self, response: Response) -> None:
        status = response.status
        has_body = self.command != "HEAD" and status >= 200 and status not in (204, 304)
        chunked = has_body and response.length is None and self.request_version == "HTTP/1.1"
        if has_body and response.length is None and not chunked:
            self.close_connection = True  # HTTP/1.0: the body ends with the connection
        self.send_response(status)
        self.send_header("Content-Type", response.content_type)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        elif response.length is not None and status >= 200 and status not in (204, 304):
            self.send_header("Content-Length", str(response.length))
        if self.app.app_id:
            self.send_header("X-Os-App-Id", self.app.app_id)
        for name, value in response.headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if has_body:
            self._write_body(response.body, chunked)

    def _write_body(self, body: bytes | Iterable[bytes], chunked: bool) -> None:
        if isinstance(body, bytes):
            self.wfile.write(body)
            return
        try:
            for chunk in body:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
        except Exception:
            self.close_connection = True  # the status line is out: all that is left is to cut
            raise
        if chunked:
            self.wfile.write(b"0\r\n\r\n")


def _file_response(root: Path, subpath: str) -> Response:
    relative = unquote(subpath)
    if ".." in relative.split("/") or "\\" in relative or "\x00" in relative:
        raise HttpError(404, f"no file {subpath!r}")
    target = (root / relative).resolve()
    if not target.is_relative_to(root):
        raise HttpError(404, f"no file {subpath!r}")  # a link that leaves the directory
    if target.is_dir():
        target /= "index.html"
    try:
        data = target.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise HttpError(404, f"no file {subpath!r}") from None
    return Response(data, content_type=_content_type(target.name))


def _content_type(filename: str) -> str:
    import mimetypes  # already loaded by http.server

    guessed, _ = mimetypes.guess_type(filename)
    content_type = guessed or "application/octet-stream"
    if content_type.startswith("text/") or content_type in _TEXT_TYPES:
        content_type += "; charset=utf-8"
    return content_type


_TEXT_TYPES = {"application/javascript", "application/json", "image/svg+xml"}


def _kind_of(value: object) -> str:
    if value is None:
        return "empty"
    return {list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _dumps(data: object) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def _decode(body: bytes, content_type: str) -> object:
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            return json.loads(body) if body else None
        except ValueError:
            pass
    return body.decode("utf-8", "replace")


def _read_manifest() -> dict[str, object]:
    try:
        data = json.loads(Path("app.manifest.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _print_exception(where: str) -> None:
    import traceback  # ~3 ms: only on the error path

    sys.stderr.write(f"error in {where}:\n")
    traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()


def _is_main_thread() -> bool:
    import threading  # already loaded by socketserver

    return threading.current_thread() is threading.main_thread()


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop
