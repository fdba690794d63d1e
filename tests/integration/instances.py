"""What the tests of several users do with instances of the SDK echo app (``ECHO``, installed
by the ``echo_shell`` fixture of conftest.py): launch one, open a view on it as a page client,
and check an answer is exactly the one a missing instance gets."""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.conftest import ECHO, RunningShell
from tests.integration.test_origins import enter


def launch(api: httpx.Client, app_id: str = ECHO, *, new: bool = False) -> dict[str, Any]:
    """`POST /api/instances` as ``api``'s user: the instance object."""
    answer = api.post("/api/instances", json={"appId": app_id, "new": new})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def new_instance(api: httpx.Client, app_id: str = ECHO) -> str:
    """A new instance of ``app_id`` for ``api``'s user: its id."""
    instance_id: str = launch(api, app_id, new=True)["instanceId"]
    return instance_id


def view_client(shell: RunningShell, client: httpx.Client, instance_id: str) -> httpx.Client:
    """A view on ``instance_id`` opened as ``client``'s user, entered as a browser does: a
    client on the instance's origin holding the view's cookie and that origin as `Origin`."""
    view = client.post(f"/api/instances/{instance_id}/views", json={})
    assert view.status_code == 200, view.text
    page, _ = enter(shell, view.json()["url"])
    page.headers["Origin"] = f"http://{page.headers['Host']}"
    return page


def as_missing(answer: httpx.Response, instance_id: str) -> None:
    """The answer a missing instance gets: 404 not_found, kind instance, nothing else."""
    assert answer.status_code == 404, answer.text
    assert answer.json() == {
        "error": {
            "code": "not_found",
            "message": f"no instance {instance_id!r}",
            "kind": "instance",
            "id": instance_id,
        }
    }
