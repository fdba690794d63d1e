"""`atrium new`: a working app folder from one of three templates.

Every template makes the same app (a page following the theme, a content provider, an intent
filter, a contract test) in another style: ``python`` on the shell's SDK, ``stdlib`` and ``node``
meeting the HTTP contract by hand, to show the contract is all an app needs. The files live in
``templates/`` beside this module; ``{{APP_ID}}``, ``{{APP_NAME}}``, ``{{ENTRYPOINT}}`` and
``{{TEMPLATE}}`` are filled in.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from atrium.ids import is_reserved
from atrium.manifest import APP_ID_RE

TEMPLATE_DIR: Final = Path(__file__).with_name("templates")


@dataclass(frozen=True, slots=True)
class Template:
    """One style of app: its entrypoint and the folder holding its own files."""

    name: str
    entrypoint: tuple[str, ...]
    summary: str


TEMPLATES: Final = {
    t.name: t
    for t in (
        Template("python", ("python3", "server.py"), "Python on the shell's SDK (atrium.sdk)"),
        Template("stdlib", ("python3", "server.py"), "plain Python, the HTTP contract by hand"),
        Template("node", ("node", "server.js"), "Node's http module, the HTTP contract by hand"),
    )
}


class ScaffoldError(ValueError):
    """A bad app id, template or target folder: the message says which."""


def app_name(app_id: str) -> str:
    """``com.example.hello-world`` → ``Hello World``."""
    return app_id.rsplit(".", 1)[-1].replace("-", " ").title()


def render(app_id: str, template: str) -> dict[str, bytes]:
    """Every file of the new app folder, by relative path."""
    if not APP_ID_RE.fullmatch(app_id):
        raise ScaffoldError(
            f"{app_id!r} is not an app id: lowercase reverse-domain, such as com.example.hello"
        )
    if is_reserved(app_id):
        raise ScaffoldError(
            f"{app_id!r}: app ids starting with 'system.' are reserved for the shell"
        )
    chosen = TEMPLATES.get(template)
    if chosen is None:
        raise ScaffoldError(f"no template {template!r}: one of {', '.join(TEMPLATES)}")
    values = {
        "{{APP_ID}}": app_id,
        "{{APP_NAME}}": app_name(app_id),
        "{{ENTRYPOINT}}": json.dumps(list(chosen.entrypoint)),
        "{{TEMPLATE}}": template,
    }
    files: dict[str, bytes] = {}
    for source in (TEMPLATE_DIR / "common", TEMPLATE_DIR / template):
        for path in sorted(source.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                text = path.read_text()
                for key, value in values.items():
                    text = text.replace(key, value)
                files[path.relative_to(source).as_posix()] = text.encode()
    return files


def create(parent: Path, app_id: str, template: str) -> Path:
    """Write the app folder ``parent/<app_id>``: all of it or nothing (a temporary folder beside
    it, renamed into place). An existing folder of that name is refused, never touched."""
    files = render(app_id, template)
    target = parent / app_id
    if target.exists() or target.is_symlink():
        raise ScaffoldError(f"{target} already exists: choose another folder or app id")
    if not parent.is_dir():
        raise ScaffoldError(f"{parent} is not a folder")
    staging = Path(tempfile.mkdtemp(prefix=f".{app_id}.", dir=parent))
    try:
        for relative, data in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        # an app tree must be readable by the app's own uid when a root shell runs it
        for path in (staging, *staging.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        staging.rename(target)  # a target made meanwhile is never replaced unless it is empty
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
