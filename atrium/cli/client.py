"""The CLI's httpx client: finds the shell and its token, turns error bodies into one line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:  # httpx is loaded by the first client made: `atrium version` needs none
    import httpx

DEFAULT_URL = "http://127.0.0.1:7070"


def _home() -> Path:
    raw = os.environ.get("ATRIUM_HOME")
    if raw:
        return Path(raw).expanduser()
    # the settings model (pydantic-settings) only when its default is needed: importing it
    # costs more than a client command's whole round trip
    from atrium.settings import Settings

    home: Path = Settings.model_fields["home"].get_default(call_default_factory=True)
    return home


def shell_url() -> str:
    """``ATRIUM_URL``, else the URL the running shell wrote to ``$ATRIUM_HOME/run/url``."""
    if url := os.environ.get("ATRIUM_URL"):
        return url.rstrip("/")
    try:
        return (_home() / "run" / "url").read_text().strip().rstrip("/")
    except OSError:
        return DEFAULT_URL


#: the token given with `atrium --token …`, which wins over ``ATRIUM_TOKEN`` and ``run/token``
_given_token: str | None = None


def use_token(token: str | None) -> None:
    """The root command's ``--token``: every command of this run calls the shell with it."""
    global _given_token
    _given_token = token or None


def user_token() -> str | None:
    """``--token``, else ``ATRIUM_TOKEN`` (a personal token, or the bootstrap admin's), else the
    bootstrap token the running shell wrote to ``$ATRIUM_HOME/run/token``."""
    if _given_token:
        return _given_token
    if token := os.environ.get("ATRIUM_TOKEN"):
        return token
    try:
        return (_home() / "run" / "token").read_text().strip()
    except OSError:
        return None


def fail(message: str, exit_code: int = 1) -> NoReturn:
    """Report ``message`` as one line on stderr and exit non-zero (2: the shell is unreachable)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(exit_code)


def describe_error(response: httpx.Response) -> str:
    try:
        err = response.json()["error"]
        line = f"{err['code']}: {err['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"
    for problem in err.get("problems") or []:
        if isinstance(problem, dict):
            line += f"\n  - {problem.get('field')}: {problem.get('message')}"
    return line


class ShellClient:
    """Calls the running shell as the user."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self.url = url or shell_url()
        headers = {}
        if tok := token or user_token():
            headers["Authorization"] = f"Bearer {tok}"
        import httpx

        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=30.0)
        self._lost: type[httpx.TransportError] = httpx.TransportError
        self.unhurried = httpx.Timeout(30.0, read=None)  # streams: no read deadline

    def __enter__(self) -> ShellClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer as it is, error statuses included (the caller reads them)."""
        try:
            return self._http.request(method, path, **kwargs)
        except self._lost as err:
            fail(f"cannot reach the shell at {self.url} ({err}); is `atrium serve` running?", 2)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except self._lost as err:
            fail(f"cannot reach the shell at {self.url} ({err}); is `atrium serve` running?", 2)
        if response.status_code >= 400:
            fail(describe_error(response))
        return response.json()

    def request_text(self, method: str, path: str, **kwargs: Any) -> str:
        try:
            response = self._http.request(method, path, **kwargs)
        except self._lost as err:
            fail(f"cannot reach the shell at {self.url} ({err}); is `atrium serve` running?", 2)
        if response.status_code >= 400:
            fail(describe_error(response))
        return response.text

    def download(self, path: str, target: Path, **kwargs: Any) -> int:
        """GET ``path`` into ``target`` (written beside it, then renamed); returns its size."""
        partial = target.with_name(f".{target.name}.partial")
        try:
            with self._http.stream("GET", path, timeout=self.unhurried, **kwargs) as response:
                if response.status_code >= 400:
                    response.read()
                    fail(describe_error(response))
                with partial.open("wb") as file:
                    for chunk in response.iter_bytes():
                        file.write(chunk)
        except self._lost as err:
            partial.unlink(missing_ok=True)
            fail(f"lost the shell at {self.url} ({err})", 2)
        partial.replace(target)
        return target.stat().st_size

    def stream_progress(self, method: str, path: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Yield the JSON data of each server-sent event of one request (install, update): a
        request error fails at once; an `error` event is yielded like the others."""
        try:
            with self._http.stream(
                method,
                path,
                headers={"Accept": "text/event-stream"},
                timeout=self.unhurried,
                **kwargs,
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    fail(describe_error(response))
                data = ""
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        data += line[5:].strip()
                    elif not line and data:
                        yield json.loads(data)
                        data = ""
        except self._lost as err:
            fail(f"lost the shell at {self.url} ({err})", 2)

    def stream_events(self, path: str, params: dict[str, str]) -> Iterator[tuple[str, str, Any]]:
        """Yield ``(id, topic, payload)`` for each server-sent event."""
        try:
            with self._http.stream("GET", path, params=params, timeout=self.unhurried) as response:
                if response.status_code >= 400:
                    response.read()
                    fail(describe_error(response))
                event_id, topic, data = "", "", ""
                for line in response.iter_lines():
                    if line.startswith("id:"):
                        event_id = line[3:].strip()
                    elif line.startswith("event:"):
                        topic = line[6:].strip()
                    elif line.startswith("data:"):
                        data += line[5:].strip()
                    elif not line and data:
                        yield event_id, topic, json.loads(data)
                        event_id, topic, data = "", "", ""
        except self._lost as err:
            fail(f"lost the shell at {self.url} ({err})", 2)
