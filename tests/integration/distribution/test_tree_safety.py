"""Issue 13 rows 1, 6, 8 through the running shell: what an app source may not carry, what git may
not read, and an update that must not install another app.

- No fetcher installs version-control metadata: an OCI artifact whose tree holds
  ``<id>/.git/config`` with ``core.fsmonitor`` is refused (the command never runs); a local folder
  or a git repository carrying ``.git``/``.hg`` below its top is refused too.
- No fetcher installs a tree from which a chain of links leads out (``p/q/r/s/b -> ../../../..``,
  ``leak -> p/q/r/s/b/../../../../run/token``): local, git and OCI alike.
- git in the scope repository reads no hooks or fsmonitor from the environment or the user's
  global configuration, and a hung remote ends in a clear error after the deadline.
- ``update`` of A whose recorded OCI tag (or index channel) now holds app B is ``fetch_failed``
  naming both ids, and nothing changes.

A real registry (Debian docker-registry), real git (file repositories and ``git daemon``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.distribution.oci import push_app, push_artifact
from atrium.distribution.refs import OciRef
from tests.integration.conftest import RunningShell, StartShell, run_async
from tests.integration.distribution.conftest import (
    GitRepo,
    MakeApp,
    app_listing,
    install,
    installed_ok,
)
from tests.integration.registry import Registry, running_registry
from tests.integration.tars import Member, crafted_layer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("safety-registry")) as started:
        yield started


def git_lines(cwd: Path, *args: str) -> list[str]:
    out = subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return out.splitlines()


def refused(response: httpx.Response, *words: str) -> dict[str, Any]:
    assert response.status_code == 502, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "fetch_failed", error
    for word in words:
        assert word in error["message"], error
    return error


def nothing_of(api: httpx.Client, home: Path, app_id: str) -> None:
    scope = home / "scopes/global"
    assert not (scope / "apps" / app_id).exists()
    assert not (scope / "records" / f"{app_id}.json").exists()
    assert app_listing(api, app_id) is None
    assert git_lines(scope, "status", "--porcelain") == []
    staging = scope / ".staging"
    assert not staging.exists() or not list(staging.iterdir())


def files_of(app: Path, top: str) -> list[Member]:
    """The members of a layer holding ``app``'s files under ``top/``."""
    members = [Member(top, "dir")]
    for path in sorted(app.rglob("*")):
        rel = f"{top}/{path.relative_to(app).as_posix()}"
        if path.is_symlink():
            members.append(Member(rel, "symlink", link=str(path.readlink())))
        elif path.is_dir():
            members.append(Member(rel, "dir"))
        else:
            members.append(Member(rel, "file", path.read_bytes(), mode=0o644))
    return members


def fsmonitor_repo(top: str, folder: Path, marker: Path) -> list[Member]:
    """The members of a real repository with one commit (so the scope repo's `git add` takes the
    app folder for an embedded repository and runs `git status` in it), whose config runs a
    command through core.fsmonitor."""
    folder.mkdir()
    subprocess.run(["git", "init", "--quiet", str(folder)], check=True)
    (folder / "README").write_text("hi\n")
    commit = ["git", "-c", "user.name=x", "-c", "user.email=x@x", "commit", "--quiet", "-m", "x"]
    subprocess.run(["git", "add", "README"], cwd=folder, check=True)
    subprocess.run(commit, cwd=folder, check=True)
    with (folder / ".git" / "config").open("a") as config:
        config.write(f'[core]\n\tfsmonitor = "touch {marker}"\n')
    return files_of(folder / ".git", f"{top}/.git")


def chain_out(app: Path) -> None:
    """Issue 13 row 8: each link stays inside as written; together they lead to the shell's token."""
    (app / "p/q/r/s").mkdir(parents=True)
    (app / "p/q/r/s/b").symlink_to("../../../..")
    (app / "leak").symlink_to("p/q/r/s/b/../../../../run/token")


# -- row 1: VCS metadata is never installed -----------------------------------------------------


def test_an_oci_artifact_carrying_a_git_config_is_refused_and_its_command_never_runs(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path, tmp_path: Path
) -> None:
    app_id = "com.example.fsmonitor"
    marker = tmp_path / "pwned"
    source = make_app(app_id)
    repo = fsmonitor_repo(app_id, tmp_path / "evil", marker)
    layer = crafted_layer(files_of(source, app_id) + repo)
    ref = OciRef(registry.host, f"apps/{app_id}", "1.0.0")
    run_async(push_artifact(ref, layer, app_id=app_id, version="1.0.0"))

    error = refused(install(api, str(ref), autoApprove=True), f"{app_id}/.git", "version-control")
    assert error["ref"] == str(ref)
    nothing_of(api, home, app_id)
    # more work in the same scope repository: nothing there may run the command either
    installed_ok(api, f"local:{make_app('com.example.after')}")
    git_lines(home / "scopes/global", "status")
    assert not marker.exists(), "the artifact's core.fsmonitor ran on the host"


