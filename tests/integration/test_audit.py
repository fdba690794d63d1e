"""The audit log through the real shell: every state-changing call and every sign-in attempt is one
record (who, what, on which ids, how it ended, from where), an admin reads all and a member their
own, apps none; the file is private, old records are pruned and nothing secret is ever written."""

from __future__ import annotations

import json
import re
import shutil
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from atrium.cli.main import app
from atrium.identity import SESSION_COOKIE
from atrium.state.database import SQLITE_FILE
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell

pytestmark = pytest.mark.integration

ECHO = "test.sdk.echo"
PASSWORD = "a long enough password"
WRONG = "not the password at all"


@pytest.fixture
def audited(start_shell: StartShell, system_apps: Path) -> RunningShell:
    shutil.copytree(TESTS_DIR / "apps" / ECHO, system_apps / ECHO)
    return start_shell()


@pytest.fixture
def api(audited: RunningShell) -> Iterator[httpx.Client]:
    with audited.client(timeout=30) as client:
        yield client


def records(client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    answer = client.get("/api/audit", params=params)
    assert answer.status_code == 200, answer.text
    body: list[dict[str, Any]] = answer.json()
    return body


def one(found: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    matching = [r for r in found if all(r[k] == v for k, v in fields.items())]
    assert len(matching) == 1, (fields, found)
    return matching[0]


def state_file(shell: RunningShell) -> Path:
    """The embedded state database, where the audit table is."""
    return shell.settings.home / SQLITE_FILE


def file_bytes(shell: RunningShell) -> bytes:
    path = state_file(shell)
    return b"".join(
        p.read_bytes() for p in (path, path.with_name(path.name + "-wal")) if p.is_file()
    )


def test_a_launch_and_a_kv_write_by_the_admin_are_recorded(
    audited: RunningShell, api: httpx.Client
) -> None:
    launched = api.post("/api/instances", json={"appId": ECHO})
    assert launched.status_code == 200, launched.text
    instance_id = launched.json()["instanceId"]
    assert api.put("/api/kv/os/greeting", json={"value": "hello"}).status_code == 200
    denied = api.put("/api/kv/os/bad key", json={"value": 1})
    assert denied.status_code == 400
    api.get("/api/kv/os/greeting")  # a read is not recorded

    found = records(api)
    launch = one(found, action="instance.launch")
    assert launch["actor"] == "default"
    assert launch["target"] == f"app_id={ECHO},instance_id={instance_id}"
    assert (launch["outcome"], launch["status"], launch["error"]) == ("success", 200, None)
    assert launch["address"] == "127.0.0.1"
    assert launch["time"].endswith("Z")
    write = one(found, action="kv.put", target="key=greeting")
    assert (write["actor"], write["outcome"]) == ("default", "success")
    bad = one(found, action="kv.put", target="key=bad key")
    assert (bad["outcome"], bad["status"], bad["error"]) == ("failure", 400, "bad_request")
    assert not [r for r in found if r["action"] == "kv.get"]
    # newest first
    assert [r["id"] for r in found] == sorted((r["id"] for r in found), reverse=True)


def test_sign_in_attempts_are_recorded_and_no_secret_is_written(
    audited: RunningShell, api: httpx.Client
) -> None:
    made = api.post("/api/users", json={"id": "bob", "name": "Bob", "password": PASSWORD})
    assert made.status_code == 201, made.text
    secret_token = api.post("/api/tokens", json={"name": "ci"}).json()["token"]
    with httpx.Client(
        base_url=audited.url,
        transport=httpx.HTTPTransport(local_address="127.0.0.7"),
        headers={"Origin": audited.url},
        timeout=30,
    ) as browser:
        wrong_link = browser.get("/login?token=" + "w" * 43, follow_redirects=False)
        assert wrong_link.status_code == 401
        wrong = browser.post("/api/session", json={"user": "bob", "password": WRONG})
        assert wrong.status_code == 401
        # a password typed into the user field is not an account: never written
        typo = browser.post("/api/session", json={"user": "hunter2-typed", "password": WRONG})
        assert typo.status_code == 401
        good = browser.post("/api/session", json={"user": "bob", "password": PASSWORD})
        assert good.status_code == 200, good.text
        cookie = browser.cookies[SESSION_COOKIE]
        link = browser.get(f"/login?token={audited.token}", follow_redirects=False)
        assert link.status_code == 303
        bad_bearer = browser.post("/api/tokens", headers={"Authorization": "Bearer " + "q" * 40})
        assert bad_bearer.status_code == 401

    found = records(api)
    failed_link = one(found, action="session.link", outcome="failure")
    assert failed_link == failed_link | {
        "actor": "anonymous",
        "target": "",
        "status": 401,
        "error": "unauthenticated",
        "address": "127.0.0.7",
    }
    failed = [r for r in found if r["action"] == "session.create" and r["outcome"] == "failure"]
    assert {(r["actor"], r["target"], r["status"], r["address"]) for r in failed} == {
        ("anonymous", "user=bob", 401, "127.0.0.7"),
        ("anonymous", "", 401, "127.0.0.7"),
    }
    signed = one(found, action="session.create", outcome="success")
    assert (signed["actor"], signed["target"]) == ("bob", "user=bob")
    assert one(found, action="session.link", outcome="success")["actor"] == "default"
    anonymous = one(found, action="token.create", outcome="failure")
    assert (anonymous["actor"], anonymous["status"]) == ("anonymous", 401)

    written = file_bytes(audited)
    assert b"session.create" in written  # the records are in this file (with the sessions)
    for secret in (PASSWORD, WRONG, "hunter2-typed", audited.token, secret_token, cookie, "w" * 43):
        assert secret.encode() not in written, secret
    assert "q" * 40 not in json.dumps(found)


def test_a_member_reads_only_their_own_records_and_apps_none(
    audited: RunningShell, api: httpx.Client
) -> None:
    bob_token = audited.add_user("bob")
    assert api.put("/api/kv/os/mine", json={"value": 1}).status_code == 200
    with audited.client(bob_token) as bob:
        assert bob.put("/api/kv/os/his", json={"value": 2}).status_code == 200
        assert bob.get("/api/users").status_code == 403
        assert bob.delete("/api/users/default").status_code == 403
        own = records(bob)
        assert own
        assert {r["actor"] for r in own} == {"bob"}
        assert one(own, action="user.delete")["target"] == "user_id=default"
        assert records(bob, actor="default") == []
        assert records(bob, actor="bob", action="kv.put")[0]["target"] == "key=his"
    everyone = records(api)
    assert {"default", "bob"} <= {r["actor"] for r in everyone}
    assert records(api, actor="bob", action="user.delete")[0]["outcome"] == "failure"

    app_token = audited.shell.app_tokens.issue(ECHO, f"{ECHO}-1", "default")
    with audited.client(app_token) as an_app:
        refused = an_app.get("/api/audit")
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        an_app.put(f"/api/kv/app/{ECHO}/row", json={"value": 3})
    assert records(api, actor=f"app:{ECHO}/{ECHO}-1")[0]["action"] == "kv.put"


def test_filters_limits_and_bad_query_values(audited: RunningShell, api: httpx.Client) -> None:
    for n in range(5):
        assert api.put(f"/api/kv/os/k{n}", json={"value": n}).status_code == 200
    assert len(records(api, limit=2)) == 2
    assert [r["target"] for r in records(api, action="kv.put", limit=2)] == ["key=k4", "key=k3"]
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert records(api, since=later) == []
    assert len(records(api, since="2000-01-01T00:00:00Z", action="kv.put")) == 5
    for name, value in (("limit", "0"), ("limit", "many"), ("limit", "1001"), ("since", "May")):
        answer = api.get("/api/audit", params={name: value})
        assert answer.status_code == 400, (name, value)
        error = answer.json()["error"]
        assert error["code"] == "bad_request"
        assert error["problems"][0]["field"] == name


def test_the_file_is_private_and_pruning_drops_only_old_records(
    audited: RunningShell, api: httpx.Client
) -> None:
    assert api.put("/api/kv/os/now", json={"value": 1}).status_code == 200
    log = audited.shell.audit
    old = datetime.now(UTC) - timedelta(days=91)
    edge = datetime.now(UTC) - timedelta(days=89)

    async def backdate() -> None:
        log.append(actor="x", action="old", target="", status=200, address="", when=old)
        log.append(actor="x", action="recent", target="", status=200, address="", when=edge)

    audited.on_loop(backdate())
    assert {r["action"] for r in records(api, actor="x")} == {"old", "recent"}
    assert audited.on_loop(log.prune()) == 1
    assert {r["action"] for r in records(api, actor="x")} == {"recent"}
    assert one(records(api), action="kv.put", target="key=now")

    path = state_file(audited)
    for p in (path, path.with_name(path.name + "-wal")):
        if p.exists():
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_the_audit_cli(audited: RunningShell, api: httpx.Client) -> None:
    assert api.put("/api/kv/os/cli", json={"value": 1}).status_code == 200
    runner = CliRunner()
    env = {"ATRIUM_URL": audited.url, "ATRIUM_TOKEN": audited.token, "COLUMNS": "200"}
    result = runner.invoke(app, ["audit", "--action", "kv.put", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert [r["target"] for r in json.loads(result.stdout)] == ["key=cli"]
    table = runner.invoke(app, ["audit", "--limit", "1"], env=env)
    assert table.exit_code == 0, table.output
    assert "kv.put" in table.output
    assert "key=cli" in table.output
    bad = runner.invoke(app, ["audit", "--since", "yesterday"], env=env)
    assert bad.exit_code != 0
    assert "since" in bad.output


def anonymous_rows(shell: RunningShell) -> list[tuple[str, str, int]]:
    """(address, action, count) of every anonymous row in the file, read beside the shell."""
    import sqlite3

    with sqlite3.connect(f"file:{state_file(shell)}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT address, action, count FROM audit WHERE actor = 'anonymous'"
        ).fetchall()
    return [(a, b, int(c)) for a, b, c in rows]


def test_a_flood_of_refused_anonymous_calls_is_bounded_but_still_counted(
    audited: RunningShell, api: httpx.Client
) -> None:
    flood = 5000
    with httpx.Client(
        base_url=audited.url,
        transport=httpx.HTTPTransport(local_address="127.0.0.9"),
        timeout=30,
    ) as attacker:
        for _ in range(flood):
            assert attacker.post("/api/tokens", content=b"garbage").status_code == 401
    # the admin's own actions are all recorded, whatever came before
    for n in range(30):
        assert api.put(f"/api/kv/os/own{n}", json={"value": n}).status_code == 200
    mine = records(api, actor="default", limit=1000)
    assert {f"key=own{n}" for n in range(30)} <= {r["target"] for r in mine}

    seen = records(api, actor="anonymous", limit=1000)
    from_attacker = [r for r in seen if r["address"] == "127.0.0.9"]
    # the admin sees that it happened, from where, and how often
    assert sum(r["count"] for r in from_attacker) == flood
    assert {r["status"] for r in from_attacker} == {401}
    assert len(from_attacker) <= 25, len(from_attacker)
    rows = [r for r in anonymous_rows(audited) if r[0] == "127.0.0.9"]
    assert len(rows) <= 25
    assert sum(r[2] for r in rows) == flood

    # many addresses: a cap over all of them
    for last in range(10, 20):
        with httpx.Client(
            base_url=audited.url,
            transport=httpx.HTTPTransport(local_address=f"127.0.0.{last}"),
            timeout=30,
        ) as other:
            for _ in range(40):
                assert other.post("/api/tokens", content=b"x").status_code == 401
    records(api)  # the counts so far are written
    rows = anonymous_rows(audited)
    assert len(rows) <= 100 + 25 + 11, len(rows)
    assert sum(r[2] for r in rows) == flood + 400
    for last in range(10, 20):
        assert sum(r[2] for r in rows if r[0] == f"127.0.0.{last}") == 40


ACTION = re.compile(r"[a-z]+(\.[a-z_]+)+")


def test_every_state_changing_route_has_a_named_action(
    audited: RunningShell, api: httpx.Client
) -> None:
    document = api.get("/api/openapi.json").json()
    # append-only: nothing in the API changes or deletes a record
    assert set(document["paths"]["/api/audit"]) == {"get"}
    named: dict[str, set[str]] = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if method in {"get", "head", "options"}:
                continue
            action = operation.get("x-audit-action")
            assert isinstance(action, str), (method, path)
            assert ACTION.fullmatch(action), (method, path, action)
            named.setdefault(action, set()).add(operation["operationId"].split("_", 1)[1])
    # one action is one route's name (kv.put is the same handler on two paths)
    assert all(len(routes) == 1 for routes in named.values()), named
    assert {"session.create", "session.delete", "user.create", "app.install", "kv.put"} <= set(
        named
    )

    assert api.put("/api/kv/os/named", json={"value": 1}).status_code == 200
    assert one(records(api, action="kv.put"), target="key=named")["actor"] == "default"
    assert records(api, action="put_value") == []


def test_install_update_and_uninstall_records_name_the_app(
    audited: RunningShell, api: httpx.Client, tmp_path: Path
) -> None:
    folder = tmp_path / ECHO
    shutil.copytree(TESTS_DIR / "apps" / ECHO, folder)
    body = {"ref": f"local:{folder}", "scope": "user", "autoApprove": True}
    installed = api.post("/api/dist/install", json=body)
    assert installed.status_code == 200, installed.text
    version = installed.json()["record"]["version"]
    record = one(records(api), action="app.install")
    assert f"app_id={ECHO}" in record["target"]
    assert f"version={version}" in record["target"]
    assert "scope=user" in record["target"]
    assert str(folder) not in record["target"]  # the ref is the body's, never written

    # the same through the event stream: the record is written once the stream has ended
    streamed = api.post("/api/dist/install", json=body, headers={"Accept": "text/event-stream"})
    assert streamed.status_code == 200
    assert "result" in streamed.text
    installs = [r for r in records(api) if r["action"] == "app.install"]
    assert len(installs) == 2
    assert f"app_id={ECHO}" in installs[0]["target"]

    gone = api.delete(f"/api/dist/uninstall/{ECHO}", params={"scope": "user"})
    assert gone.status_code == 200, gone.text
    removed = one(records(api), action="app.uninstall")
    assert removed["target"] == f"app_id={ECHO},scope=user"
