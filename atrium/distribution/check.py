"""Everything an install would refuse about an app folder, in one list (`atrium validate`).

An install stops at the first problem of each stage (the tree check, then the manifest); an
author wants them all at once, before publishing. This runs the same checks the fetchers and
the install stage run — `tree.check_tree` (links, special files, VCS metadata below the top),
the publishable file walk, the manifest with the directory's own name, the files it names, and
the names reserved for runtime data — and collects every problem as `{field, message}`.
"""

from __future__ import annotations

from pathlib import Path

from atrium.distribution import artifact
from atrium.distribution.tree import UnsafeTree, check_tree, ignore_rule
from atrium.distribution.validate import runtime_dir_re
from atrium.errors import AtriumError
from atrium.images.layout import LayoutSource
from atrium.images.store import ImageError
from atrium.registry import read_copy
from atrium.scopes import Scope

Problem = dict[str, str]


def problems_of(app_dir: Path) -> list[Problem]:
    """Every problem an install of ``app_dir`` would refuse; empty when it would go through."""
    if not app_dir.is_dir():
        return [{"field": "(files)", "message": f"{app_dir} is not a directory"}]
    problems: list[Problem] = []
    try:
        check_tree(app_dir, skip_top_vcs=True, rule=ignore_rule(app_dir))
    except UnsafeTree as err:
        problems.append({"field": "(files)", "message": str(err)})
    try:
        for _ in artifact.app_files(app_dir, app_dir.name):
            pass
    except AtriumError as err:
        problems.append({"field": "(files)", "message": err.message})
    copy = read_copy(Scope.USER, app_dir)
    problems += [dict(p) for p in copy.problems]
    runtime = None if copy.manifest is None else copy.manifest.runtime
    if runtime is not None and runtime.layout is not None:
        problems += _layout_problems(app_dir, runtime.layout, runtime.digest)
    reserved = runtime_dir_re(app_dir.name)
    problems += [
        {
            "field": "(files)",
            "message": f"{entry.name!r} is reserved for an instance's runtime data; rename it",
        }
        for entry in sorted(app_dir.iterdir())
        if reserved.fullmatch(entry.name)
    ]
    return problems


def _layout_problems(app_dir: Path, folder: str, pin: str | None) -> list[Problem]:
    """The image layout the app carries: one image, every blob it names present and intact
    (the install also checks media types and unpacks)."""
    try:
        digest = LayoutSource(app_dir, folder).check()
    except ImageError as err:
        return [{"field": "runtime.image", "message": err.reason}]
    if pin is not None and digest != pin:
        return [
            {
                "field": "runtime.image",
                "message": f"the image layout {folder}/ holds {digest}, not the {pin} it pins",
            }
        ]
    return []
