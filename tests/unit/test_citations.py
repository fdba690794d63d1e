"""Docstrings and comments cite only what is in the repository (issue 19).

A citation of the interface names a section of docs/api.md (``docs/api.md "Data proxy"``), a reason
names a section of docs/decisions.md (``decisions.md "Lifecycle"``); both must exist as headings,
so a renamed section breaks this test instead of leaving a dangling pointer. Rule numbers of a
document outside the repository, and files that are not in it, are not citations a reader can
follow. The needles are assembled from parts so that this file does not match itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

REPO_DIR: Final = Path(__file__).resolve().parents[2]
PACKAGES: Final = ("atrium", "bench", "tests")
SPEC: Final = "spec"
#: citations of something that is not in the repository
FOREIGN: Final = (
    re.compile(rf"\b{SPEC}\s+(?:rule|\"|[A-Z][a-z]+ (?:API )?rule)", re.IGNORECASE),
    re.compile(rf"\({SPEC}(?: |\"|: [a-z`])"),  # not ``(spec: SpawnSpec``
    re.compile(rf"\bthe {SPEC}'s\b", re.IGNORECASE),
    re.compile("MEAS" + r"URED\.md"),
)
CITATION: Final = re.compile(r"(docs/api\.md|decisions\.md) \"([^\"]+)\"")
DOCS: Final = {"docs/api.md": "docs/api.md", "decisions.md": "docs/decisions.md"}


def headings(doc: str) -> set[str]:
    text = (REPO_DIR / doc).read_text()
    return {
        line.lstrip("#").strip().replace("`", "") for line in text.splitlines() if line[:1] == "#"
    }


def cited(section: str, names: set[str]) -> bool:
    """A heading, or the start of one before its qualifier (``Storage`` for ``Storage (issue
    13/14)``, ``Recovery`` for ``Recovery and atrium doctor``)."""
    return any(name == section or name.startswith((f"{section} ", f"{section}:")) for name in names)


def python_files() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (REPO_DIR / package).rglob("*.py")
        if ".node" not in path.parts and path.name != Path(__file__).name
    )


def test_no_citation_of_a_document_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(REPO_DIR)}:{number}: {line.strip()}"
        for path in python_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(pattern.search(line) for pattern in FOREIGN)
    ]
    assert found == []


def test_every_cited_section_exists() -> None:
    known = {name: headings(doc) for name, doc in DOCS.items()}
    dangling = []
    for path in python_files():
        # a citation may wrap onto the next line of a docstring or comment
        text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text())
        for doc, section in CITATION.findall(text):
            if not cited(section.replace("`", ""), known[doc]):
                dangling.append(f"{path.relative_to(REPO_DIR)}: {doc} {section!r}")
    assert dangling == []
