"""The store's catalogue through a real shell: the index's store fields (screenshots, categories,
publisher, homepage, size), a store that is there on first run (`configured: false`, then a
catalogue URL an admin adds and the shell remembers), and a catalogue whose entries are all
refused saying why."""

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


def test_without_a_catalogue_the_store_says_it_is_not_configured(
    start_shell: StartShell,
) -> None:
    shell = start_shell()
    with shell.client() as api:
        answer = api.get("/api/dist/index").json()
    assert answer["configured"] is False
    assert answer["url"] is None
    assert answer["index"] == {"schema": 1, "apps": []}
    assert "PUT /api/dist/index" in answer["message"]


def test_an_admin_adds_a_catalogue_that_is_remembered_across_restarts(
    start_shell: StartShell, tmp_path: Path
) -> None:
    url = write_index(tmp_path / "index.json", [entry("com.example.shop")])
    shell = start_shell()
    member = shell.add_user("bob")
    with shell.client(member) as bob:
        refused = bob.put("/api/dist/index", json={"url": url})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "permission_denied"
        # a member still reads the store
        assert bob.get("/api/dist/index").json()["configured"] is False
    with shell.client() as api:
        wrong = api.put("/api/dist/index", json={"url": "ftp://example.org/index.json"})
        assert wrong.status_code == 400, wrong.text
        unreachable = api.put("/api/dist/index", json={"url": (tmp_path / "none.json").as_uri()})
        assert unreachable.status_code == 502, unreachable.text
        assert api.get("/api/dist/index").json()["configured"] is False  # nothing half done
        added = api.put("/api/dist/index", json={"url": url})
        assert added.status_code == 200, added.text
        assert added.json()["configured"] is True
        assert added.json()["url"] == url
        assert added.json()["urlFrom"] == "stored"
        assert [a["id"] for a in added.json()["index"]["apps"]] == ["com.example.shop"]
    shell.stop()

    again = start_shell()
    with again.client() as api:
        answer = api.get("/api/dist/index").json()
        assert (answer["configured"], answer["url"]) == (True, url)
        # a bare id installs through the remembered catalogue: its entry is found
        missing = api.post("/api/dist/install/preview", json={"ref": "com.example.absent"})
        assert missing.status_code == 404
        assert "the index has no app" in missing.json()["error"]["message"]
        forgotten = api.put("/api/dist/index", json={"url": None})
        assert forgotten.status_code == 200, forgotten.text
        assert forgotten.json()["configured"] is False
    again.stop()
    with start_shell().client() as api:
        assert api.get("/api/dist/index").json()["configured"] is False


def test_the_environment_url_wins_over_a_stored_one(
    start_shell: StartShell, tmp_path: Path
) -> None:
    stored = write_index(tmp_path / "stored.json", [entry("com.example.stored")])
    fixed = write_index(tmp_path / "fixed.json", [entry("com.example.fixed")])
    shell = start_shell()
    with shell.client() as api:
        assert api.put("/api/dist/index", json={"url": stored}).status_code == 200
    shell.stop()
    shell = start_shell(index_url=fixed)
    with shell.client() as api:
        answer = api.get("/api/dist/index").json()
        assert (answer["url"], answer["urlFrom"]) == (fixed, "environment")
        assert [a["id"] for a in answer["index"]["apps"]] == ["com.example.fixed"]
        refused = api.put("/api/dist/index", json={"url": stored})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "index_url_fixed"
        assert "ATRIUM_INDEX_URL" in refused.json()["error"]["message"]


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


def test_a_stored_catalogues_host_is_open_to_a_members_install_as_the_environments_is(
    start_shell: StartShell, tmp_path: Path
) -> None:
    """A member's fetch may reach the catalogue's host (where its apps live on a LAN): the
    address an admin stored counts as ATRIUM_INDEX_URL's does, and stops counting once it is
    forgotten."""
    import http.server
    import socket
    import threading
    from functools import partial

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nobody listens on: the fetch fails there, not before
    port = closed.getsockname()[1]
    folder = tmp_path / "served"
    app = entry("com.example.lan")
    app["sources"] = {"oci": {"ref": f"127.0.0.1:{port}/examples/com.example.lan"}}
    write_index(folder / "index.json", [app])
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        shell = start_shell()
        url = f"http://127.0.0.1:{server.server_address[1]}/index.json"
        with shell.client() as api, shell.client(shell.add_user("bob"), timeout=30) as bob:
            assert api.put("/api/dist/index", json={"url": url}).status_code == 200
            answer = bob.post("/api/dist/install/preview", json={"ref": "com.example.lan"})
            assert answer.json()["error"]["code"] == "fetch_failed", answer.text
            assert api.put("/api/dist/index", json={"url": None}).status_code == 200
            direct = f"oci://127.0.0.1:{port}/examples/com.example.lan:1.0.0"
            answer = bob.post("/api/dist/install/preview", json={"ref": direct})
            assert answer.json()["error"]["code"] == "fetch_host_refused", answer.text
    finally:
        server.shutdown()
        server.server_close()
        closed.close()


def test_a_catalogue_address_that_is_no_regular_file_is_refused_at_once(
    start_shell: StartShell, tmp_path: Path
) -> None:
    """A file:// address naming a FIFO (or a device) would block the fetch for good, and with it
    every read of the store behind the index's lock: it is refused before it is opened."""
    import os

    fifo = tmp_path / "index.fifo"
    os.mkfifo(fifo)
    shell = start_shell()
    with shell.client() as api:
        for url in (fifo.as_uri(), "file:///dev/zero", tmp_path.as_uri()):
            answer = api.put("/api/dist/index", json={"url": url})
            assert answer.status_code == 502, answer.text
            assert "not a regular file" in answer.json()["error"]["message"]
        assert api.get("/api/dist/index").json()["configured"] is False
