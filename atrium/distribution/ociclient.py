"""Registry client: the few OCI distribution (registry v2) calls that move app artifacts.

A small async client over aiohttp (docs/decisions.md "Distribution: OCI and publish"): entering it
probes ``/v2/`` and answers a Basic or a Bearer challenge with the Docker config's credentials; blobs
stream in chunks with their size and sha256 checked; manifests are hashed as served. Loopback
registries (127.0.0.0/8, ::1, localhost) are reached over plain HTTP, every other over HTTPS. Every
failure is RegistryError(reason), a sentence for the user; atrium.distribution.oci turns it into FetchFailed
or UpstreamFailed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import aiohttp
from yarl import URL

from atrium.distribution import artifact
from atrium.distribution.credentials import Credentials, load_credentials
from atrium.distribution.reach import Reach

CHUNK: Final = 64 << 10
MAX_MANIFEST: Final = 4 << 20
TIMEOUT: Final = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
CHALLENGE_PARAM_RE: Final = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(Exception):
    """A registry call failed; ``reason`` is a sentence for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def is_loopback(registry: str) -> bool:
    """``registry`` (``host[:port]``) is this machine: 127.0.0.0/8, ::1 or localhost."""
    bracketed = registry.startswith("[")
    host = registry[1 : registry.find("]")] if bracketed else registry.split(":", 1)[0]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def base_url(registry: str) -> URL:
    return URL(f"{'http' if is_loopback(registry) else 'https'}://{registry}")


def _basic(credentials: Credentials) -> str:
    pair = f"{credentials.username}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(pair).decode()


