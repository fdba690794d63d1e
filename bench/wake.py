"""Waking a provider: first-request latency through a wake, and what waking adds to warm requests.

For each runner (process, bwrap), `atrium serve` runs with two copies of the stdlib-only provider
(tests/apps/test.plain.stdlib, no SDK, no Atrium import): `bench.wake` sets `dataProvider.wake`,
`bench.plain` does not and is launched and resumed by hand. One sample of the wake is a GET with
no instance of `bench.wake` running, timed to the first byte of the answer (the status line);
the headless instance is then deleted through the API and the next sample starts from nothing.

Warm requests: the same GET to the woken headless instance and to the resumed `bench.plain`,
interleaved, so the cost of serving through a woken instance (the per-request count and idle
clock) shows against the proxy's own p50.

Goal (issue 15): wake → first byte ≤ 250 ms median for a stdlib app under bwrap; the warm cost
within the proxy's current p50.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.report import table
from bench.shell import serve, stop

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "apps" / "test.plain.stdlib"
WAKES = 21
WARM = 200


def provider(system: Path, app_id: str, authority: str, wake: bool) -> None:
    target = system / app_id
    shutil.copytree(FIXTURE, target)
    manifest = json.loads((target / "app.manifest.json").read_text())
    manifest.update(
        {
            "id": app_id,
            # Debian's python3: as root, the process runner's apps cannot reach an interpreter
            # under /root
            "entrypoint": ["/usr/bin/python3", "server.py"],
            "dataProvider": {
                "authority": authority,
                "providers": [{"path": "/items"}],
                "wake": wake,
            },
        }
    )
    (target / "app.manifest.json").write_text(json.dumps(manifest))


def start(root: Path, runner: str) -> tuple[subprocess.Popen[bytes], str, str]:
    root.mkdir(parents=True)
    root.chmod(0o755)
    system = root / "system-apps"
    provider(system, "bench.wake", "wakeb", True)
    provider(system, "bench.plain", "plainb", False)
    return serve(root / "home", system, runner)


def first_byte(api: httpx.Client, path: str) -> float:
    started = time.perf_counter()
    with api.stream("GET", path) as response:
        took = time.perf_counter() - started
        response.read()
    if response.status_code != 200:
        raise RuntimeError(f"GET {path}: {response.status_code} {response.text}")
    return took


def run(runner: str, root: Path) -> tuple[list[float], list[float], list[float]]:
    proc, url, token = start(root / runner, runner)
    try:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as api:
            created = api.post("/api/instances", json={"appId": "bench.plain"})
            if created.status_code != 200:
                raise RuntimeError(f"launching bench.plain failed: {created.text}")
            plain = created.json()
            api.post(f"/api/instances/{plain['instanceId']}/resumed").raise_for_status()
            wakes = []
            for _ in range(WAKES):
                wakes.append(first_byte(api, "/api/data/wakeb/items"))
                api.delete("/api/instances/bench.wake-provider").raise_for_status()
            first_byte(api, "/api/data/wakeb/items")  # woken again, for the warm requests
            woken, registered = [], []
            for _ in range(WARM):
                woken.append(first_byte(api, "/api/data/wakeb/items"))
                registered.append(first_byte(api, "/api/data/plainb/items"))
            return wakes, woken, registered
    finally:
        stop([proc])


def main_sync() -> None:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)  # the process runner's apps run under their own uid
        for runner in ("process", "bwrap"):
            results[runner] = run(runner, Path(tmp))
    table(
        f"Wake → first byte of a stdlib provider, {WAKES} wakes each",
        [
            ("process runner", results["process"][0]),
            ("bwrap runner", results["bwrap"][0]),
        ],
        baseline="process runner",
        target_ms=250,
    )
    for runner, (wakes, _, _) in results.items():
        ordered = sorted(wakes)
        p99 = ordered[min(len(ordered) - 1, round(len(ordered) * 0.99))] * 1000
        print(f"{runner}: wake p99 (of {len(ordered)}) {p99:.1f} ms")
    woken, registered = results["bwrap"][1], results["bwrap"][2]
    table(
        f"Warm GET through the data proxy (bwrap), {WARM} interleaved requests each",
        [("registered provider (the proxy's p50)", registered), ("woken headless provider", woken)],
        baseline="registered provider (the proxy's p50)",
    )
    added = (statistics.median(woken) - statistics.median(registered)) * 1000
    print(f"added by serving through a woken instance: {added:+.3f} ms at the median")


async def main() -> None:
    main_sync()
