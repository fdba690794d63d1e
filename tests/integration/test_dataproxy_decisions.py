"""The data proxy keeps what it allowed (caller, method, raw path) and uses it again: through the
real shell, every change of what the decision was made from is felt at the very next request.

Each test first makes the shell keep a decision (the same request twice, the second served from
what was kept), then changes one input, then asks again: a stale allow would answer 200.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import httpx
import pytest

from atrium.scopes import Scope
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell
from tests.integration.test_dataproxy import caller_app, ready

pytestmark = pytest.mark.integration

READ = "test.sdk.echo.read"
OWN_APP = "test.users.own"


def providers(system_apps: Path) -> None:
    for name in ("test.sdk.echo", "test.plain.stdlib"):
        shutil.copytree(TESTS_DIR / "apps" / name, system_apps / name)
    caller_app(system_apps, "test.caller.reader", [READ])
    caller_app(system_apps, "test.caller.nobody", [])


@pytest.fixture
def proxy(start_shell: StartShell, system_apps: Path) -> RunningShell:
    providers(system_apps)
    return ready(start_shell())


def as_app(shell: RunningShell, app_id: str, owner: str = "default") -> httpx.Client:
    token = shell.shell.app_tokens.issue(app_id, f"{app_id}-t-{owner}", owner)
    return shell.client(token=token, timeout=30)


def serve_for(client: httpx.Client, app_id: str = "test.sdk.echo") -> None:
    """A user's own resumed instance of the provider: their requests go to it."""
    made = client.post("/api/instances", json={"appId": app_id})
    assert made.status_code in (200, 201), made.text
    resumed = client.post(f"/api/instances/{made.json()['instanceId']}/resumed")
    assert resumed.status_code == 200, resumed.text


def raw_status(shell: RunningShell, target: str, token: str) -> tuple[int, bytes]:
    """A raw request line (an HTTP client would remove dot segments before sending)."""
    with socket.create_connection(("127.0.0.1", shell.settings.port), timeout=10) as sock:
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def kept(client: httpx.Client, path: str, shell: RunningShell, method: str = "GET") -> None:
    """Ask twice: allowed, and the decision is kept (the second answer came from it)."""
    for _ in range(2):
        answer = client.request(method, path)
        assert answer.status_code == 200, answer.text
    assert shell.shell.dataproxy.decisions_kept > 0


def set_permissions(shell: RunningShell, system_apps: Path, app_id: str, perms: list[str]) -> None:
    """What an update approving other permissions does: a new manifest, the scope read again."""
    path = system_apps / app_id / "app.manifest.json"
    manifest = json.loads(path.read_text())
    manifest["permissions"] = perms
    path.write_text(json.dumps(manifest))
    shell.on_loop(shell.shell.registry.rescan([Scope.SYSTEM]))


def test_a_permission_taken_away_is_refused_at_once_and_given_back_allowed(
    proxy: RunningShell, system_apps: Path
) -> None:
    with as_app(proxy, "test.caller.reader") as reader:
        kept(reader, "/api/data/echo/closed/x", proxy)
        set_permissions(proxy, system_apps, "test.caller.reader", [])
        refused = reader.get("/api/data/echo/closed/x")
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "permission_denied"
        set_permissions(proxy, system_apps, "test.caller.reader", [READ])
        assert reader.get("/api/data/echo/closed/x").status_code == 200


def test_a_provider_uninstalled_is_gone_at_once_and_installed_again_serves(
    proxy: RunningShell, system_apps: Path
) -> None:
    """The provider's manifest changes its entry: the kept decision was made from the old one."""
    path = system_apps / "test.sdk.echo" / "app.manifest.json"
    manifest = json.loads(path.read_text())
    with as_app(proxy, "test.caller.reader") as reader, proxy.anonymous() as anonymous:
        kept(anonymous, "/api/data/echo/open/x", proxy)
        kept(reader, "/api/data/echo/closed/x", proxy)
        # the open entry now needs the permission the reader holds: anonymous is refused
        closed = json.loads(json.dumps(manifest))
        closed["dataProvider"]["providers"][0]["readPerm"] = READ
        path.write_text(json.dumps(closed))
        proxy.on_loop(proxy.shell.registry.rescan([Scope.SYSTEM]))
        assert anonymous.get("/api/data/echo/open/x").status_code == 401
        # the provider goes: nobody reaches its authority
        shutil.move(system_apps / "test.sdk.echo", system_apps.parent / "echo-away")
        proxy.on_loop(proxy.shell.registry.rescan([Scope.SYSTEM]))
        gone = reader.get("/api/data/echo/closed/x")
        assert gone.status_code == 404, gone.text
        assert gone.json()["error"]["code"] == "no_provider"
        # back, with its manifest of before: allowed again at once (the registration is a new
        # instance's, so 200 or a 503 while it starts, never a refusal)
        shutil.move(system_apps.parent / "echo-away", system_apps / "test.sdk.echo")
        path.write_text(json.dumps(manifest))
        proxy.on_loop(proxy.shell.registry.rescan([Scope.SYSTEM]))
        again = anonymous.get("/api/data/echo/open/x")
        assert again.status_code in (200, 503), again.text


