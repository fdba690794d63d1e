"""Egress only when granted, through the real shell (root only): an "outside" server in a network
namespace of its own, joined to the host by a veth (the internet, as far as the host routes),
and image instances that try it, the host's loopback, another instance and the shell's other
ports from inside (the reach image's CGI, `test_app_network`). An app that asks nothing reaches
none of them; one granted ``egress: true`` reaches the outside and still none of the others;
one granted a ``host:port`` list reaches that alone; a revoke takes effect on the running
instance at once, and so does a grant. A contract app under bwrap (the probe) granted a list
reaches that alone too, until a revoke."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Final

import httpx
import pytest

from atrium.images.store import ImageStore
from atrium.lifecycle.runners.bwrap import bwrap_works
from tests.integration.conftest import RunningShell, StartShell, add_test_apps
from tests.integration.registry import Registry
from tests.integration.test_app_network import host_address, image, place, registry
from tests.integration.test_origins import enter, open_view
from tests.runner_contract import PROBE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the instances' network needs a root shell"),
]
__all__ = ["image", "registry"]  # the module's fixtures, shared with test_app_network

OPEN: Final = "test.egress.open"
LISTED: Final = "test.egress.listed"
CLOSED: Final = "test.egress.closed"
#: the instances' network of these tests' shells, and the outside's link to the host: the host's
#: end and the server's end; ranges no other test file takes (test_app_network's 10.214.0.0/16 and
#: test_network_attacks' 10.215.0.0/16 were these once, and clashed when the files ran at once
#: under pytest-xdist)
RANGE: Final = "10.222.0.0/16"
LINK: Final = "10.223.0.0/24"
HOST_END: Final = "10.223.0.1"
OUTSIDE: Final = "10.223.0.2"
SERVE: Final = (
    "import socket,sys,threading\n"
    "def serve(port):\n"
    "    s = socket.create_server((sys.argv[1], port))\n"
    "    while True:\n"
    "        c, _ = s.accept(); c.close()\n"
    "ports = [int(p) for p in sys.argv[2:]]\n"
    "for p in ports[1:]: threading.Thread(target=serve, args=(p,), daemon=True).start()\n"
    "print('up', flush=True)\n"
    "serve(ports[0])\n"
)


@pytest.fixture
def outside() -> Iterator[tuple[int, int]]:
    """A server on two ports in a namespace joined to the host (``OUTSIDE``); the host's IPv4
    forwarding as it was afterwards."""
    name, veth = f"atrout-{os.getpid()}", f"atxo{os.getpid()}"
    forward = Path("/proc/sys/net/ipv4/ip_forward")
    before = forward.read_text()
    ports = [free_port(), free_port()]

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    with ExitStack() as stack:
        stack.callback(forward.write_text, before)
        ip("netns", "add", name)
        stack.callback(subprocess.run, ["ip", "netns", "delete", name], check=False)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("addr", "add", f"{HOST_END}/24", "dev", veth)
        ip("link", "set", veth, "up")
        ip("-n", name, "addr", "add", f"{OUTSIDE}/24", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "route", "add", "default", "via", HOST_END)
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", SERVE, OUTSIDE, *map(str, ports)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        stack.callback(server.stdout.close)
        stack.callback(server.wait, 10)
        stack.callback(server.kill)
        assert server.stdout.readline().strip() == "up"
        yield ports[0], ports[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ask(system_apps: Path, app_id: str, egress: object) -> None:
    """``app_id``'s manifest asks ``egress`` (None: no ``network`` at all)."""
    path = system_apps / app_id / "app.manifest.json"
    manifest = json.loads(path.read_text())
    if egress is not None:
        manifest["network"] = {"egress": egress}
    path.write_text(json.dumps(manifest))


class Inside:
    """An instance of an app, asked from inside what it reaches."""

    def __init__(self, shell: RunningShell, api: httpx.Client, app_id: str) -> None:
        _, url = open_view(api, app_id)
        self.client, _ = enter(shell, url)
        answer = self.client.get("/cgi-bin/addr")
        assert answer.status_code == 200, answer.text
        self.address = answer.text.split("inet ")[1].split("/")[0]

    def reach(self, target: str) -> str:
        answer = self.client.get(f"/cgi-bin/reach?{target}")
        assert answer.status_code == 200, answer.text
        return answer.text.strip()


