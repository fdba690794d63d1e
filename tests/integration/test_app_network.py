"""Each image instance in its own network namespace on the shell's bridge, through the real shell
(root only): what an instance may reach from inside (a CGI of the busybox image tries each
target with ``nc``), and that nothing of the network outlives an instance or a killed shell."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Final

import pytest

from atrium.images.store import ImageStore
from atrium.lifecycle.network import NetworkUnavailable, open_network
from atrium.lifecycle.runners import SpawnSpec
from atrium.lifecycle.runners.bwrap import BwrapRunner, bwrap_works
from atrium.lifecycle.runners.process import descendants
from tests.integration.conftest import (
    RunningShell,
    StartShell,
    add_test_apps,
    launch_shell,
    serve_env,
    serving,
    wait_for,
)
from tests.integration.registry import Registry, running_registry
from tests.integration.test_image_apps import CONFIG, manifest
from tests.integration.test_image_store import Layer, busybox_layers, push_image
from tests.integration.test_origins import enter, open_view
from tests.runner_contract import PROBE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the instances' network needs a root shell"),
]

APP: Final = "test.net.one"
OTHER: Final = "test.net.two"
#: a range of the tests' own: another shell on this machine may hold the default one
RANGE: Final = "10.214.0.0/16"
#: ``/cgi-bin/reach?HOST:PORT``: whether a TCP connection from inside the image is accepted
REACH: Final = b"""#!/bin/sh
printf 'Content-Type: text/plain\\r\\n\\r\\n'
if nc -w 1 "${QUERY_STRING%:*}" "${QUERY_STRING##*:}" </dev/null >/dev/null 2>&1
then echo reached; else echo blocked; fi
"""
ADDR: Final = b"""#!/bin/sh
printf 'Content-Type: text/plain\\r\\n\\r\\n'
ip -o -4 addr show dev eth0
"""


def reach_layers() -> list[Layer]:
    cgi = (
        Layer()
        .folder("www/cgi-bin")
        .file("www/cgi-bin/reach", REACH, 0o755)
        .file("www/cgi-bin/addr", ADDR, 0o755)
    )
    for applet in ("nc", "ip", "printf"):
        cgi.link(f"bin/{applet}", "busybox")
    return [*busybox_layers(), cgi]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("net-registry")) as started:
        yield started


@pytest.fixture(scope="module")
def image(registry: Registry) -> str:
    digest, _ = asyncio.run(push_image(registry, "apps/reach", "1", reach_layers(), CONFIG))
    return digest


def place(system_apps: Path, registry: Registry, digest: str, app_id: str) -> None:
    described = manifest(registry, digest)
    described["id"] = app_id
    described["runtime"]["image"] = f"{registry.host}/apps/reach@{digest}"  # type: ignore[index]
    (system_apps / app_id).mkdir()
    (system_apps / app_id / "app.manifest.json").write_text(json.dumps(described))


def netns_of(pid: int) -> list[str]:
    """The named namespaces the shell ``pid`` made that still exist."""
    folder = Path("/run/netns")
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(name for name in names if name.startswith(f"atrium-{pid}-"))


def links_of(pid: int) -> list[str]:
    shown = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True).stdout)
    return [
        link["ifname"] for link in shown if link["ifname"].startswith((f"atrb{pid}-", f"atv{pid}x"))
    ]


def links_on(bridge: str) -> list[str]:
    """The bridge and the veths joined to it (another network of this process, an earlier
    test's shell, has its own bridge and is not counted)."""
    shown = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True).stdout)
    return [link["ifname"] for link in shown if bridge in (link["ifname"], link.get("master"))]


def tables_of(pid: int) -> list[str]:
    """The host's nft tables the shell ``pid`` made."""
    shown = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return [line.split()[-1] for line in shown.splitlines() if f" atrb{pid}-" in line]


def open_fds() -> set[tuple[str, str]]:
    """This process's descriptors with what each names: a leak is one not open before (or a
    number reused for something else); one that an earlier test left and the collector closed
    meanwhile is not (the count alone went down by two in CI that way)."""
    listing = f"/proc/{os.getpid()}/fd"
    found = set()
    for fd in Path(listing).iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone already
            if (target := str(fd.readlink())) != listing:  # the listing's own, at any number
                found.add((fd.name, target))
    return found


