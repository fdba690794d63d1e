"""Failover of two shells behind HAProxy, in network namespaces (docs/reliability.md, docs/deploying.md
"Several shells").

PostgreSQL, replica 1, replica 2, HAProxy and the client each run in a network namespace of their
own, joined by veth pairs to a bridge in a hub namespace. The client is threads of this test that
moved themselves into the client's namespace (`enter`): a request from the root namespace to a
namespace address would leave the machine through the default route instead. Replica 1 serves
and reaches the database through two relays in its own namespace (`DelayProxy`) that pass bytes
at once, or 100 ms late each way (this kernel has no netem).

While the client holds an event stream through HAProxy, sends 50 data requests a second and makes
2,000 KV writes, replica 1 is hit three ways in turn: (c) 5 % packet loss (iptables' random drop)
and 100 ms delay on its link, (b) its link cut while it stays alive, (a) `kill -9`. Each fault's
longest gap in successful answers is printed (`pytest -s`); `make bench BENCH=failover` runs the
same scenario (`failover`) and prints them as a table.

Which shell wrote a row is told by a trigger the test adds to every table: it notes the writer's
address (`inet_client_addr()`), backend pid and the time of every insert, update and delete.

Both replicas run their instances in pods, with the Kubernetes runner against the fake API and
kubelet of tests/kube (tests/kube/conftest.py says why a fake) in a namespace of their own too.
Before the faults the client opens three instances through HAProxy (on both replicas) and holds
each with a view, as a host page does; before (a) one more, on replica 1. After each fault every
instance's page is served through HAProxy by the process that served it first, in the same pod
(its uid in the fake API): no respawn, no hook called again. Replica 2 takes replica 1's
instances over once its shell lock is free (its sessions ended at (b), its process gone at (a));
back after (b), replica 1 writes no row of them.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from itertools import count, pairwise
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest

from atrium.lifecycle.runners.kubernetes import render
from atrium.state.migrate import upgrade_now
from tests.conftest import REPO_DIR, TESTS_DIR
from tests.integration.conftest import serve_env, wait_for
from tests.integration.test_several_shells import BACK_WITHIN, DOMAIN, HAPROXY_CFG, RATE, Balancer
from tests.kube.cluster import FakeCluster
from tests.kube.test_several_shells_origins import PROBE
from tests.postgres import _as_postgres, _pg_bin, _reachable, _template

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(map(shutil.which, ("haproxy", "iptables", "ip", "bwrap"))),
    reason="needs root, ip, iptables, bwrap and Debian's haproxy (make test installs haproxy)",
)

SUBNET = "10.231.0"
HOSTS = {"db": 1, "lb": 4, "client": 5, "kube": 6, "r1": 11, "r2": 12}
#: KV writes the client makes, and how many at a time
WRITES = 2000
WRITERS = 4
#: threads sending the data requests (a request hung on a cut link holds up only its thread)
SENDERS = 8
#: the delay case's extra latency, each way
DELAY = 0.1
LOSS = "0.05"
#: the instances the client keeps open through the faults, and their namespace in the fake cluster
INSTANCES = 3
KUBE_NS = "failover"
#: the probe app under one id per instance, so that each instance (and its pod) is told apart by
#: its app in the checks and the logs (the numbering itself reads every shell's rows: two shells
#: never give one user's instances of an app the same id)
APPS = [f"test.failover.probe{n}" for n in range(1, INSTANCES + 2)]
T = TypeVar("T")
_CLONE_NEWNET = 0x40000000
_LIBC = ctypes.CDLL(None, use_errno=True)


def addr(role: str) -> str:
    return f"{SUBNET}.{HOSTS[role]}"


def enter(namespace: str) -> None:
    """Move the calling thread, and only it, into the network namespace ``namespace``: the
    sockets it makes from now on live there (the threads it starts inherit it)."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _LIBC.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


def inside(namespace: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread of its own in ``namespace``."""
    with ThreadPoolExecutor(1, initializer=enter, initargs=(namespace,)) as pool:
        return pool.submit(fn, *args).result()


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


@dataclass
class Net:
    """The namespaces' names by role (``hub`` holds the bridge and each role's end of its veth,
    named ``v<role>``)."""

    names: dict[str, str]

    def ns(self, role: str) -> str:
        return self.names[role]

    def link(self, role: str, up: bool) -> None:
        """Cut (or mend) ``role``'s link: its veth in the hub down (or up)."""
        ip("-n", self.names["hub"], "link", "set", f"v{role}", "up" if up else "down")

    def iptables(self, role: str, *argv: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.names[role], "iptables", *argv],
            check=True,
            capture_output=True,
        )


