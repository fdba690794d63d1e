"""The pipeline as an async generator inside the running shell: staging and the per-app lock are
released however it ends, and each operation is one commit in the scope repository."""

from __future__ import annotations

import asyncio
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.distribution.pipeline import Approval
from atrium.distribution.refs import parse_ref
from atrium.scopes import Scope
from tests.integration.conftest import RunningShell
from tests.integration.distribution.conftest import MakeApp, install, installed_ok, write_manifest

pytestmark = pytest.mark.integration


def on_shell_loop(shell: RunningShell, coro: Any) -> Any:
    """Run ``coro`` on the shell's own event loop (the services live there)."""
    loop = shell.server._loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)


def test_closing_the_pipeline_early_removes_staging_and_releases_the_lock(
    dist_shell: RunningShell, make_app: MakeApp, home: Path
) -> None:
    source = make_app("com.example.early")
    dist = dist_shell.shell.dist

    async def stop_after_fetch() -> list[str]:
        events = dist.install(parse_ref(f"local:{source}"), Scope.GLOBAL, Approval())
        seen = []
        async for item in events:
            seen.append(item["type"])
            if item["type"] == "fetch.done":
                assert dist.locks.is_held("com.example.early")
                assert len(list((home / "scopes/global/.staging").iterdir())) == 1
                break
        await events.aclose()
        return seen

    assert on_shell_loop(dist_shell, stop_after_fetch())[-1] == "fetch.done"
    assert not dist.locks.is_held("com.example.early")
    assert list((home / "scopes/global/.staging").iterdir()) == []
    assert not (home / "scopes/global/apps/com.example.early").exists()


@pytest.mark.parametrize("body", [{}, {"approve": False}, {"scope": "user"}])
def test_an_answer_without_an_install_leaves_no_staging(
    api: httpx.Client, make_app: MakeApp, home: Path, body: dict[str, Any]
) -> None:
    source = make_app("com.example.asks", permissions=["com.atrium.notes.read"])
    install(api, f"local:{source}", **body)
    for scope in ("scopes/global", "scopes/users/default"):
        staging = home / scope / ".staging"
        assert not staging.exists() or list(staging.iterdir()) == []


def test_each_operation_is_one_commit_in_the_scope_repository(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = make_app("com.example.history")
    installed_ok(api, f"local:{source}", scope="user")
    write_manifest(source, version="1.0.1")
    assert api.post("/api/dist/update/com.example.history").json()["ok"] is True
    assert api.post("/api/dist/update/com.example.history").json()["upToDate"] is True
    assert api.delete("/api/dist/uninstall/com.example.history").status_code == 200
    log = subprocess.run(
        ["git", "log", "--format=%s"],
        cwd=home / "scopes/users/default",
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert log == [
        "uninstall com.example.history 1.0.1",
        f"update com.example.history 1.0.1 (local:{source})",
        f"install com.example.history 1.0.0 (local:{source})",
        "baseline: Atrium scope",
    ]


def test_installs_of_different_apps_at_once_are_separate_commits(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    sources = [make_app(f"com.example.parallel{n}") for n in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda s: install(api, f"local:{s}").json(), sources))
    assert all(a["ok"] for a in answers), answers
    repo = home / "scopes/global"
    for source in sources:
        message = f"install {source.name} 1.0.0 (local:{source})"
        changed = subprocess.run(
            ["git", "log", "--format=", "--name-only", f"--grep={message}", "--fixed-strings"],
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        assert sorted(changed) == sorted(
            [
                f"apps/{source.name}/app.manifest.json",
                f"apps/{source.name}/server.py",
                f"records/{source.name}.json",
            ]
        )
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, check=True, capture_output=True, text=True
    )
    assert status.stdout == ""
