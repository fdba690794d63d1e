"""``network.egress``: the manifest refuses bad asks naming the field; what an update asks
beyond its predecessor needs approval; a revoke holds until granted again or widened."""

from __future__ import annotations

from typing import Any, Final

import pytest

from atrium.distribution.diff import diff_manifests, requires_approval
from atrium.egress import granted, network_wire, widened, words
from atrium.errors import ManifestInvalid
from atrium.manifest import Manifest, parse_manifest

DIR: Final = "com.example.web"


def manifest(version: str = "1.0.0", **network: Any) -> Manifest:
    data: dict[str, Any] = {"id": DIR, "version": version, "name": "Web"}
    if network:
        data["network"] = network
    return parse_manifest(data, DIR)


@pytest.mark.parametrize(
    ("egress", "said"),
    [
        ("yes", "must be true, false or a list"),
        (["api.example.com"], "is not host:port"),
        (["api.example.com:0"], "port must be a number 1-65535"),
        (["api.example.com:65536"], "port must be a number 1-65535"),
        (["Api_Example.com:443"], "is not an IPv4 address or a lowercase DNS name"),
        (["localhost:80"], "is not an IPv4 address or a lowercase DNS name"),
        (["127.0.0.1:80"], "is not an address of the outside"),
        (["169.254.169.254:80"], "is not an address of the outside"),
        (["0.0.0.0:80"], "is not an address of the outside"),
        (["a.example.com:1", "a.example.com:1"], "names a host:port twice"),
        ([f"h{n}.example.com:443" for n in range(33)], "at most 32 host:port entries"),
    ],
)
def test_a_bad_egress_is_refused_naming_the_field(egress: Any, said: str) -> None:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(
            {"id": DIR, "version": "1.0.0", "name": "W", "network": {"egress": egress}}, DIR
        )
    problems = caught.value.problems
    assert [p["field"] for p in problems] == ["network.egress"], problems
    assert said in problems[0]["message"]


def test_an_unknown_network_key_is_refused() -> None:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(
            {"id": DIR, "version": "1.0.0", "name": "W", "network": {"egres": True}}, DIR
        )
    assert caught.value.problems[0]["field"] == "network.egres"


def test_good_asks_and_their_words() -> None:
    assert manifest().network is None
    assert manifest(egress=True).network.asked is True  # type: ignore[union-attr]
    listed = manifest(egress=["b.example.com:443", "192.0.2.7:25"]).network
    assert listed is not None
    assert listed.asked == ("192.0.2.7:25", "b.example.com:443")
    assert words(True) == "Can reach the internet"
    assert words(("a:1", "b:2")) == "Can reach a:1, b:2"
    assert words(False) is None


@pytest.mark.parametrize(
    ("before", "after", "added"),
    [
        (None, True, True),
        (None, ["a.example.com:443"], ["a.example.com:443"]),
        (["a.example.com:443"], ["a.example.com:443", "b.example.com:1"], ["b.example.com:1"]),
        (["a.example.com:443"], True, True),
        (True, ["a.example.com:443"], None),
        (True, True, None),
        (True, None, None),
        (["a.example.com:443"], ["a.example.com:443"], None),
    ],
)
def test_the_diff_asks_approval_for_egress_asked_or_widened(
    before: Any, after: Any, added: Any
) -> None:
    old = manifest("1.0.0") if before is None else manifest("1.0.0", egress=before)
    new = manifest("1.0.1") if after is None else manifest("1.0.1", egress=after)
    diff = diff_manifests(old, new)
    assert diff.egress_added == added
    assert requires_approval(diff) is (added is not None)
    first = diff_manifests(None, new)
    assert (first.egress_added is not None) is (after is not None)


def test_a_revoke_holds_until_granted_or_widened() -> None:
    assert granted(True, None) is True
    assert granted(True, True) is False
    assert granted(("a:1",), True) is False  # narrowed since: still revoked
    assert granted(("a:1", "b:2"), ("a:1",)) == ("a:1", "b:2")  # asked more: approved anew
    assert widened(("a:1",), ("a:1",)) is False
    assert network_wire(True, True)["egress"] == {
        "asked": True,
        "granted": False,
        "revoked": True,
        "words": "Can reach the internet",
    }
    assert network_wire(False, None)["egress"]["revoked"] is False
