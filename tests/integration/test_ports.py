"""PortAllocator against real sockets on loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from atrium.lifecycle.ports import PortAllocator, PortExhausted

pytestmark = pytest.mark.integration


def listening_on(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


@pytest.fixture
def free_range() -> Iterator[tuple[int, int]]:
    """Four consecutive ports nobody listens on right now (found by asking the kernel)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            start = probe.getsockname()[1]
        if start + 3 > 65535:
            continue
        allocator = PortAllocator(start=start, end=start + 3)
        try:
            for _ in range(4):
                allocator.reserve()
        except PortExhausted:
            continue
        yield start, start + 3
        return
    pytest.skip("no four consecutive free ports on 127.0.0.1")


def test_reserve_hands_out_distinct_free_ports() -> None:
    allocator = PortAllocator()

    ports = [allocator.reserve() for _ in range(20)]

    assert len(set(ports)) == 20
    assert all(20000 <= port <= 29999 for port in ports)
    assert allocator.in_use == frozenset(ports)
    for port in ports:
        listening_on(port).close()  # really free: an app can bind it


def test_a_port_another_program_listens_on_is_skipped(free_range: tuple[int, int]) -> None:
    start, end = free_range
    with listening_on(start), listening_on(start + 2):
        allocator = PortAllocator(start=start, end=end)

        ports = {allocator.reserve(), allocator.reserve()}

        assert ports == {start + 1, start + 3}
        with pytest.raises(PortExhausted):
            allocator.reserve()


def test_release_makes_a_port_available_again(free_range: tuple[int, int]) -> None:
    start, end = free_range
    allocator = PortAllocator(start=start, end=end)
    ports = [allocator.reserve() for _ in range(4)]

    allocator.release(ports[2])
    allocator.release(ports[2])  # twice is harmless

    assert allocator.reserve() == ports[2]
    assert allocator.in_use == frozenset(ports)


def test_an_exhausted_range_raises_a_message_with_the_range(free_range: tuple[int, int]) -> None:
    start, _ = free_range
    allocator = PortAllocator(start=start, end=start)
    allocator.reserve()

    with pytest.raises(PortExhausted) as caught:
        allocator.reserve()

    assert f"{start}-{start}" in str(caught.value)
    assert "127.0.0.1" in str(caught.value)


def test_scans_start_at_random_points() -> None:
    firsts = {PortAllocator().reserve() for _ in range(10)}

    assert len(firsts) > 1


@pytest.mark.parametrize(("start", "end"), [(0, 10), (30, 20), (65000, 70000)])
def test_a_bad_range_is_refused(start: int, end: int) -> None:
    with pytest.raises(ValueError, match="bad port range"):
        PortAllocator(start=start, end=end)
