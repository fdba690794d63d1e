"""Attacks from inside an image instance on its own network (root only): what an untrusted image,
which reaches the shell's API at its bridge address, can make the shell believe."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Final

import httpx
import pytest

from atrium.images.store import ImageStore
from atrium.users.throttle import LIMIT
from tests.integration.conftest import StartShell
from tests.integration.registry import Registry, running_registry
from tests.integration.test_image_apps import CONFIG, manifest
from tests.integration.test_image_store import Layer, busybox_layers, push_image
from tests.integration.test_origins import enter, open_view

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the instances' network needs a root shell"),
]

APP: Final = "test.net.say"
#: a range of these tests' own, and a trusted proxies' network that covers it (10.0.0.0/8 is
#: what an operator whose HAProxy sits on a private address may well write)
RANGE: Final = "10.215.0.0/16"
PASSWORD: Final = "a long enough password"
#: ``POST /cgi-bin/say?HOST:PORT/FORWARDED`` with JSON as the body: posted from inside the image
#: to the shell's sign-in at HOST:PORT with ``X-Forwarded-For: FORWARDED``; what wget saw back
SAY: Final = b"""#!/bin/sh
printf 'Content-Type: text/plain\\r\\n\\r\\n'
wget -S -O- --header "X-Forwarded-For: ${QUERY_STRING#*/}" --header 'Content-Type: application/json' \\
  --post-data "$(head -c "$CONTENT_LENGTH")" "http://${QUERY_STRING%%/*}/api/session" 2>&1
"""


def say_layers() -> list[Layer]:
    cgi = Layer().folder("www/cgi-bin").file("www/cgi-bin/say", SAY, 0o755)
    for applet in ("wget", "head", "printf"):
        cgi.link(f"bin/{applet}", "busybox")
    return [*busybox_layers(), cgi]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("net-attack-registry")) as started:
        yield started


@pytest.fixture(scope="module")
def image(registry: Registry) -> str:
    digest, _ = asyncio.run(push_image(registry, "apps/say", "1", say_layers(), CONFIG))
    return digest


def place(system_apps: Path, registry: Registry, digest: str) -> None:
    described = manifest(registry, digest)
    described["id"] = APP
    described["runtime"]["image"] = f"{registry.host}/apps/say@{digest}"  # type: ignore[index]
    (system_apps / APP).mkdir()
    (system_apps / APP / "app.manifest.json").write_text(json.dumps(described))


def test_an_instance_in_a_trusted_range_cannot_choose_its_address(
    start_shell: StartShell, system_apps: Path, home: Path, registry: Registry, image: str
) -> None:
    """The operator trusts 10.0.0.0/8 (their proxy's network), which holds the instances' range:
    an image that sends X-Forwarded-For to the shell's API on the bridge must still be counted
    by its own address, so it can neither lock the user out of their account from the user's
    own address nor spread its guesses over addresses it makes up."""
    asyncio.run(ImageStore(home / "images").pull(registry.host, "apps/say", image))
    place(system_apps, registry, image)
    shell = start_shell(app_network=RANGE, trusted_proxies="10.0.0.0/8")
    assert shell.shell.network is not None
    bridge = f"{shell.shell.network.plan.shell_address}:{shell.settings.port}"
    with shell.client(timeout=30) as api:
        made = api.post("/api/users", json={"id": "bob", "password": PASSWORD})
        assert made.status_code == 201, made.text
        _, url = open_view(api, APP)
        client, _ = enter(shell, url)
        with closing(client):
            client.headers["Origin"] = f"http://{client.headers['Host']}"
            # bob's own address is the loopback's: the image blames it for LIMIT failures
            for _ in range(LIMIT + 1):
                said = client.post(
                    f"/cgi-bin/say?{bridge}/127.0.0.1",
                    json={"user": "bob", "password": "not the password"},
                )
                assert said.status_code == 200, said.text
                assert "HTTP/1.1 401" in said.text or "HTTP/1.1 429" in said.text, said.text
    with httpx.Client(base_url=shell.url, timeout=30) as owner:
        answer = owner.post("/api/session", json={"user": "bob", "password": PASSWORD})
        assert answer.status_code == 200, answer.text
