"""Installs from real git: bare repositories over `git+file://`, `git daemon` over `git://`, and
bare ids through an index with channels."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import (
    GitDaemon,
    GitRepo,
    MakeApp,
    app_listing,
    free_port,
    install,
    installed_ok,
    write_manifest,
)

pytestmark = pytest.mark.integration


def test_a_git_file_install_clones_the_default_branch_without_git(
    api: httpx.Client, make_app: MakeApp, git_repo: Callable[..., GitRepo], home: Path
) -> None:
    repo = git_repo(make_app("com.example.gitapp"))
    head = repo.commit_and_tag(message="second")
    answer = installed_ok(api, repo.url)
    record = answer["record"]
    assert (record["source"], record["digest"], record["ref"]) == ("git", head, repo.url)
    target = home / "scopes/global/apps/com.example.gitapp"
    assert (target / "server.py").is_file()
    assert not (target / ".git").exists()
    assert [e["type"] for e in answer["events"]][2:4] == ["fetch.start", "fetch.done"]


def test_a_tag_is_cloned_at_its_commit(
    api: httpx.Client, make_app: MakeApp, git_repo: Callable[..., GitRepo]
) -> None:
    source = make_app("com.example.tagged")
    repo = git_repo(source, "v1.0.0")
    write_manifest(source, version="2.0.0")
    repo.commit_and_tag(message="two")
    record = installed_ok(api, f"{repo.url}#v1.0.0")["record"]
    assert record["version"] == "1.0.0"
    latest = installed_ok(api, repo.url)["record"]
    assert latest["version"] == "2.0.0"


def test_git_daemon_serves_a_git_url(
    api: httpx.Client,
    make_app: MakeApp,
    git_repo: Callable[..., GitRepo],
    git_daemon: GitDaemon,
) -> None:
    repo = git_repo(make_app("com.example.daemon"), "v1")
    record = installed_ok(api, git_daemon.url("com.example.daemon.git#v1"))["record"]
    assert record["source"] == "git"
    assert record["digest"] == repo.commit_of("v1")
    assert app_listing(api, "com.example.daemon") is not None


def test_an_unreachable_git_server_is_fetch_failed(api: httpx.Client) -> None:
    response = install(api, f"git://127.0.0.1:{free_port()}/com.example.gone.git")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "fetch_failed"
    assert "com.example.gone.git" in error["message"]


def test_a_missing_tag_is_fetch_failed(
    api: httpx.Client, make_app: MakeApp, git_repo: Callable[..., GitRepo]
) -> None:
    repo = git_repo(make_app("com.example.notags"))
    response = install(api, f"{repo.url}#v9")
    assert response.status_code == 502
    assert "no branch or tag named 'v9'" in response.json()["error"]["message"]


def test_a_missing_file_repository_keeps_gits_cause(api: httpx.Client, tmp_path: Path) -> None:
    """Issue 14 row 9: git's "does not appear to be a git repository" line is the cause; it used
    to be dropped for the generic last lines ("Please make sure you have the correct access…")."""
    response = install(api, f"git+file://{tmp_path}/nowhere/com.example.missing.git")
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "fetch_failed"
    assert "does not appear to be a git repository" in error["reason"]


def test_a_commit_id_as_ref_says_refs_name_branches_or_tags(
    api: httpx.Client, make_app: MakeApp, git_repo: Callable[..., GitRepo]
) -> None:
    """Issue 14 row 9: a commit id is not "no branch or tag named …" without a word of why."""
    repo = git_repo(make_app("com.example.commitref"), "v1")
    commit = repo.commit_of("v1")
    response = install(api, f"{repo.url}#{commit}")
    assert response.status_code == 502, response.text
    reason = response.json()["error"]["reason"]
    assert "looks like a commit id" in reason
    assert "names a branch or tag" in reason


def test_a_repository_named_unlike_the_app_id_is_invalid(
    api: httpx.Client, make_app: MakeApp, git_repo: Callable[..., GitRepo], tmp_path: Path
) -> None:
    source = make_app("com.example.named")
    repo = git_repo(source)
    renamed = tmp_path / "repos" / "other-name.git"
    repo.bare.rename(renamed)
    response = install(api, f"git+file://{renamed}")
    assert response.status_code == 422
    assert "must equal the directory name 'other-name'" in response.json()["error"]["message"]


def test_a_symlink_leaving_the_repository_is_fetch_failed(
    api: httpx.Client, make_app: MakeApp, git_repo: Callable[..., GitRepo]
) -> None:
    source = make_app("com.example.linky")
    (source / "passwd").symlink_to("/etc/passwd")
    repo = git_repo(source)
    response = install(api, repo.url)
    assert response.status_code == 502
    assert "passwd is a symlink to the absolute path" in response.json()["error"]["message"]


# -- the index ----------------------------------------------------------------------------------


def write_index(path: Path, apps: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"schema": 1, "apps": apps}))
    return f"file://{path}"


@pytest.fixture
def indexed(
    make_app: MakeApp, git_repo: Callable[..., GitRepo], git_daemon: GitDaemon, tmp_path: Path
) -> str:
    """An app with a stable and a beta tag served by git daemon, listed in a file:// index."""
    source = make_app("com.example.indexed")
    repo = git_repo(source, "v1.0.0")
    write_manifest(source, version="1.1.0-beta.1")
    repo.commit_and_tag("v1.1.0-beta.1", message="beta")
    entry = {
        "id": "com.example.indexed",
        "name": "Indexed",
        "publisher": "Example",
        "sources": {
            "git": {"ref": git_daemon.url("com.example.indexed.git"), "default-branch": "main"}
        },
        "channels": {"stable": {"git-tag": "v1.0.0"}, "beta": {"git-tag": "v1.1.0-beta.1"}},
    }
    bad = {"id": "Bad Id", "name": "x", "sources": {}}
    return write_index(tmp_path / "index.json", [entry, bad])


