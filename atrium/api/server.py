"""Run the API under uvicorn on a socket bound first, so port 0 works and the real URL is known."""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from atrium.api.app import AtriumApp, create_app
from atrium.settings import ConfigError, Settings, setting_name
from atrium.shell import Shell, open_shell

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _HeldWrites:
    """A transport that holds one write until the next write or the end of the loop iteration.

    uvicorn writes a response's head and its body in two `write` calls, each a `send` system call
    on loopback; holding the head lets both leave in one `writev`. Anything but `write` and
    `close` passes straight to the real transport.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            if data:
                self._held = data
                self._loop.call_soon(self.flush)
            return
        self._held = None
        self._transport.writelines((held, data))

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


class _Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing each response's head and body together."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HeldWrites(transport, self.loop))  # type: ignore[arg-type]


class _Server(uvicorn.Server):
    """Ends every event stream as soon as shutdown begins, so open streams never hold it up."""

    def __init__(self, config: uvicorn.Config, app: AtriumApp) -> None:
        super().__init__(config)
        self._app = app

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM start a graceful shutdown that ends with exit status 0 (uvicorn would
        re-raise the signal afterwards, killing the process before `serve` can clean up)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        shell: Shell | None = getattr(self._app.state, "shell", None)
        if shell is not None:
            shell.bus.close()
        await super().shutdown(sockets)


def cannot_listen(host: str, port: int, err: OSError) -> str:
    """The one-line report of a socket that could not be bound."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    port_name = setting_name("port", ("port",))
    if err.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {address}: the address is already in use; choose another port "
            f"with {port_name} (0 for any free port)"
        )
    return (
        f"cannot listen on {address}: {err.strerror or err}; check "
        f"{setting_name('host', ('host',))} and {port_name}"
    )


class ShellServer:
    """One shell on one listening socket."""

    def __init__(self, settings: Settings, user_token: str) -> None:
        self.socket = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((settings.host, settings.port))
        except OSError as err:  # every bind failure is about the host or port the user chose
            self.socket.close()
            raise ConfigError(cannot_listen(settings.host, settings.port, err)) from err
        self.socket.listen(2048)
        self.socket.setblocking(False)
        port = self.socket.getsockname()[1]
        self.settings = settings.model_copy(update={"port": port})
        self._user_token = user_token
        self.app = create_app(self.settings)
        config = uvicorn.Config(
            self.app,
            loop="none",
            http=_Protocol,
            ws="none",
            # the shell is opened by `serve` below, not in an ASGI lifespan: a ConfigError found
            # while opening it (a damaged KV file or scope repository) then reaches the caller as
            # itself, not as a logged traceback and uvicorn's exit status 3
            lifespan="off",
            timeout_graceful_shutdown=3,
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,  # forwarded headers are the caller's words: never trusted
        )
        self._server = _Server(config, self.app)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://localhost:{self.settings.port}"

    @property
    def started(self) -> bool:
        return self._server.started

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Open the shell, call ``ready`` (nothing is served before), serve until asked to stop,
        then close the shell. SIGINT/SIGTERM while the shell opens stop it as soon as it is open."""
        self._loop = asyncio.get_running_loop()
        with self._server.capture_signals():
            async with open_shell(self.settings, self._user_token) as shell:
                # open_shell closes the bus (ending every stream) on the way out; the server's
                # own shutdown closes it first, so open streams never hold up the shutdown
                self.app.state.shell = shell
                if ready is not None:
                    ready()
                await self._server.serve(sockets=[self.socket])

    def request_exit(self) -> None:
        """Ask the server to stop; safe from any thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(setattr, self._server, "should_exit", True)
        else:
            self._server.should_exit = True