@contextmanager
def topology() -> Iterator[Net]:
    """The namespaces and the bridge, deleted afterwards whatever happened (deleting a namespace
    deletes the veth ends in it, and with them their peers)."""
    tag = f"fo{os.getpid() % 100000}"
    names = {role: f"{tag}-{role}" for role in ("hub", *HOSTS)}
    hub = names["hub"]
    try:
        ip("netns", "add", hub)
        ip("-n", hub, "link", "add", "br0", "type", "bridge")
        ip("-n", hub, "link", "set", "br0", "up")
        for role, host in HOSTS.items():
            ns = names[role]
            ip("netns", "add", ns)
            ip(
                "-n",
                hub,
                "link",
                "add",
                f"v{role}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            ip("-n", hub, "link", "set", f"v{role}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{SUBNET}.{host}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield Net(names)
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@contextmanager
def postgres_in(namespace: str, address: str) -> Iterator[str]:
    """Debian's PostgreSQL listening on ``address`` in ``namespace``, with the keepalive settings
    a deployment uses (tests/postgres.py's server, moved): the URL of its ``postgres`` database."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (make test installs Debian's postgresql)")
    template = _template(bin_dir)
    run = Path(tempfile.mkdtemp(prefix="atrium-pg-failover-", dir="/tmp"))
    _reachable(run)
    data = run / "data"
    subprocess.run(["cp", "-a", str(template), str(data)], check=True)
    with (data / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all {SUBNET}.0/24 trust\n")
    options = (
        f"-k {run} -p 5432 -h {address} -c fsync=off -c tcp_keepalives_idle=2 "
        f"-c tcp_keepalives_interval=1 -c tcp_keepalives_count=2"
    )
    pg_ctl = str(bin_dir / "pg_ctl")
    started = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            namespace,
            *_as_postgres(
                [pg_ctl, "-w", "-D", str(data), "-l", str(run / "log"), "-o", options, "start"]
            ),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        assert started.returncode == 0, started.stderr + (run / "log").read_text()
        yield f"postgresql+psycopg://atrium@{address}:5432/postgres"
    finally:
        subprocess.run(
            _as_postgres([pg_ctl, "-w", "-D", str(data), "-m", "immediate", "stop"]),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(run, ignore_errors=True)


#: every insert, update and delete of every table, with who made it and when
WRITERS_SQL = """
CREATE TABLE failover_writes (
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    addr inet DEFAULT inet_client_addr(),
    pid int NOT NULL DEFAULT pg_backend_pid(),
    tbl text NOT NULL,
    op text NOT NULL,
    key text
);
CREATE FUNCTION failover_note() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE row jsonb := CASE WHEN TG_OP = 'DELETE' THEN to_jsonb(OLD) ELSE to_jsonb(NEW) END;
BEGIN
    INSERT INTO failover_writes (tbl, op, key)
    VALUES (TG_TABLE_NAME, TG_OP, coalesce(row->>'key', row->>'id'));
    RETURN NULL;
END $$;
"""


def prepare(server: str) -> str:
    """A fresh database on ``server``, upgraded, with the writers' trigger on every table."""
    import psycopg

    conninfo = server.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE DATABASE failover")
    url = server.rsplit("/", 1)[0] + "/failover"
    upgrade_now(url)
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(WRITERS_SQL)
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename NOT IN ('failover_writes', 'alembic_version')"
        ).fetchall()
        for (table,) in tables:
            conn.execute(
                f"CREATE TRIGGER failover_note AFTER INSERT OR UPDATE OR DELETE ON {table}"
                " FOR EACH ROW EXECUTE FUNCTION failover_note()"
            )
    return url


def query(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True, connect_timeout=5) as conn:
        return conn.execute(sql, params).fetchall()


