"""What a sandboxed app's processes may reach of the host through the descriptors of the
processes beside them in its sandbox (root only: image apps)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Final

import pytest

from atrium.images.store import ImageStore
from tests.integration.conftest import StartShell
from tests.integration.registry import Registry, running_registry
from tests.integration.test_image_apps import CONFIG, manifest
from tests.integration.test_image_store import Layer, busybox_layers, push_image
from tests.integration.test_origins import enter, open_view

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="image apps need a root shell"),
]

APP: Final = "test.sandbox.fds"
#: ``/cgi-bin/fds``: where the descriptors the sandbox's pid 1 holds lead (bwrap's reaper, which
#: runs under the image's own host uid): the parent folder of each, listed, and a file there
FDS: Final = b"""#!/bin/sh
printf 'Content-Type: text/plain\\r\\n\\r\\n'
for fd in /proc/1/fd/*; do
  ls -a "$fd/../" 2>/dev/null; cat "$fd/../planted" 2>/dev/null
done
echo done
"""


def fds_layers() -> list[Layer]:
    cgi = Layer().folder("www/cgi-bin").file("www/cgi-bin/fds", FDS, 0o755)
    for applet in ("ls", "cat", "printf"):
        cgi.link(f"bin/{applet}", "busybox")
    return [*busybox_layers(), cgi]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("sandbox-fds-registry")) as started:
        yield started


def test_an_image_reaches_no_host_folder_through_its_reapers_descriptors(
    start_shell: StartShell, system_apps: Path, home: Path, registry: Registry
) -> None:
    """The instance's lock was a descriptor of its data folder, held by bwrap's pid 1 in the
    sandbox (``--sync-fd``): the image opened ``/proc/1/fd/<n>/..`` and listed the folder of its
    app's instances on the host and read a file there."""
    digest, _ = asyncio.run(push_image(registry, "apps/fds", "1", fds_layers(), CONFIG))
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/fds", digest))
    described = manifest(registry, digest)
    described["id"] = APP
    described["runtime"]["image"] = f"{registry.host}/apps/fds@{digest}"  # type: ignore[index]
    (system_apps / APP).mkdir()
    (system_apps / APP / "app.manifest.json").write_text(json.dumps(described))
    shell = start_shell(app_network="off")
    with shell.client(timeout=30) as api:
        instance, url = open_view(api, APP)
        data_dir = shell.shell.lifecycle.get(instance["instanceId"]).data_dir
        planted = data_dir.parent / "planted"
        planted.write_text("a host file beside the instance's data folder\n")
        planted.chmod(0o644)
        client, _ = enter(shell, url)
        with closing(client):
            seen = client.get("/cgi-bin/fds")
            assert seen.status_code == 200, seen.text
            assert seen.text.endswith("done\n"), seen.text
            assert "a host file" not in seen.text, seen.text
            assert data_dir.name not in seen.text, seen.text  # nor its own folder's name
