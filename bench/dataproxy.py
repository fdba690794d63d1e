"""The data proxy under load: direct upstream vs Atrium vs nginx vs configurable-http-proxy.

All four serve the same upstream (bench/apps/bench.upstream, uvloop + httptools), driven by wrk
at 32 connections for requests/s and at 1 connection for latency, small (200 B) and large
(64 KiB) bodies, rounds interleaved in one run. Atrium's path is the full one: an app's bearer
token looked up, the provider entry matched, the permission checked, the headers rewritten.
Targets (providers issue): ≥ 25 % of nginx's requests/s for small bodies; ≤ 0.3 ms added median
latency at 1 connection. The anchor is nginx (Debian `nginx-light`), keepalive upstream.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"
NODE_DIR = Path(__file__).resolve().parent / ".node"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = os.environ.get("BENCH_SECONDS", "4")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def wrk(url: str, connections: int, token: str | None) -> tuple[float, float]:
    """(requests/s, median latency ms)."""
    cmd = ["wrk", f"-t{min(connections, 2)}", f"-c{connections}", f"-d{SECONDS}s", "--latency"]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"50%\s+([\d.]+)(\w+)", out).groups()  # type: ignore[union-attr]
    factor = {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    return rps, float(value) * factor


def start_shell(home: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    system = home / "system-apps"
    shutil.copytree(APPS / "bench.upstream", system / "bench.upstream")
    caller = system / "bench.caller"
    shutil.copytree(APPS / "bench.upstream", caller)
    manifest = json.loads((caller / "app.manifest.json").read_text())
    manifest.update({"id": "bench.caller", "permissions": ["bench.upstream.read"]})
    manifest.pop("dataProvider")
    (caller / "app.manifest.json").write_text(json.dumps(manifest))
    env = {
        **os.environ,
        "ATRIUM_HOME": str(home),
        "ATRIUM_PORT": "0",
        "ATRIUM_SYSTEM_APPS": str(system),
        "ATRIUM_RUNNER": "process",
        "ATRIUM_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "atrium", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url_file = home / "run" / "url"
    deadline = time.monotonic() + 30
    while not url_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the shell did not start")
        time.sleep(0.05)
    url = url_file.read_text().strip().replace("localhost", "127.0.0.1")
    return proc, url, (home / "run" / "token").read_text().strip()


def launch(url: str, token: str, app_id: str) -> dict[str, object]:
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as api:
        created = api.post("/api/instances", json={"appId": app_id})
        if created.status_code != 200:
            raise RuntimeError(f"launching {app_id} failed: {created.text}")
        instance: dict[str, object] = created.json()
        api.post(f"/api/instances/{instance['instanceId']}/resumed").raise_for_status()
        return instance


def start_nginx(tmp: Path, upstream: int) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log error;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  upstream up {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering on;
    }}
  }}
}}
""")
    proc = subprocess.Popen(
        ["nginx", "-c", str(conf), "-p", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return proc, port


def start_chp(upstream: int) -> tuple[subprocess.Popen[bytes], int] | None:
    """JupyterHub's configurable-http-proxy from the npm registry (skipped when unavailable)."""
    binary = NODE_DIR / "node_modules" / ".bin" / "configurable-http-proxy"
    if not binary.exists():
        install = subprocess.run(
            [
                "npm",
                "install",
                "--silent",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(NODE_DIR),
                "configurable-http-proxy@4",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if install.returncode != 0 or not binary.exists():
            print(f"configurable-http-proxy unavailable: {install.stderr.strip()[:200]}")
            return None
    port, api_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            str(binary),
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--api-ip",
            "127.0.0.1",
            "--api-port",
            str(api_port),
            "--default-target",
            f"http://127.0.0.1:{upstream}",
            "--log-level",
            "error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return proc, port


def main_sync() -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        shell, url, user_token = start_shell(tmp / "home")
        procs: list[subprocess.Popen[bytes]] = [shell]
        try:
            upstream = launch(url, user_token, "bench.upstream")
            launch(url, user_token, "bench.caller")
            caller_token = tmp / "home/scopes/system/apps/bench.caller/bench.caller-1/token"
            token = caller_token.read_text().strip()
            up_port = int(str(upstream["port"]))
            nginx, nginx_port = start_nginx(tmp, up_port)
            procs.append(nginx)
            targets: dict[str, tuple[str, str | None]] = {
                "direct upstream": (f"http://127.0.0.1:{up_port}/api/data", None),
                "atrium data proxy": (f"{url}/api/data/bench", token),
                "nginx (anchor)": (f"http://127.0.0.1:{nginx_port}/api/data", None),
            }
            chp = start_chp(up_port)
            if chp is not None:
                procs.append(chp[0])
                targets["configurable-http-proxy"] = (f"http://127.0.0.1:{chp[1]}/api/data", None)
            run(targets)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def run(targets: dict[str, tuple[str, str | None]]) -> None:
    results: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for size in ("small", "large"):
        for base, token in targets.values():
            wrk(f"{base}/{size}", 8, token)  # warm up connections and caches
    for _ in range(ROUNDS):
        for size in ("small", "large"):
            for name, (base, token) in targets.items():
                for connections in (32, 1):
                    results.setdefault((name, size, connections), []).append(
                        wrk(f"{base}/{size}", connections, token)
                    )
    for size, label in (("small", "200 B"), ("large", "64 KiB")):
        anchor = statistics.median(r for r, _ in results[("nginx (anchor)", size, 32)])
        direct_ms = statistics.median(ms for _, ms in results[("direct upstream", size, 1)])
        print(
            f"\nData proxy, {label} bodies, medians of {ROUNDS} interleaved rounds "
            f"(wrk, {SECONDS} s each)"
        )
        print(
            f"{'stack':<26} {'req/s @32':>10} {'vs nginx':>9} {'p50 ms @1':>10} {'added ms @1':>12}"
        )
        for name in targets:
            rps = statistics.median(r for r, _ in results[(name, size, 32)])
            ms = statistics.median(m for _, m in results[(name, size, 1)])
            print(
                f"{name:<26} {rps:>10.0f} {rps / anchor:>8.2f}x {ms:>10.3f} {ms - direct_ms:>12.3f}"
            )
    print("targets: atrium ≥ 0.25x nginx req/s (small); ≤ 0.3 ms added median latency @1")


async def main() -> None:
    main_sync()
