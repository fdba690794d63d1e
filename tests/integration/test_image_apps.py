"""Image apps through the real shell: Debian's busybox-static httpd, built by the test as an OCI
image (tests/integration/test_image_store.py's helpers), pushed to the real docker-registry, run
under bubblewrap as an app and its page fetched through the app's origin (root only: the shell
maps the image's users onto ids of their own)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import httpx
import pytest

from atrium.images.store import ImageStore, entry_name
from atrium.lifecycle.runners.image import image_ids
from atrium.lifecycle.runners.process import descendants
from tests.integration.conftest import (
    RunningShell,
    StartShell,
    launch_shell,
    serving,
    wait_for,
)
from tests.integration.registry import Registry, running_registry
from tests.integration.test_image_store import Layer, busybox_layers, push_image
from tests.integration.test_origins import enter, open_view

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="image apps need the shell to run as root"),
]

APP: Final = "test.image.busybox"
#: a manifest env value: the image gets it, and no other user of the host can read it
WORD: Final = "kept-off-the-command-line"
#: a CGI that writes into the data folder and says who it runs as
SAVE: Final = b"""#!/bin/sh
echo "saved by $(id -u)" > /www/data/note
printf 'Content-Type: text/plain\r\n\r\n'
id -u
"""
CONFIG: Final[dict[str, object]] = {
    "Entrypoint": ["/bin/busybox", "httpd", "-f", "-v"],
    "Cmd": ["-p", "80", "-h", "/www"],
    "Env": ["PATH=/bin"],
    "WorkingDir": "/www",
    "ExposedPorts": {"80/tcp": {}},
    "User": "www:web",
}


def httpd_layers() -> list[Layer]:
    cgi = Layer().folder("www/cgi-bin").file("www/cgi-bin/save", SAVE, 0o755)
    for applet in ("id", "printf"):
        cgi.link(f"bin/{applet}", "busybox")
    return [*busybox_layers(), cgi]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("image-app-registry")) as started:
        yield started


@pytest.fixture(scope="module")
def httpd(registry: Registry) -> str:
    digest, _ = asyncio.run(push_image(registry, "apps/httpd", "1", httpd_layers(), CONFIG))
    return digest


def manifest(registry: Registry, digest: str) -> dict[str, object]:
    return {
        "id": APP,
        "version": "1.0.0",
        "name": "Busybox httpd",
        "runtime": {
            "image": f"{registry.host}/apps/httpd@{digest}",
            "port": 80,
            "health": {"path": "/"},
            "data": ["/www/data"],
            "env": {"SECRET_WORD": WORD},
        },
    }


def host_ids(pid: int) -> tuple[int, int]:
    """The real uid and gid of ``pid`` as the host sees them."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


def test_an_image_runs_as_an_app_its_data_survives_a_restart(
    start_shell: StartShell, system_apps: Path, home: Path, registry: Registry, httpd: str
) -> None:
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/httpd", httpd))
    (system_apps / APP).mkdir()
    (system_apps / APP / "app.manifest.json").write_text(json.dumps(manifest(registry, httpd)))
    shell: RunningShell = start_shell()
    with shell.client(timeout=30) as api:
        instance, url = open_view(api, APP)
        assert instance["state"] in ("started", "resumed"), instance
        client, location = enter(shell, url)
        with closing(client):
            page = client.get(location)
            assert page.status_code == 200
            assert page.text == "hello from the image\n"
            assert "<script" not in page.text  # theming none: nothing injected
            saved = client.get("/cgi-bin/save")
            assert saved.status_code == 200, saved.text
            assert saved.text.strip() == "33"  # the image's User, www
        # on the host, uid 33 of the image is an id of the app's own block, never root
        first = image_ids(APP).uid
        pid = api.get(f"/api/instances/{instance['instanceId']}").json()["pid"]
        inside = [p.pid for p in descendants(pid) if p.pid != pid]
        assert {host_ids(p)[0] for p in inside} >= {first + 33}
        assert all(host_ids(p)[0] >= first for p in [pid, *inside])
        assert all(WORD not in Path(f"/proc/{p}/cmdline").read_text() for p in [pid, *inside])
        iid = instance["instanceId"]
        (kept,) = home.rglob("www/data/note")
        before = kept.stat()
        assert before.st_uid == first + 33  # the image's www owns its data on the host
        # the instance ended (its process gone) and made again: the same id, the same data
        assert api.delete(f"/api/instances/{iid}").status_code == 200
        again = api.post("/api/instances", json={"appId": APP}).json()
        assert again["instanceId"] == iid, again
        assert again["pid"] != pid
        url = api.post(f"/api/instances/{iid}/views", json={"path": "/"}).json()["url"]
        client, _ = enter(shell, url)
        with closing(client):
            note = client.get("/data/note")
            assert note.status_code == 200
            assert note.text == "saved by 33\n"
        # the restart handed nothing to another owner and back (a chown changes the ctime)
        assert kept.stat().st_ctime_ns == before.st_ctime_ns


