"""A real OCI registry for tests: Debian's ``docker-registry`` on 127.0.0.1 (not a conftest).

``start_registry(tmp, auth=...)`` runs ``/usr/bin/docker-registry serve <own cfg.yml>`` with its own
filesystem storage in ``tmp``, on a free loopback port, optionally behind authentication with a Docker
config directory holding the credentials: ``auth="basic"`` is htpasswd (bcrypt hashes),
``auth="token"`` is Bearer tokens from a small token service in a thread (RS256 JWTs signed with a
throw-away key by the ``openssl`` command, the way Docker Hub and GHCR authenticate). It returns once
``/v2/`` answers. ``Registry.stop()`` ends it. The packaged system service is never started (it listens on all
interfaces). Use it from a fixture::

    @pytest.fixture
    def registry(tmp_path: Path) -> Iterator[Registry]:
        with running_registry(tmp_path) as started:
            yield started
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final, Literal
from urllib.parse import parse_qs, urlsplit

import bcrypt
import httpx

from atrium.distribution.refs import OciRef

BINARY: Final = "/usr/bin/docker-registry"
DEADLINE: Final = 20.0
USERNAME: Final = "publisher"
PASSWORD: Final = "s3cret-pass"
SERVICE: Final = "atrium-test"
ISSUER: Final = "atrium-test-issuer"
Auth = Literal["basic", "token"] | None


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    """A Docker token service: Basic credentials in, an RS256 JWT granting the asked scope out."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.key, self.cert = folder / "key.pem", folder / "cert.pem"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=atrium-test-token",
                "-keyout",
                str(self.key),
                "-out",
                str(self.cert),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        der = subprocess.run(
            ["openssl", "x509", "-in", str(self.cert), "-outform", "DER"],
            check=True,
            capture_output=True,
            timeout=60,
        ).stdout
        self.x5c = base64.b64encode(der).decode()
        #: answer a request without credentials with a token granting nothing, as Docker Hub and
        #: GHCR do, instead of 401 (the registry then refuses the pull itself)
        self.anonymous = False
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                expected = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
                query = parse_qs(urlsplit(self.path).query)
                scope = query.get("scope", [""])[0]
                if self.headers.get("Authorization") != expected:
                    if not (service.anonymous and "Authorization" not in self.headers):
                        self.send_response(401)
                        self.end_headers()
                        return
                    scope = ""  # an anonymous token that grants nothing (Docker Hub, private repo)
                body = json.dumps({"token": service.token(scope)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/token"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def token(self, scope: str) -> str:
        access = []
        if scope.startswith("repository:"):
            _, name, actions = scope.split(":", 2)
            access.append({"type": "repository", "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        claims = {
            "iss": ISSUER,
            "sub": USERNAME,
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": str(now),
            "access": access,
        }
        signing_input = ".".join(
            _b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
        )
        signature = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key)],
            input=signing_input.encode(),
            check=True,
            capture_output=True,
            timeout=60,
        ).stdout
        return f"{signing_input}.{_b64url(signature)}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=DEADLINE)


@dataclass
class Registry:
    """A running registry: its address, storage root and, with auth, a Docker config directory."""

    host: str
    root: Path
    process: subprocess.Popen[bytes]
    log: Path
    docker_config: Path | None = None
    token_service: TokenService | None = None

    def ref(self, repository: str, tag: str = "latest") -> OciRef:
        return OciRef(self.host, repository, tag)

    def blob_data(self, digest: str) -> Path:
        """The file holding a blob in the registry's filesystem storage."""
        hex_digest = digest.removeprefix("sha256:")
        return self.root / "docker/registry/v2/blobs/sha256" / hex_digest[:2] / hex_digest / "data"

    def stop(self) -> None:
        if self.token_service is not None:
            self.token_service.stop()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=DEADLINE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_docker_config(folder: Path, host: str, username: str, password: str) -> Path:
    """A Docker config directory whose ``config.json`` holds ``auths.<host>`` (base64 ``auth``)."""
    folder.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return folder


def _config(tmp: Path, port: int, auth: Auth, tokens: TokenService | None) -> Path:
    lines = [
        "version: 0.1",
        "log:",
        "  level: error",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {tmp / 'storage'}",
        "  delete:",
        "    enabled: true",
        "http:",
        f"  addr: 127.0.0.1:{port}",
    ]
    if auth == "basic":
        # cost 4 (bcrypt's minimum): the registry checks the hash on every request
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        (tmp / "htpasswd").write_text(f"{USERNAME}:{hashed}\n")
        lines += ["auth:", "  htpasswd:", "    realm: atrium-test", f"    path: {tmp / 'htpasswd'}"]
    elif tokens is not None:
        lines += [
            "auth:",
            "  token:",
            f"    realm: {tokens.url}",
            f"    service: {SERVICE}",
            f"    issuer: {ISSUER}",
            f"    rootcertbundle: {tokens.cert}",
        ]
    path = tmp / "registry.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _wait_ready(registry: Registry) -> bool:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if registry.process.poll() is not None:
            return False
        try:
            status = httpx.get(f"http://{registry.host}/v2/", timeout=2.0).status_code
        except httpx.TransportError:
            time.sleep(0.02)
            continue
        if status in (200, 401):
            return True
    raise TimeoutError(f"docker-registry on {registry.host} did not answer /v2/ in time")


def start_registry(tmp: Path, *, auth: Auth = None) -> Registry:
    """Start a registry storing under ``tmp``; retried on another port if the port was taken."""
    tmp.mkdir(parents=True, exist_ok=True)
    tokens = TokenService(tmp / "token") if auth == "token" else None
    for _attempt in range(3):
        port = free_port()
        log = tmp / "registry.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [BINARY, "serve", str(_config(tmp, port, auth, tokens))],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        registry = Registry(f"127.0.0.1:{port}", tmp / "storage", process, log, None, tokens)
        if _wait_ready(registry):
            if auth:
                registry.docker_config = write_docker_config(
                    tmp / "docker", registry.host, USERNAME, PASSWORD
                )
            return registry
        registry.stop()
    raise RuntimeError(f"docker-registry did not start: {log.read_text()[-2000:]}")


@contextmanager
def running_registry(tmp: Path, *, auth: Auth = None) -> Iterator[Registry]:
    registry = start_registry(tmp, auth=auth)
    try:
        yield registry
    finally:
        registry.stop()
