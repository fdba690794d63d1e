"""The instances' network as planned (atrium.lifecycle.network): names, addresses, the clash
check and what a start-up sweep takes; the plumbing itself is tested through the real shell
(tests/integration/test_app_network.py)."""

from __future__ import annotations

import ipaddress

import pytest

from atrium.lifecycle.network import (
    Plan,
    clash,
    leftovers,
    mac_of,
    parse_range,
    veth_name,
)


def test_an_address_has_one_mac_and_names_fit_an_interface() -> None:
    plan = Plan(parse_range("10.213.0.0/16"), 4_194_304, 8000, 3)
    assert plan.shell_address == ipaddress.ip_address("10.213.0.1")
    assert plan.shell_url == "http://10.213.0.1:8000"
    assert plan.address(0) == ipaddress.ip_address("10.213.0.2")
    assert mac_of(plan.address(0)) == "02:a7:0a:d5:00:02"
    assert mac_of(plan.address(0)) == mac_of(ipaddress.IPv4Address("10.213.0.2"))
    assert len(plan.bridge) <= 15
    assert len(veth_name(4_194_304, 36**4 - 1)) <= 15
    with pytest.raises(ValueError, match="no interface name"):
        veth_name(4_194_304, 36**4)
    small = Plan(parse_range("10.9.9.0/28"), 1, 1)
    assert small.address(12) == ipaddress.ip_address("10.9.9.14")
    with pytest.raises(RuntimeError, match="no address left"):
        small.address(13)


def test_the_instance_ruleset_lets_out_only_its_loopback_and_the_shells_port() -> None:
    rules = Plan(parse_range("10.213.0.0/16"), 1, 8000).ruleset()
    assert "policy drop;" in rules
    assert 'oifname "lo" accept' in rules
    assert "ip daddr 10.213.0.1 tcp dport 8000 accept" in rules
    assert "ip saddr 10.213.0.1 accept" in rules  # in: the shell's address only
    assert rules.count("policy drop;") == 2
    assert rules.count("accept") == 6


def test_a_granted_ruleset_lets_out_past_the_range_only_and_a_list_to_its_pairs() -> None:
    plan = Plan(parse_range("10.213.0.0/16"), 1, 8000)
    anywhere = plan.ruleset(True).splitlines()
    shell = anywhere.index("    ip daddr 10.213.0.1 tcp dport 8000 accept")
    # the API first, then the range and the clouds' metadata services refused, then the rest
    assert anywhere[shell + 1 : shell + 5] == [
        "    ip daddr 10.213.0.0/16 drop",
        "    ip daddr 169.254.0.0/16 drop",
        "    ip daddr 100.100.100.200 drop",
        "    accept",
    ]
    listed = plan.ruleset((("192.0.2.7", 443),))
    assert "ip daddr 192.0.2.7 meta l4proto { tcp, udp } th dport 443 accept" in listed
    assert "\n    accept\n" not in listed
    assert plan.ruleset(False) == plan.ruleset()
    host = plan.host_ruleset()
    # from the bridge, the host answers only the shell's API
    assert 'iifname "atrb1-0" ip daddr 10.213.0.1 tcp dport 8000 accept' in host
    assert 'iifname "atrb1-0" tcp flags & (syn | ack) == syn reject with tcp reset' in host
    assert "masquerade" not in host  # until the first grant (egress_commands)
    assert "masquerade" in plan.egress_commands()


@pytest.mark.parametrize("text", ["8.8.0.0/16", "10.0.0.0/29", "10.0.0.1/16", "fd00::/64", "x"])
def test_a_range_must_be_a_private_ipv4_network_with_room(text: str) -> None:
    with pytest.raises(ValueError, match=text.replace(".", r"\.")):
        parse_range(text)


def test_a_clash_names_the_host_route_and_ignores_its_own_bridge() -> None:
    network = parse_range("10.213.0.0/16")
    routes: list[dict[str, object]] = [
        {"dst": "default", "dev": "eth0"},
        {"dst": "10.213.0.0/16", "dev": "atrb7-0"},
        {"dst": "192.0.2.0/24", "dev": "eth0"},
    ]
    assert clash(network, routes, "atrb7-0") is None
    routes.append({"dst": "10.0.0.0/8", "dev": "wg0"})
    assert clash(network, routes, "atrb7-0") == (
        "10.213.0.0/16 overlaps the host's route to 10.0.0.0/8 on wg0"
    )


def test_a_sweep_takes_only_what_stopped_shells_named() -> None:
    names = ["atrium-10-0", "atrium-11-4", "atrb10-0", "atv10x3", "atv11xa", "eth0", "atrium-x"]
    assert leftovers(names, alive=[11]) == ["atrium-10-0", "atrb10-0", "atv10x3"]
