"""Attacks on this session's new surfaces through the real shell, second round: a member's fetch
rule (odd spellings of loopback, names that do not resolve, a token realm elsewhere), the trust
API, the page an app origin shows a browser, the dev problems alert, the audit log's bounds and
the service unit. Each test is an attack; those that found nothing stay as guards."""

from __future__ import annotations

import http.server
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa, x25519
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from atrium.authoring.scaffold import create
from atrium.cli.client import ShellClient
from atrium.cli.dev import DevSession
from tests.conftest import REPO_DIR
from tests.integration.conftest import (
    ECHO,
    RunningShell,
    SseReader,
    StartShell,
    add_test_apps,
    wait_for,
)
from tests.integration.test_users_attacks import listener

pytestmark = pytest.mark.integration


@pytest.fixture
def bob(echo_shell: RunningShell) -> Iterator[httpx.Client]:
    with echo_shell.client(echo_shell.add_user("bob"), timeout=30) as client:
        yield client


# ---- 1. a member's fetch rule -----------------------------------------------------------------


def _clean_refusal(answer: httpx.Response) -> dict[str, object]:
    """A refusal in the error shape: 4xx, or 502 fetch_failed where the fetcher itself refused
    the spelling before connecting (yarl will not take a non-canonical IPv4 host)."""
    error: dict[str, object] = answer.json()["error"]
    assert 400 <= answer.status_code < 500 or error["code"] == "fetch_failed", answer.text
    return error


@pytest.mark.parametrize(
    "spelling",
    [
        "git://2130706433:{port}/x",
        "git://0x7f000001:{port}/x",
        "git://0177.0.0.1:{port}/x",
        "git://127.1:{port}/x",
        "git://[::ffff:127.0.0.1]:{port}/x",
        "git://localhost.:{port}/x",
        "git://LOCALHOST:{port}/x",
        "git://127.0.0.1%2e:{port}/x",
        "git+https://user:pass@127.0.0.1:{port}/x",
        "git+https://8.8.8.8:{port}@127.0.0.1:{port}/x",
        "git+https://%31%32%37.0.0.1:{port}/x",
        "git+https://127.0.0.1.:{port}/x",
        "git+https://0x7f.1:{port}/x",
        "oci://2130706433:{port}/app:1",
        "oci://0177.0.0.1:{port}/app:1",
        "oci://127.1:{port}/app:1",
        "oci://localhost.:{port}/app:1",
        "oci://[::ffff:127.0.0.1]:{port}/app:1",
        # 0.0.0.0 reaches the machine's own listeners on Linux
        "git://0.0.0.0:{port}/x",
        "git://0:{port}/x",
        "oci://0.0.0.0:{port}/app:1",
        "git+https://[::]:{port}/x",
    ],
)
def test_odd_spellings_of_loopback_are_refused_without_a_connection(
    bob: httpx.Client, spelling: str
) -> None:
    with listener() as (port, seen):
        ref = spelling.format(port=port)
        for route in ("/api/dist/install", "/api/dist/install/preview"):
            answer = bob.post(route, json={"ref": ref, "scope": "user"})
            error = _clean_refusal(answer)
            assert error["code"] in ("fetch_host_refused", "bad_ref", "fetch_failed"), (ref, error)
    assert seen == [], ref


@pytest.mark.parametrize(
    "spelling", ["git://[::1]:{port}/x", "oci://[::1]:{port}/app:1", "git+https://[::1]:{port}/x"]
)
def test_ipv6_loopback_is_refused_without_a_connection(bob: httpx.Client, spelling: str) -> None:
    with listener("::1") as (port, seen):
        ref = spelling.format(port=port)
        answer = bob.post("/api/dist/install/preview", json={"ref": ref, "scope": "user"})
        assert _clean_refusal(answer)["code"] == "fetch_host_refused", answer.text
    assert seen == []


