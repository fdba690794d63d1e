"""Accounts through the real shell: `/api/me`, the admin's `/api/users…`, what disabling and
deleting a user do (sign-ins and tokens end at once, instances stop, the scope goes to
lost+found), personal tokens, and the `atrium users` / `atrium tokens` CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from atrium.cli.main import app
from tests.integration.conftest import DEADLINE, RunningShell, SseReader, wait_for

pytestmark = pytest.mark.integration

NOTES = "com.atrium.notes"
PASSWORD = "a long enough password"


@pytest.fixture
def bob(shell: RunningShell) -> Iterator[httpx.Client]:
    with shell.client(shell.add_user("bob", name="Bob")) as client:
        yield client


def start_owned(shell: RunningShell, owner: str) -> str:
    """An instance of the notes app owned by ``owner``, booted through the lifecycle."""

    async def start() -> str:
        lifecycle = shell.shell.lifecycle
        instance = lifecycle.new_instance(NOTES, owner=owner)
        await lifecycle.boot(instance)
        return instance.id

    instance_id: str = shell.on_loop(start())
    return instance_id


def live_ids(shell: RunningShell) -> set[str]:
    return {i.id for i in shell.shell.lifecycle.all()}


def error(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()["error"]
    assert body["code"] == code, body
    return body


def test_me_answers_who_is_calling(
    shell: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    assert api.get("/api/me").json() == {"id": "default", "name": "default", "role": "admin"}
    assert bob.get("/api/me").json() == {"id": "bob", "name": "Bob", "role": "member"}
    with shell.anonymous() as anonymous:
        error(anonymous.get("/api/me"), 401, "unauthenticated")


def test_an_app_is_not_a_user_at_api_me(shell: RunningShell) -> None:
    instance_id = start_owned(shell, "default")
    token = next(
        t for t, c in shell.shell.app_tokens._by_token.items() if c.instance_id == instance_id
    )
    with shell.client(token) as app_client:
        error(app_client.get("/api/me"), 403, "permission_denied")
        error(app_client.get("/api/tokens"), 403, "permission_denied")


def test_the_admin_adds_lists_changes_and_reads_users(api: httpx.Client) -> None:
    made = api.post("/api/users", json={"id": "carol", "name": "Carol", "password": PASSWORD})
    assert made.status_code == 201, made.text
    assert made.json() | {"createdAt": None} == {
        "id": "carol",
        "name": "Carol",
        "role": "member",
        "disabled": False,
        "createdAt": None,
        "hasPassword": True,
    }
    assert [u["id"] for u in api.get("/api/users").json()] == ["carol", "default"]
    changed = api.patch("/api/users/carol", json={"name": "Carol C.", "role": "admin"})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["name"], changed.json()["role"]) == ("Carol C.", "admin")
    assert api.get("/api/users/carol").json()["role"] == "admin"
    error(api.get("/api/users/nobody"), 404, "not_found")
    error(api.post("/api/users", json={"id": "carol"}), 409, "user_exists")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": "Bad Id"}, "id"),
        ({"id": "-x"}, "id"),
        ({"id": "a" * 33}, "id"),
        ({"id": "dave", "role": "owner"}, "role"),
        ({"id": "dave", "password": "short"}, "password"),
        ({"id": "dave", "name": ""}, "name"),
        ({"id": "dave", "colour": "red"}, "colour"),
        ({}, "id"),
    ],
)
def test_a_bad_new_user_is_400_naming_the_field(
    api: httpx.Client, body: dict[str, Any], field: str
) -> None:
    answer = error(api.post("/api/users", json=body), 400, "bad_request")
    fields = [p["field"] for p in answer.get("problems", [])] or [answer["field"]]
    assert field in fields, answer
    assert [u["id"] for u in api.get("/api/users").json()] == ["default"]  # nothing half done


def test_a_member_gets_403_on_every_admin_route(bob: httpx.Client) -> None:
    for method, path, body in [
        ("GET", "/api/users", None),
        ("POST", "/api/users", {"id": "eve"}),
        ("GET", "/api/users/default", None),
        ("PATCH", "/api/users/default", {"disabled": True}),
        ("DELETE", "/api/users/default", None),
        ("PUT", "/api/users/default/password", {"password": PASSWORD}),
    ]:
        error(bob.request(method, path, json=body), 403, "permission_denied")


def test_the_last_enabled_admin_cannot_be_disabled_demoted_or_deleted(api: httpx.Client) -> None:
    error(api.patch("/api/users/default", json={"disabled": True}), 409, "last_admin")
    error(api.patch("/api/users/default", json={"role": "member"}), 409, "last_admin")
    error(api.delete("/api/users/default"), 409, "bootstrap_admin")
    assert api.get("/api/me").json()["role"] == "admin"


def test_disabling_ends_sign_ins_and_tokens_at_once_and_stops_instances(
    shell: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    assert bob.get("/api/me").status_code == 200
    theirs = start_owned(shell, "bob")
    mine = start_owned(shell, "default")
    assert {theirs, mine} <= live_ids(shell)
    disabled = api.patch("/api/users/bob", json={"disabled": True})
    assert disabled.status_code == 200, disabled.text
    assert disabled.json()["disabled"] is True
    assert disabled.json()["stoppedInstances"] == [theirs]
    error(bob.get("/api/me"), 401, "unauthenticated")
    assert theirs not in live_ids(shell)
    assert mine in live_ids(shell)  # another user's instance runs on
    # enabling does not bring the old token back
    assert api.patch("/api/users/bob", json={"disabled": False}).json()["disabled"] is False
    error(bob.get("/api/me"), 401, "unauthenticated")


def test_deleting_stops_instances_and_moves_the_scope_to_lost_and_found(
    shell: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    home = shell.settings.home
    data = home / "scopes" / "users" / "bob" / "apps" / NOTES / "x-1" / "note.txt"
    data.parent.mkdir(parents=True)
    data.write_text("bob's note")
    theirs = start_owned(shell, "bob")
    answer = api.delete("/api/users/bob")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["stoppedInstances"] == [theirs]
    assert theirs not in live_ids(shell)
    moved = home / body["lostAndFound"]
    assert moved.parent == home / "lost+found" / "users"
    assert moved.name.startswith("bob-")
    assert (moved / "apps" / NOTES / "x-1" / "note.txt").read_text() == "bob's note"
    assert not (home / "scopes" / "users" / "bob").exists()
    error(bob.get("/api/me"), 401, "unauthenticated")
    error(api.get("/api/users/bob"), 404, "not_found")
    # the id may be used again: a new, empty account; the old data stays in lost+found
    again = api.post("/api/users", json={"id": "bob"})
    assert again.status_code == 201, again.text
    assert not (home / "scopes" / "users" / "bob" / "apps").exists()
    assert (moved / "apps" / NOTES / "x-1" / "note.txt").is_file()


def test_a_scope_folder_left_under_a_new_id_is_set_aside_not_inherited(
    shell: RunningShell, api: httpx.Client
) -> None:
    home = shell.settings.home
    left = home / "scopes" / "users" / "erin" / "apps" / "secret.txt"
    left.parent.mkdir(parents=True)
    left.write_text("someone else's")
    assert api.post("/api/users", json={"id": "erin"}).status_code == 201
    assert not left.exists()
    (found,) = (home / "lost+found" / "users").iterdir()
    assert (found / "apps" / "secret.txt").read_text() == "someone else's"


def test_personal_tokens_are_shown_once_listed_and_deleted(
    shell: RunningShell, bob: httpx.Client
) -> None:
    made = bob.post("/api/tokens", json={"name": "laptop", "expiresInDays": 30})
    assert made.status_code == 201, made.text
    body = made.json()
    secret = body["token"]
    expires = datetime.fromisoformat(body["expiresAt"].replace("Z", "+00:00"))
    assert timedelta(days=29) < expires - datetime.now(UTC) <= timedelta(days=30)
    listed = bob.get("/api/tokens").json()
    assert "laptop" in [t["name"] for t in listed]
    assert all("token" not in t for t in listed)  # shown once
    with shell.client(secret) as laptop:
        assert laptop.get("/api/me").json()["id"] == "bob"
        # another user's token id answers as a missing one
        with shell.client(shell.add_user("carol")) as carol:
            missing = error(carol.delete(f"/api/tokens/{body['id']}"), 404, "not_found")
            assert missing["id"] == body["id"]
        assert bob.delete(f"/api/tokens/{body['id']}").status_code == 200
        error(laptop.get("/api/me"), 401, "unauthenticated")
    error(bob.delete(f"/api/tokens/{body['id']}"), 404, "not_found")
    for bad in (
        {"name": ""},
        {"name": "x", "expiresInDays": 0},
        {"name": "x", "expiresInDays": "a"},
    ):
        error(bob.post("/api/tokens", json=bad), 400, "bad_request")


def test_an_expired_token_is_401(shell: RunningShell, bob: httpx.Client) -> None:
    made = bob.post("/api/tokens", json={"name": "short", "expiresInDays": 1}).json()
    users = shell.shell.users

    async def age() -> None:  # its day passes (the store's own record of it, nothing else)
        for key, token in list(users._tokens.items()):
            if token.id == made["id"]:
                users._tokens[key] = token.__class__(
                    token.id, token.user_id, token.name, token.created_at, "2000-01-01T00:00:00Z"
                )

    shell.on_loop(age())
    with shell.client(made["token"]) as expired:
        error(expired.get("/api/me"), 401, "unauthenticated")


# ---- CLI ------------------------------------------------------------------------------------


@pytest.fixture
def cli(shell: RunningShell, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("ATRIUM_URL", shell.url)
    monkeypatch.setenv("ATRIUM_TOKEN", shell.token)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def run(cli: CliRunner, *args: str, input: str | None = None) -> Any:
    result = cli.invoke(app, list(args), input=input)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result.output


def test_the_users_cli_adds_sets_disables_enables_and_removes(
    shell: RunningShell, cli: CliRunner
) -> None:
    made = run(cli, "users", "add", "frank", "--name", "Frank", "--role", "member", "--json")
    assert (made["id"], made["name"], made["role"]) == ("frank", "Frank", "member")
    assert "frank" in run(cli, "users", "list")
    assert [u["id"] for u in run(cli, "users", "list", "--json")] == ["default", "frank"]
    assert run(cli, "users", "set", "frank", "--role", "admin", "--json")["role"] == "admin"
    assert run(cli, "users", "disable", "frank", "--json")["disabled"] is True
    assert run(cli, "users", "enable", "frank", "--json")["disabled"] is False
    # the password is asked twice, never taken as an argument
    typed = f"{PASSWORD}\n{PASSWORD}\n"
    assert run(cli, "users", "passwd", "frank", "--json", input=typed)["hasPassword"] is True
    with shell.anonymous() as browser:
        signed = browser.post("/api/session", json={"user": "frank", "password": PASSWORD})
        assert signed.status_code == 200, signed.text
    mismatch = cli.invoke(app, ["users", "passwd", "frank"], input=f"{PASSWORD}\nother one!\n")
    assert mismatch.exit_code != 0
    assert run(cli, "users", "remove", "frank", "--json")["user"] == "frank"
    failed = cli.invoke(app, ["users", "remove", "default"])
    assert failed.exit_code == 1
    assert failed.output.startswith("error: bootstrap_admin")


def test_a_member_uses_the_cli_with_a_personal_token(
    shell: RunningShell, cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token = shell.add_user("gina", name="Gina")
    monkeypatch.setenv("ATRIUM_TOKEN", token)
    assert run(cli, "users", "me", "--json") == {"id": "gina", "name": "Gina", "role": "member"}
    made = run(cli, "tokens", "add", "ci", "--days", "7", "--json")
    assert made["token"]
    assert made["expiresAt"]
    assert "ci" in [t["name"] for t in run(cli, "tokens", "list", "--json")]
    assert run(cli, "tokens", "remove", made["id"], "--json")["id"] == made["id"]
    assert "ci" not in [t["name"] for t in run(cli, "tokens", "list", "--json")]
    denied = cli.invoke(app, ["users", "list"])
    assert denied.exit_code == 1
    assert denied.output.startswith("error: permission_denied")
    # --token wins over ATRIUM_TOKEN, for every command
    monkeypatch.delenv("ATRIUM_TOKEN")
    monkeypatch.setenv("ATRIUM_HOME", str(tmp_path / "no-home"))
    assert run(cli, "--token", token, "users", "me", "--json")["id"] == "gina"
    assert run(cli, "--token", token, "apps", "--json")
    no_token = cli.invoke(app, ["users", "me"])
    assert no_token.exit_code == 1


def test_a_personal_token_cannot_widen_its_own_reach(
    shell: RunningShell, bob: httpx.Client
) -> None:
    """A leaked token that expires cannot mint a successor that lives longer, nor give an account
    without a password a first one (a way in that would outlive it)."""
    week = bob.post("/api/tokens", json={"name": "week", "expiresInDays": 7}).json()
    with shell.client(week["token"]) as leaked:
        for body in ({"name": "forever"}, {"name": "month", "expiresInDays": 30}):
            refused = error(leaked.post("/api/tokens", json=body), 400, "bad_request")
            assert refused["problems"][0]["field"] == "expiresInDays"
        assert (
            leaked.post("/api/tokens", json={"name": "day", "expiresInDays": 1}).status_code == 201
        )
        error(leaked.put("/api/me/password", json={"password": PASSWORD}), 403, "permission_denied")
    assert shell.shell.users.password_hash("bob") is None


def test_an_open_event_stream_ends_with_the_sign_in_it_was_opened_with(
    shell: RunningShell, api: httpx.Client
) -> None:
    """Disabling a user, deleting their token or ending their session ends their streams too:
    an open stream is not a way to keep hearing after the credential ended."""
    dave = shell.add_user("dave")
    spare = shell.add_user("erin")
    with shell.client(dave) as by_token, shell.client(spare) as other:
        disabled = SseReader(by_token)
        deleted = SseReader(other)
        assert api.patch("/api/users/dave", json={"disabled": True}).status_code == 200
        assert disabled.ended.wait(DEADLINE), "a disabled user's stream went on"
        (token,) = other.get("/api/tokens").json()
        second = other.post("/api/tokens", json={"name": "second"}).json()["token"]
        with shell.client(second) as kept:
            still = SseReader(kept)
            assert other.delete(f"/api/tokens/{token['id']}").status_code == 200
            assert deleted.ended.wait(DEADLINE), "a deleted token's stream went on"
            assert not still.ended.is_set()  # the user's other token streams on
    with shell.anonymous(headers={"Origin": shell.url}) as page:
        assert api.post("/api/users", json={"id": "fay", "password": PASSWORD}).status_code == 201
        signed = page.post("/api/session", json={"user": "fay", "password": PASSWORD})
        assert signed.status_code == 200, signed.text
        by_cookie = SseReader(page)
        assert page.delete("/api/session").status_code == 200
        assert by_cookie.ended.wait(DEADLINE), "a signed-out cookie's stream went on"


def test_an_id_added_again_while_its_deletion_runs_keeps_its_new_folder(
    shell: RunningShell, api: httpx.Client
) -> None:
    """A delete sets the scope aside after ending the user's instances; an add of the same id
    arriving meanwhile must not have its new folder moved by the delete still running."""
    shell.add_user("hana")
    home = shell.settings.home
    old = home / "scopes" / "users" / "hana" / "apps" / "old.txt"
    old.parent.mkdir(parents=True)
    old.write_text("before")
    start_owned(shell, "hana")
    with ThreadPoolExecutor(1) as pool:
        deleting = pool.submit(api.delete, "/api/users/hana")
        wait_for(lambda: shell.shell.users.get("hana") is None, "the account removed")
        again = api.post("/api/users", json={"id": "hana"})
        assert again.status_code == 201, again.text
        new = home / "scopes" / "users" / "hana" / "apps" / "new.txt"
        new.parent.mkdir(parents=True, exist_ok=True)
        new.write_text("after")
        assert deleting.result().status_code == 200
    assert new.read_text() == "after"
    moved = [p.read_text() for p in (home / "lost+found" / "users").glob("hana-*/apps/*.txt")]
    assert moved == ["before"]


def test_a_member_changes_their_own_password_with_the_cli(
    shell: RunningShell, api: httpx.Client, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = shell.add_user("ivan")
    assert api.put("/api/users/ivan/password", json={"password": PASSWORD}).status_code == 200
    monkeypatch.setenv("ATRIUM_TOKEN", token)
    new = "ivan's own new password"
    wrong = cli.invoke(app, ["users", "passwd", "ivan"], input=f"not it at all\n{new}\n{new}\n")
    assert wrong.exit_code == 1
    assert "permission_denied" in wrong.output
    typed = f"{PASSWORD}\n{new}\n{new}\n"
    assert run(cli, "users", "passwd", "ivan", "--json", input=typed)["id"] == "ivan"
    with shell.anonymous() as script:
        assert (
            script.post("/api/session", json={"user": "ivan", "password": new}).status_code == 200
        )