@pytest.mark.parametrize("name", ["static/.git", "static/.GIT", "lib/.hg"])
def test_a_local_folder_with_vcs_metadata_below_its_top_is_refused_naming_it(
    api: httpx.Client, make_app: MakeApp, home: Path, tmp_path: Path, name: str
) -> None:
    app_id = "com.example.nestedvcs"
    source = make_app(app_id)
    (source / ".git").mkdir()  # the developer's own checkout at the top is fine: not copied
    (source / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (source / name).mkdir(parents=True)
    (source / name / "config").write_text(f'[core]\n\tfsmonitor = "touch {tmp_path / "x"}"\n')
    refused(install(api, f"local:{source}", autoApprove=True), name, "version-control")
    nothing_of(api, home, app_id)

    (source / name / "config").unlink()
    (source / name).rmdir()
    record = installed_ok(api, f"local:{source}")["record"]
    assert record["id"] == app_id
    assert not (home / "scopes/global/apps" / app_id / ".git").exists()


def test_a_git_repository_carrying_an_hg_folder_is_refused(
    api: httpx.Client, make_app: MakeApp, git_repo: Callable[..., GitRepo], home: Path
) -> None:
    app_id = "com.example.githg"
    source = make_app(app_id)
    (source / "tools" / ".hg").mkdir(parents=True)
    (source / "tools" / ".hg" / "hgrc").write_text("[hooks]\nupdate = touch /tmp/x\n")
    repo = git_repo(source)
    refused(install(api, repo.url, autoApprove=True), "tools/.hg", "version-control")
    nothing_of(api, home, app_id)


# -- row 8: no chain of links leads out ---------------------------------------------------------


def test_a_local_link_chain_to_the_token_is_refused(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    app_id = "com.example.chainlocal"
    source = make_app(app_id)
    chain_out(source)
    refused(install(api, f"local:{source}", autoApprove=True), "leak", "outside the app")
    nothing_of(api, home, app_id)


def test_a_git_link_chain_to_the_token_is_refused_over_git_daemon(
    api: httpx.Client,
    make_app: MakeApp,
    git_repo: Callable[..., GitRepo],
    git_daemon: Any,
    home: Path,
) -> None:
    app_id = "com.example.chaingit"
    source = make_app(app_id)
    chain_out(source)
    git_repo(source, base=git_daemon.base)
    url = git_daemon.url(f"{app_id}.git")
    refused(install(api, url, autoApprove=True), "leak", "outside the app")
    nothing_of(api, home, app_id)


def test_an_oci_link_chain_to_the_token_is_refused(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path
) -> None:
    app_id = "com.example.chainoci"
    source = make_app(app_id)
    chain_out(source)
    ref = OciRef(registry.host, f"apps/{app_id}", "1.0.0")
    layer = crafted_layer(files_of(source, app_id))
    run_async(push_artifact(ref, layer, app_id=app_id, version="1.0.0"))
    refused(install(api, str(ref), autoApprove=True), "leak", "outside")
    nothing_of(api, home, app_id)


# -- git reads nothing from the environment or the user's configuration -------------------------


@pytest.fixture
def hostile_git_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An environment and a global git config that would run a command on `git status` and
    `git commit` in any repository; the marker file the command would create."""
    marker = tmp_path / "ran"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("pre-commit", "post-commit", "post-index-change"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hooks / hook).chmod(0o755)
    global_config = tmp_path / "gitconfig"
    global_config.write_text(
        f'[core]\n\thooksPath = {hooks}\n\tfsmonitor = "touch {marker}"\n'
        f'[filter "evil"]\n\tclean = "touch {marker}; cat"\n'
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(global_config))
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", f"touch {marker}")
    return marker


def test_scope_git_runs_no_hook_or_fsmonitor_from_the_environment_or_global_config(
    hostile_git_setup: Path, start_shell: StartShell, make_app: MakeApp, home: Path
) -> None:
    shell = start_shell()
    source = make_app("com.example.envgit")
    # a committed attributes file naming a filter driver that only the global config defines
    (source / ".gitattributes").write_text("* filter=evil\n")
    with shell.client(timeout=60) as api:
        installed_ok(api, f"local:{source}")
        assert api.delete("/api/dist/uninstall/com.example.envgit").status_code == 200
    log = git_lines(home / "scopes/global", "-c", "core.fsmonitor=false", "log", "--format=%s")
    assert log[0].startswith("uninstall com.example.envgit")
    assert not hostile_git_setup.exists(), "git ran a command from the environment or config"


class HungServer:
    """Accepts TCP connections and never answers (a remote that hangs)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_hung_git_remote_ends_in_a_clear_error_after_the_deadline(
    api: httpx.Client, make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATRIUM_GIT_TIMEOUT_SECONDS", "2")
    server = HungServer()
    try:
        source = make_app("com.example.hung")
        url = f"git://127.0.0.1:{server.port}/com.example.hung.git"
        published = api.post(
            "/api/dist/publish", json={"path": str(source), "to": url, "tag": "v1"}
        )
        assert published.status_code == 502, published.text
        error = published.json()["error"]
        assert error["code"] == "upstream_failed"
        assert "did not finish within 2 s" in error["message"]
        refused(install(api, f"{url}#v1", autoApprove=True), "did not finish within 2 s")
    finally:
        server.close()


# -- row 6: update never installs another app ---------------------------------------------------


def test_an_update_whose_oci_tag_now_holds_another_app_changes_nothing(
    api: httpx.Client, make_app: MakeApp, registry: Registry, home: Path
) -> None:
    app_a, app_b = "com.example.updatea", "com.example.updateb"
    source_a, source_b = make_app(app_a), make_app(app_b, version="2.0.0")
    tag_a = OciRef(registry.host, f"apps/{app_a}", "current")
    run_async(push_app(source_a, tag_a))
    record_a = installed_ok(api, str(tag_a))["record"]
    tag_b = OciRef(registry.host, f"apps/{app_b}", "1")
    run_async(push_app(source_b, tag_b))
    record_b = installed_ok(api, str(tag_b))["record"]
    scope = home / "scopes/global"
    log = git_lines(scope, "log", "--format=%s")

    run_async(push_app(source_b, tag_a))  # A's tag now holds B's artifact
    response = api.post(f"/api/dist/update/{app_a}", json={"autoApprove": True})
    error = refused(response, app_a, app_b)
    assert error["ref"] == str(tag_a)

    assert git_lines(scope, "log", "--format=%s") == log
    assert git_lines(scope, "status", "--porcelain") == []
    installed = {r["id"]: r for r in api.get("/api/dist/installed").json()}
    assert installed == {app_a: record_a, app_b: record_b}
    manifest_a = json.loads((scope / "apps" / app_a / "app.manifest.json").read_text())
    assert (manifest_a["id"], manifest_a["version"]) == (app_a, "1.0.0")


def test_a_bare_id_whose_index_tag_holds_another_app_is_refused(
    start_shell: StartShell, make_app: MakeApp, registry: Registry, home: Path, tmp_path: Path
) -> None:
    app_a, app_b = "com.example.indexa", "com.example.indexb"
    run_async(push_app(make_app(app_b), OciRef(registry.host, f"apps/{app_a}", "1.0.0")))
    entry = {
        "id": app_a,
        "name": "A",
        "publisher": "Example",
        "sources": {"oci": {"ref": f"{registry.host}/apps/{app_a}"}},
        "channels": {"stable": {"oci-tag": "1.0.0"}},
    }
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"schema": 1, "apps": [entry]}))
    shell: RunningShell = start_shell(index_url=f"file://{index}")
    with shell.client(timeout=60) as api:
        refused(install(api, app_a, autoApprove=True), app_a, app_b)
        nothing_of(api, home, app_a)
        nothing_of(api, home, app_b)


