"""Several shells behind HAProxy (docs/deploying.md "Several shells"): Debian's haproxy runs the
repository's own deploy/haproxy.cfg (its addresses given through the environment variables the
file reads) in front of two `atrium serve` processes, each with its own home, on one PostgreSQL
database. Replica 1 reaches the database through a TCP relay the test can cut.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from atrium.identity import SESSION_COOKIE
from atrium.state.migrate import upgrade_now
from atrium.users.throttle import LIMIT
from tests.conftest import REPO_DIR
from tests.integration.conftest import RunningShell, ServeProcess, serving, wait_for
from tests.postgres import new_database
from tests.relay import Relay

HAPROXY_CFG = REPO_DIR / "deploy" / "haproxy.cfg"
#: the name users reach the group by: the shells' app domain and the health check's Host
DOMAIN = "atrium.test"
#: the client's pace (requests per second) and how long a gap in its answers may last
RATE = 50
BACK_WITHIN = 3.0
PASSWORD = "correct horse battery"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Balancer:
    """HAProxy on ``port`` with its runtime socket at ``stats``."""

    proc: subprocess.Popen[str]
    port: int
    stats: Path

    def servers(self) -> dict[str, dict[str, str]]:
        """``show stat`` of the `shells` backend: each server's row by name."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(self.stats))
            sock.sendall(b"show stat\n")
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        lines = raw.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {
            r["svname"]: r for r in rows if r["pxname"] == "shells" and r["svname"][:5] == "shell"
        }

    def status(self, server: str) -> str:
        return self.servers()[server]["status"]

    def served(self, server: str) -> int:
        return int(self.servers()[server]["stot"])


@contextmanager
def haproxy(tmp: Path, shells: list[ServeProcess]) -> Iterator[Balancer]:
    """The repository's deploy/haproxy.cfg, as it is, in front of ``shells``."""
    port = free_port()
    stats = tmp / "haproxy.sock"
    env = {
        **os.environ,
        "ATRIUM_APP_DOMAIN": DOMAIN,
        "ATRIUM_LB_BIND": f"127.0.0.1:{port}",
        "ATRIUM_LB_STATS": str(stats),
        **{
            f"ATRIUM_SHELL_{i}": f"127.0.0.1:{urlsplit(s.url).port}"
            for i, s in enumerate(shells, 1)
        },
    }
    checked = subprocess.run(
        ["haproxy", "-c", "-f", str(HAPROXY_CFG)], env=env, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    with (tmp / "haproxy.log").open("w") as log:
        proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(HAPROXY_CFG)], env=env, stdout=log, stderr=log, text=True
        )
    try:
        wait_for(stats.exists, "haproxy's runtime socket")
        yield Balancer(proc, port, stats)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass
class Client:
    """GET ``path`` through the balancer at ``RATE`` per second from a thread: each answer's
    status and when it came."""

    url: str
    path: str
    answers: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, headers={"Host": DOMAIN}, timeout=10) as client:
            next_at = time.monotonic()
            while not self._stop.is_set():
                try:
                    status = client.get(self.path).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((time.monotonic(), status))
                next_at += 1 / RATE
                time.sleep(max(0.0, next_at - time.monotonic()))

    @contextmanager
    def running(self) -> Iterator[Client]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=15)

    def since(self, moment: float) -> list[tuple[float, int]]:
        return [(at, status) for at, status in self.answers if at >= moment]


def me(shell: ServeProcess, cookie: str) -> int:
    """The status of ``GET /api/me`` on ``shell`` with the session cookie ``cookie``."""
    with httpx.Client(
        base_url=shell.url, headers={"Cookie": f"{SESSION_COOKIE}={cookie}"}, timeout=10
    ) as browser:
        return browser.get("/api/me").status_code


def serve_together(
    stack: ExitStack, *shells: AbstractContextManager[ServeProcess]
) -> list[ServeProcess]:
    """Start ``shells`` at the same time (a shell takes seconds to start on a loaded machine);
    each one started is stopped when ``stack`` closes, also when another failed to start."""
    with ThreadPoolExecutor(len(shells)) as pool:
        started = [pool.submit(shell.__enter__) for shell in shells]
        wait(started)
    for shell, future in zip(shells, started, strict=True):
        if future.exception() is None:
            stack.push(shell.__exit__)
    return [future.result() for future in started]


@pytest.fixture
def pg_url(postgres_server: str) -> str:
    url = new_database(postgres_server)
    upgrade_now(url)  # a shared database is upgraded by `atrium db upgrade`, not at start
    return url


