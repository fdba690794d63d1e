"""The data proxy under load: direct upstream vs Atrium vs nginx vs configurable-http-proxy,
and the candidate stacks for the proxy's HTTP server and client (bench/candidates.py).

All serve the same upstream (bench/apps/bench.upstream, uvloop + httptools), driven by wrk at 32
connections for requests/s and p50/p99 latency and at 1 connection for latency, small (200 B) and
large (64 KiB) bodies, rounds interleaved in one run: every stack, candidates included, is measured
in every round, so a drift of the machine shows in all of them. Atrium's path is the full one: an
app's bearer token looked up, the provider entry matched, the permission checked, the headers
rewritten. Each candidate is its own process (`python -m bench.candidates --stack NAME`); one that
cannot start (its package missing) is reported and skipped; BENCH_CANDIDATES=a,b picks some
(empty: none). Before measuring, every stack must answer both bodies correctly.
Goals (the structure issue): ≥ 0.40x nginx's requests/s for small bodies; ≥ 0.9x of the bare-pool
candidate for 64 KiB bodies; ≤ 0.3 ms added median latency at 1 connection. The anchor is nginx
(Debian `nginx-light`), keepalive upstream. What Atrium's checks cost is printed as the loop time
per request of the full path less that of the bare pool (`candidate: atrium-pool`, the same pool
and server with no token, table or permission): a regression in the checks shows there.
The users issue's goal: the same path in a shell holding 50 members (each with a session and a
personal token; the bench apps launched by one of them, so every lookup is a member's) answers
small bodies within 5 % of the shell with its admin alone, measured in the same rounds.
The data proxy keeps what it allowed per (caller, method, raw path) (decisions.md "Data proxy:
decisions kept"): the same path with every request decided afresh (`ATRIUM_DATA_DECISIONS=0`, the
path before decisions were kept) is measured in the same rounds, and each step of the checks is
timed in this process on the shell's own functions (`steps`), before (every step) and after (a
decision kept).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from atrium.api.proxy.data import split_path
from atrium.api.proxy.headers import DATA, Inbound, outbound
from atrium.identity import AppCaller, AppTokens, UserAuth, new_token
from atrium.manifest import Manifest
from atrium.permissions import holds
from atrium.providers import ProviderTable
from atrium.users.store import secret_hash
from bench import candidates
from bench.shell import ROOT, USERS, Shell, free_port, running_shell, stop, wait_port
from bench.wrk import WrkResult, wrk

NODE_DIR = Path(__file__).resolve().parent / ".node"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "4"))
SIZES = {"small": 200, "large": 65536}
ANCHOR = "nginx (anchor)"
DIRECT = "direct upstream"
ATRIUM = "atrium data proxy"
#: the same, in a shell holding USERS members with sessions and tokens, the apps run by one of them
ATRIUM_USERS = f"atrium, {USERS} users (a member's apps)"
#: Atrium's own pool with none of its checks: what the checks cost is measured against it
BARE_POOL = "candidate: atrium-pool"
#: the full path with no decision kept: every request decided afresh, as before they were kept
DECIDED_AFRESH = "atrium, every request decided"


@dataclass(frozen=True)
class Target:
    """One stack under test: its base URL (append `/small`, `/large`) and the token it is sent."""

    base: str
    token: str | None


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
    wait_port(port, proc=proc)
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
    wait_port(port, proc=proc)
    return proc, port


def selected_candidates() -> list[str]:
    chosen = os.environ.get("BENCH_CANDIDATES")
    if chosen is None:
        return list(candidates.STACKS)
    return [name.strip() for name in chosen.split(",") if name.strip()]


def start_candidate(
    tmp: Path, name: str, upstream: int
) -> tuple[subprocess.Popen[bytes], int] | None:
    """`python -m bench.candidates --stack NAME` on a free port; None (and why) when it fails."""
    if name not in candidates.STACKS:
        print(f"candidate {name} skipped: no such stack (bench/candidates.py STACKS)")
        return None
    port = free_port()
    log = tmp / f"candidate-{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.candidates",
                "--stack",
                name,
                "--port",
                str(port),
                "--upstream-port",
                str(upstream),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_port(port, proc=proc)
    except (RuntimeError, TimeoutError) as err:
        stop([proc])
        lines = log.read_text(errors="replace").strip().splitlines()
        print(f"candidate {name} skipped: {lines[-1] if lines else err}")
        return None
    return proc, port


def answers(name: str, target: Target) -> bool:
    """Whether the stack answers both bodies with 200 and the right length (else say why)."""
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
    with httpx.Client(headers=headers, timeout=10) as client:
        for size, length in SIZES.items():
            try:
                response = client.get(f"{target.base}/{size}")
            except httpx.HTTPError as err:
                print(f"{name} skipped: GET /{size} failed: {err!r}")
                return False
            if response.status_code != 200 or len(response.content) != length:
                print(
                    f"{name} skipped: GET /{size} answered {response.status_code} with "
                    f"{len(response.content)} bytes, not 200 with {length}"
                )
                return False
    return True


def main_sync() -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            (tmp / "users").mkdir()
            (tmp / "afresh").mkdir()
            steps()
            with (
                running_shell(tmp) as shell,
                running_shell(tmp / "users", users=USERS) as many,
                running_shell(tmp / "afresh", env={"ATRIUM_DATA_DECISIONS": "0"}) as afresh,
            ):
                targets = collect_targets(tmp, shell, procs)
                targets[ATRIUM_USERS] = Target(many.data_url, many.caller_token)
                targets[DECIDED_AFRESH] = Target(afresh.data_url, afresh.caller_token)
                for name in (ATRIUM_USERS, DECIDED_AFRESH):
                    if not answers(name, targets[name]):
                        raise RuntimeError(f"{name} does not answer correctly")
                run(targets)
        finally:
            stop(procs)


def collect_targets(
    tmp: Path, shell: Shell, procs: list[subprocess.Popen[bytes]]
) -> dict[str, Target]:
    """Start nginx, configurable-http-proxy and the candidates; every stack that answers."""
    up_port = shell.upstream_port
    nginx, nginx_port = start_nginx(tmp, up_port)
    procs.append(nginx)
    targets = {
        DIRECT: Target(shell.direct_url, None),
        ATRIUM: Target(shell.data_url, shell.caller_token),
        ANCHOR: Target(f"http://127.0.0.1:{nginx_port}/api/data", None),
    }
    chp = start_chp(up_port)
    if chp is not None:
        procs.append(chp[0])
        targets["configurable-http-proxy"] = Target(f"http://127.0.0.1:{chp[1]}/api/data", None)
    for name in selected_candidates():
        started = start_candidate(tmp, name, up_port)
        if started is not None:
            procs.append(started[0])
            # sent the caller's token like Atrium is, so the request is the same; it is dropped
            targets[f"candidate: {name}"] = Target(
                f"http://127.0.0.1:{started[1]}/api/data", shell.caller_token
            )
    for name in list(targets):
        if not answers(name, targets[name]):
            if name in (DIRECT, ANCHOR):
                raise RuntimeError(f"{name} does not answer correctly")
            del targets[name]
    return targets


def _per_call(fn: Callable[[], object], number: int = 20_000) -> float:
    """µs a call of ``fn``, the best of five runs (the least disturbed by other work)."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def steps() -> None:
    """Each step of the checks on a small-body request as the bench sends it, timed on the
    shell's own functions in this process: the caller (an app's bearer token: the bootstrap
    token compared, the personal tokens' hash looked up, the app token found), the canonical
    path, the entry match, the permission, the header filter both ways; and a kept decision's
    lookup, which replaces the canonical path, the match and the permission once made."""
    manifest = Manifest.model_validate(
        json.loads((Path(__file__).parent / "apps/bench.upstream/app.manifest.json").read_text())
    )
    provider = manifest.data_provider
    if provider is None:
        raise RuntimeError("bench.upstream declares no dataProvider")
    table = ProviderTable.build([("bench.upstream", provider)])
    granted = ["bench.upstream.read", "bench.upstream.write"]
    auth, tokens, personal = UserAuth(new_token()), AppTokens(), {"x": None}
    token = tokens.issue("bench.caller", "bench.caller-1", "default")
    raw = b"bench/small"
    request_headers = [
        (b"host", b"127.0.0.1:7070"),
        (b"authorization", f"Bearer {token}".encode()),
        (b"user-agent", b"wrk"),
    ]
    answer_headers = [
        (b"content-type", b"application/octet-stream"),
        (b"content-length", b"200"),
        (b"date", b"Fri, 27 Nov 2026 02:00:00 GMT"),
        (b"server", b"bench"),
    ]

    def caller() -> object:
        auth.is_token(token)
        personal.get(secret_hash(token))
        return tokens.lookup(token)

    who = tokens.lookup(token)
    if who is None:
        raise RuntimeError("the bench token is unknown")
    kept: dict[tuple[AppCaller, str, bytes], object] = {(who, "GET", raw): object()}

    def permission() -> bool:
        match = table.match("bench", "/small")
        return match is not None and holds(granted, match.permission("GET"))

    def decision_kept() -> object:
        found = kept.get((who, "GET", raw))
        slash = raw.find(b"/")
        return found, raw[slash:]

    figures = {
        "caller (app bearer token)": _per_call(caller),
        "canonical path": _per_call(lambda: split_path(raw)),
        "entry match": _per_call(lambda: table.match("bench", "/small")),
        "permission (match + holds)": _per_call(permission),
        "header filter in (Inbound)": _per_call(lambda: Inbound(request_headers, DATA)),
        "header filter out (outbound)": _per_call(lambda: outbound(answer_headers, DATA)),
        "decision kept (lookup)": _per_call(decision_kept),
    }
    print("\nThe checks' steps, µs a call in this process (best of 5 runs of 20,000 calls)")
    for name, value in figures.items():
        print(f"  {name:<30} {value:>7.3f}")
    common = (
        figures["caller (app bearer token)"]
        + figures["header filter in (Inbound)"]
        + figures["header filter out (outbound)"]
    )
    before = common + figures["canonical path"] + figures["permission (match + holds)"]
    after = common + figures["decision kept (lookup)"]
    print(
        f"  every step, decided afresh: {before:.3f} µs; with the decision kept: {after:.3f} µs "
        f"({after / before:.2f}x)"
    )