def test_a_users_own_provider_removed_is_gone_at_once(start_shell: StartShell, home: Path) -> None:
    shell = start_shell()
    bob = shell.add_user("bob")
    registry = shell.shell.registry
    shell.on_loop(registry.ensure_user("bob"))
    target = home / "scopes/users/bob/apps" / OWN_APP
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", target)
    manifest = json.loads((target / "app.manifest.json").read_text())
    manifest.update({"id": OWN_APP, "warmPool": False})
    manifest["dataProvider"] = {"authority": "own", "providers": [{"path": "/open"}]}
    (target / "app.manifest.json").write_text(json.dumps(manifest))
    shell.on_loop(registry.rescan([Scope.USER], user="bob"))
    with shell.client(bob, timeout=60) as b, shell.client() as alice:
        instance = b.post("/api/instances", json={"appId": OWN_APP}).json()
        assert b.post(f"/api/instances/{instance['instanceId']}/resumed").status_code == 200
        kept(b, "/api/data/own/open/x", shell)
        # bob's kept allow never serves alice, who sees no such app
        assert alice.get("/api/data/own/open/x").json()["error"]["code"] == "no_provider"
        shutil.rmtree(target)
        shell.on_loop(registry.rescan([Scope.USER], user="bob"))
        gone = b.get("/api/data/own/open/x")
        assert gone.status_code == 404, gone.text
        assert gone.json()["error"]["code"] == "no_provider"


def test_a_deleted_token_a_disabled_or_removed_user_is_refused_at_once(
    proxy: RunningShell,
) -> None:
    bob = proxy.add_user("bob")
    with proxy.client() as admin, proxy.client(bob, timeout=60) as b:
        serve_for(b)
        second = b.post("/api/tokens", json={"name": "second"}).json()
        kept(b, "/api/data/echo/closed/x", proxy)
        with proxy.client(second["token"]) as b2:
            kept(b2, "/api/data/echo/closed/x", proxy)
            assert b.delete(f"/api/tokens/{second['id']}").status_code in (200, 204)
            assert b2.get("/api/data/echo/closed/x").status_code == 401
        # a role change leaves a user's reach as it was (a user may every entry of theirs)
        assert admin.patch("/api/users/bob", json={"role": "admin"}).status_code == 200
        assert b.get("/api/data/echo/closed/x").status_code == 200
        assert admin.patch("/api/users/bob", json={"role": "member"}).status_code == 200
        kept(b, "/api/data/echo/closed/x", proxy)
        assert admin.patch("/api/users/bob", json={"disabled": True}).status_code == 200
        assert b.get("/api/data/echo/closed/x").status_code == 401
    carol = proxy.add_user("carol")
    with proxy.client() as admin, proxy.client(carol, timeout=60) as c:
        serve_for(c)
        kept(c, "/api/data/echo/closed/x", proxy)
        assert admin.delete("/api/users/carol").status_code in (200, 204)
        assert c.get("/api/data/echo/closed/x").status_code == 401


def test_a_destroyed_instances_token_is_refused_at_once(proxy: RunningShell) -> None:
    with proxy.client(timeout=60) as admin:
        made = admin.post("/api/instances", json={"appId": "test.plain.stdlib"}).json()
        instance_id = made["instanceId"]
        token = proxy.shell.app_tokens.issue("test.plain.stdlib", instance_id, "default")
        with proxy.client(token) as app:
            kept(app, "/api/data/echo/open/x", proxy)
            assert admin.delete(f"/api/instances/{instance_id}").status_code in (200, 204)
            assert app.get("/api/data/echo/open/x").status_code == 401