@pytest.mark.parametrize(
    "ref",
    [
        "oci://127.0.0.1.nip.io/app:1",
        "git://127.0.0.1.nip.io/x",
        "git+https://127.0.0.1.nip.io/x",
        "oci://no-such-host.invalid/app:1",
    ],
)
def test_a_name_that_does_not_resolve_fails_cleanly(bob: httpx.Client, ref: str) -> None:
    """Git must never be handed a name the shell could not check: it would resolve it again
    itself, and a DNS server that fails the shell's lookup and answers git's with 127.0.0.1
    would get past the rule. The shell refuses such a name itself (aiohttp, for OCI, connects
    only through the checked lookup, so its own failure is the answer)."""
    for route in ("/api/dist/install", "/api/dist/install/preview"):
        answer = bob.post(route, json={"ref": ref, "scope": "user"})
        error = _clean_refusal(answer)
        if ref.startswith("git"):
            assert answer.status_code == 403, answer.text
            assert error["code"] == "fetch_host_refused", error
            assert "resolve" in str(error["message"]), error


class _Challenge(http.server.BaseHTTPRequestHandler):
    """A registry on an allowed host whose token service (the realm) is elsewhere."""

    realm = ""

    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", f'Bearer realm="{self.realm}",service="x"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "realm", ["http://127.0.0.2:{port}/token", "http://2130706434:{port}/token"]
)
def test_a_token_realm_elsewhere_is_refused(start_shell: StartShell, realm: str) -> None:
    with listener("127.0.0.2") as (port, seen):
        _Challenge.realm = realm.format(port=port)
        with serving(_Challenge) as registry:
            shell = start_shell(member_fetch_hosts="localhost")
            with shell.client(shell.add_user("bob"), timeout=30) as bob:
                ref = f"oci://localhost:{registry}/a:1"
                answer = bob.post("/api/dist/install/preview", json={"ref": ref})
                error = _clean_refusal(answer)
                assert error["code"] in ("fetch_host_refused", "fetch_failed"), error
        assert seen == []


class _GitRedirect(http.server.BaseHTTPRequestHandler):
    target = ""
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(302)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_https_git_source_cannot_redirect_a_members_fetch(
    start_shell: StartShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("GIT_SSL_CAINFO", str(cert))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with listener("127.0.0.2") as (port, seen):
        _GitRedirect.target = f"https://127.0.0.2:{port}"
        _GitRedirect.hits = []
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GitRedirect)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            shell = start_shell(member_fetch_hosts="localhost")
            with shell.client(shell.add_user("bob"), timeout=30) as bob:
                ref = f"git+https://localhost:{server.server_address[1]}/app.git#v1"
                answer = bob.post("/api/dist/install/preview", json={"ref": ref})
                error = _clean_refusal(answer)
                assert error["code"] in ("fetch_host_refused", "fetch_failed"), error
            assert _GitRedirect.hits, "git never reached the allowed host (the test proves nothing)"
        finally:
            server.shutdown()
            server.server_close()
    assert seen == []


# ---- 2. the trust API ---------------------------------------------------------------------------