def median(results: Sequence[WrkResult], field: str) -> float:
    return statistics.median(float(getattr(r, field)) for r in results)


def comparisons(
    results: dict[tuple[str, str, int], list[WrkResult]], targets: dict[str, Target], size: str
) -> None:
    """Atrium with users against Atrium alone, and Atrium's checks against the bare pool."""
    if ATRIUM in targets and ATRIUM_USERS in targets:
        alone = median(results[(ATRIUM, size, 32)], "rps")
        shared = median(results[(ATRIUM_USERS, size, 32)], "rps")
        print(
            f"With {USERS} users: {shared / alone:.3f}x the requests/s of the shell with its "
            f"admin alone (goal: within 5 %, >= 0.95x)"
        )
    if ATRIUM in targets and DECIDED_AFRESH in targets:
        kept = median(results[(ATRIUM, size, 32)], "rps")
        afresh = median(results[(DECIDED_AFRESH, size, 32)], "rps")
        print(
            f"Decisions kept: {kept / afresh:.3f}x the requests/s of every request decided "
            f"({1e6 / afresh - 1e6 / kept:.1f} µs of the loop per request saved at 32 connections)"
        )
    for name in (ATRIUM, DECIDED_AFRESH):
        if name not in targets or BARE_POOL not in targets:
            continue
        full, bare = (
            median(results[(name, size, 32)], "rps"),
            median(results[(BARE_POOL, size, 32)], "rps"),
        )
        print(
            f"{name}: checks {1e6 / full - 1e6 / bare:.1f} µs of the loop per request "
            f"(full path {1e6 / full:.1f} µs, bare pool {1e6 / bare:.1f} µs at 32 "
            f"connections); full path {full / bare:.2f}x of the bare pool"
        )


