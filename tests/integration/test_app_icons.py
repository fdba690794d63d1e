"""`GET /api/apps/{appId}/icon` (docs/api.md "Apps and scopes"): an icon is served as an inert
image, only from inside the app's directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import StartShell

pytestmark = pytest.mark.integration
SVG = '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'


def app(system_apps: Path, app_id: str, icon: str, files: dict[str, str]) -> Path:
    target = system_apps / app_id
    target.mkdir()
    (target / "entrypoint.sh").write_text("#!/bin/sh\n")
    for name, body in files.items():
        (target / name).write_text(body)
    manifest = {"id": app_id, "name": app_id, "version": "1.0.0", "icon": icon}
    (target / "app.manifest.json").write_text(json.dumps(manifest))
    return target


def test_icons_are_inert_images_from_the_app_folder(
    start_shell: StartShell, system_apps: Path, tmp_path: Path
) -> None:
    app(system_apps, "test.icon.svg", "icon.svg", {"icon.svg": SVG})
    app(system_apps, "test.icon.text", "icon.txt", {"icon.txt": "not an image"})
    outside = tmp_path / "secret.svg"
    outside.write_text("<svg>secret</svg>")
    linked = app(system_apps, "test.icon.link", "link.svg", {})
    (linked / "link.svg").symlink_to(outside)
    shell = start_shell()
    with shell.client() as api, shell.anonymous() as anonymous:
        icon = api.get("/api/apps/test.icon.svg/icon")
        assert icon.status_code == 200
        assert icon.headers["content-type"] == "image/svg+xml"
        assert icon.headers["content-security-policy"].startswith("sandbox; default-src 'none'")
        assert icon.headers["x-content-type-options"] == "nosniff"
        assert icon.text == SVG
        for app_id in ("test.icon.text", "test.icon.link", "com.atrium.notes", "nobody.here"):
            refused = api.get(f"/api/apps/{app_id}/icon")
            assert refused.status_code == 404, app_id
            assert "secret" not in refused.text
        assert anonymous.get("/api/apps/test.icon.svg/icon").status_code == 401


def test_an_icon_is_judged_by_the_file_opened_never_from_runtime_data(
    start_shell: StartShell, system_apps: Path, tmp_path: Path
) -> None:
    """An app writes its runtime data below its own folder: an icon there could be swapped for a
    link between a check and the read. Such icons are refused, and the file read is the file
    checked (a link swapped in for the checked file is never followed)."""
    secret = tmp_path / "secret.svg"
    secret.write_text("<svg>TOP SECRET</svg>")
    runtime = app(system_apps, "test.icon.runtime", "test.icon.runtime-1/i.svg", {})
    (runtime / "test.icon.runtime-1").mkdir()
    (runtime / "test.icon.runtime-1" / "i.svg").write_text(SVG)
    inside = app(system_apps, "test.icon.inside", "icon.svg", {"art.svg": SVG})
    (inside / "icon.svg").symlink_to("art.svg")  # a link within the tree is an icon
    shell = start_shell()
    with shell.client() as api:
        refused = api.get("/api/apps/test.icon.runtime/icon")
        assert refused.status_code == 404
        assert api.get("/api/apps/test.icon.inside/icon").text == SVG
        # the swap itself, done between requests as often as an app could: never the secret
        icon = runtime / "test.icon.runtime-1" / "i.svg"
        icon.unlink()
        icon.symlink_to(secret)
        for _ in range(20):
            assert "TOP SECRET" not in api.get("/api/apps/test.icon.runtime/icon").text
