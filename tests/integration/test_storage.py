"""The shell's own storage through real `atrium serve` processes (issues 13 and 14): one home, one
shell; private modes under ``$ATRIUM_HOME``; a damaged KV file or scope repository refused at start
with one line; damaged pages and a full disk met at run time answered with storage error codes."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_DIR
from tests.integration.conftest import fill_disk, serve_env, serving, tmpfs
from tests.integration.test_serve import serve_refused

pytestmark = pytest.mark.integration


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# --- one home, one shell (issue 14 row 7) -------------------------------------------------------


def test_a_second_serve_on_a_home_in_use_refuses_and_names_the_running_shell(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with serving(home) as first:
        token_before = (home / "run" / "token").read_text()
        [line] = serve_refused(home)
        assert f"ATRIUM_HOME / --home '{home}' is in use by the shell at {first.url}" in line
        assert f"(pid {first.proc.pid})" in line
        # nothing of the first shell's was touched: the CLI still reaches it through the home
        assert (home / "run" / "token").read_text() == token_before
        assert (home / "run" / "url").read_text().strip() == first.url
        result = subprocess.run(
            [sys.executable, "-m", "atrium", "apps"],
            env=serve_env(home),
            cwd=REPO_DIR,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        assert "com.atrium.notes" in result.stdout


def test_the_same_port_on_a_home_in_use_names_the_shell_not_the_port(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with serving(home) as first:
        port = first.url.rsplit(":", 1)[1]
        [line] = serve_refused(home, ATRIUM_PORT=port)
        assert "is in use by the shell at" in line
        assert "already in use" not in line


def test_a_home_whose_shell_was_killed_starts_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with serving(home) as first:
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        # the killed shell left its URL behind; the kernel released its lock
        assert (home / "run" / "url").exists()
        with serving(home) as second, second.client() as api:
            assert api.get("/api/apps").status_code == 200
            assert (home / "run" / "url").read_text().strip() == second.url


# --- private modes (issue 13) --------------------------------------------------------------------


def _exempt(rel: Path) -> str | None:
    """Why a path under the home keeps the mode it has (None: it must be 0600 / 0700).

    - an app tree (``scopes/*/apps/<id>/…``) keeps the artifact's modes, and an instance's data
      folder inside it is the sandbox's: the app's own uid must read and write them;
    - the folders leading to the app trees (``scopes``, ``scopes/<scope>``, ``…/apps``,
      ``scopes/users``) are left as created, for the same uid;
    - inside a scope's ``.git`` (itself 0700) git writes with its own modes;
    - ``toolchain`` holds links to host programs the apps run;
    - ``sdk`` is the copy of the public SDK code every app imports (the apps' own uids read it).
    """
    parts = rel.parts
    if parts[0] in ("toolchain", "sdk"):
        return parts[0]
    if parts[0] != "scopes":
        return None
    scope_depth = 3 if len(parts) > 1 and parts[1] == "users" else 2
    inside = parts[scope_depth:]
    if len(parts) < scope_depth or not inside:
        return "scope folder"
    if inside[0] == "apps":
        return "app tree"
    if inside[0] == ".git" and len(inside) > 1:
        return "git internals"
    return None


def test_the_shell_keeps_its_home_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    source = tmp_path / "src" / "com.atrium.notes"
    shutil.copytree(REPO_DIR / "apps" / "com.atrium.notes", source)
    with serving(home) as served, served.client() as api:
        install = api.post(
            "/api/dist/install",
            json={"ref": f"local:{source}", "scope": "user", "autoApprove": True},
        )
        assert install.status_code == 200, install.text
        launched = api.post("/api/instances", json={"appId": "com.atrium.notes"})
        assert launched.status_code in (200, 201), launched.text
        assert api.put("/api/kv/os/private", json={"value": "mine"}).status_code == 200
        assert list((home / "run" / "logs").glob("*.log"))
        assert list((home / "scopes" / "users" / "default" / "records").glob("*.json"))
        checked: list[str] = []
        loose: list[str] = []
        for path in [home, *sorted(home.rglob("*"))]:
            rel = path.relative_to(home)
            if rel.parts and _exempt(rel) is not None:
                continue
            if path.is_symlink():
                continue
            want = 0o700 if path.is_dir() else 0o600
            checked.append(str(rel))
            if mode(path) != want:
                loose.append(f"{rel} {mode(path):04o}")
        assert loose == [], "\n".join(loose)
        for must in (
            ".",
            "run",
            "run/token",
            "run/url",
            "run/serve.lock",
            "run/logs",
            "state.sqlite3",
        ):
            assert must in checked
        assert "state.sqlite3-wal" in checked
        assert "scopes/users/default/.git" in checked
        assert any(c.startswith("scopes/users/default/records/") for c in checked)
        # the app tree keeps the modes of the tree it came from
        tree = home / "scopes" / "users" / "default" / "apps" / "com.atrium.notes"
        for name in ("app.manifest.json", "server.py"):
            assert mode(tree / name) == mode(source / name)


def test_an_older_home_left_readable_is_tightened(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with serving(home):
        pass
    for path in (home, home / "run", home / "state.sqlite3"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    # and the KV file of a shell older still, which moves into the state database
    older = sqlite3.connect(home / "kv.sqlite3")
    older.execute("CREATE TABLE kv (namespace, key, value, updated_at)")
    older.close()
    (home / "kv.sqlite3").chmod(0o644)
    (home / "run" / "logs").mkdir(exist_ok=True, mode=0o755)
    log = home / "run" / "logs" / "old.log"
    log.write_text("old\n")
    log.chmod(0o644)
    with serving(home):
        assert mode(home) == 0o700
        assert mode(home / "run") == 0o700
        assert mode(home / "run" / "logs") == 0o700
        assert mode(home / "state.sqlite3") == 0o600
        (aside,) = home.glob("kv.sqlite3.moved-*")
        assert mode(aside) == 0o600
        assert mode(log) == 0o600


def test_a_shared_folder_is_refused_as_a_home(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    (shared / "someone-elses-file").write_text("x")
    [line] = serve_refused(shared)
    assert f"ATRIUM_HOME / --home '{shared}'" in line
    assert "not an Atrium home" in line
    assert mode(shared) == 0o1777


# --- a damaged KV file or scope repository (issue 14 row 6) -------------------------------------

PAGE = 4096


def _fill_kv(home: Path, keys: int, size: int) -> dict[str, str]:
    """Write ``keys`` values of ``size`` characters through a real shell, then stop it cleanly
    (which checkpoints the WAL into ``state.sqlite3``)."""
    values = {f"k{n:04d}": f"{n:04d}" + "v" * (size - 4) for n in range(keys)}
    with serving(home) as served, served.client() as api:
        for key, value in values.items():
            assert api.put(f"/api/kv/os/{key}", json={"value": value}).status_code == 200
    wal = home / "state.sqlite3-wal"
    assert not wal.exists() or not wal.stat().st_size
    return values


def _page_of(path: Path, needle: bytes) -> int:
    """The first page of a SQLite file that holds ``needle`` (a KV value: the state database
    holds the event log too, which a page picked by position may belong to)."""
    data = path.read_bytes()
    return data.index(needle) // PAGE


def _damage(path: Path, first_page: int, pages: int = 1) -> None:
    """Overwrite whole pages of a real SQLite file with garbage (not the header page)."""
    garbage = bytes((n * 151 + 7) % 256 for n in range(PAGE * pages))
    with path.open("r+b") as file:
        file.seek(first_page * PAGE)
        file.write(garbage)


def test_a_damaged_kv_file_stops_start_up_with_one_line_naming_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _fill_kv(home, 300, 200)
    kv = home / "state.sqlite3"
    pages = kv.stat().st_size // PAGE
    assert pages > 10
    _damage(kv, pages // 2)
    before = kv.read_bytes()
    [line] = serve_refused(home)
    assert f"the KV store {kv} is damaged" in line
    assert "restore the file from a backup" in line
    assert ".recover" in line
    assert kv.read_bytes() == before  # never written around
    assert not (home / "run" / "url").exists()


def test_a_file_that_is_not_a_database_stops_start_up(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "state.sqlite3").write_bytes(b"this is not SQLite\n" * 300)
    [line] = serve_refused(home)
    assert f"{home / 'state.sqlite3'} cannot be used: file is not a database" in line


def test_damage_met_at_run_time_is_a_storage_error_never_500_nor_wrong_data(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    values = _fill_kv(home, 300, 200)
    kv = home / "state.sqlite3"
    page = _page_of(kv, values["k0150"].encode())
    with serving(home) as served, served.client() as api:
        # the disk goes bad under the running shell. SQLite keeps the pages the start-up check
        # read in its own cache; a change by another connection (here the header's user_version)
        # makes it read them from the file again, as it would after evicting them
        _damage(kv, page)
        poke = sqlite3.connect(kv)
        poke.execute("PRAGMA user_version = 1")
        poke.close()
        statuses: dict[int, int] = {}
        for key, value in values.items():
            response = api.get(f"/api/kv/os/{key}")
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code == 200:
                assert response.json()["value"] == value  # never garbage served as data
            else:
                assert response.status_code == 503, response.text
                error = response.json()["error"]
                assert error["code"] == "storage_damaged"
                assert error["path"] == str(kv)
        assert statuses.get(503), statuses
        # once damage was seen, nothing more is written into the file
        response = api.put("/api/kv/os/after", json={"value": 1})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "storage_damaged"


def test_a_garbage_scope_head_stops_start_up_naming_the_repository(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with serving(home):
        pass
    repo = home / "scopes" / "global"
    (repo / ".git" / "HEAD").write_bytes(b"\x00garbage\xff\n")
    [line] = serve_refused(home)
    assert f"the scope repository {repo} is damaged" in line
    assert (
        f"'ref: refs/heads/main' (the branch Atrium commits to) into {repo / '.git' / 'HEAD'}"
        in line
    )
    # the way out it names works
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    with serving(home) as served, served.client() as api:
        assert api.get("/api/apps").status_code == 200


# --- a full disk (issue 14 row 3) -----------------------------------------------------------------


@pytest.fixture
def six_mib_home(home: Path) -> Iterator[Path]:
    """A home on a 6 MiB tmpfs of its own (needs root or CAP_SYS_ADMIN; skipped without)."""
    with tmpfs(home, 6) as mounted:
        yield mounted


def test_a_full_disk_answers_storage_full_and_loses_nothing_answered(six_mib_home: Path) -> None:
    home = six_mib_home
    acknowledged: dict[str, str] = {}
    with serving(home) as served, served.client() as api:
        for n in range(10):
            assert api.put(f"/api/kv/os/before{n}", json={"value": f"v{n}"}).status_code == 200
            acknowledged[f"before{n}"] = f"v{n}"
        filler = fill_disk(home)
        full = None
        for n in range(200):
            value = f"{n:04d}" + "x" * 20_000
            response = api.put(f"/api/kv/os/full{n}", json={"value": value})
            assert response.status_code != 500, response.text
            if response.status_code == 200:
                acknowledged[f"full{n}"] = value
                continue
            full = response
            break
        assert full is not None, "the disk never filled"
        assert full.status_code == 507, full.text
        error = full.json()["error"]
        assert error["code"] == "storage_full"
        assert error["path"] == str(home / "state.sqlite3")
        # what was answered is still there, and the store works again once space is freed
        for key, value in acknowledged.items():
            assert api.get(f"/api/kv/os/{key}").json()["value"] == value
        filler.unlink()
        assert api.put("/api/kv/os/after", json={"value": "room"}).status_code == 200
        acknowledged["after"] = "room"
        served.proc.send_signal(signal.SIGKILL)
        served.proc.wait()
    with serving(home) as again, again.client() as api:
        for key, value in acknowledged.items():
            assert api.get(f"/api/kv/os/{key}").json()["value"] == value
