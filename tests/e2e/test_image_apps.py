"""Image apps in a real browser: a real server installed from Debian packages (Radicale, into a
root mmdebstrap makes from the configured Debian mirror, `tests.debian_image`) and the busybox
httpd image of the integration tests, each pushed to the real docker-registry, installed through
the install pipeline (pinned by digest, pulled, unpacked), launched from the host page and shown
in its iframe on the app's own origin. Radicale's own page signs in: its principal collection is
written in the instance's data folder, owned on the host by the image's ``radicale`` user's id of
the app's block. Root only (the shell maps the images' users onto ids of their own).

The Debian root is built once per session (about a minute on a quiet 2-core machine); without
the mirror the test skips saying which mirror did not answer.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Frame, Page

from atrium.lifecycle.runners.image import image_ids
from tests.debian_image import MMDEBSTRAP, TarLayer, build_rootfs, configured_mirror, unreachable
from tests.e2e.conftest import ARTIFACTS, Served, serve_on
from tests.e2e.test_host_page import api, launch
from tests.integration.registry import Registry, running_registry
from tests.integration.test_image_apps import CONFIG as HTTPD_CONFIG
from tests.integration.test_image_apps import httpd_layers
from tests.integration.test_image_store import push_image

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="image apps need the shell to run as root"),
    # the session's one build of the Debian root comes first (about a minute on a quiet machine)
    pytest.mark.timeout(900),
]

RADICALE: Final = "test.image.radicale"
HTTPD: Final = "test.image.httpd"
#: what a Dockerfile for Debian's radicale would say: its own user (made by the package's
#: maintainer script), every address of its network, no authentication of its own (the shell
#: decides who reaches the app's origin)
RADICALE_CONFIG: Final[dict[str, object]] = {
    "Entrypoint": ["/usr/bin/radicale"],
    "Cmd": ["--server-hosts", "0.0.0.0:5232", "--auth-type", "none"],
    "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
    "ExposedPorts": {"5232/tcp": {}},
    "User": "radicale",
    "WorkingDir": "/var/lib/radicale",
}
COLLECTIONS: Final = "/var/lib/radicale/collections"
#: a tar an earlier run built (`tests.debian_image.build_rootfs`), to rerun without building
KEPT_ROOTFS: Final = "DEBIAN_RADICALE_ROOTFS"
#: the instances' network of this module's shell (a range no other test's shell takes)
RANGE: Final = "10.221.0.0/16"


@pytest.fixture(scope="session")
def radicale_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Debian's radicale installed into an essential root: one build per session."""
    if os.geteuid() != 0:
        pytest.skip("image apps need the shell to run as root")
    if not MMDEBSTRAP.exists():
        pytest.fail(f"{MMDEBSTRAP} is missing: `make test` installs Debian's mmdebstrap")
    mirror = configured_mirror()
    reason = unreachable(mirror)
    if reason is not None or mirror is None:
        pytest.skip(reason or "no mirror")
    kept = os.environ.get(KEPT_ROOTFS)
    if kept:
        return Path(kept)
    folder = tmp_path_factory.mktemp("radicale-rootfs")
    tar = folder / "rootfs.tar"
    build_rootfs(mirror, ["radicale"], tar, folder / "mmdebstrap.log")
    return tar


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("e2e-image-registry")) as started:
        yield started