def run(targets: dict[str, Target]) -> None:
    results: dict[tuple[str, str, int], list[WrkResult]] = {}
    for size in SIZES:
        for target in targets.values():
            wrk(f"{target.base}/{size}", 8, SECONDS, target.token)  # warm connections and caches
    for _ in range(ROUNDS):
        for size in SIZES:
            for name, target in targets.items():
                for connections in (32, 1):
                    results.setdefault((name, size, connections), []).append(
                        wrk(f"{target.base}/{size}", connections, SECONDS, target.token)
                    )
    width = max(26, *(len(name) for name in targets))
    for size, label in (("small", "200 B"), ("large", "64 KiB")):
        anchor = median(results[(ANCHOR, size, 32)], "rps")
        direct_ms = median(results[(DIRECT, size, 1)], "p50_ms")
        print(
            f"\nData proxy, {label} bodies, medians of {ROUNDS} interleaved rounds "
            f"(wrk, {SECONDS} s each)"
        )
        print(
            f"{'stack':<{width}} {'req/s @32':>10} {'vs nginx':>9} {'p50 ms @32':>11} "
            f"{'p99 ms @32':>11} {'p50 ms @1':>10} {'added ms @1':>12}"
        )
        for name in targets:
            at32, at1 = results[(name, size, 32)], results[(name, size, 1)]
            rps, p50_1 = median(at32, "rps"), median(at1, "p50_ms")
            print(
                f"{name:<{width}} {rps:>10.0f} {rps / anchor:>8.2f}x "
                f"{median(at32, 'p50_ms'):>11.3f} {median(at32, 'p99_ms'):>11.3f} "
                f"{p50_1:>10.3f} {p50_1 - direct_ms:>12.3f}"
            )
        comparisons(results, targets, size)
        for name in targets:
            runs = results[(name, size, 32)] + results[(name, size, 1)]
            socket_errors = sum(r.socket_errors for r in runs)
            bad = sum(r.bad_status for r in runs)
            if socket_errors or bad:
                print(
                    f"  {name}: {socket_errors} socket errors, {bad} responses ≥ 400 "
                    "over its runs: its figures are not comparable"
                )
    print(
        "goals: atrium ≥ 0.40x nginx req/s (200 B); ≥ 0.9x of the bare pool (64 KiB); "
        "≤ 0.3 ms added median latency @1"
    )


async def main() -> None:
    main_sync()