class DelayProxy:
    """A TCP relay in ``namespace`` from ``listen`` to ``target`` that holds every chunk
    `delay` seconds in each direction (0: passes it at once), in order. `close` ends the
    listener and every connection through it."""

    def __init__(self, namespace: str, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.namespace = namespace
        self.target = target
        self.delay = 0.0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        ready = threading.Event()
        threading.Thread(target=self._accept, args=(listen, ready), daemon=True).start()
        assert ready.wait(10), "the relay did not start"

    def _accept(self, listen: tuple[str, int], ready: threading.Event) -> None:
        enter(self.namespace)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(listen)
        listener.listen(128)
        self._listener = listener
        ready.set()
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.target, timeout=30)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, server}
            for a, b in ((client, server), (server, client)):
                held: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(a, held), daemon=True).start()
                threading.Thread(target=self._write, args=(b, held), daemon=True).start()

    def _read(self, source: socket.socket, held: queue.Queue[tuple[float, bytes]]) -> None:
        with suppress(OSError):
            while chunk := source.recv(65536):
                held.put((time.monotonic() + self.delay, chunk))
        held.put((0.0, b""))

    def _write(self, sink: socket.socket, held: queue.Queue[tuple[float, bytes]]) -> None:
        with suppress(OSError):
            while True:
                due, chunk = held.get()
                if not chunk:
                    sink.shutdown(socket.SHUT_WR)
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                sink.sendall(chunk)

    def close(self) -> None:
        with self._lock:
            if self._listener is not None:
                with suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)
                self._listener.close()
                self._listener = None
            for sock in self._open:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()


@dataclass
class Replica:
    proc: subprocess.Popen[bytes]
    url: str
    token: str


@contextmanager
def serve_in(namespace: str, home: Path, log: Path, **extra: str) -> Iterator[Replica]:
    """`atrium serve` in ``namespace`` (its output in ``log``), killed when the block ends."""
    home.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, "-m", "atrium", "serve"],
            env=serve_env(home, **extra),
            cwd=REPO_DIR,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def login() -> tuple[str, str] | None:
            """The shell's URL and the token of its login link, once printed: none from the
            shell that took the bootstrap token the other keeps in the database."""
            assert proc.poll() is None, f"serve ended: {log.read_text()}"
            text = log.read_text()
            if "Open the host page:" not in text:
                return None
            url = re.search(r"Atrium (http://\S+) ", text)
            assert url is not None
            token = re.search(r"/login\?token=(\S+)", text)
            return url.group(1), token.group(1) if token else ""

        url, token = wait_for(login, f"{namespace}: serve's login URL", timeout=60)
        yield Replica(proc, url, token)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@contextmanager
def haproxy_in(namespace: str, tmp: Path) -> Iterator[Balancer]:
    """The repository's deploy/haproxy.cfg, as it is, in ``namespace``."""
    stats = tmp / "haproxy.sock"
    env = {
        **os.environ,
        "ATRIUM_APP_DOMAIN": DOMAIN,
        "ATRIUM_LB_BIND": f"{addr('lb')}:80",
        "ATRIUM_LB_STATS": str(stats),
        "ATRIUM_SHELL_1": f"{addr('r1')}:7070",
        "ATRIUM_SHELL_2": f"{addr('r2')}:7070",
    }
    with (tmp / "haproxy.log").open("w") as log:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", namespace, "haproxy", "-db", "-f", str(HAPROXY_CFG)],
            env=env,
            stdout=log,
            stderr=log,
            text=True,
        )
    try:
        wait_for(stats.exists, "haproxy's runtime socket")
        yield Balancer(proc, 80, stats)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def cluster_in(net: Net, tmp: Path) -> Iterator[FakeCluster]:
    """The fake Kubernetes API and kubelet (tests/kube/conftest.py says why a fake) in the
    ``kube`` namespace: the API on its address, the pods' bridge there, forwarding on, and the
    replicas routed to the pods through it (the pods reach the replicas the same way back).
    The namespace ``KUBE_NS`` in it holds the pods, and ``tmp``/system-apps the probe app."""
    cluster = FakeCluster("fo", addr("kube"), lambda: enter(net.ns("kube")))
    try:
        cluster.start()
        subprocess.run(
            ["ip", "netns", "exec", net.ns("kube"), "sysctl", "-qw", "net.ipv4.ip_forward=1"],
            check=True,
            capture_output=True,
        )
        for role in ("r1", "r2"):
            ip("-n", net.ns(role), "route", "add", str(cluster.kubelet.network.subnet), "via",
               addr("kube"))  # fmt: skip
        cluster.call(cluster.api.create, "v1/namespaces", "", {"metadata": {"name": KUBE_NS}})
        for app in APPS:
            folder = tmp / "system-apps" / app
            shutil.copytree(TESTS_DIR / "apps" / PROBE, folder)
            manifest = json.loads((folder / "app.manifest.json").read_text())
            (folder / "app.manifest.json").write_text(json.dumps({**manifest, "id": app}))
        yield cluster
    finally:
        cluster.stop()