def test_git_and_local_updates_to_another_apps_manifest_change_nothing(
    api: httpx.Client, make_app: MakeApp, git_repo: Callable[..., GitRepo], home: Path
) -> None:
    """The same rule for the other sources: their directory name is the app id, so a source that
    now holds another app's manifest is refused (the id must equal the directory name)."""
    scope = home / "scopes/global"
    git_source = make_app("com.example.gitswap")
    repo = git_repo(git_source)
    local_source = make_app("com.example.localswap")
    before = {
        "com.example.gitswap": installed_ok(api, repo.url)["record"],
        "com.example.localswap": installed_ok(api, f"local:{local_source}")["record"],
    }
    log = git_lines(scope, "log", "--format=%s")
    for source in (git_source, local_source):
        manifest = json.loads((source / "app.manifest.json").read_text())
        manifest.update(id="com.example.intruder", version="9.0.0")
        (source / "app.manifest.json").write_text(json.dumps(manifest))
    repo.commit_and_tag(message="now another app")
    for app_id in before:
        response = api.post(f"/api/dist/update/{app_id}", json={"autoApprove": True})
        assert response.status_code in (422, 502), response.text
        assert "com.example.intruder" in response.text
    installed = {r["id"]: r for r in api.get("/api/dist/installed").json()}
    assert installed == before
    assert git_lines(scope, "log", "--format=%s") == log
    assert git_lines(scope, "status", "--porcelain") == []
    assert not (scope / "apps/com.example.intruder").exists()


def peak_rss_mib() -> float:
    """This process's resident-set high-water mark (the shell runs in it), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def test_a_linked_atriumignore_is_not_read_through_its_link(
    api: httpx.Client, make_app: MakeApp, tmp_path: Path
) -> None:
    """The folder's `.atriumignore` is read before the tree check refuses a link out of the
    folder: read through the link, an author's `.atriumignore -> /some/huge/file` made the shell
    load that whole file (here 1 GiB, sparse) into memory before answering."""
    source = make_app("com.example.linkedignore", version="1.0.0")
    huge = tmp_path / "huge"
    with huge.open("wb") as sparse:
        sparse.truncate(1 << 30)
    (source / ".atriumignore").symlink_to(huge)
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts from now
    before = peak_rss_mib()
    response = install(api, f"local:{source}")
    grown = peak_rss_mib() - before
    assert response.status_code == 502, response.text
    assert ".atriumignore" in response.json()["error"]["message"]
    assert grown < 256, f"the shell's memory peaked {grown:.0f} MiB higher reading the link"