def source(root: Path, app_id: str, name: str, runtime: dict[str, object]) -> str:
    """A local install source: only a manifest, whose image is a tag (install pins it)."""
    folder = root / app_id
    folder.mkdir(parents=True)
    manifest = {"id": app_id, "version": "1.0.0", "name": name, "runtime": runtime}
    (folder / "app.manifest.json").write_text(json.dumps(manifest))
    return f"local:{folder}"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, registry: Registry, radicale_rootfs: Path
) -> Iterator[Served]:
    """A shell with both images installed through the install pipeline."""
    root = tmp_path_factory.mktemp("e2e-images")
    pushed = [
        push_image(registry, "apps/radicale", "3.1.8", [TarLayer(tar=radicale_rootfs)], RADICALE_CONFIG),
        push_image(registry, "apps/httpd", "1", httpd_layers(), HTTPD_CONFIG),
    ]  # fmt: skip
    # in a thread of its own: Playwright's sync API runs an event loop in this one
    with ThreadPoolExecutor(1) as thread:
        for push in pushed:
            thread.submit(asyncio.run, push).result()
    sources = [
        source(root / "sources", RADICALE, "Radicale", {
            "image": f"{registry.host}/apps/radicale:3.1.8", "port": 5232,
            "health": {"path": "/.web/"}, "data": [COLLECTIONS],
        }),
        source(root / "sources", HTTPD, "Busybox httpd", {
            "image": f"{registry.host}/apps/httpd:1", "port": 80,
            "health": {"path": "/"}, "data": ["/www/data"],
        }),
    ]  # fmt: skip
    with serve_on(root, ATRIUM_APP_NETWORK=RANGE) as shell, api(shell) as client:
        client.timeout = httpx.Timeout(300)  # a pull and unpack of 110 MB on a loaded machine
        for ref in sources:
            done = client.post("/api/dist/install", json={"ref": ref, "autoApprove": True})
            assert done.status_code == 200, done.text
            assert done.json()["ok"] is True, done.text
        yield shell


@pytest.fixture
def page(browser: Browser, served: Served) -> Iterator[Page]:
    """A desktop page only: the host page's layouts have their own tests."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{served.url}/login?token={served.token}")
    page.wait_for_selector("body[data-ready=true]")
    yield page
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "image-apps.png"))
    context.close()


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def on_own_origin(page: Page, frame: Frame) -> str:
    """The frame's origin, asserted to be an app origin, never the host page's."""
    own = origin(frame.url)
    assert own != origin(page.url), frame.url
    assert urlsplit(frame.url).hostname.endswith(".localhost"), frame.url  # type: ignore[union-attr]
    return own


def test_a_debian_server_image_and_busybox_open_in_the_host_page_on_their_own_origins(
    page: Page, served: Served
) -> None:
    frame = launch(page, HTTPD)
    httpd_origin = on_own_origin(page, frame)
    assert frame.inner_text("body").strip() == "hello from the image"

    frame = launch(page, RADICALE)
    assert on_own_origin(page, frame) != httpd_origin
    assert urlsplit(frame.url).path == "/.web/"  # Radicale's redirect from /, on its origin
    assert frame.title() == "Radicale Web Interface"
    assert frame.locator("#loginscene input[data-name=user]").is_visible()
    # a CalDAV client's request from Radicale's own origin, with its own Basic sign-in
    status = frame.evaluate(
        """() => fetch('/atrium/', {method: 'PROPFIND', headers: {
             Authorization: 'Basic ' + btoa('atrium:'), Depth: '0'}}).then((r) => r.status)"""
    )
    assert status == 207, status
    # the signed-in PROPFIND made the principal's collection: in the instance's data folder, owned by the
    # image's radicale user (uid 100 in the image, made by the package) as the host sees it
    (made,) = served.home.rglob("var/lib/radicale/collections/collection-root/atrium")
    (rootfs,) = {p.parents[2] for p in (served.home / "images").glob("*/rootfs/usr/bin/radicale")}
    users = (fields.split(":") for fields in (rootfs / "etc/passwd").read_text().splitlines())
    uid = next(int(user[2]) for user in users if user[0] == "radicale")
    assert made.stat().st_uid == image_ids(RADICALE).uid + uid


def test_radicales_own_sign_in_form_signs_in_inside_the_iframe(page: Page) -> None:
    """Radicale's page signs in as the standard says: its script opens each XHR with the user
    and password typed into its form. In the host page's iframe (another site) Chromium does
    not answer Radicale's `WWW-Authenticate: Basic` with them, so the shell's shim on the app's
    pages sends them as `Authorization: Basic` to the app's own origin (decisions.md "Images:
    an app's own sign-in")."""
    frame = launch(page, RADICALE)
    frame.fill("#loginscene input[data-name=user]", "atrium")
    frame.fill("#loginscene input[data-name=password]", "any password")
    frame.click("#loginscene button[type=submit]")
    frame.wait_for_selector("#collectionsscene", state="visible")
    assert frame.locator("#loginscene").is_hidden()
    assert frame.locator('#collectionsscene a[data-name="new"]').is_visible()