def kube_env(cluster: FakeCluster, tmp: Path, role: str) -> dict[str, str]:
    """A replica's settings for the Kubernetes runner on ``cluster`` (`cluster_in`)."""
    return {
        "ATRIUM_SYSTEM_APPS": str(tmp / "system-apps"),
        "ATRIUM_RUNNER": "kubernetes",
        "ATRIUM_KUBE_CONFIG": str(cluster.kubeconfig),
        "ATRIUM_KUBE_NAMESPACE": KUBE_NS,
        "ATRIUM_KUBE_SHELL_URL": f"http://{addr(role)}:7070",
        "ATRIUM_KUBE_START_TIMEOUT_SECONDS": "30",
    }


def api_client(token: str, base: str = f"http://{addr('lb')}", **kwargs: Any) -> httpx.Client:
    return httpx.Client(
        base_url=base,
        headers={"Host": DOMAIN, "Authorization": f"Bearer {token}"},
        **kwargs,
    )


@dataclass
class Opened:
    """An instance the client keeps open with a view, as a host page does: its app origin (the
    `Host` of its pages through HAProxy), the view's cookie, and its page and pod when opened."""

    iid: str
    view: str
    host: str
    cookie: str
    boot: dict[str, Any]
    uid: str = ""

    def page(self) -> dict[str, Any] | None:
        """Its page through HAProxy now (in the client's namespace); None without one."""
        with httpx.Client(
            base_url=f"http://{addr('lb')}",
            headers={"Host": self.host, "Cookie": self.cookie},
            timeout=5,
        ) as origin:
            try:
                answer = origin.get("/boot")
            except httpx.HTTPError:
                return None
        return answer.json() if answer.status_code == 200 else None


def launch(token: str, apps: list[str], base: str = f"http://{addr('lb')}") -> list[str] | None:
    """An instance of each of ``apps`` launched at once (through HAProxy: its round robin puts
    them on both replicas), their ids; None if one was refused (a replica not serving yet)."""

    def one(app: str) -> str | None:
        with api_client(token, base, timeout=60) as api:
            launched = api.post("/api/instances", json={"appId": app})
        return str(launched.json()["instanceId"]) if launched.status_code == 200 else None

    with ThreadPoolExecutor(len(apps)) as pool:
        ids = list(pool.map(one, apps))
    return [i for i in ids if i] if all(ids) else None


def hold(token: str, iid: str) -> Opened:
    """A view of ``iid`` made and entered through HAProxy, its first page read."""
    with api_client(token, timeout=30) as api:
        made = api.post(f"/api/instances/{iid}/views", json={"path": "/boot"})
    assert made.status_code == 200, made.text
    ticket = urlsplit(made.json()["url"])
    assert ticket.hostname is not None
    with httpx.Client(
        base_url=f"http://{addr('lb')}", headers={"Host": ticket.hostname}, timeout=30
    ) as origin:
        entered = origin.get(f"{ticket.path}?{ticket.query}", follow_redirects=False)
    assert entered.status_code == 303, entered.text
    opened = Opened(
        iid, made.json()["viewId"], ticket.hostname, entered.headers["set-cookie"].split(";")[0], {}
    )
    page = opened.page()
    assert page is not None
    assert page["hooks"] == ["onCreate", "onStart"], page
    opened.boot = page
    return opened