def test_one_callers_kept_allow_never_serves_another(
    proxy: RunningShell, system_apps: Path, home: Path
) -> None:
    """Apps with and without the permission, one app of two owners (bob's copy of the reader
    asks for nothing), anonymous: each is decided for itself on a path another was allowed."""
    path = "/api/data/echo/closed/x"
    bob = proxy.add_user("bob")
    registry = proxy.shell.registry
    proxy.on_loop(registry.ensure_user("bob"))
    bobs = home / "scopes/users/bob/apps"
    bobs.mkdir(parents=True, exist_ok=True)
    caller_app(bobs, "test.caller.reader", [])
    proxy.on_loop(registry.rescan([Scope.USER], user="bob"))
    with (
        as_app(proxy, "test.caller.reader") as reader,
        as_app(proxy, "test.caller.nobody") as nobody,
        as_app(proxy, "test.caller.reader", owner="bob") as bobs_reader,
        proxy.anonymous() as anonymous,
        proxy.client(bob, timeout=60) as b,
    ):
        kept(reader, path, proxy)
        assert nobody.get(path).status_code == 403
        assert bobs_reader.get(path).status_code == 403
        assert anonymous.get(path).status_code == 401
        # the user reaches it, for themself: bob's request goes to bob's provider instance
        assert b.get(path).json()["error"]["code"] == "provider_unavailable"
        serve_for(b)
        assert b.get(path).status_code == 200
        # a kept allow of one method is not another's
        assert reader.put(path, content=b"{}").status_code == 403
        # the assertions a request carries are checked against a kept decision too
        forged = nobody.get(path, headers={"X-Os-Caller-App-Id": "test.caller.reader"})
        assert forged.json()["error"]["code"] == "caller_mismatch"
        wrong = reader.get(path, headers={"X-Os-Permission": "test.sdk.echo.write"})
        assert wrong.status_code == 403
        assert wrong.json()["error"]["code"] == "permission_denied"
        assert reader.get(path, headers={"X-Os-Permission": READ}).status_code == 200


@pytest.mark.parametrize(
    ("variant", "status"),
    [
        # the stricter entry `/closed/deeper` (reads need `.deep`), spelled another way
        ("/api/data/echo/closed/%64eeper", 403),
        ("/api/data/echo/closed/DEEPER", 403),
        ("/api/data/echo/closed/x/%2e%2e/deeper", 400),
        ("/api/data/echo/closed/x/%2E%2e/deeper", 400),
        ("/api/data/echo/closed/x/../deeper", 400),
        ("/api/data/echo/closed//deeper", 400),
        ("/api/data/echo/closed/deeper;x", 400),
    ],
)
def test_another_spelling_of_a_path_is_decided_afresh(
    proxy: RunningShell, variant: str, status: int
) -> None:
    """The user's allow of `/closed/deeper` and the reader's of `/closed/x` are kept; the reader,
    without `.deep`, never rides on either through a spelling that reads as the deeper path."""
    with proxy.client() as user:
        kept(user, "/api/data/echo/closed/deeper", proxy)
    with as_app(proxy, "test.caller.reader") as reader:
        kept(reader, "/api/data/echo/closed/x", proxy)
        token = reader.headers["authorization"].removeprefix("Bearer ")
    for _ in range(2):  # and a refusal is never kept as anything else
        answer, body = raw_status(proxy, variant, token)
        assert answer == status, body


def test_a_flood_of_distinct_paths_keeps_the_map_bounded(
    start_shell: StartShell, system_apps: Path
) -> None:
    providers(system_apps)
    shell = ready(start_shell(data_decisions=16))
    with shell.anonymous() as anonymous:
        for n in range(200):
            assert anonymous.get(f"/api/data/echo/open/{n}").status_code == 200
            assert shell.shell.dataproxy.decisions_kept <= 16
        # a path longer than a key may be is decided every time, never kept
        before = shell.shell.dataproxy.decisions_kept
        long = "/api/data/echo/open/" + "y" * 600
        assert anonymous.get(long).status_code == 200
        assert shell.shell.dataproxy.decisions_kept == before


def test_a_shell_told_to_keep_none_keeps_none(start_shell: StartShell, system_apps: Path) -> None:
    providers(system_apps)
    shell = ready(start_shell(data_decisions=0))
    with shell.anonymous() as anonymous:
        for _ in range(2):
            assert anonymous.get("/api/data/echo/open/x").status_code == 200
        assert shell.shell.dataproxy.decisions_kept == 0
