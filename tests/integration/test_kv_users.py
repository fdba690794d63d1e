"""The key-value store with several users, through the real shell: `os` and `app/<appId>` rows are
each user's own (an app's are its owner's), `global` holds the platform defaults an admin writes
and everyone reads, the theme is each user's own over the global default, and a file made before
rows had owners gives its rows to the bootstrap admin."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atrium.bus import EventBus
from atrium.kv import KvStore, salvage
from atrium.settings import ConfigError
from atrium.state.versions import open_checked
from tests.conftest import TESTS_DIR
from tests.integration.conftest import (
    RunningShell,
    SseReader,
    StartShell,
    fill_disk,
    run_async,
    tmpfs,
    wait_for,
)
from tests.integration.test_origins import enter

pytestmark = pytest.mark.integration

ECHO = "test.sdk.echo"


@pytest.fixture
def two(start_shell: StartShell, system_apps: Path) -> RunningShell:
    shutil.copytree(TESTS_DIR / "apps" / ECHO, system_apps / ECHO)
    return start_shell()


@pytest.fixture
def bob(two: RunningShell) -> Iterator[httpx.Client]:
    with two.client(two.add_user("bob")) as client:
        yield client


@pytest.fixture
def api(two: RunningShell) -> Iterator[httpx.Client]:
    with two.client() as client:
        yield client


def app_client(shell: RunningShell, owner: str) -> httpx.Client:
    return shell.client(shell.shell.app_tokens.issue(ECHO, f"{ECHO}-{owner}", owner))


def test_each_user_reads_and_writes_only_their_own_os_and_app_rows(
    api: httpx.Client, bob: httpx.Client
) -> None:
    assert api.put("/api/kv/os/x", json={"value": "alice's"}).status_code == 200
    assert bob.put("/api/kv/os/x", json={"value": "bob's"}).status_code == 200
    assert api.put("/api/kv/os/only-a", json={"value": 1}).status_code == 200
    assert api.put(f"/api/kv/app/{ECHO}/k", json={"value": "a"}).status_code == 200
    assert api.get("/api/kv/os/x").json()["value"] == "alice's"
    assert bob.get("/api/kv/os/x").json()["value"] == "bob's"
    # another user's key answers exactly as a missing one, for reads and deletes
    missing = bob.get("/api/kv/os/only-a")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert bob.get("/api/kv/os/never").json()["error"] == missing.json()["error"] | {
        "id": "os/never",
        "message": missing.json()["error"]["message"].replace("only-a", "never"),
    }
    assert bob.get(f"/api/kv/app/{ECHO}/k").status_code == 404
    assert bob.delete("/api/kv/os/only-a").status_code == 404
    assert api.get("/api/kv/os/only-a").json()["value"] == 1
    assert bob.delete("/api/kv/os/x").status_code == 200
    assert api.get("/api/kv/os/x").json()["value"] == "alice's"


def test_an_app_reads_and_writes_its_owners_rows(two: RunningShell, bob: httpx.Client) -> None:
    with two.client() as api, app_client(two, "bob") as bobs_app:
        assert api.put(f"/api/kv/app/{ECHO}/k", json={"value": "alice's"}).status_code == 200
        assert bobs_app.get(f"/api/kv/app/{ECHO}/k").status_code == 404
        assert bobs_app.put(f"/api/kv/app/{ECHO}/k", json={"value": "bob's"}).status_code == 200
        assert bob.get(f"/api/kv/app/{ECHO}/k").json()["value"] == "bob's"
        assert api.get(f"/api/kv/app/{ECHO}/k").json()["value"] == "alice's"
        # the permission rules are today's: os keys still need the manifest's permission
        denied = bobs_app.get("/api/kv/os/x")
        assert denied.status_code == 403
        assert denied.json()["error"]["permission"] == "system.kv.os.x.read"
        with app_client(two, two.settings.user) as alices_app:
            assert alices_app.get(f"/api/kv/app/{ECHO}/k").json()["value"] == "alice's"


def test_global_defaults_are_an_admins_to_write_and_everyones_to_read(
    two: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    refused = bob.put("/api/kv/global/motd", json={"value": "bob was here"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    assert bob.delete("/api/kv/global/motd").status_code == 403
    with app_client(two, two.settings.user) as app:
        by_app = app.put("/api/kv/global/motd", json={"value": "an app"})
        assert by_app.status_code == 403
        assert by_app.json()["error"]["code"] == "permission_denied"
        # reading a default takes the read permission of the os key it defaults
        assert app.get("/api/kv/global/motd").json()["error"]["permission"] == (
            "system.kv.os.motd.read"
        )
    assert api.put("/api/kv/global/motd", json={"value": "hello"}).status_code == 200
    assert bob.get("/api/kv/global/motd").json()["value"] == "hello"
    assert api.get("/api/kv/global/motd").json()["value"] == "hello"
    assert api.get("/api/kv/os/motd").status_code == 404  # a default is not anyone's own row
    assert api.delete("/api/kv/global/motd").json() == {
        "ok": True,
        "namespace": "global",
        "key": "motd",
    }
    assert bob.get("/api/kv/global/motd").status_code == 404


def test_a_users_theme_overrides_the_global_default_for_them_alone(
    two: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    default = api.get("/api/os/theme").json()
    assert default["colorMode"] == "auto"
    alice_stream = SseReader(api, {"topics": "theme:changed"})
    bob_stream = SseReader(bob, {"topics": "theme:changed"})
    # the platform default: every user without a choice of their own follows it
    assert api.put("/api/kv/global/theme", json={"value": {"colorMode": "dark"}}).status_code == 200
    assert bob.get("/api/os/theme").json()["colorMode"] == "dark"
    assert api.get("/api/os/theme").json()["colorMode"] == "dark"
    wait_for(lambda: alice_stream.of("theme:changed"), "alice hears the new default")
    wait_for(lambda: bob_stream.of("theme:changed"), "bob hears the new default")
    # bob's own choice: his alone
    chosen = bob.post("/api/os/themes/select", json={"colorMode": "light"})
    assert chosen.status_code == 200, chosen.text
    assert bob.get("/api/os/theme").json()["colorMode"] == "light"
    assert api.get("/api/os/theme").json()["colorMode"] == "dark"
    assert "color-scheme: light;" in bob.get("/api/os/theme.css").text
    assert "color-scheme: dark;" in api.get("/api/os/theme.css").text
    wait_for(lambda: len(bob_stream.of("theme:changed")) == 2, "bob hears his choice")
    assert bob_stream.of("theme:changed")[1].data["colorMode"] == "light"
    # a new default no longer moves bob, and bob's choice never reached alice
    assert api.put("/api/kv/global/theme", json={"value": {"colorMode": "auto"}}).status_code == 200
    wait_for(lambda: len(alice_stream.of("theme:changed")) == 2, "alice hears the default")
    assert [e.data["colorMode"] for e in alice_stream.of("theme:changed")] == ["dark", "auto"]
    assert bob.get("/api/os/theme").json()["colorMode"] == "light"
    # his app's pages get his theme, and a page nobody signed in to the platform default
    with app_client(two, "bob") as bobs_app:
        assert bobs_app.get("/api/os/theme").json()["colorMode"] == "light"
        assert "color-scheme: light;" in bobs_app.get("/api/os/theme.css").text
    with two.anonymous() as nobody:
        assert "color-scheme: light dark;" in nobody.get("/api/os/theme.css").text
    assert [e.data["colorMode"] for e in bob_stream.of("theme:changed")] == ["dark", "light"]


# --- a file made before rows had owners -----------------------------------------------------------

OLD_SCHEMA = """
CREATE TABLE kv (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
"""
OLD_ROWS = [
    ("os", "x", json.dumps("old value"), "2026-01-01T00:00:00.000Z"),
    (f"app/{ECHO}", "k", json.dumps({"n": 1}), "2026-01-02T00:00:00.000Z"),
    ("os", "theme", json.dumps({"colorMode": "dark"}), "2026-01-03T00:00:00.000Z"),
]


def old_file(path: Path) -> None:
    """A KV file as the shell wrote it before rows had owners (WAL, the same table without
    the owner column)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(OLD_SCHEMA)
    conn.executemany("INSERT INTO kv VALUES (?, ?, ?, ?)", OLD_ROWS)
    conn.close()
    path.chmod(0o600)


def test_the_rows_of_an_older_file_become_the_bootstrap_admins(
    start_shell: StartShell, home: Path, system_apps: Path
) -> None:
    shutil.copytree(TESTS_DIR / "apps" / ECHO, system_apps / ECHO)
    old_file(home / "kv.sqlite3")
    shell = start_shell()
    with shell.client() as api, shell.client(shell.add_user("bob")) as bob:
        got = api.get("/api/kv/os/x").json()
        assert got == {"value": "old value", "updatedAt": "2026-01-01T00:00:00.000Z"}
        assert api.get(f"/api/kv/app/{ECHO}/k").json()["value"] == {"n": 1}
        assert api.get("/api/os/theme").json()["colorMode"] == "dark"  # the admin's choice kept
        assert bob.get("/api/kv/os/x").status_code == 404
        assert bob.get("/api/os/theme").json()["colorMode"] == "auto"  # not the admin's choice
        assert api.put("/api/kv/os/x", json={"value": "new"}).status_code == 200
    shell.stop()
    conn = sqlite3.connect(home / "state.sqlite3")
    rows = conn.execute(
        "SELECT owner, namespace, key FROM kv WHERE owner NOT LIKE '#%' ORDER BY namespace, key"
    ).fetchall()
    conn.close()
    admin = shell.settings.user
    assert rows == [(admin, f"app/{ECHO}", "k"), (admin, "os", "theme"), (admin, "os", "x")]
    assert not (home / "kv.sqlite3").exists()  # moved aside, never deleted
    assert len(list(home.glob("kv.sqlite3.moved-*"))) == 1
    # a second start finds the rows moved and changes nothing
    again = start_shell()
    with again.client() as api:
        assert api.get("/api/kv/os/x").json()["value"] == "new"
    again.stop()


def test_repair_salvages_an_older_file_into_the_bootstrap_admins_rows(tmp_path: Path) -> None:
    path = tmp_path / "kv.sqlite3"
    old_file(path)
    kept, aside = salvage(path, "stamp", "alice")
    assert kept == len(OLD_ROWS)
    assert aside.exists()
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT owner, namespace, key, value FROM kv ORDER BY key").fetchall()
    conn.close()
    assert rows == sorted(
        [("alice", ns, key, value) for ns, key, value, _ in OLD_ROWS], key=lambda r: r[2]
    )


def test_a_removed_users_rows_are_set_aside_and_a_new_user_of_that_id_starts_empty(
    two: RunningShell, api: httpx.Client
) -> None:
    with two.client(two.add_user("bob")) as bob:
        assert bob.put("/api/kv/os/x", json={"value": "old bob's"}).status_code == 200
        assert bob.post("/api/os/themes/select", json={"colorMode": "dark"}).status_code == 200
    two.on_loop(two.shell.users.remove("bob"))
    with two.client(two.add_user("bob")) as new_bob:
        wait_for(lambda: new_bob.get("/api/kv/os/x").status_code == 404, "old bob's row gone")
        assert new_bob.get("/api/os/theme").json()["colorMode"] == "auto"
    # nothing was deleted: the rows stay in the file, out of every user's reach
    conn = sqlite3.connect(two.settings.home / "state.sqlite3")
    owners = [r[0] for r in conn.execute("SELECT owner FROM kv WHERE key = 'x'").fetchall()]
    conn.close()
    assert len(owners) == 1
    assert owners[0].startswith("bob#removed-")


def test_a_grantee_sees_an_instance_in_their_own_theme(
    two: RunningShell, api: httpx.Client, bob: httpx.Client
) -> None:
    assert api.post("/api/os/themes/select", json={"colorMode": "dark"}).status_code == 200
    assert bob.post("/api/os/themes/select", json={"colorMode": "light"}).status_code == 200
    started = api.post("/api/instances", json={"appId": ECHO, "new": True})
    assert started.status_code == 200, started.text
    instance_id = started.json()["instanceId"]
    granted = api.post(
        f"/api/instances/{instance_id}/grants", json={"user": "bob", "role": "viewer"}
    )
    assert granted.status_code == 201, granted.text
    for client, scheme in ((api, "color-scheme: dark;"), (bob, "color-scheme: light;")):
        view = client.post(f"/api/instances/{instance_id}/views", json={})
        assert view.status_code == 200, view.text
        page, _ = enter(two, view.json()["url"])
        css = page.get("/_os/api/os/theme.css")
        page.close()
        assert css.status_code == 200, css.text
        assert scheme in css.text


def test_a_move_that_meets_a_full_disk_changes_nothing_and_runs_again(home: Path) -> None:
    """The move into the state database is one transaction: a full disk midway refuses the
    start with the file named, the old file stays whole where it was, and once space is freed
    the next open moves it."""
    with tmpfs(home, 16) as disk:
        path = disk / "kv.sqlite3"
        old_file(path)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO kv VALUES ('os', ?, ?, '2026-01-01T00:00:00.000Z')",
            [(f"k{n:04d}", json.dumps("v" * 1000)) for n in range(1000)],
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        filler = fill_disk(disk, leave=512 * 1024)  # enough to open, not to copy the rows
        with pytest.raises(
            ConfigError, match=f"the KV store {path} cannot be moved into .*: the disk holding"
        ):
            run_async(open_and_read(path))
        filler.unlink()
        conn = sqlite3.connect(path)
        columns = [row[1] for row in conn.execute("PRAGMA table_info(kv)")]
        count = conn.execute("SELECT count(*) FROM kv").fetchone()[0]
        conn.close()
        assert "owner" not in columns
        assert count == 1000 + len(OLD_ROWS)
        assert run_async(open_and_read(path)) == ("old value", 1000 + len(OLD_ROWS))


async def open_and_read(path: Path) -> tuple[object, int]:
    """Open the store on a state database beside ``path``, moving ``path`` into it."""
    async with (
        EventBus() as bus,
        open_checked(f"sqlite+aiosqlite:///{path.parent / 'state.sqlite3'}") as db,
        KvStore.open(db, bus=bus, user="alice", moved_from=path) as kv,
    ):
        entry = await kv.get("os", "x", owner="alice")
        assert entry is not None
        return entry.value, len(await kv.keys("os", owner="alice")) + 1