def children_of(pid: int) -> set[int]:
    """The processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def host_address() -> str | None:
    """An address of the host outside loopback and the tests' range, if it has one."""
    route = subprocess.run(
        ["ip", "-j", "-4", "route", "get", "192.0.2.1"], capture_output=True, check=False
    )
    try:
        found = json.loads(route.stdout)[0].get("prefsrc")
    except (ValueError, IndexError):
        return None
    return None if found is None else str(found)


def test_an_instance_reaches_the_shells_api_and_nothing_else(
    start_shell: StartShell, system_apps: Path, home: Path, registry: Registry, image: str
) -> None:
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/reach", image))
    place(system_apps, registry, image, APP)
    place(system_apps, registry, image, OTHER)
    shell: RunningShell = start_shell(app_network=RANGE)
    bridge = str(ipaddress.ip_network(RANGE).network_address + 1)
    # a service of the host's on every address: the shell's other ports, the host's services
    with socket.create_server(("0.0.0.0", 0)) as listener, shell.client(timeout=30) as api:  # noqa: S104
        elsewhere = listener.getsockname()[1]
        instance, url = open_view(api, APP)
        _, other_url = open_view(api, OTHER)
        listed = api.get(f"/api/instances/{instance['instanceId']}").json()
        assert listed["network"] == "own", listed
        one, _ = enter(shell, url)
        two, _ = enter(shell, other_url)
        with closing(one), closing(two):
            # the shell reaches both at their addresses in the range, no loopback port
            mine, theirs = (
                client.get("/cgi-bin/addr").text.split("inet ")[1].split("/")[0]
                for client in (one, two)
            )
            assert ipaddress.ip_address(mine) in ipaddress.ip_network(RANGE)
            assert ipaddress.ip_address(theirs) in ipaddress.ip_network(RANGE)
            assert mine != theirs

            def reach(target: str) -> str:
                answer = one.get(f"/cgi-bin/reach?{target}")
                assert answer.status_code == 200, answer.text
                return answer.text.strip()

            assert reach(f"{bridge}:{shell.settings.port}") == "reached"  # the shell's API
            assert reach(f"{bridge}:{elsewhere}") == "blocked"  # the shell's other ports
            assert reach(f"{theirs}:80") == "blocked"  # another instance
            assert reach(f"127.0.0.1:{registry.host.rsplit(':', 1)[1]}") == "blocked"
            outside = host_address()
            if outside is not None:
                assert reach(f"{outside}:{elsewhere}") == "blocked"  # the host elsewhere
            assert reach("127.0.0.1:80") == "reached"  # its own loopback


#: run as another user of the host: connects to HOST:PORT, says whether it was answered
KNOCK: Final = (
    "import socket,sys\n"
    "try:\n"
    "    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
    "    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
    "    print('answered' if s.recv(64) else 'closed')\n"
    "except OSError as err:\n"
    "    print(f'refused: {err}')\n"
)