def _pem(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()


def _ssh(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


def test_a_member_changes_only_their_own_scopes_trust(
    echo_shell: RunningShell, bob: httpx.Client, home: Path
) -> None:
    good = _pem(ec.generate_private_key(ec.SECP256R1()))
    body = {"policy": "off", "keys": [{"name": "mallory", "key": good}]}
    answer = bob.put("/api/scopes/global/trust", json=body)
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "permission_denied"
    admin = echo_shell.settings.user
    for scope in (
        f"users/{admin}", f"users%2F{admin}", "user%2F..%2Fglobal", "USER", "Global",
        "user ", admin, "..", "%2e%2e", "system",
    ):  # fmt: skip
        answer = bob.put(f"/api/scopes/{scope}/trust", json=body)
        assert answer.status_code in (400, 403, 404, 405), (scope, answer.text)
    assert not (home / "scopes/global/trust.json").exists()
    assert not (home / f"scopes/users/{admin}/trust.json").exists()
    with echo_shell.client() as alice:
        assert alice.get("/api/scopes/user/trust").json()["keys"] == []
        assert alice.get("/api/scopes/global/trust").json()["keys"] == []
    # an app of bob's acts as bob for data, never for his trust store
    app_token = echo_shell.shell.app_tokens.issue("test.sdk.echo", "test.sdk.echo-bob", "bob")
    with echo_shell.client(app_token) as app:
        answer = app.put("/api/scopes/user/trust", json=body)
        assert answer.status_code in (401, 403), answer.text
    assert not (home / "scopes/users/bob/trust.json").exists()


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "a\nb"},
        {"name": "ok\n"},
        {"name": ".."},
        {"name": "../x"},
        {"name": "-n"},
        {"name": "a b"},
        {"name": "é"},
        {"name": "x" * 65},
        {"name": ""},
        {"key": "x" * 1_000_000},
        {"key": "ssh-ed25519 AAAA\nssh-ed25519 BBBB"},
        {"key": "P384"},
        {"key": "ssh-P384"},
        {"key": "ssh-rsa"},
        {"key": "ed448"},
        {"key": "x25519"},
        {"policy": "always"},
        {"policy": 2},
        {"policy": None},
        {"policy": "REQUIRE"},
    ],
)
def test_a_bad_trust_store_is_refused_whole(
    bob: httpx.Client, home: Path, bad: dict[str, object]
) -> None:
    keys = {
        "P384": _pem(ec.generate_private_key(ec.SECP384R1())),
        "ssh-P384": _ssh(ec.generate_private_key(ec.SECP384R1())),
        "ssh-rsa": rsa.generate_private_key(65537, 2048)
        .public_key()
        .public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
        .decode(),
        "ed448": ed448.Ed448PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        .decode(),
        "x25519": x25519.X25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        .decode(),
    }
    key: dict[str, object] = {"name": "carol", "key": _ssh(ed25519.Ed25519PrivateKey.generate())}
    body: dict[str, object] = {"policy": bad.get("policy", "require"), "keys": [key]}
    if "name" in bad:
        key["name"] = bad["name"]
    if "key" in bad:
        key["key"] = keys.get(str(bad["key"]), bad["key"])
    answer = bob.put("/api/scopes/user/trust", json=body)
    assert answer.status_code in (400, 413), answer.text
    assert answer.json()["error"]["code"] in ("bad_request", "payload_too_large"), answer.text
    assert not (home / "scopes/users/bob/trust.json").exists()


@pytest.mark.parametrize(
    "garbage",
    [b'{"policy": "require", "keys": [', b"null", b'{"policy": 5}', b"\xff\xfe", b"[" * 100_000],
)
def test_a_hand_edited_trust_store_answers_503_not_500(
    echo_shell: RunningShell, home: Path, garbage: bytes
) -> None:
    with echo_shell.client() as alice:
        assert alice.put("/api/scopes/global/trust", json={"policy": "off"}).status_code == 200
        (home / "scopes/global/trust.json").write_bytes(garbage)
        answer = alice.get("/api/scopes/global/trust")
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "storage_damaged"
        # an install reading it is refused the same way: test_signed_apps'
        # test_a_damaged_trust_store_refuses_installs_rather_than_turning_off


# ---- 3. the page an app origin shows a browser -------------------------------------------------

