"""The permission diff between an installed manifest and the one about to replace it.

Pure (docs/api.md "Approval"). The diff is the user's approval gate: anything
it adds needs approval, nothing it removes does.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from atrium.egress import ask_wire, asked, widened
from atrium.manifest import IntentFilter, Manifest
from atrium.wire import WireModel

#: what identifies an intent filter for the diff: action, MIME types, schemes, categories, priority
FilterKey: TypeAlias = tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...], int]


class PermissionDiff(WireModel):
    """docs/api.md "Approval"; ``version_from`` is None on a first install."""

    app_id: str
    version_from: str | None
    version_to: str
    tools_added: list[str]
    tools_removed: list[str]
    permissions_added: list[str]
    permissions_removed: list[str]
    data_provider_added: bool
    data_provider_removed: bool
    intent_filters_added: list[dict[str, Any]]
    #: what the new version asks to reach beyond what the old one asked: true (the internet),
    #: the added ``host:port`` entries, or None (nothing more)
    egress_added: bool | list[str] | None = None

    def wire(self) -> dict[str, Any]:
        """The wire form; ``egressAdded`` only when the new version asks to reach more."""
        data = super().wire()
        if data["egressAdded"] is None:
            del data["egressAdded"]
        return data


def filter_key(f: IntentFilter) -> FilterKey:
    """MIME types and schemes compare case-insensitively (decisions.md "Data proxy and intents"); the order of
    list members does not matter."""
    return (
        f.action,
        tuple(sorted({m.lower() for m in f.data_mime or ()})),
        tuple(sorted({s.lower() for s in f.data_scheme or ()})),
        tuple(sorted(set(f.category))),
        f.priority,
    )


def _authority(manifest: Manifest | None) -> str | None:
    if manifest is None or manifest.data_provider is None:
        return None
    return manifest.data_provider.authority


def diff_manifests(old: Manifest | None, new: Manifest) -> PermissionDiff:
    """What ``new`` asks for beyond ``old`` and what it gives up (``old`` None: first install).

    A provider whose authority changes counts as one removed and one added.
    """
    old_tools = set(old.tools) if old else set()
    old_perms = set(old.permissions) if old else set()
    old_filters = {filter_key(f) for f in old.intent_filters} if old else set()
    before, after = _authority(old), _authority(new)
    added_filters: list[dict[str, Any]] = []
    seen: set[FilterKey] = set()
    for f in new.intent_filters:
        key = filter_key(f)
        if key not in old_filters and key not in seen:
            seen.add(key)
            added_filters.append(f.model_dump(mode="json", by_alias=True, exclude_none=True))
    return PermissionDiff(
        app_id=new.id,
        version_from=old.version if old else None,
        version_to=new.version,
        tools_added=sorted(set(new.tools) - old_tools),
        tools_removed=sorted(old_tools - set(new.tools)),
        permissions_added=sorted(set(new.permissions) - old_perms),
        permissions_removed=sorted(old_perms - set(new.permissions)),
        data_provider_added=after is not None and after != before,
        data_provider_removed=before is not None and after != before,
        intent_filters_added=added_filters,
        egress_added=(
            None if (more := widened(asked(old), asked(new))) is False else ask_wire(more)
        ),
    )


def requires_approval(diff: PermissionDiff) -> bool:
    """docs/api.md "Approval": anything added needs the user; removals never do."""
    return bool(
        diff.tools_added
        or diff.permissions_added
        or diff.data_provider_added
        or diff.intent_filters_added
        or diff.egress_added is not None
    )
