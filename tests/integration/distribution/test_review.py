"""What the install review shows before anything is installed: the preview names the app in its
own words (name, version, description, icon), its size, and the permissions it asks for in the
words of the apps that define them, whatever the source (a git source has no manifest preview)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import MakeApp

pytestmark = pytest.mark.integration
PERMISSION = "com.atrium.notes.read"


def test_the_preview_names_the_app_and_words_what_it_asks_for(
    api: httpx.Client, make_app: MakeApp
) -> None:
    source = make_app(
        "com.example.review",
        name="Review Me",
        description="One line on what it does",
        icon="R",
        permissions=[PERMISSION],
    )
    answer = api.post("/api/dist/install/preview", json={"ref": f"local:{source}"}).json()
    app = answer["app"]
    assert (app["id"], app["name"], app["version"]) == ("com.example.review", "Review Me", "1.0.0")
    assert app["description"] == "One line on what it does"
    assert app["icon"] == "R"
    assert app["authority"] is None  # it shares no data
    on_disk = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    assert app["size"] == on_disk
    assert answer["permissions"] == [
        {
            "name": PERMISSION,
            "label": "Read your notes",
            "description": "See the text of every note in Notes.",
            "declaredBy": "com.atrium.notes",
        }
    ]


def test_a_preview_of_an_app_that_asks_for_nothing_says_so(
    api: httpx.Client, make_app: MakeApp
) -> None:
    source = make_app("com.example.modest")
    answer = api.post("/api/dist/install/preview", json={"ref": f"local:{source}"}).json()
    assert answer["permissions"] == []
    assert answer["requiresApproval"] is False
    assert answer["app"]["name"]


def test_a_preview_names_the_authority_a_provider_offers(
    api: httpx.Client, make_app: MakeApp
) -> None:
    """The diff says only that a data provider is added (a boolean): the review names it."""
    provider = {"authority": "reviewed", "providers": [{"path": "/items"}]}
    source = make_app("com.example.provider", dataProvider=provider)
    answer = api.post("/api/dist/install/preview", json={"ref": f"local:{source}"}).json()
    assert answer["diff"]["dataProviderAdded"] is True
    assert answer["app"]["authority"] == "reviewed"


def test_a_preview_says_in_plain_words_what_the_app_may_use(
    start_shell: StartShell, make_app: MakeApp
) -> None:
    """The review words the resources the app will run under: what its manifest asks, capped by
    the administrator's ceilings, and the administrator's default where it asks nothing."""
    shell = start_shell(app_memory_mib=1024, app_pids=128)
    asking = make_app("com.example.bounded", resources={"memoryMiB": 512, "pids": 64})
    silent = make_app("com.example.silent")
    greedy = make_app("com.example.greedy", resources={"memoryMiB": 4096, "cpuMilli": 500})
    with shell.client(timeout=60) as api:

        def preview(source: Path) -> dict[str, Any]:
            answer = api.post("/api/dist/install/preview", json={"ref": f"local:{source}"})
            assert answer.status_code == 200, answer.text
            result: dict[str, Any] = answer.json()["resources"]
            return result

        bounded = preview(asking)
        assert bounded == {
            "memoryMiB": 512,
            "cpuMilli": None,
            "pids": 64,
            "asked": True,
            "words": "may use up to 512 MiB of memory and 64 processes",
        }
        default = preview(silent)
        assert default["asked"] is False
        assert default["words"] == (
            "may use up to 1024 MiB of memory and 128 processes (the administrator's default)"
        )
        capped = preview(greedy)
        assert (capped["memoryMiB"], capped["cpuMilli"], capped["pids"]) == (1024, 500, 128)
        assert capped["words"] == (
            "may use up to 1024 MiB of memory, 128 processes and 0.5 CPU cores"
        )


def test_an_install_or_update_waiting_for_approval_words_the_resources_too(
    api: httpx.Client, make_app: MakeApp
) -> None:
    """The review an update shows (its answer waiting for approval) says what the app may use, as
    the install preview does."""
    source = make_app(
        "com.example.approve", permissions=[PERMISSION], resources={"memoryMiB": 256, "pids": 32}
    )
    answer = api.post("/api/dist/install", json={"ref": f"local:{source}"}).json()
    assert answer["needsApproval"] is True
    assert answer["resources"]["words"] == "may use up to 256 MiB of memory and 32 processes"