HTML = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
XSS = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def test_the_app_origin_page_reflects_nothing_and_links_only_to_the_shells_own_name(
    start_shell: StartShell, system_apps: Path
) -> None:
    add_test_apps(system_apps, ECHO)
    shell = start_shell(app_domain="atrium.test")
    port = shell.settings.port
    host_page = f"http://atrium.test:{port}/"
    with shell.client(timeout=30) as api:
        instance = api.post("/api/instances", json={"appId": ECHO, "new": True}).json()
        view = api.post(f"/api/instances/{instance['instanceId']}/views", json={"path": "/"})
        origin_host = urlsplit(view.json()["url"]).netloc
    hosts = [origin_host, f"abcdefabcdef.atrium.test:{port}"]
    paths = [
        f"/{quote(XSS)}",
        f"/?q={quote(XSS)}",
        "/%22%3E%3Cscript%3Ealert(1)%3C/script%3E",
        "//evil.example/",
        "/\\evil.example",
    ]
    for host in hosts:
        for path in paths:
            headers = {
                "Host": host,
                "Accept": HTML,
                "X-Forwarded-Host": "evil.example",
                "X-Forwarded-Proto": "https",
                "Forwarded": "host=evil.example",
                "Referer": f"http://evil.example/{XSS}",
            }
            page = httpx.get(shell.url + path, headers=headers, timeout=30)
            assert page.status_code in (401, 404), (host, path, page.text)
            assert page.headers["content-type"].startswith("text/html"), page.text
            csp = page.headers["content-security-policy"]
            assert "default-src 'none'" in csp, csp
            assert "script" not in page.text.lower(), (host, path, page.text)
            assert "onerror" not in page.text.lower(), (host, path, page.text)
            assert "evil" not in page.text, (host, path, page.text)
            assert re.findall(r'href="([^"]*)"', page.text) == [host_page], page.text
    # a Host of the attacker's is refused before any page (421, the error object)
    for host in (f"evil.example:{port}", f"{XSS}.atrium.test:{port}", f"atrium.test:{port}@evil"):
        answer = httpx.get(shell.url + "/", headers={"Host": host, "Accept": HTML}, timeout=30)
        assert answer.status_code in (400, 421), (host, answer.text)
        assert not answer.headers.get("content-type", "").startswith("text/html"), answer.text


def test_a_view_path_a_browser_reads_as_another_site_is_never_a_redirect(
    start_shell: StartShell, system_apps: Path
) -> None:
    """Browsers read ``/\\host`` as ``//host``, and drop tabs and newlines from a URL: a view's
    path (given when the view is made, or in ``/_os/enter?path=``) of that kind would send the
    user's frame off to another site through the app origin's redirect."""
    add_test_apps(system_apps, ECHO)
    shell = start_shell()
    evil = ["/\\evil.example/", "/\t/evil.example/", "/\n/evil.example/", "/\x7f/x"]
    with shell.client(timeout=30) as api:
        instance = api.post("/api/instances", json={"appId": ECHO, "new": True}).json()
        views = f"/api/instances/{instance['instanceId']}/views"
        for path in evil:
            refused = api.post(views, json={"path": path})
            assert refused.status_code == 400, (path, refused.text)
            assert "path" in refused.json()["error"]["message"], refused.text
        for path in evil:
            view = api.post(views, json={"path": "/"}).json()
            url = urlsplit(view["url"])
            ticket = parse_qs(url.query)["ticket"][0]
            entered = httpx.get(
                shell.url + url.path,
                params={"ticket": ticket, "path": path},
                headers={"Host": url.netloc},
                timeout=30,
            )
            assert entered.status_code == 303, entered.text
            assert entered.headers["location"] == "/", (path, entered.headers["location"])


# ---- 4. the dev problems alert ------------------------------------------------------------------

DEV_APP = "com.example.devloop"


def test_a_dev_problem_is_text_to_the_authors_page_and_4000_characters_at_most(
    shell: RunningShell, tmp_path: Path
) -> None:
    """The message reaches the author's page as it was sent (JSON text in the event), and the
    host page shows it with textContent (the source guard below): markup in it stays text."""
    folder = create(tmp_path, DEV_APP, "stdlib")
    token = shell.token  # a dev copy is made from a folder on the shell's machine: an admin's
    with shell.client(token) as author, ShellClient(shell.url, token) as client:
        heard = SseReader(author, params={"topics": "dev:failed"})
        session = DevSession(client, folder)
        assert session.sync()
        route = f"/api/dist/dev/{DEV_APP}/problems"
        message = XSS + "\n" + "x" * (4000 - len(XSS) - 1)
        assert author.post(route, json={"message": message}).status_code == 200
        wait_for(lambda: heard.of("dev:failed"), "dev:failed")
        assert heard.of("dev:failed")[-1].data["message"] == message
        for bad in ("x" * 4001, "", 5, ["x"], None):
            answer = author.post(route, json={"message": bad})
            assert answer.status_code == 400, (bad, answer.text)
        answer = author.post(
            route, content=b"x" * 2_000_000, headers={"Content-Type": "application/json"}
        )
        assert answer.status_code in (400, 413), answer.text
        assert len(heard.of("dev:failed")) == 1
        session.remove()