def test_egress_only_when_granted_and_revoked_at_once(
    start_shell: StartShell,
    system_apps: Path,
    home: Path,
    registry: Registry,
    image: str,
    outside: tuple[int, int],
) -> None:
    first, second = outside
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/reach", image))
    for app_id, egress in (
        (OPEN, True),
        (LISTED, [f"{OUTSIDE}:{first}"]),
        (CLOSED, None),
    ):
        place(system_apps, registry, image, app_id)
        ask(system_apps, app_id, egress)
    contract = bwrap_works() is None
    if contract:
        add_test_apps(system_apps, PROBE)
        ask(system_apps, PROBE, [f"{OUTSIDE}:{first}"])
    shell = start_shell(runner="bwrap", app_network=RANGE)
    bridge = str(ipaddress.ip_network(RANGE).network_address + 1)
    registry_port = registry.host.rsplit(":", 1)[1]
    elsewhere = host_address()
    with (
        socket.create_server(("0.0.0.0", 0)) as listener,  # noqa: S104 - the host's service
        shell.client(timeout=30) as api,
    ):
        port = listener.getsockname()[1]
        opened, listed, closed = (Inside(shell, api, a) for a in (OPEN, LISTED, CLOSED))
        with closing(opened.client), closing(listed.client), closing(closed.client):

            def nowhere_else(one: Inside, other: Inside) -> None:
                assert one.reach(f"{bridge}:{shell.settings.port}") == "reached"  # its API
                assert one.reach(f"{bridge}:{port}") == "blocked"  # the shell's other ports
                assert one.reach(f"{other.address}:80") == "blocked"  # another instance
                assert one.reach(f"127.0.0.1:{registry_port}") == "blocked"  # host loopback
                assert one.reach(f"{HOST_END}:{port}") == "blocked"  # the host, its uplink
                if elsewhere is not None:
                    assert one.reach(f"{elsewhere}:{port}") == "blocked"  # the host elsewhere

            # asked nothing: nothing outside
            assert closed.reach(f"{OUTSIDE}:{first}") == "blocked"
            nowhere_else(closed, opened)
            # granted the internet: the outside, and nothing of the host or the others
            assert opened.reach(f"{OUTSIDE}:{first}") == "reached"
            assert opened.reach(f"{OUTSIDE}:{second}") == "reached"
            nowhere_else(opened, closed)
            # granted one host:port: that one alone
            assert listed.reach(f"{OUTSIDE}:{first}") == "reached"
            assert listed.reach(f"{OUTSIDE}:{second}") == "blocked"
            nowhere_else(listed, closed)

            detail = api.get(f"/api/apps/{OPEN}").json()
            assert detail["network"]["egress"]["asked"] is True, detail
            assert detail["network"]["egress"]["granted"] is True
            assert detail["network"]["egress"]["words"] == "Can reach the internet"
            assert api.get(f"/api/apps/{CLOSED}").json()["network"]["egress"]["asked"] is False

            # revoked: the running instance loses it at once
            revoked = api.delete(f"/api/apps/{OPEN}/egress")
            assert revoked.status_code == 200, revoked.text
            assert revoked.json()["network"]["egress"]["granted"] is False
            assert opened.reach(f"{OUTSIDE}:{first}") == "blocked"
            assert listed.reach(f"{OUTSIDE}:{first}") == "reached"  # another app's grant
            detail = api.get(f"/api/apps/{OPEN}").json()["network"]["egress"]
            assert (detail["granted"], detail["revoked"]) == (False, True), detail
            # granted again: at once too
            assert api.put(f"/api/apps/{OPEN}/egress").status_code == 200
            assert opened.reach(f"{OUTSIDE}:{first}") == "reached"
            nowhere_else(opened, closed)
            # an app that asks nothing has nothing to grant
            refused = api.put(f"/api/apps/{CLOSED}/egress")
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["appId"] == CLOSED
            if contract:
                probe = api.post("/api/instances", json={"appId": PROBE, "new": True}).json()
                assert (probe.get("state"), probe.get("network")) == ("started", "own"), probe

                def probed(port: int) -> bool:
                    answer = api.post(
                        f"/api/proxy/{probe['instanceId']}/reach",
                        params={"host": OUTSIDE, "port": port},
                    )
                    assert answer.status_code == 200, answer.text
                    reached: bool = answer.json()["reached"]
                    return reached

                # a contract app granted one host:port: that one alone, until revoked
                assert probed(first)
                assert not probed(second)
                assert api.delete(f"/api/apps/{PROBE}/egress").status_code == 200
                assert not probed(first)
            # revoked again, the shell stopped: the next one's instance starts without it
            assert api.delete(f"/api/apps/{OPEN}/egress").status_code == 200
    shell.stop()
    again = start_shell(app_network=RANGE)
    with again.client(timeout=30) as api:
        detail = api.get(f"/api/apps/{OPEN}").json()["network"]["egress"]
        assert (detail["granted"], detail["revoked"]) == (False, True), detail
        later = Inside(again, api, OPEN)
        with closing(later.client):
            assert later.reach(f"{OUTSIDE}:{first}") == "blocked"