@dataclass
class Pods:
    """The client's instances in the fake cluster's pods, looked at from the client's namespace,
    the database and the fake API."""

    client_ns: str
    url: str
    token: str
    cluster: FakeCluster

    def open(self, apps: list[str], base: str = f"http://{addr('lb')}") -> list[Opened]:
        """An instance of each of ``apps`` launched at ``base``, held open with a view each."""
        ids = wait_for(
            lambda: inside(self.client_ns, launch, self.token, apps, base), "instances launched"
        )
        opened = [inside(self.client_ns, hold, self.token, iid) for iid in ids]
        for each in opened:
            each.uid = self.uid(each)
        return opened

    def holders(self) -> dict[str, str]:
        """Which replica (``r1``, ``r2``) each instance's row names."""
        rows = inside(self.client_ns, query, self.url, "SELECT id, shell FROM instances")
        return {iid: "r1" if shell.endswith("/home1") else "r2" for iid, shell in rows}

    def moved(self, which: list[Opened]) -> bool:
        """Whether replica 2 holds every one of ``which`` (pauses a little if not)."""
        now = self.holders()
        if any(now.get(o.iid) != "r2" for o in which):
            time.sleep(0.1)
            return False
        return True

    def uid(self, opened: Opened) -> str:
        pod = self.cluster.pod(KUBE_NS, render.pod_name(opened.iid))
        return str(pod["metadata"]["uid"]) if pod else ""

    def kept(self, stage: str, which: list[Opened]) -> None:
        """Each instance's page served through HAProxy by the process that served it first
        (its boot token, and the hooks it was called with: none since), in the same pod."""

        def pages() -> list[dict[str, Any] | None] | None:
            got = inside(self.client_ns, lambda: [o.page() for o in which])
            if None in got:
                time.sleep(0.1)
                return None
            return got

        got = wait_for(pages, f"the instances served through HAProxy after ({stage})", 20)
        assert got == [o.boot for o in which], f"({stage}) respawned or hooks called: {got}"
        assert [self.uid(o) for o in which] == [o.uid for o in which], f"({stage}) respawned"


