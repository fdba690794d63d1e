"""What an app may reach beyond the shell's API: asked in its manifest (``network.egress``),
approved with the install's permission diff, revocable by whoever may manage the app (docs/api.md
"Network"). Pure: the grants are stored by `atrium.state.egress`, enforced by
`atrium.lifecycle.network`.

An ask is False (nothing), True (the internet) or a sorted tuple of ``host:port`` entries. A
revoke is stored with the ask it revoked: an update that asks no more stays revoked; one that
asks more was approved anew in its diff, and that approval is the grant.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from atrium.manifest import Manifest

Ask: TypeAlias = bool | tuple[str, ...]


def asked(manifest: Manifest | None) -> Ask:
    """What ``manifest`` asks to reach (False: nothing)."""
    if manifest is None or manifest.network is None:
        return False
    return manifest.network.asked


def widened(before: Ask, after: Ask) -> Ask:
    """What ``after`` asks beyond ``before`` (False: nothing more)."""
    if after is False or before is True:
        return False
    if after is True:
        return True
    assert isinstance(after, tuple)  # noqa: S101 - narrowed for mypy
    more = tuple(sorted(set(after) - (set(before) if isinstance(before, tuple) else set())))
    return more or False


def granted(ask: Ask, revoked: Ask | None) -> Ask:
    """What the instances get: the ask, unless revoked (``revoked``: the ask when it was) and
    not widened since."""
    if revoked is None or widened(revoked, ask) is not False:
        return ask
    return False


def words(ask: Ask) -> str | None:
    """The review's sentence for an ask; None for nothing."""
    if ask is False:
        return None
    if ask is True:
        return "Can reach the internet"
    assert isinstance(ask, tuple)  # noqa: S101 - narrowed for mypy
    return "Can reach " + ", ".join(ask)


def ask_wire(ask: Ask) -> bool | list[str]:
    return list(ask) if isinstance(ask, tuple) else ask


def ask_of(data: Any) -> Ask:
    """An ask read back from its wire form (a stored revoke)."""
    if isinstance(data, list):
        return tuple(sorted(str(entry) for entry in data)) or False
    return data is True


def network_wire(ask: Ask, revoked: Ask | None) -> dict[str, Any]:
    """An app's ``network`` in `GET /api/apps/{appId}`."""
    given = granted(ask, revoked)
    return {
        "egress": {
            "asked": ask_wire(ask),
            "granted": ask_wire(given),
            "revoked": ask is not False and given is False,
            "words": words(ask),
        }
    }