def test_a_bare_id_installs_the_stable_channel_through_git(
    start_shell: StartShell, indexed: str
) -> None:
    shell = start_shell(index_url=indexed)
    with shell.client(timeout=60) as api:
        record = installed_ok(api, "com.example.indexed")["record"]
        assert (record["version"], record["channel"], record["ref"]) == (
            "1.0.0",
            "stable",
            "com.example.indexed",
        )
        assert record["source"] == "git"
        beta = installed_ok(api, "com.example.indexed@beta", scope="user")["record"]
        assert (beta["version"], beta["channel"]) == ("1.1.0-beta.1", "beta")
        unknown = install(api, "com.example.indexed@nightly")
        assert unknown.status_code == 404
        assert "no channel 'nightly'" in unknown.json()["error"]["message"]
        missing = install(api, "com.example.absent")
        assert missing.status_code == 404


def test_the_index_endpoint_answers_the_cache_with_its_problems(
    start_shell: StartShell, indexed: str, tmp_path: Path
) -> None:
    shell = start_shell(index_url=indexed)
    with shell.client(timeout=60) as api:
        answer = api.get("/api/dist/index").json()
        assert [e["id"] for e in answer["index"]["apps"]] == ["com.example.indexed"]
        assert answer["index"]["apps"][0]["channels"]["beta"] == {"git-tag": "v1.1.0-beta.1"}
        assert answer["stale"] is False
        assert 0 < answer["refreshAfterSeconds"] <= 3600
        assert answer["fetchedAt"].endswith("Z")
        assert [(p["position"], p["field"]) for p in answer["problems"]] == [
            (1, "id"),
            (1, "sources"),
        ]
        # the cache answers until a refresh is asked for
        write_index(tmp_path / "index.json", [])
        assert len(api.get("/api/dist/index").json()["index"]["apps"]) == 1
        assert api.get("/api/dist/index", params={"refresh": "1"}).json()["index"]["apps"] == []
        (tmp_path / "index.json").write_text("not json")
        broken = api.get("/api/dist/index", params={"refresh": "1"})
        assert broken.status_code == 502
        assert broken.json()["error"]["code"] == "fetch_failed"


def test_the_index_cache_survives_a_restart(
    start_shell: StartShell, indexed: str, tmp_path: Path
) -> None:
    first = start_shell(index_url=indexed)
    with first.client() as api:
        fetched = api.get("/api/dist/index").json()["fetchedAt"]
    first.stop()
    (tmp_path / "index.json").unlink()
    second = start_shell(index_url=indexed)
    with second.client() as api:
        answer = api.get("/api/dist/index").json()
    assert answer["fetchedAt"] == fetched
    assert len(answer["index"]["apps"]) == 1


def test_without_an_index_url_the_index_is_empty(api: httpx.Client) -> None:
    answer = api.get("/api/dist/index").json()
    assert answer["url"] is None
    assert answer["index"] == {"schema": 1, "apps": []}