@dataclass
class Load:
    """The client: data requests, KV writes and one event stream, all through HAProxy from the
    client's namespace."""

    namespace: str
    token: str
    lb: str = f"http://{addr('lb')}"
    #: (when, status) of every data request; status 0: no answer
    answers: list[tuple[float, int]] = field(default_factory=list)
    #: KV write n: (sent at, answered at or None, value)
    sent: dict[int, tuple[float, float | None, Any]] = field(default_factory=dict)
    #: ids of the kv:changed frames the stream got, in order; and how often it (re)connected
    seen: list[int] = field(default_factory=list)
    connects: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _next: Iterator[int] = field(default_factory=count)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(
            base_url=self.lb,
            headers={"Host": DOMAIN, "Authorization": f"Bearer {self.token}"},
            **kwargs,
        )

    def _send(self) -> None:
        enter(self.namespace)
        with self._client(timeout=5) as client:
            next_at = time.monotonic()
            while not self._stop.is_set():
                try:
                    status = client.get("/api/me").status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((time.monotonic(), status))
                next_at = max(next_at + SENDERS / RATE, time.monotonic())
                time.sleep(max(0.0, next_at - time.monotonic()))

    def _write(self) -> None:
        enter(self.namespace)
        with self._client(timeout=5) as client:
            while not self._stop.is_set() and (n := next(self._next)) < WRITES:
                value = {"n": n, "by": "failover"}
                sent_at = time.monotonic()
                self.sent[n] = (sent_at, None, value)
                try:
                    answer = client.put(f"/api/kv/os/w{n}", json={"value": value})
                except httpx.HTTPError:
                    continue
                if answer.status_code == 200:
                    self.sent[n] = (sent_at, time.monotonic(), value)

    def _stream(self) -> None:
        enter(self.namespace)
        last: str | None = None
        with self._client(timeout=httpx.Timeout(5, read=3)) as client:
            while not self._stop.is_set():
                headers = {"Last-Event-ID": last} if last else {}
                try:
                    with client.stream(
                        "GET", "/api/events", params={"topics": "kv:changed"}, headers=headers
                    ) as answer:
                        if answer.status_code != 200:
                            time.sleep(0.1)
                            continue
                        self.connects += 1
                        frame: dict[str, str] = {}
                        for line in answer.iter_lines():
                            if self._stop.is_set():
                                return
                            if line:
                                name, _, value = line.partition(":")
                                frame[name] = value.strip()
                            elif "id" in frame:
                                last = frame["id"]
                                if frame.get("event") == "kv:changed":
                                    self.seen.append(int(last))
                                frame = {}
                except httpx.HTTPError:
                    time.sleep(0.05)

    @contextmanager
    def running(self) -> Iterator[Load]:
        for target, n in ((self._stream, 1), (self._send, SENDERS), (self._write, WRITERS)):
            for _ in range(n):
                thread = threading.Thread(target=target, daemon=True)
                thread.start()
                self._threads.append(thread)
        try:
            yield self
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join(timeout=15)

    def writes_done(self) -> bool:
        return all(not t.is_alive() for t in self._threads[1 + SENDERS :])

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time without a successful data answer between ``start`` and ``end``."""
        ok = sorted(at for at, status in self.answers if status == 200 and start <= at <= end)
        return max(b - a for a, b in pairwise([start, *ok, end]))

    def longest_write_gap(self, start: float, end: float) -> float:
        """The longest time without an acknowledged KV write between ``start`` and ``end``."""
        acked = sorted(at for _, at, _ in list(self.sent.values()) if at and start <= at <= end)
        return max(b - a for a, b in pairwise([start, *acked, end]))


@dataclass
class Failover:
    """One run of the scenario (see the module docstring), for the checks after it; the
    namespaces and the database are there until the `failover` block ends."""

    #: seconds: each fault's longest gap in successful answers (and writes), and stages' times
    figures: dict[str, float]
    load: Load
    url: str
    client_ns: str
    r1_addr: str
    #: replica 1's database sessions before the cut, and when the server had ended them
    r1_pids: set[int]
    gone_at: Any
    cut_at: float
    mended_at: float
    #: the instances the client held open through the faults (the last opened on replica 1
    #: before (a)), and those replica 2 took over from replica 1 at (b)
    opened: list[Opened]
    taken: list[Opened]


@contextmanager
def failover(tmp_path: Path, *, settle: bool = True) -> Iterator[Failover]:
    """Run the three faults under the load (the test's and `make bench BENCH=failover`'s);
    ``settle``: then wait for the client's 2,000 writes to end and its stream to catch up (what
    the test checks; the bench's figures are taken before)."""
    figures: dict[str, float] = {}
    t0 = time.monotonic()
    with ExitStack() as stack:
        net = stack.enter_context(topology())
        client_ns = net.ns("client")
        server = stack.enter_context(postgres_in(net.ns("db"), addr("db")))
        url = inside(client_ns, prepare, server)
        cluster = stack.enter_context(cluster_in(net, tmp_path))

        # replica 1 serves behind one relay and reaches the database through another, both in
        # its namespace (the delay case slows them); its connections come from its address
        http_relay = DelayProxy(net.ns("r1"), (addr("r1"), 7070), ("127.0.0.1", 7071))
        stack.callback(http_relay.close)
        db_relay = DelayProxy(net.ns("r1"), ("127.0.0.1", 5433), (addr("db"), 5432))
        stack.callback(db_relay.close)
        common = {
            "ATRIUM_APP_DOMAIN": DOMAIN,
            "ATRIUM_TRUSTED_PROXIES": f"{addr('lb')},127.0.0.1",
            "ATRIUM_HEARTBEAT_SECONDS": "1",
        }
        shells = [
            serve_in(
                net.ns("r1"),
                tmp_path / "home1",
                tmp_path / "r1.log",
                ATRIUM_HOST="127.0.0.1",
                ATRIUM_PORT="7071",
                ATRIUM_DATABASE_URL=url.replace(f"{addr('db')}:5432", "127.0.0.1:5433"),
                **common,
                **kube_env(cluster, tmp_path, "r1"),
            ),
            serve_in(
                net.ns("r2"),
                tmp_path / "home2",
                tmp_path / "r2.log",
                ATRIUM_HOST=addr("r2"),
                ATRIUM_PORT="7070",
                ATRIUM_DATABASE_URL=url,
                **common,
                **kube_env(cluster, tmp_path, "r2"),
            ),
        ]
        with ThreadPoolExecutor(2) as pool:
            starting = [pool.submit(stack.enter_context, shell) for shell in shells]
            r1, r2 = [s.result() for s in starting]
        bootstrap = r1.token or r2.token  # one shell printed the token both share
        balancer = stack.enter_context(haproxy_in(net.ns("lb"), tmp_path))
        wait_for(
            lambda: [balancer.status(s) for s in ("shell1", "shell2")] == ["UP", "UP"],
            "both shells UP behind haproxy",
            timeout=60,
        )

        def new_token() -> str:
            with httpx.Client(
                base_url=f"http://{addr('lb')}",
                headers={"Host": DOMAIN, "Authorization": f"Bearer {bootstrap}"},
                timeout=10,
            ) as client:
                # ask replica 1 directly
                made = client.post(
                    f"http://{addr('r1')}:7070/api/tokens", json={"name": "failover"}
                )
                assert made.status_code == 201, made.text
                return str(made.json()["token"])

        token = inside(client_ns, new_token)
        figures["setup"] = time.monotonic() - t0

        pods = Pods(client_ns, url, token, cluster)
        # three instances opened through HAProxy at once: on both replicas (round robin)
        opening = time.monotonic()
        opened = pods.open(APPS[:INSTANCES])
        figures["instances open"] = time.monotonic() - opening
        held = pods.holders()
        taken = [o for o in opened if held[o.iid] == "r1"]
        assert 0 < len(taken) < INSTANCES, f"not on both replicas: {held}"
        load = Load(client_ns, token)
        r1_addr = addr("r1")
        with load.running():
            began = time.monotonic()
            wait_for(lambda: load.connects >= 1 and len(load.answers) >= RATE, "the load")
            time.sleep(1)

            # (c) 5 % loss and 100 ms delay on replica 1's link
            start = time.monotonic()
            for chain in ("INPUT", "OUTPUT"):
                net.iptables(
                    "r1", "-A", chain, "-m", "statistic", "--mode", "random",
                    "--probability", LOSS, "-j", "DROP",
                )  # fmt: skip
            http_relay.delay = db_relay.delay = DELAY
            time.sleep(3)
            figures["c"] = load.longest_gap(start, time.monotonic())
            figures["c writes"] = load.longest_write_gap(start, time.monotonic())
            net.iptables("r1", "-F")
            http_relay.delay = db_relay.delay = 0.0
            time.sleep(1)
            pods.kept("c", opened)

            # (b) replica 1's link cut; it stays alive
            r1_pids = {
                pid
                for (pid,) in inside(
                    client_ns,
                    query,
                    url,
                    "SELECT pid FROM pg_stat_activity WHERE client_addr = %s",
                    r1_addr,
                )
            }
            assert r1_pids, "replica 1 holds no database session"
            cut_at = time.monotonic()
            net.link("r1", up=False)

            def sessions_gone() -> Any:
                rows = inside(
                    client_ns,
                    query,
                    url,
                    "SELECT clock_timestamp(), array_agg(pid) FILTER (WHERE pid = ANY(%s))"
                    " FROM pg_stat_activity",
                    list(r1_pids),
                )
                return rows[0][0] if rows[0][1] is None else None

            try:
                gone_at = wait_for(sessions_gone, "replica 1's sessions ended by the server")
            except AssertionError:
                left = inside(
                    client_ns,
                    query,
                    url,
                    "SELECT pid, application_name, state, wait_event, left(query, 60)"
                    " FROM pg_stat_activity WHERE pid = ANY(%s)",
                    list(r1_pids),
                )
                raise AssertionError(
                    f"replica 1's sessions still there after the cut: {left}"
                ) from None
            figures["sessions gone"] = time.monotonic() - cut_at
            wait_for(lambda: balancer.status("shell1").startswith("DOWN"), "shell1 DOWN")
            wait_for(lambda: pods.moved(taken), "replica 2 takes replica 1's instances over", 15)
            figures["b takeover"] = time.monotonic() - cut_at
            time.sleep(max(0.0, cut_at + 6 - time.monotonic()))
            figures["b"] = load.longest_gap(cut_at, time.monotonic())
            figures["b writes"] = load.longest_write_gap(cut_at, time.monotonic())
            mended_at = time.monotonic()
            net.link("r1", up=True)
            wait_for(lambda: balancer.status("shell1") == "UP", "shell1 UP again", timeout=30)
            up_at = time.monotonic()
            # replica 1, back, let go of what replica 2 took: both serve every instance from
            # the same pods, and no hook was called again
            pods.kept("b", opened)
            # one more instance, opened on replica 1 for (a) to take over
            last = pods.open(APPS[INSTANCES:], f"http://{addr('r1')}:7070")
            assert pods.holders()[last[0].iid] == "r1"
            opened += last
            time.sleep(max(0.0, up_at + 1 - time.monotonic()))

            # (a) kill -9 of replica 1 (its relays go with it: nothing listens at its address)
            killed_at = time.monotonic()
            r1.proc.kill()
            http_relay.close()
            db_relay.close()
            wait_for(lambda: pods.moved(last), "replica 2 takes the killed one's instance over", 15)
            figures["a takeover"] = time.monotonic() - killed_at
            time.sleep(max(0.0, killed_at + 3 - time.monotonic()))
            figures["a"] = load.longest_gap(killed_at, time.monotonic())
            figures["a writes"] = load.longest_write_gap(killed_at, time.monotonic())
            wait_for(lambda: balancer.status("shell1").startswith("DOWN"), "shell1 DOWN")
            pods.kept("a", opened)

            figures["faults done"] = time.monotonic() - began
            if settle:
                wait_for(load.writes_done, "the KV writes", timeout=120)
                figures["writes done"] = time.monotonic() - began
                newest = inside(
                    client_ns, query, url, "SELECT max(id) FROM events WHERE topic = 'kv:changed'"
                )[0][0]
                wait_for(lambda: load.seen and load.seen[-1] >= newest, "the stream caught up")

        yield Failover(
            figures,
            load,
            url,
            client_ns,
            r1_addr,
            r1_pids,
            gone_at,
            cut_at,
            mended_at,
            opened,
            taken,
        )