def test_ready_answers_on_the_embedded_database_and_only_to_the_shells_names(
    shell: RunningShell,
) -> None:
    with shell.anonymous() as client:
        answer = client.get("/api/ready")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"ready": True}
        assert answer.headers["cache-control"] == "no-store"
        # a DNS-rebinding page learns nothing: a name that is not the shell's is refused
        refused = client.get("/api/ready", headers={"Host": "rebound.attacker.test"})
        assert refused.status_code == 421


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="make test installs Debian's haproxy")
def test_two_shells_behind_haproxy_lose_nothing_when_one_dies(tmp_path: Path, pg_url: str) -> None:
    parsed = urlsplit(pg_url.replace("postgresql+psycopg", "postgresql"))
    relay = Relay((parsed.hostname or "127.0.0.1", parsed.port or 5432))
    via_relay = pg_url.replace(f":{parsed.port}/", f":{relay.port}/")
    with ExitStack() as stack:
        stack.callback(relay.cut)
        replicas = serve_together(
            stack,
            *(
                serving(
                    tmp_path / f"home{i}",
                    stop=signal.SIGKILL,
                    ATRIUM_DATABASE_URL=url,
                    ATRIUM_APP_DOMAIN=DOMAIN,
                    ATRIUM_TRUSTED_PROXIES="127.0.0.1",  # where HAProxy connects from
                )
                for i, url in ((1, via_relay), (2, pg_url))
            ),
        )
        # one bootstrap token for both, though neither was given one: the first to start kept
        # its own in the database (hashed), the other took it, printed no login link and let
        # its home's own token go
        assert sorted(bool(r.token) for r in replicas) == [False, True]
        token = next(r.token for r in replicas if r.token)
        assert not any((r.home / "run" / "token").exists() for r in replicas if not r.token)
        for replica in replicas:
            replica.token = token
        # the login link signs in on either shell, and its sign-in holds on the other
        link_cookies = []
        for made_on, used_on in ((0, 1), (1, 0)):
            with httpx.Client(base_url=replicas[made_on].url) as browser:
                answer = browser.get(f"/login?token={token}", follow_redirects=False)
                assert answer.status_code == 303, answer.text
                link_cookies.append(answer.cookies[SESSION_COOKIE])
            assert me(replicas[used_on], link_cookies[-1]) == 200
        balancer = stack.enter_context(haproxy(tmp_path, replicas))
        lb = f"http://127.0.0.1:{balancer.port}"
        wait_for(
            lambda: [balancer.status(s) for s in ("shell1", "shell2")] == ["UP", "UP"],
            "both shells UP behind haproxy",
        )

        # each shell sees the client's own address (HAProxy's X-Forwarded-For), not HAProxy's,
        # and not the one a client wrote itself
        with httpx.Client(
            base_url=lb,
            headers={"Host": DOMAIN, "X-Forwarded-For": "192.0.2.66"},
            transport=httpx.HTTPTransport(local_address="127.0.0.9"),
            timeout=10,
        ) as far:
            for _ in range(2):  # round robin: one to each shell
                wrong = far.get("/login?token=" + "w" * 43, follow_redirects=False)
                assert wrong.status_code == 401, wrong.text

        def failed_link_addresses() -> list[str]:
            found = []
            for replica in replicas:
                with replica.client() as direct:
                    listed = direct.get("/api/audit", params={"action": "session.link"})
                    found += [r["address"] for r in listed.json() if r["status"] == 401]
            return found

        wait_for(lambda: len(failed_link_addresses()) >= 2, "the failed sign-ins audited")
        assert set(failed_link_addresses()) == {"127.0.0.9"}

        # the sign-in limit is kept in the database: five failed sign-ins through shell 1, and
        # the sixth attempt, through shell 2, is refused (in memory it had five more there)
        with replicas[0].client() as admin:
            made = admin.post("/api/users", json={"id": "bob", "password": PASSWORD})
            assert made.status_code == 201, made.text

        def sign_in(replica: ServeProcess, password: str) -> httpx.Response:
            with httpx.Client(
                base_url=replica.url,
                transport=httpx.HTTPTransport(local_address="127.0.0.7"),
                timeout=30,
            ) as guesser:
                return guesser.post("/api/session", json={"user": "bob", "password": password})

        for _ in range(LIMIT):
            assert sign_in(replicas[0], "not the password").status_code == 401
        refused = sign_in(replicas[1], PASSWORD)
        assert refused.status_code == 429, refused.text
        assert 0 < int(refused.headers["retry-after"]) <= 60

        # replica 1 loses its database: its /api/ready says so, and HAProxy stops sending to it
        relay.cut()
        with httpx.Client(base_url=replicas[0].url, headers={"Host": DOMAIN}) as direct:
            answer = direct.get("/api/ready")
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "database_unavailable"
        assert error["database"] == "postgresql"
        assert str(relay.port) not in answer.text  # the database's address is not told
        wait_for(lambda: balancer.status("shell1").startswith("DOWN"), "shell1 DOWN")
        before = balancer.served("shell1")
        with Client(lb, "/api/ready").running() as client:
            wait_for(lambda: len(client.answers) >= RATE, "a second of requests")
        assert {status for _, status in client.answers} == {200}
        assert balancer.served("shell1") == before

        # back: the database again, then replica 1 is sent requests again
        relay.mend()
        wait_for(lambda: balancer.status("shell1") == "UP", "shell1 UP again")

        # kill -9 of replica 1 under load: no request fails, the gap is short
        with Client(lb, "/api/version").running() as client:
            wait_for(lambda: len(client.answers) >= RATE, "a second of requests")
            served_by_1 = balancer.served("shell1")
            killed_at = time.monotonic()
            replicas[0].proc.kill()
            wait_for(lambda: len(client.since(killed_at)) >= 2 * RATE, "two seconds after")
        assert served_by_1 > 0  # replica 1 took its share before the kill
        failed = [status for _, status in client.answers if status != 200]
        assert failed == [], f"{len(failed)} of {len(client.answers)} requests failed: {failed}"
        times = [killed_at] + [at for at, _ in client.since(killed_at)]
        longest = max(b - a for a, b in pairwise(times))
        assert longest < BACK_WITHIN, f"no answer for {longest:.2f} s after the kill"

        # a shell started again, with a new token of its own in mind (its home may hold none),
        # takes the shared one: it ends none of the sign-ins the login link made
        with serving(
            tmp_path / "home1", ATRIUM_DATABASE_URL=pg_url, ATRIUM_APP_DOMAIN=DOMAIN
        ) as again:
            assert again.token in ("", token)
            for cookie in link_cookies:
                assert me(replicas[1], cookie) == 200
                assert me(again, cookie) == 200
        wait_for(lambda: balancer.status("shell1").startswith("DOWN"), "shell1 DOWN")
