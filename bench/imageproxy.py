"""Images and namespaces through a real shell: what pulling an image costs per MiB, and what an
instance's own network namespace costs the data proxy and the page proxy.

1. Pull + unpack: an image of busybox and 32 MiB of files in 256 of 128 KiB (gzip level 1),
   pushed to a real docker-registry (`tests.integration.registry`), pulled by digest into a fresh
   image store (`atrium.images.store.ImageStore.pull`: every blob verified, each layer unpacked by
   the store's rules) `RUNS` times: milliseconds per MiB unpacked. The same image as an OCI image
   layout an app carries (`ImageStore.load` over `atrium.images.layout.LayoutSource`), loaded
   `RUNS` times into a fresh store: the same per MiB, no registry.
2. The data proxy (`GET /api/data/echo/open/x` with the user's token) and the page proxy
   (`GET /whoami` on the app's origin with its view cookie) to the SDK echo app, `REQUESTS` each
   on one kept-alive connection, against a shell whose bubblewrap instances live in a network
   namespace of their own on its bridge (``ATRIUM_APP_NETWORK_APPS=all``) and one whose instances
   share the host's loopback (``ATRIUM_APP_NETWORK=off``). Root only (the bridge, the image ids).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from atrium.images.layout import LayoutSource
from atrium.images.store import ImageStore
from bench.report import table
from tests.conftest import TESTS_DIR
from tests.integration.conftest import serving
from tests.integration.registry import running_registry
from tests.integration.test_image_layouts import write_layout
from tests.integration.test_image_store import BUSYBOX_CONFIG, Layer, busybox_layers, push_image

RUNS = 5
REQUESTS = 300
FILES = 256
FILE_BYTES = 128 * 1024
#: the own-network shell's range (others on this machine may hold the default one)
RANGE = "10.222.0.0/16"


async def pulls(folder: Path) -> tuple[list[float], list[float], float]:
    """Seconds per MiB of each pull + unpack and of each load from a layout, and the MiB
    unpacked."""
    bulk = Layer().folder("data")
    for number in range(FILES):
        bulk.file(f"data/f{number}", secrets.token_bytes(FILE_BYTES // 2) * 2)
    layers = [*busybox_layers(), bulk]
    per_mib: list[float] = []
    mib = 0.0
    with running_registry(folder / "registry") as registry:
        digest, _ = await push_image(registry, "bench/bulk", "1", layers, BUSYBOX_CONFIG)
        for number in range(RUNS):
            store = ImageStore(folder / f"store{number}")
            began = time.perf_counter()
            image = await store.pull(registry.host, "bench/bulk", digest)
            took = time.perf_counter() - began
            mib = image.size / (1 << 20)
            per_mib.append(took / mib)
            shutil.rmtree(store.root)
    app = folder / "app"
    carried = write_layout(app / "image", layers, BUSYBOX_CONFIG)
    loaded: list[float] = []
    for number in range(RUNS):
        store = ImageStore(folder / f"layout-store{number}")
        began = time.perf_counter()
        image = await store.load(LayoutSource(app, "image"), carried, "bench")
        loaded.append((time.perf_counter() - began) / (image.size / (1 << 20)))
        shutil.rmtree(store.root)
    return per_mib, loaded, mib


def proxied(folder: Path, network: str) -> tuple[list[float], list[float], str]:
    """Data proxy and page proxy request times against one shell whose instances' network is
    ``network`` (a range, or ``off``), and the network the instance says it has."""
    apps = folder / "apps"
    shutil.copytree(TESTS_DIR / "apps" / "test.sdk.echo", apps / "test.sdk.echo")
    home = folder / "home"
    with (
        serving(
            home,
            ATRIUM_SYSTEM_APPS=str(apps),
            ATRIUM_APP_NETWORK=network,
            ATRIUM_APP_NETWORK_APPS="all",
            ATRIUM_RUNNER="bwrap",
        ) as served,
        httpx.Client(
            base_url=served.url.replace("localhost", "127.0.0.1"),
            headers={"Authorization": f"Bearer {served.token}"},
            timeout=30,
        ) as api,
    ):
        instance = api.post("/api/instances", json={"appId": "test.sdk.echo"}).json()
        joined = str(api.get(f"/api/instances/{instance['instanceId']}").json().get("network"))
        data: list[float] = []
        for _ in range(REQUESTS):
            began = time.perf_counter()
            api.get("/api/data/echo/open/x").raise_for_status()
            data.append(time.perf_counter() - began)
        view = api.post(f"/api/instances/{instance['instanceId']}/views", json={"path": "/"})
        parts = urlsplit(view.json()["url"])
        with httpx.Client(
            base_url=served.url.replace("localhost", "127.0.0.1"),
            headers={"Host": parts.netloc},
            timeout=30,
        ) as page:
            entered = page.get(f"{parts.path}?{parts.query}")
            page.headers["Cookie"] = entered.headers["set-cookie"].split(";", 1)[0]
            pages: list[float] = []
            for _ in range(REQUESTS):
                began = time.perf_counter()
                page.get("/whoami").raise_for_status()
                pages.append(time.perf_counter() - began)
    return data, pages, joined


async def main() -> None:
    if os.geteuid() != 0 or not Path("/bin/busybox").is_file():
        print("\nimageproxy: skipped (needs root and Debian's busybox-static at /bin/busybox)")
        return
    with tempfile.TemporaryDirectory(prefix="atrium-bench-imageproxy-") as name:
        folder = Path(name)
        folder.chmod(0o755)
        per_mib, loaded, mib = await pulls(folder)
        own = await asyncio.to_thread(proxied, folder / "own", RANGE)
        loop = await asyncio.to_thread(proxied, folder / "loop", "off")
    table(
        f"Pull + unpack of an image ({mib:.1f} MiB unpacked), {RUNS} pulls (and {RUNS} loads "
        "from a layout the app carries) into a fresh store: "
        "time per MiB",
        [
            ("pull + verify + unpack, per MiB", per_mib),
            ("carried layout: verify + unpack, per MiB", loaded),
        ],
        baseline="pull + verify + unpack, per MiB",
    )
    table(
        f"The data proxy and the page proxy to the SDK echo app, {REQUESTS} requests each "
        f"(networks: {own[2]} vs {loop[2]})",
        [
            ("data proxy, instance on loopback", loop[0]),
            ("data proxy, instance in its own namespace", own[0]),
            ("page proxy, instance on loopback", loop[1]),
            ("page proxy, instance in its own namespace", own[1]),
        ],
        baseline="data proxy, instance on loopback",
    )