def size_text(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


@dataclass(frozen=True, slots=True)
class PulledManifest:
    """A manifest as the registry served it, with its verified digest."""

    body: bytes
    media_type: str | None
    digest: str

    def json(self) -> object:
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError) as err:  # RecursionError: nested past the parser
            raise RegistryError(f"the manifest {self.digest} is not JSON: {err}") from err


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The body, or at most ``cap + 1`` bytes of it (so a caller can tell it is too large)."""
    body = bytearray()
    async for chunk in response.content.iter_chunked(CHUNK):
        body += chunk
        if len(body) > cap:
            break
    return bytes(body[: cap + 1])


def _error_detail(body: bytes) -> str:
    try:
        errors = json.loads(body)["errors"]
        return "; ".join(f"{e['code']}: {e['message']}" for e in errors)
    except (ValueError, KeyError, TypeError, RecursionError):
        return body[:200].decode(errors="replace").strip()


class RegistryClient:
    """One repository of one registry over one aiohttp session (``async with``).

    Entering probes ``/v2/`` and logs in when the registry asks for it, so a registry that is down,
    not a registry, or refuses the credentials fails there, before any content moves.
    """

    def __init__(
        self,
        registry: str,
        repository: str,
        *,
        docker_config: Path | None,
        push: bool = False,
        reach: Reach | None = None,
    ) -> None:
        """``reach``: whose fetch this is (a member's connects only where it may, without the
        shell's credentials); None is the shell's own."""
        self.registry = registry
        self.repository = repository
        self.base = base_url(registry)
        self._docker_config = docker_config
        self._actions = "pull,push" if push else "pull"
        self._authorization: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._reach = reach

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=TIMEOUT,
            connector=None if self._reach is None else self._reach.connector(),
        )
        try:
            await self._probe()
        except BaseException:
            await self._session.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the registry client is not open")
        return self._session

    @asynccontextmanager
    async def _call(
        self, method: str, url: URL, *, auth: str | None = None, **kwargs: Any
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        headers: dict[str, str] = dict(kwargs.pop("headers", {}))
        if auth or self._authorization:
            headers["Authorization"] = auth or self._authorization or ""
        try:
            async with self.session.request(method, url, headers=headers, **kwargs) as response:
                yield response
        except aiohttp.ClientConnectorError as err:
            raise RegistryError(
                f"cannot reach the registry at {self.base} ({err.os_error.strerror or err}); "
                "is it running?"
            ) from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise RegistryError(
                f"the registry at {self.base} failed: {err or type(err).__name__}"
            ) from err

    def _credentials(self) -> Credentials | None:
        if self._reach is not None and self._reach.restricted():
            return None  # a member's fetch never carries the shell's own registry logins
        return load_credentials(self.registry, self._docker_config)

    async def _probe(self) -> None:
        async with self._call("GET", self.base / "v2/") as response:
            if response.status == 200:
                return
            challenge = response.headers.get("WWW-Authenticate", "")
            if response.status != 401 or not challenge:
                raise RegistryError(
                    f"{self.base} does not answer as an OCI registry (GET /v2/ → {response.status})"
                )
        scheme, _, params = challenge.partition(" ")
        credentials = self._credentials()
        if scheme.lower() == "basic":
            if credentials is None:
                raise self._missing_credentials()
            basic = _basic(credentials)
            async with self._call("GET", self.base / "v2/", auth=basic) as response:
                if response.status == 401:
                    raise self._wrong_credentials(credentials)
            self._authorization = basic
        elif scheme.lower() == "bearer":
            fields = dict(CHALLENGE_PARAM_RE.findall(params))
            self._authorization = "Bearer " + await self._token(fields, credentials)
        else:
            raise RegistryError(f"{self.base} asks for unsupported authentication {scheme!r}")

    async def _token(self, fields: Mapping[str, str], credentials: Credentials | None) -> str:
        realm = fields.get("realm")
        if not realm:
            raise RegistryError(f"{self.base} sent a Bearer challenge without a realm")
        query = {"scope": f"repository:{self.repository}:{self._actions}"}
        if service := fields.get("service"):
            query["service"] = service
        basic = None
        if credentials is not None:
            basic = _basic(credentials)
        async with self._call("GET", URL(realm).with_query(query), auth=basic) as response:
            body = await response.read()
            if response.status == 401:
                raise (
                    self._missing_credentials()
                    if credentials is None
                    else self._wrong_credentials(credentials)
                )
            if response.status != 200:
                raise RegistryError(f"the token service {realm} answered {response.status}")
        try:
            answer = json.loads(body)
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError, RecursionError):
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"the token service {realm} answered without a token")
        return token

    def _missing_credentials(self) -> RegistryError:
        return RegistryError(
            f"the registry {self.registry} needs credentials (401) and the Docker config has none "
            f"for it; add them under 'auths' in $DOCKER_CONFIG/config.json or ~/.docker/config.json "
            f"(e.g. `docker login {self.registry}`)"
        )

    def _wrong_credentials(self, credentials: Credentials) -> RegistryError:
        return RegistryError(
            f"the registry {self.registry} refused the credentials of user "
            f"{credentials.username!r} from {credentials.source} (401): wrong user name or password"
        )

    def _refused(self, status: int, body: bytes, what: str) -> RegistryError:
        detail = _error_detail(body)
        if status == 401:
            if self._credentials() is None:
                # e.g. an anonymous token that grants nothing: a private repository
                return RegistryError(f"{what}: {self._missing_credentials()} {detail}".rstrip())
            return RegistryError(f"{what}: the registry asks for credentials again (401) {detail}")
        if status == 403:
            return RegistryError(f"{what}: access denied (403) {detail}")
        return RegistryError(f"{what}: the registry answered {status} {detail}".rstrip())

    def _url(self, kind: str, reference: str) -> URL:
        return self.base / "v2" / self.repository / kind / reference

    async def manifest(self, reference: str) -> PulledManifest:
        """GET a manifest by tag or digest; its digest is computed from the bytes as served."""
        found = await self.find_manifest(reference)
        if found is None:
            raise RegistryError(
                f"manifest unknown: {self.repository} has no {reference!r} in {self.registry}"
            )
        return found

    async def find_manifest(self, reference: str) -> PulledManifest | None:
        """``manifest``, or None when the registry has no such tag or digest (404)."""
        headers = {"Accept": ", ".join(artifact.MANIFEST_TYPES)}
        async with self._call("GET", self._url("manifests", reference), headers=headers) as resp:
            if resp.status == 404:
                return None
            body = await _read_capped(resp, MAX_MANIFEST)
            if resp.status != 200:
                raise self._refused(resp.status, body, f"reading manifest {reference!r}")
            if len(body) > MAX_MANIFEST:
                raise RegistryError(f"the manifest {reference!r} is larger than 4 MiB")
            digest = artifact.sha256_digest(body)
            claimed = resp.headers.get("Docker-Content-Digest")
            media_type = resp.headers.get("Content-Type", "").split(";")[0].strip() or None
        for expected in (claimed, reference if reference.startswith("sha256:") else None):
            if expected and expected != digest:
                raise RegistryError(
                    f"the manifest's bytes hash to {digest}, not to {expected} (digest mismatch)"
                )
        return PulledManifest(body, media_type, digest)

    async def tags(self, pages: int = 20) -> list[str]:
        """The repository's tags (``GET /v2/<repo>/tags/list``), following ``Link`` pages up to
        ``pages`` of them."""
        found: list[str] = []
        url: URL | None = self.base / "v2" / self.repository / "tags" / "list"
        for _ in range(pages):
            if url is None:
                break
            async with self._call("GET", url) as resp:
                body = await _read_capped(resp, MAX_MANIFEST)
                if resp.status == 404:
                    return found
                if resp.status != 200:
                    raise self._refused(resp.status, body, "listing the tags")
                link = resp.headers.get("Link", "")
            try:
                listed = json.loads(body).get("tags") or []
            except (ValueError, AttributeError, RecursionError) as err:
                raise RegistryError("the registry's tag list is not JSON") from err
            found.extend(t for t in listed if isinstance(t, str))
            nxt = link.partition("<")[2].partition(">")[0] if 'rel="next"' in link else ""
            # only a page on the same registry: a Link elsewhere is not followed
            url = self.base.join(URL(nxt)) if nxt.startswith("/v2/") else None
        return found

    async def blob(self, digest: str, size: int) -> AsyncGenerator[bytes, None]:
        """Stream a blob in chunks; after the last one its size and sha256 are verified."""
        hasher, received = hashlib.sha256(), 0
        async with self._call("GET", self._url("blobs", digest)) as resp:
            if resp.status == 404:
                raise RegistryError(f"blob unknown: {digest} is not in {self.repository}")
            if resp.status != 200:
                raise self._refused(resp.status, await _read_capped(resp, 4096), f"blob {digest}")
            async for chunk in resp.content.iter_chunked(CHUNK):
                received += len(chunk)
                if received > size:
                    raise RegistryError(f"blob {digest} is larger than the {size} bytes declared")
                hasher.update(chunk)
                yield chunk
        actual = "sha256:" + hasher.hexdigest()
        if received != size or actual != digest:
            raise RegistryError(
                f"blob {digest} failed verification: got {received} bytes hashing to {actual} "
                "(digest mismatch; the registry's copy is corrupt or tampered with)"
            )

    async def has_blob(self, digest: str) -> bool:
        async with self._call("HEAD", self._url("blobs", digest)) as resp:
            if resp.status in (200, 404):
                return resp.status == 200
            raise self._refused(resp.status, b"", f"checking blob {digest}")

    async def push_blob(
        self,
        source: bytes | Path,
        digest: str,
        progress: Callable[[int, int], object] | None = None,
    ) -> None:
        """Upload one blob (POST an upload, then one streamed PUT with its digest)."""
        if await self.has_blob(digest):
            return
        async with self._call("POST", self.base / "v2" / self.repository / "blobs/uploads/") as r:
            location = r.headers.get("Location")
            if r.status != 202 or not location:
                raise self._refused(r.status, await r.read(), "starting a blob upload")
        size = len(source) if isinstance(source, bytes) else await file_size(source)
        url = self.base.join(URL(location)).update_query(digest=digest)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        body = source if isinstance(source, bytes) else _file_chunks(source, size, progress)
        async with self._call("PUT", url, headers=headers, data=body) as resp:
            if resp.status != 201:
                raise self._refused(resp.status, await resp.read(), f"uploading blob {digest}")

    async def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        headers = {"Content-Type": media_type}
        url = self._url("manifests", reference)
        async with self._call("PUT", url, headers=headers, data=body) as resp:
            if resp.status != 201:
                raise self._refused(resp.status, await resp.read(), f"writing manifest {reference}")
            claimed = resp.headers.get("Docker-Content-Digest")
        digest = artifact.sha256_digest(body)
        if claimed and claimed != digest:
            raise RegistryError(f"the registry stored the manifest as {claimed}, not {digest}")
        return digest


async def _file_chunks(
    path: Path, size: int, progress: Callable[[int, int], object] | None
) -> AsyncIterator[bytes]:
    sent = 0
    with await asyncio.to_thread(path.open, "rb") as f:
        while chunk := f.read(CHUNK):
            sent += len(chunk)
            if progress is not None:
                progress(sent, size)
            yield chunk


async def file_size(path: Path) -> int:
    return (await asyncio.to_thread(path.stat)).st_size
