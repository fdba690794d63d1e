"""Platform-wide changes are an admin's: a member is refused, the admin is not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_DIR
from tests.integration.conftest import RunningShell

APP_ID = "test.plain.stdlib"


def test_a_member_cannot_reload_the_theme_catalogue(shell: RunningShell) -> None:
    bob = shell.add_user("bob")
    with shell.client(bob) as member:
        refused = member.post("/api/os/themes/reload")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    with shell.client() as admin:
        reloaded = admin.post("/api/os/themes/reload")
    assert reloaded.status_code == 200
    assert "count" in reloaded.json()


def secret_app(folder: Path) -> Path:
    """A valid app folder holding a file only the shell's own account should read (another
    user's files, say)."""
    app = folder / APP_ID
    shutil.copytree(REPO_DIR / "tests" / "apps" / APP_ID, app)
    (app / "secret.txt").write_text("the admin's secret")
    return app


@pytest.mark.parametrize("route", ["/api/dist/install", "/api/dist/install/preview"])
def test_a_member_cannot_install_from_a_path_on_the_shells_machine(
    shell: RunningShell, tmp_path: Path, route: str
) -> None:
    """`local:` and `git+file://` read whatever the shell's account can read: a member naming
    one would copy files of the machine (or of another user's folders) into their own scope."""
    app = secret_app(tmp_path / "private")
    subprocess.run(["git", "init", "-q", str(app)], check=True)
    bob = shell.add_user("bob")
    with shell.client(bob) as member:
        for ref in (f"local:{app}", f"git+file://{app}"):
            refused = member.post(route, json={"ref": ref, "scope": "user"})
            assert refused.status_code == 403, (ref, refused.text)
            assert refused.json()["error"]["code"] == "permission_denied"
        assert member.get(f"/api/apps/{APP_ID}").status_code == 404
    with shell.client() as admin:
        allowed = admin.post(
            "/api/dist/install/preview", json={"ref": f"local:{app}", "scope": "user"}
        )
    assert allowed.status_code == 200, allowed.text


def test_a_member_cannot_publish_a_path_on_the_shells_machine(
    shell: RunningShell, tmp_path: Path
) -> None:
    app = secret_app(tmp_path / "private")
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    bob = shell.add_user("bob")
    with shell.client(bob) as member:
        refused = member.post(
            "/api/dist/publish", json={"path": str(app), "to": f"git+file://{remote}", "tag": "v1"}
        )
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "permission_denied"
    tags = subprocess.run(
        ["git", "-C", str(remote), "tag"], capture_output=True, text=True, check=True
    )
    assert tags.stdout == ""