def test_the_host_page_writes_no_markup_from_strings() -> None:
    """Guard: the host page builds its DOM with textContent and element properties (`el`); a
    string that reaches an HTML sink (a dev problem, an app's name, an error message) would be
    markup in the shell's own origin."""
    web = Path(__file__).resolve().parents[2] / "atrium" / "web"
    sinks = re.compile(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|createContextualFragment|srcdoc"
    )
    found = [
        f"{path.name}:{n}"
        for path in sorted(web.rglob("*.js"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if sinks.search(line)
    ]
    assert found == []


# ---- 5. the audit log's bounds ------------------------------------------------------------------


def test_a_members_loop_of_refused_calls_is_counted_not_written_row_by_row(
    echo_shell: RunningShell, bob: httpx.Client
) -> None:
    """A member (or an app) looping on a refused call grew the audit file by one row a call, as
    fast as the shell answered (nothing else limits them). Their refused calls beyond a window's
    budget are counted into one row per action with its count, still under their name; every
    call that changed something keeps a row of its own."""
    flood = 1000
    for _ in range(flood):
        assert bob.put("/api/kv/global/x", json={"value": 1}).status_code == 403
    for n in range(150):
        assert bob.put(f"/api/kv/os/k{n}", json={"value": n}).status_code == 200
    with echo_shell.client() as admin:
        params: dict[str, str | int] = {"actor": "bob", "action": "kv.global.put", "limit": 1000}
        refused = admin.get("/api/audit", params=params).json()
        found = admin.get("/api/audit", params={"actor": "bob", "limit": 1000}).json()
    assert len(refused) <= 101, len(refused)
    assert sum(r["count"] for r in refused) == flood, refused[:3]
    assert {(r["actor"], r["status"]) for r in refused} == {("bob", 403)}
    done = {r["target"] for r in found if r["status"] == 200}
    assert {f"key=k{n}" for n in range(150)} <= done


# ---- 6. atrium service install ------------------------------------------------------------------


def _service(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_")}
    return subprocess.run(
        [sys.executable, "-m", "atrium", "service", "install", *args],
        env=clean,
        cwd=REPO_DIR,
        capture_output=True,
        check=False,
        timeout=30,
    )


@pytest.mark.parametrize(
    "name",
    ['a "quoted" home', "$HOME and ${HOME}", "100% %n %h", "back\\slash\\", "tab\there", "-x", ";"],
)
def test_a_home_path_reaches_the_unit_as_one_literal_word(tmp_path: Path, name: str) -> None:
    home = tmp_path / name
    printed = _service("--system", "--print", "--home", str(home))
    assert printed.returncode == 0, printed.stderr
    unit = printed.stdout.decode()
    [line] = [x for x in unit.splitlines() if x.startswith("Environment=")]
    # systemd's reading of a quoted word (no $ expansion in Environment=; %% is one %)
    [word] = shlex.split(line.removeprefix("Environment="))
    assert word.replace("%%", "%") == f"ATRIUM_HOME={home}"
    assert "%" not in word.replace("%%", "")
    path = tmp_path / "atrium.service"
    path.write_text(unit)
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        checked = subprocess.run(
            [analyze, "verify", str(path)], capture_output=True, text=True, check=False, timeout=60
        )
        assert checked.returncode == 0, checked.stderr
        assert "atrium.service" not in checked.stderr, checked.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--system", "--run-as", "a%n"),
        ("--system", "--run-as", "root NoNewPrivileges=no"),
        ("--system", "--run-as", "root\\"),
        ("--system", "--run-as", ""),
        ("--system", "--run-as", "-root"),
        ("--system", "--home", b"/srv/\xff"),
        ("--system", "--home", "/srv/a\rb"),
    ],
)
def test_a_run_as_or_home_a_unit_cannot_hold_is_refused(args: tuple[str | bytes, ...]) -> None:
    refused = _service("--print", *args)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stdout == b""
    assert refused.stderr.startswith(b"atrium service install: "), refused.stderr