def block_processes(first: int) -> list[int]:
    """Pids whose real uid is in the block starting at ``first``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid, _ = host_ids(int(entry.name))
            except (OSError, KeyError):
                continue
            if first <= uid < first + 65536:
                found.append(int(entry.name))
    return found


def test_an_image_app_installs_pinned_after_a_plain_review_and_a_killed_shell_leaves_nothing(
    home: Path, tmp_path: Path, registry: Registry, httpd: str
) -> None:
    source = tmp_path / "source" / APP
    source.mkdir(parents=True)
    described = manifest(registry, httpd)
    runtime: dict[str, object] = described["runtime"]  # type: ignore[assignment]
    del runtime["port"]  # the port the image's ExposedPorts names (80) is the one
    runtime["image"] = f"{registry.host}/apps/httpd:1"
    (source / "app.manifest.json").write_text(json.dumps(described))
    first = image_ids(APP).uid
    missing = tmp_path / "missing" / APP
    missing.mkdir(parents=True)
    runtime["image"] = f"{registry.host}/apps/httpd:nope"
    (missing / "app.manifest.json").write_text(json.dumps(described))
    # an image that exposes no port, with a manifest that names none: nothing to reach
    portless = tmp_path / "portless" / APP
    portless.mkdir(parents=True)
    asyncio.run(
        push_image(registry, "apps/portless", "1", [Layer().file("x", b"x\n")], {"Cmd": ["/x"]})
    )
    runtime["image"] = f"{registry.host}/apps/portless:1"
    (portless / "app.manifest.json").write_text(json.dumps(described))
    with serving(home, stop=signal.SIGKILL) as served, served.client(timeout=60) as api:
        refused = api.post(
            "/api/dist/install", json={"ref": f"local:{missing}", "autoApprove": True}
        )
        assert refused.status_code == 502, refused.text
        assert refused.json()["error"]["code"] == "fetch_failed"
        assert api.get(f"/api/apps/{APP}").status_code == 404  # nothing half installed
        refused = api.post(
            "/api/dist/install", json={"ref": f"local:{portless}", "autoApprove": True}
        )
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_manifest"
        assert error["problems"][0]["field"] == "runtime.port"
        assert "ExposedPorts" in error["problems"][0]["message"]
        assert api.get(f"/api/apps/{APP}").status_code == 404
        asked = api.post("/api/dist/install", json={"ref": f"local:{source}"})
        assert asked.status_code == 200, asked.text
        review = asked.json()
        assert review["ok"] is False
        assert review["needsApproval"] is True
        image = review["image"]
        assert image["kind"] == "container image"
        assert image["publisher"] == f"{registry.host}/apps/httpd"
        assert image["digest"] == httpd
        assert image["size"] > 1_000_000
        assert image["folders"] == ["/www/data"]
        assert image["network"] is False
        assert not (home / "apps" / APP).exists()
        done = api.post("/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True})
        assert done.status_code == 200, done.text
        assert done.json()["ok"] is True
        listed = api.get(f"/api/apps/{APP}").json()
        assert listed["manifest"]["runtime"]["image"] == f"{registry.host}/apps/httpd@{httpd}"
        # another app naming that digest at a repository that does not serve it gets nothing
        # from the store: a digest is no proof that the registry gives it to this caller
        borrower = tmp_path / "borrower" / "test.image.borrower"
        borrower.mkdir(parents=True)
        runtime["image"] = f"{registry.host}/apps/elsewhere@{httpd}"
        (borrower / "app.manifest.json").write_text(
            json.dumps({**described, "id": "test.image.borrower"})
        )
        refused = api.post(
            "/api/dist/install", json={"ref": f"local:{borrower}", "autoApprove": True}
        )
        assert refused.status_code == 502, refused.text
        assert refused.json()["error"]["code"] == "fetch_failed"
        assert api.get("/api/apps/test.image.borrower").status_code == 404
        instance = api.post("/api/instances", json={"appId": APP}).json()
        assert instance["state"] == "started", instance
        iid = instance["instanceId"]
        url = api.post(f"/api/instances/{iid}/views", json={"path": "/"}).json()["url"]
        parts = urlsplit(url)
        with httpx.Client(base_url=served.url, headers={"Host": parts.netloc}) as page:
            entered = page.get(f"{parts.path}?{parts.query}")
            cookie = entered.headers["set-cookie"].split(";", 1)[0]
            answer = page.get("/", headers={"Cookie": cookie})
            assert answer.status_code == 200
            assert answer.text == "hello from the image\n"
        assert block_processes(first)
    # serving() ended the shell with SIGKILL: the sandbox and everything in it went with it
    wait_for(lambda: not block_processes(first), "the image's processes to be gone")


#: a CGI that leaves a link in the data folder, pointing where the query says
LINKER: Final = b"""#!/bin/sh
ln -s "$QUERY_STRING" /www/data/x
printf 'Content-Type: text/plain\\r\\n\\r\\n'
echo linked
"""


def test_a_link_an_image_left_in_its_data_never_leads_a_later_data_folder_out_of_it(
    start_shell: StartShell, system_apps: Path, home: Path, tmp_path: Path, registry: Registry
) -> None:
    """The image owns what is in its data folders, links included. An update whose ``data``
    names a folder under one of them (``/www/data/x/y``, x the image's link to a host folder)
    must not make, chmod, chown and bind the host's folder for the image."""
    layers = httpd_layers()
    layers[-1].file("www/cgi-bin/link", LINKER, 0o755).link("bin/ln", "busybox")
    digest, _ = asyncio.run(push_image(registry, "apps/linker", "1", layers, CONFIG))
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/linker", digest))
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    described = manifest(registry, digest)
    described["runtime"]["image"] = f"{registry.host}/apps/linker@{digest}"  # type: ignore[index]
    (system_apps / APP).mkdir()
    (system_apps / APP / "app.manifest.json").write_text(json.dumps(described))
    shell = start_shell()
    with shell.client(timeout=30) as api:
        instance, url = open_view(api, APP)
        client, _ = enter(shell, url)
        with closing(client):
            linked = client.get(f"/cgi-bin/link?{victim}")
            assert linked.status_code == 200, linked.text
        assert api.delete(f"/api/instances/{instance['instanceId']}").status_code == 200
    shell.stop()
    (link,) = home.rglob("www/data/x")
    assert link.is_symlink()
    described["version"] = "1.0.1"
    described["runtime"]["data"] = ["/www/data/x/y"]  # type: ignore[index]
    (system_apps / APP / "app.manifest.json").write_text(json.dumps(described))
    shell = start_shell()
    with shell.client(timeout=30) as api:
        started = api.post("/api/instances", json={"appId": APP})
        assert not (victim / "y").exists(), started.text
        assert victim.stat().st_mode & 0o777 == 0o755
        assert victim.stat().st_uid == 0
        assert started.status_code >= 400, started.text
        assert "/www/data/x/y" in started.json()["error"]["message"]


#: a CGI that says what the image's environment holds
SHOW_ENV: Final = b"""#!/bin/sh
printf 'Content-Type: text/plain\\r\\n\\r\\n'
echo "$SECRET_WORD $LD_DEBUG"
"""


def test_an_image_environment_reaches_the_image_never_the_hosts_setpriv_and_bwrap(
    start_shell: StartShell, system_apps: Path, home: Path, registry: Registry
) -> None:
    """setpriv and bwrap are host programs started as root: the dynamic loader of each obeys
    LD_PRELOAD, LD_LIBRARY_PATH, LD_DEBUG_OUTPUT … of its environment, and the image's root is
    at a known path of their mount namespace. The image's (and the manifest's) environment must
    reach the image's command only. LD_DEBUG_OUTPUT is the harmless witness: the host loader
    writes a file where the manifest says."""
    layers = httpd_layers()
    layers[-1].file("www/cgi-bin/env", SHOW_ENV, 0o755)
    digest, _ = asyncio.run(push_image(registry, "apps/env", "1", layers, CONFIG))
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/env", digest))
    witness = Path("/var/tmp") / f"atrium-ld-{os.getpid()}-{digest[7:19]}"  # noqa: S108
    described = manifest(registry, digest)
    runtime = described["runtime"]
    runtime["image"] = f"{registry.host}/apps/env@{digest}"  # type: ignore[index]
    runtime["env"] = {  # type: ignore[index]
        "SECRET_WORD": WORD,
        "LD_DEBUG": "files",
        "LD_DEBUG_OUTPUT": str(witness),
    }
    (system_apps / APP).mkdir()
    (system_apps / APP / "app.manifest.json").write_text(json.dumps(described))
    shell = start_shell()
    try:
        with shell.client(timeout=30) as api:
            instance, url = open_view(api, APP)
            assert instance["state"] in ("started", "resumed"), instance
            client, _ = enter(shell, url)
            with closing(client):
                shown = client.get("/cgi-bin/env")
                assert shown.status_code == 200, shown.text
                assert shown.text.strip() == f"{WORD} files"  # the image has all of it
        written = sorted(witness.parent.glob(witness.name + "*"))
        assert written == [], [p.read_text()[:200] for p in written]
    finally:
        for path in witness.parent.glob(witness.name + "*"):
            path.unlink()


def test_a_user_the_images_passwd_numbers_beyond_its_ids_is_refused(
    start_shell: StartShell, system_apps: Path, home: Path, registry: Registry
) -> None:
    """The image's ids 0-65535 are its block of host ids; a ``User`` given by name takes its id
    from the image's own /etc/passwd, which may say anything: 131072 would be the root of the
    block two further on (another app's or user's, chosen by its public hash), never this one's."""
    far = Layer().file("etc/passwd", b"root:x:0:0::/:/bin/sh\nwww:x:131072:34::/www:/bin/sh\n")
    digest, _ = asyncio.run(push_image(registry, "apps/far", "1", [*httpd_layers(), far], CONFIG))
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/far", digest))
    described = manifest(registry, digest)
    described["runtime"]["image"] = f"{registry.host}/apps/far@{digest}"  # type: ignore[index]
    (system_apps / APP).mkdir()
    (system_apps / APP / "app.manifest.json").write_text(json.dumps(described))
    shell = start_shell()
    with shell.client(timeout=30) as api:
        started = api.post("/api/instances", json={"appId": APP})
        assert not block_processes(image_ids(APP).uid + 131072)
        assert started.status_code >= 400, started.text
        assert "131072" in started.json()["error"]["message"]


def test_an_image_app_listed_in_the_index_installs_by_its_id(
    start_shell: StartShell, tmp_path: Path, registry: Registry, httpd: str
) -> None:
    # the index lists the app as any other: its source is a git repository holding the manifest,
    # whose runtime names the image (by tag: the install pins it)
    repo = tmp_path / f"{APP}.git"
    repo.mkdir()
    described = manifest(registry, httpd)
    described["runtime"]["image"] = f"{registry.host}/apps/httpd:1"  # type: ignore[index]
    (repo / "app.manifest.json").write_text(json.dumps(described))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "image app"], check=True)
    entry = {
        "id": APP,
        "name": "Busybox httpd",
        "description": "An OCI image as an app",
        "sources": {"git": {"ref": f"git+file://{repo}", "default-branch": "main"}},
    }
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"schema": 1, "apps": [entry]}))
    shell = start_shell(index_url=index.as_uri())
    with shell.client(timeout=60) as api:
        listed = api.get("/api/dist/index").json()["index"]["apps"]
        assert [e["id"] for e in listed] == [APP]
        review = api.post("/api/dist/install", json={"ref": APP})
        assert review.status_code == 200, review.text
        assert review.json()["image"]["kind"] == "container image"
        done = api.post("/api/dist/install", json={"ref": APP, "autoApprove": True})
        assert done.status_code == 200, done.text
        installed = api.get(f"/api/apps/{APP}").json()["manifest"]["runtime"]["image"]
        assert installed == f"{registry.host}/apps/httpd@{httpd}"


