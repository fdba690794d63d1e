"""`GET /api/openapi.json` matches docs/api.md, and no input generated from it gets a 5xx.

The fuzzing is schemathesis (hypothesis strategies built from the served document) against the
real shell in a thread, as the user (bearer token). Examples per operation are bounded so the
whole run stays well under a minute on two cores.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Final

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

from atrium.api.openapi import NOT_JSON_API
from tests.integration.conftest import RunningShell
from tests.unit.test_errors import API_REFERENCE

pytestmark = pytest.mark.integration

#: operations fuzzed with invalid input only, and why: with valid input they would reach out to
#: registries and git servers named by the generated refs (install, preview, update), create
#: repositories at generated paths on this machine (publish), or fetch a catalogue from a
#: generated address (whose failure is the 502 of an upstream, not the shell's fault)
BAD_INPUT_ONLY: Final = {
    ("POST", "/api/dist/install"),
    ("POST", "/api/dist/install/preview"),
    ("POST", "/api/dist/update/{appId}"),
    ("POST", "/api/dist/publish"),
    ("PUT", "/api/dist/index"),
}
EXAMPLES: Final = 20
#: examples per operation of the run as a member: the same document, the answers of a caller
#: who is refused more often; fewer examples keep it short (about 40 s on two busy cores)
MEMBER_EXAMPLES: Final = 5


def _normal(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path.split("?")[0])


def documented_endpoints() -> set[tuple[str, str]]:
    """(method, path) of every row of docs/api.md's endpoint index, parameters as ``{}``."""
    text = API_REFERENCE.read_text()
    index = text.split("## Endpoint index", 1)[1].split("\n## ", 1)[0]
    found: set[tuple[str, str]] = set()
    for line in index.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[1].startswith("`"):
            continue
        methods = [m.strip() for m in cells[0].split(",")]
        for path in re.findall(r"`([^`]+)`", cells[1]):
            found.update((method, _normal(path)) for method in methods)
    return found


def excluded(path: str) -> bool:
    normal = _normal(path)
    return normal.startswith(("http://", "/static")) or any(
        normal == _normal(p) for p in NOT_JSON_API
    )


def test_the_document_is_the_endpoint_index(shell: RunningShell) -> None:
    """Every documented JSON route is in the document and vice versa; what is left out is named
    in `NOT_JSON_API` (the data proxy, page proxy, event stream, host page, login)."""
    with shell.anonymous() as client:  # open: the document is the API's shape, nothing more
        response = client.get("/api/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    served = {
        (method.upper(), _normal(path))
        for path, operations in document["paths"].items()
        for method in operations
    }
    documented = {(m, p) for m, p in documented_endpoints() if not excluded(p)}
    assert served == documented
    # the document never names an excluded route
    assert not [p for _, p in served if excluded(p)]
    # who may call, as the index says
    assert document["paths"]["/api/version"]["get"]["security"] == [{}]
    assert document["paths"]["/api/os/themes/select"]["post"]["x-callers"] == ["user"]
    body = document["paths"]["/api/kv/os/{key}"]["put"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/KvPut"}


def operations(document: dict[str, Any]) -> list[tuple[str, str, GenerationMode]]:
    out = []
    for path, methods in document["paths"].items():
        for method in methods:
            out.append((method.upper(), path, GenerationMode.NEGATIVE))
            if (method.upper(), path) not in BAD_INPUT_ONLY:
                out.append((method.upper(), path, GenerationMode.POSITIVE))
    return out


def fuzz(
    base_url: str,
    auth: dict[str, str],
    strategy: Any,
    failures: list[str],
    examples: int = EXAMPLES,
) -> None:
    """Send ``examples`` generated requests of one operation; note every 5xx."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(case=strategy)
    def check(case: Any) -> None:
        case.headers = {
            k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"
        }
        response = case.call(base_url=base_url, headers=auth, timeout=30)
        if response.status_code >= 500:
            request = response.request
            failures.append(
                f"{request.method} {request.url} {request.body!r:.300} → "
                f"{response.status_code} {response.text[:300]}"
            )

    # an operation with nothing to get wrong (no parameters, no body) has no bad input
    with contextlib.suppress(Unsatisfiable):
        check()


# every operation of the document is fuzzed in turn: about 60 s on a quiet machine, past the
# suite's 120 s when other work shares the two cores (seen once at 2 cores, load 3)
@pytest.mark.timeout(360)
def test_no_generated_request_gets_a_5xx(shell: RunningShell) -> None:
    with shell.anonymous() as client:
        document = client.get("/api/openapi.json").json()
    schema = schemathesis.openapi.from_dict(document)
    auth = {"Authorization": f"Bearer {shell.token}"}
    failures: list[str] = []
    for method, path, mode in operations(document):
        strategy = schema[path][method].as_strategy(generation_mode=mode)
        fuzz(shell.url, auth, strategy, failures)
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(360)
def test_no_generated_request_as_a_member_gets_a_5xx(shell: RunningShell) -> None:
    """The same run with a member's personal token: the checks of who owns what and of what a
    member may do answer 4xx, never 5xx, whatever the input."""
    member = shell.add_user("member")
    with shell.anonymous() as client:
        document = client.get("/api/openapi.json").json()
    schema = schemathesis.openapi.from_dict(document)
    auth = {"Authorization": f"Bearer {member}"}
    failures: list[str] = []
    for method, path, mode in operations(document):
        strategy = schema[path][method].as_strategy(generation_mode=mode)
        fuzz(shell.url, auth, strategy, failures, MEMBER_EXAMPLES)
    assert not failures, "\n".join(failures)