def knock(address: str, port: int, user: int | None = None) -> str:
    """Whether a process of the host (the test's own, root but without the shell's mark, or
    ``user``'s) is answered at ``address:port``."""
    said = subprocess.run(
        ["/usr/bin/python3", "-c", KNOCK, address, str(port)],
        user=user,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return said.stdout.strip() or said.stderr


def test_only_the_shell_reaches_an_instances_address(
    start_shell: StartShell, system_apps: Path, home: Path, registry: Registry, image: str
) -> None:
    """Image apps check no shell secret: whoever reaches the address is served as the shell
    would be. Another user of the host, a root process without the shell's mark and a contract
    app on the host's network are refused; the shell's page proxy still serves the instance."""
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/reach", image))
    place(system_apps, registry, image, APP)
    add_test_apps(system_apps, PROBE)
    shell = start_shell(app_network=RANGE, app_network_apps="images")  # the probe on the host's
    with shell.client(timeout=30) as api:
        instance, url = open_view(api, APP)
        address = shell.shell.lifecycle.get(instance["instanceId"]).address
        assert ipaddress.ip_address(address.host) in ipaddress.ip_network(RANGE)
        client, _ = enter(shell, url)
        with closing(client):
            assert client.get("/cgi-bin/addr").status_code == 200  # the shell's own door
            assert knock(address.host, address.port, user=65534).startswith("refused"), "nobody"
            assert knock(address.host, address.port).startswith("refused"), "root, no mark"
            probe = api.post("/api/instances", json={"appId": PROBE}).json()
            assert probe["state"] == "started", probe
            answer = api.post(
                f"/api/proxy/{probe['instanceId']}/reach",
                params={"host": address.host, "port": address.port},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["reached"] is False  # a contract app on the host's network
            assert client.get("/cgi-bin/addr").status_code == 200


def test_only_the_shell_reaches_the_forwarders_loopback_port(
    start_shell: StartShell, system_apps: Path, home: Path, registry: Registry, image: str
) -> None:
    """Without the network (off here; a clash or no bwrap alike) an image app is reached at a
    loopback port the shell forwards into its namespace: another process of the host that
    connects there is let go unanswered, the shell's own connections are forwarded."""
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/reach", image))
    place(system_apps, registry, image, APP)
    shell = start_shell(app_network="off")
    with shell.client(timeout=30) as api:
        instance, url = open_view(api, APP)
        address = shell.shell.lifecycle.get(instance["instanceId"]).address
        assert address.host == "127.0.0.1", address
        client, _ = enter(shell, url)
        with closing(client):
            assert client.get("/cgi-bin/addr").status_code == 200  # the shell's own door
            # accepted, then closed unanswered (a reset: the request was left unread)
            assert knock(address.host, address.port, user=65534) != "answered"
            assert knock(address.host, address.port) != "answered"  # root, another process
            assert client.get("/cgi-bin/addr").status_code == 200


def test_nothing_of_the_network_outlives_an_instance_or_a_killed_shell(
    start_shell: StartShell, system_apps: Path, home: Path, registry: Registry, image: str
) -> None:
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/reach", image))
    place(system_apps, registry, image, APP)
    add_test_apps(system_apps, PROBE)
    home.chmod(0o700)  # the image store made it: the home is the shell's alone
    with serving(
        home, stop=signal.SIGKILL, ATRIUM_APP_NETWORK=RANGE, ATRIUM_SYSTEM_APPS=str(system_apps)
    ) as served:
        pid = served.proc.pid
        bridge = [f"atrb{pid}-0"]
        # the bridge and the host's table wait for the first instance
        assert not links_of(pid)
        assert not tables_of(pid)
        with served.client(timeout=30) as api:
            first = api.post("/api/instances", json={"appId": APP}).json()
            assert first["state"] == "started", first
            # the instance's namespace is named only until its sandbox is in it
            assert not netns_of(pid)
            assert len(links_of(pid)) == 2  # the bridge and the instance's veth
            # destroyed: its namespace goes, and its veth with it
            assert api.delete(f"/api/instances/{first['instanceId']}").status_code == 200
            wait_for(lambda: links_of(pid) == bridge, "the destroyed instance's veth to go")
            # crashed (its sandbox killed from outside): the same
            crashed = api.post("/api/instances", json={"appId": APP}).json()
            os.kill(crashed["pid"], signal.SIGKILL)
            wait_for(lambda: links_of(pid) == bridge, "the crashed instance's veth to go")
            # and the crash seen (the veth goes first): a launch before it was handed the
            # instance whose process had just died, still `started`
            wait_for(
                lambda: (
                    api.get(f"/api/instances/{crashed['instanceId']}").json()["state"] == "error"
                ),
                "the crash to be seen",
            )
            third = api.post("/api/instances", json={"appId": APP}).json()
            assert third["state"] == "started", third
            # a contract app under bwrap has its own namespace by default, gone the same way
            probe = api.post("/api/instances", json={"appId": PROBE}).json()
            assert probe["state"] == "started", probe
            assert probe["network"] == "own", probe
            assert len(links_of(pid)) == 3
    # serving() killed the shell with SIGKILL: the sandbox went with it, and its namespace and
    # veth with the sandbox; only the bridge stays until a shell starts
    wait_for(lambda: links_of(pid) == bridge, "the killed shell's instance's veth to go")
    assert not netns_of(pid)
    assert tables_of(pid) == bridge  # the host's table, named as the bridge
    shell = start_shell(app_network=RANGE)
    assert shell.shell.network is not None
    assert not links_of(pid)
    assert not tables_of(pid)
    # doctor says which network instances get here
    said = subprocess.run(
        [sys.executable, "-m", "atrium", "doctor", "--json"],
        env=serve_env(home, ATRIUM_APP_NETWORK=RANGE),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert json.loads(said.stdout)["network"].startswith(
        f"network: each image instance and each contract app under bwrap in its own namespace "
        f"on {RANGE}"
    ), said.stdout + said.stderr


def test_a_contract_app_under_bwrap_reaches_the_shells_api_and_nothing_else(
    start_shell: StartShell, system_apps: Path
) -> None:
    if (problem := bwrap_works()) is not None:
        pytest.skip(f"bubblewrap does not work here: {problem}")
    add_test_apps(system_apps, PROBE)
    shell = start_shell(runner="bwrap", app_network=RANGE)  # every sandboxed app, by default
    bridge = str(ipaddress.ip_network(RANGE).network_address + 1)
    with socket.create_server(("0.0.0.0", 0)) as listener, shell.client(timeout=30) as api:  # noqa: S104
        elsewhere = listener.getsockname()[1]
        one, two = (
            api.post("/api/instances", json={"appId": PROBE, "new": True}).json() for _ in range(2)
        )
        assert one["state"] == two["state"] == "started", (one, two)
        assert one["network"] == "own", one
        # the shell reaches it at its address in the range, not on loopback
        mine = shell.shell.lifecycle.get(one["instanceId"]).address
        assert ipaddress.ip_address(mine.host) in ipaddress.ip_network(RANGE)
        assert api.get(f"/api/proxy/{one['instanceId']}/boot").status_code == 200
        theirs = shell.shell.lifecycle.get(two["instanceId"]).address

        def reach(host: str, port: int) -> bool:
            answer = api.post(
                f"/api/proxy/{one['instanceId']}/reach", params={"host": host, "port": port}
            )
            assert answer.status_code == 200, answer.text
            reached: bool = answer.json()["reached"]
            return reached

        assert reach(bridge, shell.settings.port)  # the shell's API, at OS_SHELL_URL
        assert not reach("127.0.0.1", elsewhere)  # the host's loopback services
        assert not reach("127.0.0.1", shell.settings.port)  # the shell's loopback port
        assert not reach(bridge, elsewhere)  # the shell's other ports
        assert not reach(theirs.host, theirs.port)  # another instance
        outside = host_address()
        if outside is not None:
            assert not reach(outside, elsewhere)  # the host elsewhere


def test_an_address_used_again_is_reached_while_the_last_namespace_on_it_lingers(
    start_shell: StartShell, system_apps: Path
) -> None:
    """The kernel tears an instance's namespace down after its last process, later (seconds on
    a busy machine): its veth stayed on the bridge with the address's one MAC, the bridge sent
    the next instance on that address the shell's packets for the old one, and its start met
    the deadline (`/health did not answer`, seen as a warm pool that did not refill). The old
    namespace is held here by a descriptor, as the kernel's late teardown would hold it."""
    if (problem := bwrap_works()) is not None:
        pytest.skip(f"bubblewrap does not work here: {problem}")
    add_test_apps(system_apps, PROBE)
    shell = start_shell(runner="bwrap", app_network=RANGE)
    network = shell.shell.network
    assert network is not None
    with shell.client(timeout=30) as api:
        first = api.post("/api/instances", json={"appId": PROBE}).json()
        assert first["state"] == "started", first
        address = shell.shell.lifecycle.get(first["instanceId"]).address.host
        held = os.open(f"/proc/{first['pid']}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            assert api.delete(f"/api/instances/{first['instanceId']}").status_code == 200
            # its veth left the bridge though the namespace lives on
            assert links_on(network.plan.bridge) == [network.plan.bridge]
            second = api.post("/api/instances", json={"appId": PROBE}).json()
            assert second["state"] == "started", second
            assert shell.shell.lifecycle.get(second["instanceId"]).address.host == address
            assert api.get(f"/api/proxy/{second['instanceId']}/boot").status_code == 200
        finally:
            os.close(held)


def test_the_bridge_waits_for_the_first_instance_that_needs_it(
    start_shell: StartShell, system_apps: Path
) -> None:
    """A root shell makes no bridge (nor host table) at its start; contract apps kept on the
    host's network (``ATRIUM_APP_NETWORK_APPS=images``, the way out) need none either; the
    shell's close removes what it made."""
    if (problem := bwrap_works()) is not None:
        pytest.skip(f"bubblewrap does not work here: {problem}")
    add_test_apps(system_apps, PROBE)
    shell = start_shell(runner="bwrap", app_network=RANGE, app_network_apps="images")
    network = shell.shell.network
    assert network is not None
    bridge = network.plan.bridge
    assert not links_on(bridge)
    with shell.client(timeout=30) as api:
        probe = api.post("/api/instances", json={"appId": PROBE}).json()
        assert probe["state"] == "started", probe
        assert probe["network"] == "host", probe
        assert api.get(f"/api/proxy/{probe['instanceId']}/boot").status_code == 200
    assert not links_on(bridge)
    assert bridge not in tables_of(os.getpid())
    shell.stop()
    assert not links_on(bridge)


def test_a_range_taken_after_the_start_leaves_contract_apps_on_the_hosts_network(
    start_shell: StartShell, system_apps: Path, tmp_path: Path
) -> None:
    """Two shells started on one range (the bridge waits for an instance, so neither saw a
    clash): the second one's first instance finds the range taken, and its contract apps share
    the host's network, as with a clash seen at the start, rather than fail to start."""
    if (problem := bwrap_works()) is not None:
        pytest.skip(f"bubblewrap does not work here: {problem}")
    add_test_apps(system_apps, PROBE)
    first = start_shell(runner="bwrap", app_network=RANGE)
    second = launch_shell(tmp_path / "second", system_apps, runner="bwrap", app_network=RANGE)
    try:
        for shell, network in ((first, "own"), (second, "host")):
            with shell.client(timeout=30) as api:
                probe = api.post("/api/instances", json={"appId": PROBE}).json()
                assert (probe["state"], probe["network"]) == ("started", network), (
                    probe,
                    shell.shell.isolation,
                )
                assert api.get(f"/api/proxy/{probe['instanceId']}/boot").status_code == 200
        assert second.shell.network is not None
        assert second.shell.network.refused is not None
        assert not links_on(second.shell.network.plan.bridge)
    finally:
        second.stop()


def test_fifty_contract_sandboxes_leave_nothing(tmp_path: Path) -> None:
    """Fifty contract apps' sandboxes (bwrap, each in a namespace of the network) started and
    stopped, or killed from outside: no namespace, veth, descriptor or process is left."""
    if (problem := bwrap_works()) is not None:
        pytest.skip(f"bubblewrap does not work here: {problem}")
    fds = open_fds()
    children = children_of(os.getpid())
    network = open_network("10.220.0.0/16", 9)
    runner = BwrapRunner(network=network)
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "idle.py").write_text("import time\ntime.sleep(600)\n")

    def spec(n: int) -> SpawnSpec:
        return SpawnSpec(
            app_id="test.net.idle",
            instance_id=f"i{n}",
            app_dir=app_dir,
            argv=[sys.executable, str(app_dir / "idle.py")],
            env={},
            data_dir=tmp_path / "data" / f"i{n}",
            host="127.0.0.1",
            port=8000,
            log_path=tmp_path / "logs" / f"i{n}.log",
            ro_paths=(Path(sys.prefix), Path(sys.base_prefix)),
        )

    async def cycle() -> set[str]:
        addresses, pids = set(), []
        for n in range(50):
            app = await runner.spawn(spec(n))
            addresses.add(app.host)
            pids.append(app.pid)
            # the app runs (bwrap's reaper and the app below it): a bwrap killed before its
            # reaper asked to die with it leaves the sandbox running (bwrap 0.8)
            while len(descendants(app.pid or 0)) < 2:
                await asyncio.sleep(0.005)
            if n % 2:
                os.kill(app.pid or 0, signal.SIGKILL)  # a crash
                await app.wait()
            # a stop returns once the watcher released the address (after a crash too)
            await app.stop(grace=5)
        assert not [pid for pid in pids if pid and Path(f"/proc/{pid}").exists()]
        return addresses

    try:
        assert asyncio.run(cycle()) == {"10.220.0.2"}  # the one address, reused
        assert not netns_of(os.getpid())
        bridge = [network.plan.bridge]
        wait_for(lambda: links_on(bridge[0]) == bridge, "the veths to go", timeout=60)
    finally:
        network.close()
    wait_for(lambda: not links_on(bridge[0]), "the bridge to go")
    assert bridge[0] not in tables_of(os.getpid())
    assert open_fds() - fds == set()
    assert children_of(os.getpid()) <= children


def test_fifty_namespaces_made_and_removed_leave_nothing() -> None:
    """The network's own bookkeeping (real ``ip`` and ``nft``, no shell): addresses come back,
    and no namespace, veth or descriptor is left."""
    fds = open_fds()
    network = open_network("10.218.0.0/16", 9)

    async def cycle() -> list[str]:
        addresses = []
        for _ in range(50):
            lease = await network.plumb()
            addresses.append(lease.address)
            await network.release(lease)
            await network.release(lease)  # a second release does nothing
        return addresses

    try:
        assert set(asyncio.run(cycle())) == {"10.218.0.2"}  # the one address, reused
        assert not netns_of(os.getpid())
        # the kernel removes a deleted namespace's veth pair a moment later
        bridge = [network.plan.bridge]
        # (fifty at once may queue a while on a loaded machine: a generous deadline)
        wait_for(lambda: links_on(bridge[0]) == bridge, "the veths to go", timeout=60)
    finally:
        network.close()
    wait_for(lambda: not links_on(bridge[0]), "the bridge to go")
    assert open_fds() - fds == set()


def test_a_range_the_host_routes_elsewhere_is_refused_and_named() -> None:
    first = open_network("10.219.0.0/16", 9)
    try:
        asyncio.run(first.bridge())  # as its first instance makes it
        with pytest.raises(NetworkUnavailable) as refused:
            open_network("10.219.128.0/17", 9)
        assert str(refused.value) == (
            "10.219.128.0/17 overlaps the host's route to 10.219.0.0/16 on "
            f"{first.plan.bridge}: choose another range in ATRIUM_APP_NETWORK"
        )
        # and the refused one left no bridge behind (veths of earlier tests' instances may still
        # be on their way out: the kernel removes a namespace's devices a moment after it ends)
        bridges = [name for name in links_of(os.getpid()) if name.startswith("atrb")]
        assert bridges == [first.plan.bridge]
    finally:
        first.close()


def test_a_neighbour_routing_the_range_here_does_not_reach_the_shell_on_the_bridge(
    start_shell: StartShell,
) -> None:
    """A machine beside the host (a namespace joined to the host by a veth of its own, not the
    bridge) that routes the range to the host reaches the bridge's address (the host answers for
    its addresses on every interface), but the shell's listener there takes only the bridge's."""
    shell = start_shell(app_network=RANGE)
    assert shell.shell.network is not None
    shell.on_loop(shell.shell.network.bridge())  # as the first instance makes it
    bridge = str(ipaddress.ip_network(RANGE).network_address + 1)
    name, link = f"atrtest{os.getpid()}", f"atrt{os.getpid()}"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name],
        ["ip", "addr", "add", "192.168.251.1/30", "dev", link],
        ["ip", "link", "set", link, "up"],
        ["ip", "-n", name, "addr", "add", "192.168.251.2/30", "dev", "eth0"],
        ["ip", "-n", name, "link", "set", "eth0", "up"],
        ["ip", "-n", name, "route", "add", RANGE, "via", "192.168.251.1"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        probe = (
            "import socket,sys\n"
            "try:\n"
            f"    socket.create_connection(({bridge!r}, {shell.settings.port}), timeout=3)\n"
            "except OSError as err:\n"
            "    sys.exit(f'refused: {err}')\n"
            "print('reached')\n"
        )
        answer = subprocess.run(
            ["ip", "netns", "exec", name, sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert "reached" not in answer.stdout, answer
        assert "refused" in answer.stderr, answer
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True)
        subprocess.run(["ip", "link", "delete", link], check=False, capture_output=True)
