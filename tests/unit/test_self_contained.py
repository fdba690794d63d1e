"""The project stands alone: no file of it reads or links the design folder beside the checkout.

A clone holds only this repository, so any path into that sibling folder breaks it (issue 9): the
interface lives in docs/api.md, the reasons in docs/decisions.md. Files are walked with pathlib,
skipping what git ignores or never holds (virtualenvs, caches, node_modules, generated artifacts).
The needles are assembled from parts so that this file does not match itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

REPO_DIR: Final = Path(__file__).resolve().parents[2]
SIBLING: Final = "shared"
NEEDLES: Final = (
    f"../{SIBLING}",
    f"..\\{SIBLING}",
    f"{SIBLING}/spec",
    f"{SIBLING}/design",
)
#: directory names skipped wherever they are
SKIPPED_NAMES: Final = frozenset(
    {".git", ".venv", "venv", "node_modules", "__pycache__", ".hypothesis", ".tox", ".nox"}
)
#: directories skipped by their path from the repository root
SKIPPED_PATHS: Final = frozenset({"bench/.node", "test-artifacts", "build", "dist"})
#: a file whose first bytes hold a NUL is binary (images, databases, bytecode)
BINARY_PROBE: Final = 8192


def skipped(directory: Path, root: Path) -> bool:
    name = directory.name
    return (
        name in SKIPPED_NAMES
        or name.endswith(("_cache", ".egg-info"))
        or directory.relative_to(root).as_posix() in SKIPPED_PATHS
    )


def project_files(root: Path) -> Iterator[Path]:
    """Every file under ``root`` outside the skipped directories; symlinks are yielded, never
    followed."""
    pending = [root]
    while pending:
        directory = pending.pop()
        for entry in sorted(directory.iterdir()):
            if entry.is_symlink() or entry.is_file():
                yield entry
            elif entry.is_dir() and not skipped(entry, root):
                pending.append(entry)


def offences(text: str) -> list[tuple[int, str]]:
    """``(line number, needle)`` for each needle on each line of ``text`` (case-insensitive)."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.lower().splitlines(), start=1):
        found.extend((number, needle) for needle in NEEDLES if needle in line)
    return found


def file_offences(path: Path) -> list[tuple[int, str]]:
    """What ``path`` mentions; a symlink is judged by its target, a binary file not at all."""
    if path.is_symlink():
        return [(0, needle) for _, needle in offences(str(path.readlink()))]
    data = path.read_bytes()
    if b"\0" in data[:BINARY_PROBE]:
        return []
    return offences(data.decode("utf-8", errors="replace"))


def test_no_project_file_mentions_the_sibling_design_folder() -> None:
    mistakes = [
        f"{path.relative_to(REPO_DIR)}:{line}: mentions {needle!r}"
        for path in project_files(REPO_DIR)
        for line, needle in file_offences(path)
    ]
    assert not mistakes, "the project must stand alone:\n" + "\n".join(mistakes)


def test_the_walk_covers_code_tests_and_docs_but_not_the_virtualenv() -> None:
    found = {path.relative_to(REPO_DIR).as_posix() for path in project_files(REPO_DIR)}
    expected = {
        "README.md",
        "Makefile",
        "pyproject.toml",
        "docs/api.md",
        "docs/decisions.md",
        "docs/architecture.md",
        "atrium/errors.py",
        "tests/unit/test_errors.py",
        "tests/unit/test_self_contained.py",
    }
    assert expected <= found
    assert not any(path.startswith((".venv/", ".git/")) for path in found)
    assert not any("/__pycache__/" in f"/{path}" for path in found)


def test_every_needle_is_caught_and_this_file_does_not_match_itself() -> None:
    parent, folder = "..", SIBLING
    text = "\n".join(
        [
            "nothing here",
            f"see {parent}/{folder}/spec/decisions.md",
            f"SEE {folder.upper()}/DESIGN/ARCHITECTURE.md",
            f"windows {parent}\\{folder}\\spec",
            f"the word {folder} alone, or {parent}/docs/{folder}.md, is fine",
        ]
    )
    assert offences(text) == [
        (2, f"../{SIBLING}"),
        (2, f"{SIBLING}/spec"),
        (3, f"{SIBLING}/design"),
        (4, f"..\\{SIBLING}"),
    ]
    assert file_offences(Path(__file__)) == []