def test_an_image_app_described_by_its_index_entry_installs_reviewed_and_updates_by_it(
    start_shell: StartShell, tmp_path: Path, registry: Registry, httpd: str
) -> None:
    # the entry itself is the app: no source holds a manifest; the shell makes the app tree
    icon = b"\x89PNG\r\n\x1a\n an icon"
    entry: dict[str, object] = {
        "id": APP,
        "name": "Busybox httpd",
        "description": "An OCI image as an app",
        "publisher": "Busybox people",
        "version": "1.0.0",
        "icon": "data:image/png;base64," + base64.b64encode(icon).decode(),
        "runtime": {
            "image": f"{registry.host}/apps/httpd:1",
            "health": {"path": "/"},
            "data": ["/www/data"],
        },
        "network": {"egress": ["api.example.com:443"]},
    }
    # a bad entry is refused by the field it got wrong, and the rest is served
    broken = {**entry, "id": "test.image.broken", "runtime": {"image": "no tag", "health": {}}}
    both = {**entry, "id": "test.image.both", "sources": {"oci": {"ref": f"{registry.host}/x"}}}
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"schema": 1, "apps": [broken, entry, both]}))
    shell = start_shell(index_url=index.as_uri())
    with shell.client(timeout=60) as api:
        catalogue = api.get("/api/dist/index").json()
        assert [e["id"] for e in catalogue["index"]["apps"]] == [APP]
        assert catalogue["index"]["apps"][0]["runtime"]["image"] == entry["runtime"]["image"]  # type: ignore[index]
        fields = {(p["id"], p["field"]) for p in catalogue["problems"]}
        assert fields == {
            ("test.image.broken", "runtime.image"),
            ("test.image.broken", "runtime.health.path"),
            ("test.image.both", "runtime"),
        }, catalogue["problems"]
        # no channels: a channel is a clear 404, never another app
        channel = api.post("/api/dist/install", json={"ref": f"{APP}@beta"})
        assert channel.status_code == 404, channel.text
        assert "without channels" in channel.json()["error"]["message"]
        asked = api.post("/api/dist/install", json={"ref": APP})
        assert asked.status_code == 200, asked.text
        review = asked.json()
        assert review["needsApproval"] is True
        assert review["resolved"]["source"] == "index"
        image = review["image"]
        assert image["kind"] == "container image"
        assert image["publisher"] == f"{registry.host}/apps/httpd"
        assert image["digest"] == httpd
        assert image["size"] > 1_000_000
        assert image["folders"] == ["/www/data"]
        assert image["network"] == ["api.example.com:443"]
        assert review["egress"]["asked"] == ["api.example.com:443"]
        assert review["diff"]["egressAdded"] == ["api.example.com:443"]
        done = api.post("/api/dist/install", json={"ref": APP, "autoApprove": True})
        assert done.status_code == 200, done.text
        record = done.json()["record"]
        assert (record["source"], record["ref"], record["version"]) == ("index", APP, "1.0.0")
        installed = api.get(f"/api/apps/{APP}").json()["manifest"]
        assert installed["runtime"]["image"] == f"{registry.host}/apps/httpd@{httpd}"
        assert installed["description"] == "An OCI image as an app"
        shown = api.get(f"/api/apps/{APP}/icon")
        assert shown.status_code == 200
        assert (shown.headers["content-type"], shown.content) == ("image/png", icon)
        # the entry changes: an update, asked again because it reaches more
        entry["version"] = "1.1.0"
        entry["network"] = {"egress": True}
        index.write_text(json.dumps({"schema": 1, "apps": [entry]}))
        api.get("/api/dist/index", params={"refresh": 1}).raise_for_status()
        updates = api.get("/api/dist/updates", params={"refresh": 1}).json()["updates"]
        assert [(u["id"], u["available"]) for u in updates] == [(APP, True)], updates
        held = api.post(f"/api/dist/update/{APP}", json={})
        assert held.status_code == 200, held.text
        assert held.json()["needsApproval"] is True
        assert held.json()["diff"]["egressAdded"] is True
        assert api.get(f"/api/apps/{APP}").json()["manifest"]["version"] == "1.0.0"
        taken = api.post(f"/api/dist/update/{APP}", json={"approve": True})
        assert taken.status_code == 200, taken.text
        assert api.get(f"/api/apps/{APP}").json()["manifest"]["version"] == "1.1.0"


def test_an_exported_image_app_is_pulled_again_where_the_store_lacks_it(
    start_shell: StartShell, system_apps: Path, tmp_path: Path, registry: Registry, httpd: str
) -> None:
    """A pulled image is not in the export: another home, its image store empty, pulls the
    pinned digest from the registry the manifest names when it imports the app."""
    source = tmp_path / "source" / APP
    source.mkdir(parents=True)
    (source / "app.manifest.json").write_text(json.dumps(manifest(registry, httpd)))
    with start_shell().client(timeout=60) as api:
        done = api.post("/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True})
        assert done.status_code == 200, done.text
        archive = api.get(f"/api/dist/export/{APP}")
        assert archive.status_code == 200, archive.text
    elsewhere = tmp_path / "elsewhere"
    shell = launch_shell(elsewhere, system_apps)  # another machine's home
    try:
        with shell.client(timeout=60) as other:
            answer = other.post(
                "/api/dist/import", params={"autoApprove": "1"}, content=archive.content
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["ok"] is True, answer.text
            assert (elsewhere / "images" / entry_name(httpd) / "rootfs").is_dir()
    finally:
        shell.stop()
