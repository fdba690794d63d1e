"""The authors' kit, measured (issue 18): from `atrium new` to the first painted page, and the
`atrium dev` reload from a file saved to the new version answering.

One `atrium serve` (the best runner: bwrap) and one Chromium (Debian's, already open, as a
user's browser would be). First page, per template, `SAMPLES` times with a new app id each: the
folder written (`atrium new`'s own code), installed into the user scope through the API,
launched, a view created, and the view's URL opened until the page's first contentful paint.

Reload, per template: `atrium dev <folder>` as its own process against that shell; each sample
writes a new marker into the page, then polls the page through `/api/proxy/…` every 5 ms until
the marker is served. The time counts watchfiles noticing the save, the validation, the install
of the dev copy (fetch, check, commit) and the instance's restart. Goal: ≤ 1 s for `python`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import Page, sync_playwright

from atrium.authoring.scaffold import TEMPLATES, create
from bench.report import table
from bench.shell import serve, stop

SAMPLES = 5
RELOADS = 11


def first_page(
    api: httpx.Client, root: Path, page: Page, template: str, n: int
) -> dict[str, float]:
    app_id = f"com.example.bench-{template}-{n}"
    marks = {"start": time.perf_counter()}
    folder = create(root, app_id, template)
    marks["new"] = time.perf_counter()
    body = {"ref": f"local:{folder}", "scope": "user", "autoApprove": True}
    api.post("/api/dist/install", json=body).raise_for_status()
    marks["install"] = time.perf_counter()
    instance = api.post("/api/instances", json={"appId": app_id})
    instance.raise_for_status()
    iid = instance.json()["instanceId"]
    marks["launch"] = time.perf_counter()
    view = api.post(f"/api/instances/{iid}/views", json={"path": "/"})
    view.raise_for_status()
    page.goto(view.json()["url"])
    page.wait_for_function("performance.getEntriesByName('first-contentful-paint').length > 0")
    marks["paint"] = time.perf_counter()
    return {
        "total": marks["paint"] - marks["start"],
        "new": marks["new"] - marks["start"],
        "install": marks["install"] - marks["new"],
        "launch": marks["launch"] - marks["install"],
        "view and paint": marks["paint"] - marks["launch"],
    }


def reloads(url: str, token: str, api: httpx.Client, root: Path, template: str) -> list[float]:
    app_id = f"com.example.reload-{template}"
    folder = create(root, app_id, template)
    env = {**os.environ, "ATRIUM_URL": url, "ATRIUM_TOKEN": token}
    dev = subprocess.Popen(
        [sys.executable, "-m", "atrium", "dev", str(folder)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert dev.stdout is not None
    try:
        while "Watching" not in (line := dev.stdout.readline()):
            if not line:
                raise RuntimeError(f"atrium dev {template} ended before watching")
        time.sleep(0.5)
        page = folder / "index.html"
        original = page.read_text()
        samples = []
        for n in range(RELOADS):
            marker = f"reload-marker-{n}"
            started = time.perf_counter()
            page.write_text(original.replace("</h1>", f" {marker}</h1>"))
            deadline = started + 30
            while marker not in api.get(f"/api/proxy/{app_id}-1/").text:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{template}: reload {n} not served within 30 s")
                time.sleep(0.005)
            samples.append(time.perf_counter() - started)
            time.sleep(0.3)  # the log poll and the watcher settle between saves
        return samples
    finally:
        dev.send_signal(2)
        dev.communicate(timeout=30)


def main_sync() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        system = root / "system-apps"
        system.mkdir()
        apps = root / "apps"
        apps.mkdir()
        proc, url, token = serve(root / "home", system, "bwrap")
        try:
            with (
                httpx.Client(
                    base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
                ) as api,
                sync_playwright() as pw,
            ):
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium")
                page = browser.new_page()
                page.goto(f"{url}/login?token={token}")
                firsts = {
                    t: [first_page(api, apps, page, t, n) for n in range(SAMPLES)]
                    for t in TEMPLATES
                }
                browser.close()
                reloaded = {t: reloads(url, token, api, apps, t) for t in TEMPLATES}
        finally:
            stop([proc])
    table(
        f"`atrium new` → first contentful paint in Chromium (bwrap), {SAMPLES} new apps each",
        [(f"{t}: total", [s["total"] for s in firsts[t]]) for t in TEMPLATES],
        baseline="python: total",
    )
    for t in TEMPLATES:
        parts = ", ".join(
            f"{k} {sorted(s[k] for s in firsts[t])[SAMPLES // 2] * 1000:.0f} ms"
            for k in ("new", "install", "launch", "view and paint")
        )
        print(f"{t}: medians of the steps: {parts}")
    table(
        f"`atrium dev`: file saved → new version served, {RELOADS} saves each",
        [(f"{t} template", reloaded[t]) for t in TEMPLATES],
        baseline="python template",
        target_ms=1000,
    )


async def main() -> None:
    await asyncio.to_thread(main_sync)  # Playwright's sync API refuses a running event loop
