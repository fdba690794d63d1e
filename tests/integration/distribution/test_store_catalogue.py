"""The store's catalogue through a real shell: the index's store fields (screenshots, categories,
publisher, homepage, size), and a catalogue whose entries are all refused saying why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import StartShell

pytestmark = pytest.mark.integration


def entry(app_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": app_id,
        "name": app_id.rsplit(".", 1)[-1].title(),
        "sources": {"oci": {"ref": f"127.0.0.1:5000/examples/{app_id}"}},
        "channels": {"stable": {"oci-tag": "1.0.0"}},
        **extra,
    }


def write_index(path: Path, apps: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": 1, "apps": apps}))
    return path.as_uri()


def test_the_store_fields_are_validated_and_served(start_shell: StartShell, tmp_path: Path) -> None:
    good = entry(
        "com.example.shop",
        screenshots=["shots/one.png", "https://img.example.org/two.png"],
        categories=["productivity", "notes"],
        publisher={"name": "Example Ltd", "url": "https://example.org"},
        homepage="https://example.org/shop",
        size=123456,
    )
    legacy = entry("com.example.legacy", publisher="Old Style", categories=["tools"])
    bad = [
        entry("com.example.far", screenshots=["../../etc/passwd"]),
        entry("com.example.rooted", screenshots=["/etc/passwd"]),
        entry("com.example.script", screenshots=["javascript:alert(1)"]),
        entry("com.example.loud", categories=["Not A Word!"]),
        entry("com.example.huge", size=-1),
        entry("com.example.nohome", homepage="ftp://example.org"),
        entry("com.example.nopub", publisher={"url": "https://example.org"}),
    ]
    base = tmp_path / "catalogue"
    url = write_index(base / "index.json", [good, legacy, *bad])
    shell = start_shell(index_url=url)
    with shell.client() as api:
        answer = api.get("/api/dist/index").json()
    apps = {a["id"]: a for a in answer["index"]["apps"]}
    assert sorted(apps) == ["com.example.legacy", "com.example.shop"]
    shop = apps["com.example.shop"]
    assert shop["screenshots"] == [
        (base / "shots" / "one.png").as_uri(),
        "https://img.example.org/two.png",
    ]
    assert shop["categories"] == ["productivity", "notes"]
    assert shop["publisher"] == {"name": "Example Ltd", "url": "https://example.org"}
    assert shop["homepage"] == "https://example.org/shop"
    assert shop["size"] == 123456
    # a publisher written as a plain name is still read, and served in the one shape
    assert apps["com.example.legacy"]["publisher"] == {"name": "Old Style"}
    assert apps["com.example.legacy"]["screenshots"] == []
    refused = {p["id"]: p for p in answer["problems"]}
    assert sorted(refused) == sorted(b["id"] for b in bad)
    assert refused["com.example.far"]["field"].startswith("screenshots")
    assert "relative" in refused["com.example.far"]["message"]
    assert refused["com.example.loud"]["field"].startswith("categories")
    assert refused["com.example.huge"]["field"] == "size"
    assert refused["com.example.nohome"]["field"] == "homepage"
    assert refused["com.example.nopub"]["field"].startswith("publisher")


def test_an_http_index_resolves_relative_screenshots_against_its_address(
    start_shell: StartShell, tmp_path: Path
) -> None:
    import http.server
    import threading
    from functools import partial

    folder = tmp_path / "served"
    write_index(
        folder / "apps" / "index.json", [entry("com.example.shop", screenshots=["s/a.png"])]
    )
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        shell = start_shell(index_url=f"http://127.0.0.1:{port}/apps/index.json")
        with shell.client() as api:
            answer = api.get("/api/dist/index").json()
    finally:
        server.shutdown()
        server.server_close()
    assert answer["index"]["apps"][0]["screenshots"] == [f"http://127.0.0.1:{port}/apps/s/a.png"]


def test_a_catalogue_whose_entries_are_all_refused_says_why(
    start_shell: StartShell, tmp_path: Path
) -> None:
    url = write_index(
        tmp_path / "index.json",
        [
            {**entry("com.example.bad"), "id": "Bad Id"},
            {"id": "com.example.nosource", "name": "No source", "sources": {}},
        ],
    )
    shell = start_shell(index_url=url)
    with shell.client() as api:
        answer = api.get("/api/dist/index").json()
    assert answer["index"]["apps"] == []
    assert answer["refused"] == [
        {"id": "Bad Id", "reason": "id: 'Bad Id' is not a reverse-domain app id"},
        {
            "id": "com.example.nosource",
            "reason": "sources: an entry needs sources.git or sources.oci",
        },
    ]
    assert answer["message"] == (
        f"The catalogue at {url} lists 2 apps and every one was refused: "
        "Bad Id (id: 'Bad Id' is not a reverse-domain app id); com.example.nosource (sources: an "
        "entry needs sources.git or sources.oci)"
    )