def test_failover_of_a_replica_loses_no_write_and_no_event(tmp_path: Path) -> None:
    with failover(tmp_path) as run:
        figures, load, url, client_ns = run.figures, run.load, run.url, run.client_ns
        r1_addr, r1_pids, gone_at = run.r1_addr, run.r1_pids, run.gone_at
        cut_at, mended_at = run.cut_at, run.mended_at
        # the figures docs/decisions.md quotes (seen with `pytest -s`)
        print(f"\nfailover (longest gap in successful answers, s): {figures}")  # noqa: T201

        # every acknowledged write is there with its value
        acked = {n: value for n, (_, answered, value) in load.sent.items() if answered}
        assert len(acked) > WRITES * 0.9, f"only {len(acked)} of {WRITES} writes answered"
        stored = {
            key: json.loads(value)
            for key, value in inside(
                client_ns, query, url, "SELECT key, value FROM kv WHERE namespace = 'os'"
            )
        }
        lost = {n for n, value in acked.items() if stored.get(f"w{n}") != value}
        assert not lost, f"{len(lost)} acknowledged writes lost: {sorted(lost)[:20]}"

        # the stream, resumed with Last-Event-ID over the faults, had every stored event once
        assert load.connects > 1, "the stream was never resumed"
        ids = [
            i
            for (i,) in inside(
                client_ns, query, url, "SELECT id FROM events WHERE topic = 'kv:changed'"
            )
        ]
        twice = [i for i, n in Counter(load.seen).items() if n > 1]
        assert not twice, f"{len(twice)} events sent twice: {twice[:20]}"
        missed = sorted(set(ids) - set(load.seen))
        assert not missed, f"{len(missed)} stored events never sent: {missed[:20]}"
        assert set(load.seen) <= set(ids)

        # after the cut, nothing replica 1 sent before its link came back was written once its
        # sessions were gone
        late = inside(
            client_ns,
            query,
            url,
            "SELECT at, pid, tbl, op, key FROM failover_writes WHERE addr = %s AND at > %s"
            " ORDER BY at",
            r1_addr,
            gone_at,
        )
        stale = [
            row
            for row in late
            if row[2] == "kv"
            and row[4].startswith("w")
            and load.sent[int(row[4][1:])][0] < mended_at
        ]
        wall = time.time() - time.monotonic()
        assert not stale, (
            f"replica 1 wrote after its sessions ended ({gone_at.timestamp() - wall - cut_at:.2f} s"
            f" after the cut, link back {mended_at - cut_at:.2f} s after): "
            + ", ".join(
                f"{key} sent {load.sent[int(key[1:])][0] - cut_at:.2f} s after the cut,"
                f" answered {load.sent[int(key[1:])][1]}, written"
                f" {at.timestamp() - wall - cut_at:.2f} s after by session {pid}"
                for at, pid, _, _, key in stale[:10]
            )
        )
        old_sessions = [row for row in late if row[1] in r1_pids]
        assert not old_sessions, old_sessions[:10]
        # nor, back, of the instances replica 2 had taken over (their rows and views)
        taken = {o.iid for o in run.taken} | {o.view for o in run.taken}
        theirs = [row for row in late if row[2] in ("instances", "views") and row[4] in taken]
        assert not theirs, f"replica 1 wrote the rows of instances taken from it: {theirs}"
        for case in ("a", "b", "c"):
            assert figures[case] < BACK_WITHIN, f"({case}): no answer for {figures[case]:.2f} s"
