"""docs/authoring.md describes every manifest field an author may set, and `atrium new` writes
the fields it says it writes (the guide and the model cannot drift apart)."""

from __future__ import annotations

import json

import pytest

from atrium.authoring.scaffold import TEMPLATES, render
from atrium.manifest import Manifest
from tests.conftest import REPO_DIR


def guide_rows() -> dict[str, str]:
    guide = (REPO_DIR / "docs" / "authoring.md").read_text()
    section = guide.split("## The manifest, field by field", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1]
    return rows


def test_every_manifest_field_is_in_the_guide() -> None:
    fields = {info.alias or name for name, info in Manifest.model_fields.items()}
    assert set(guide_rows()) == fields


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_the_template_writes_what_the_guide_says(template: str) -> None:
    manifest = json.loads(render("com.example.guide", template)["app.manifest.json"])
    written = {field for field, said in guide_rows().items() if said != "—"}
    assert set(manifest) == written
    Manifest.model_validate(manifest)  # and it is valid as written
