"""The boundary between users, proven route by route (docs/security.md "The boundary between
users").

User A (the bootstrap admin, `alice`) plants things of hers: instances with data, a view, an
activity, a grant, KV rows, a personal token, a sign-in, backups, a private app in her user scope.
User B (`bob`, a member) then calls every route of `/api/openapi.json` that has a path parameter,
every method, with A's ids, three ways: B's session cookie (from the host page's origin), B's
personal token and B's app's token. Each answer is a 403 or a 404 exactly like the one a missing
id of the same shape gets, nothing of A's appears in any body or header, and A's things are as
she left them. Routes without path parameters are read as B and scanned the same way, and B's
event streams (live and replayed) are scanned at the end.

The matrix is built from the routes themselves, so a route added later is covered the day it
lands: a path parameter with no entry in `PARAMETERS` (or a request body with none in `BODIES`)
fails `test_every_route_parameter_has_a_value_of_a`, and its author adds A's value there.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
import pytest

from atrium.api.app import create_app
from atrium.api.openapi import NOT_JSON_API, build_document
from atrium.identity import SESSION_COOKIE
from atrium.settings import Settings
from atrium.users.model import SessionKind
from tests.conftest import REPO_DIR, TESTS_DIR
from tests.integration.conftest import RunningShell, SseReader, launch_shell, wait_for

if TYPE_CHECKING:
    from atrium.state.events import StoredEvent

pytestmark = pytest.mark.integration

ALICE: Final = "alice"
BOB: Final = "bob"
CAROL: Final = "carol"
#: A's app installed into her own user scope: nobody else may see it
PRIVATE_APP: Final = "test.iso.private"
#: a global app both users run, each their own instance and data
SHARED_APP: Final = "test.iso.shared"
CREDENTIALS: Final = ("cookie", "token", "app")


def _document() -> dict[str, Any]:
    """The OpenAPI document the shell serves, built from its routes at collection time (the
    running shell's document is checked to be this one)."""
    with tempfile.TemporaryDirectory() as home:
        app = create_app(Settings(home=Path(home), port=0))
        return build_document(app.starlette.routes)


DOCUMENT: Final = _document()
#: routes left out of the document that still take ids: the page proxy and the data proxy
EXTRA_ROUTES: Final = {
    path: ["GET", "POST", "DELETE"] for path in NOT_JSON_API if re.search(r"\{[^}]+\}", path)
}


@dataclass(frozen=True)
class Kind:
    """What one of A's values is to B: ``private`` (something of A's: B must get the answer a
    missing one gets, 403 or 404) or a ``name`` in B's own namespace (a KV key, a theme, the
    user scope: B may use it for B's own, but nothing of A's may come back and A's stays)."""

    private: bool
    #: a private name with no missing twin (the global scope, a tool): B's answer must be a
    #: 403 or 404, compared with the same request again
    fixed: bool = False
    #: B may read it (GET) though not change it: the global scope's trust store, which holds
    #: public keys and a policy that are every user's to know
    readable: bool = False


PRIVATE: Final = Kind(private=True)
NAME: Final = Kind(private=False)
DENIED: Final = Kind(private=True, fixed=True)

#: path parameter (as the document spells it) → label → what A's value under that label is.
#: ``"<path>#<name>"`` keys a parameter whose name means different things on different routes.
PARAMETERS: Final[dict[str, dict[str, Kind]]] = {
    "instanceId": {"a": PRIVATE, "b": NAME},  # "b": B's own instance, with A's other ids
    "appId": {"private": PRIVATE, "shared": NAME},
    "viewId": {"a": PRIVATE},
    "activityId": {"a": PRIVATE},
    "grantId": {"a": PRIVATE},
    "action": {"stop": NAME, "reset": NAME, "destroy": NAME},  # on A's instance
    "key": {"a": NAME},
    "scope": {"user": NAME, "global": DENIED},  # global is the admin's to change
    "themeId": {"any": NAME},
    "name": {"git": DENIED},  # the toolchain is the admin's
    "path": {"a": NAME},
    "authority": {"private": PRIVATE},
    "userId": {"a": PRIVATE},
    "tokenId": {"a": PRIVATE},
    "sessionId": {"a": PRIVATE},
    "backupId": {"a": PRIVATE},
    "identityId": {"a": PRIVATE},
    "provider": {"a": NAME},  # a sign-in provider's name: the same for everyone
    # B's own rows of any app id (A's private app's included): never A's
    "/api/kv/app/{appId}/{key}#appId": {"private": NAME, "shared": NAME},
    "/api/users/{id}#id": {"a": PRIVATE},
    "/api/tokens/{id}#id": {"a": PRIVATE},
    "/api/sessions/{id}#id": {"a": PRIVATE},
    "/api/scopes/{scope}/trust#scope": {
        "user": NAME,
        "global": Kind(private=True, fixed=True, readable=True),
    },
}

#: request body schema → the body B sends (given the case's values), so the request is valid
#: and reaches the check of who owns what
BODIES: Final[dict[str, Callable[[World, dict[str, str]], dict[str, Any]]]] = {
    "ActivityBody": lambda w, v: {},
    "ViewBody": lambda w, v: {},
    "GrantBody": lambda w, v: {"user": BOB, "role": "editor"},
    "KvPut": lambda w, v: {"value": "bob was here"},
    "ToolBody": lambda w, v: {"path": shutil.which("git")},
    "GitRepoBody": lambda w, v: {"url": "https://example.invalid/bob.git"},
    "UpdateBody": lambda w, v: {"autoApprove": True},
    "RollbackBody": lambda w, v: {"scope": w.scope_of(v)},
    "BackupBody": lambda w, v: {"scope": w.scope_of(v)},
    "RestoreBody": lambda w, v: {"backup": w.backup_of(v), "scope": w.scope_of(v)},
    "UserChange": lambda w, v: {"role": "member", "disabled": True},
    "PasswordReset": lambda w, v: {"password": "bob owns alice now"},
    "IdentityLink": lambda w, v: {"issuer": "https://example.invalid", "subject": "bob"},
    "DevProblemBody": lambda w, v: {"message": "bob was here"},
    "Trust": lambda w, v: {"policy": "off", "keys": []},
}
#: bodies that carry one of A's ids (so the case is private whatever its path says)
PRIVATE_BODIES: Final = {"RestoreBody"}


def _parameter(path: str, name: str) -> dict[str, Kind] | None:
    return PARAMETERS.get(f"{path}#{name}") or PARAMETERS.get(name)


def _body_schema(operation: dict[str, Any]) -> str | None:
    body = operation.get("requestBody")
    if body is None:
        return None
    ref: str = body["content"]["application/json"]["schema"]["$ref"]
    return ref.rsplit("/", 1)[1]


def routes_with_ids() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in DOCUMENT["paths"].items():
        if "{" not in path:
            continue
        for method, operation in operations.items():
            yield method.upper(), path, operation
    for path, methods in EXTRA_ROUTES.items():
        for method in methods:
            yield method, path, {}


def _names(path: str) -> list[str]:
    return re.findall(r"\{([^}]+)\}", path)


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    credential: str
    labels: tuple[tuple[str, str], ...]
    body: str | None

    @property
    def id(self) -> str:
        chosen = ",".join(f"{k}={v}" for k, v in self.labels)
        return f"{self.method} {self.path} [{self.credential}] {chosen}"


def matrix() -> list[Case]:
    cases = []
    for method, path, operation in routes_with_ids():
        names = _names(path)
        tables = [_parameter(path, n) for n in names]
        if any(t is None for t in tables):
            continue  # test_every_route_parameter_has_a_value_of_a fails instead
        choices = []
        for name, table in zip(names, tables, strict=True):
            assert table is not None
            labels = list(table)
            if name == "instanceId" and not any(
                other != "instanceId" and t is not None and any(k.private for k in t.values())
                for other, t in zip(names, tables, strict=True)
            ):
                labels = ["a"]  # B's own instance only matters beside another of A's ids
            choices.append([(name, label) for label in labels])
        for combo in itertools.product(*choices):
            for credential in CREDENTIALS:
                cases.append(Case(method, path, credential, combo, _body_schema(operation)))
    return cases


#: cases that fail today, each with why (an expected failure must fail: strict)
KNOWN: Final[dict[str, str]] = {}


def _params() -> list[Any]:
    out = []
    for case in matrix():
        marks = []
        if case.id in KNOWN:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[case.id]))
        out.append(pytest.param(case, id=case.id, marks=marks))
    return out


def twin(value: str) -> str:
    """A value of the same shape as ``value`` that names nothing: its last four letters and
    digits changed to others of their class."""
    chars = list(value)
    changed = 0
    for i in range(len(chars) - 1, -1, -1):
        c = chars[i]
        if changed == 4:
            break
        if c.isdigit():
            chars[i] = "3" if c == "7" else "7"
        elif c.isalpha():
            q = "z" if c.lower() == "q" else "q"
            chars[i] = q.upper() if c.isupper() else q
        else:
            continue
        changed += 1
    return "".join(chars)


def datawriter(target: Path, app_id: str) -> Path:
    source = TESTS_DIR / "apps" / "test.sdk.datawriter"
    shutil.copytree(source, target)
    manifest = json.loads((target / "app.manifest.json").read_text())
    manifest.update({"id": app_id, "name": f"isolation {app_id}"})
    (target / "app.manifest.json").write_text(json.dumps(manifest))
    return target


def ok(response: httpx.Response) -> Any:
    assert response.status_code in (200, 201), f"{response.request.url}: {response.text}"
    return response.json()


@dataclass
class World:
    """What A planted and the means of B, on one running shell."""

    shell: RunningShell
    sources: Path
    mark: str = field(default_factory=lambda: "alicemark" + secrets.token_hex(8))
    values: dict[str, str] = field(default_factory=dict)
    traces: set[str] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)
    states: dict[str, str] = field(default_factory=dict)
    bob_token: str = ""
    bob_cookie: str = ""
    bob_app_token: str = ""
    alice_token: str = ""
    alice_cookie: str = ""
    alice_page: SseReader | None = None
    closing: list[httpx.Client] = field(default_factory=list)

    def alice(self, **kwargs: Any) -> httpx.Client:
        return self.shell.client(timeout=60, **kwargs)

    def page(self) -> str:
        """The client id of A's host page, whose event stream stays open (started once)."""
        if self.alice_page is None:
            client = self.alice()
            self.alice_page = SseReader(client, params={"client": "alice-host-page"})
            self.closing.append(client)
        return "alice-host-page"

    def scope_of(self, values: dict[str, str]) -> str:
        """The scope A's app of the case is in (its twin is asked in the same one)."""
        return "user" if values.get("appId") in (PRIVATE_APP, twin(PRIVATE_APP)) else "global"

    def backup_of(self, values: dict[str, str]) -> str:
        private = self.scope_of(values) == "user"
        return self.values["backup:private" if private else "backup:shared"]

    # --- planting -------------------------------------------------------------------------

    def setup_users(self) -> None:
        shell = self.shell
        self.bob_token = shell.add_user(BOB, name="Bob")
        shell.add_user(CAROL)
        users = shell.shell.users
        self.bob_cookie, _ = shell.on_loop(
            users.create_session(BOB, SessionKind.PASSWORD, address="127.0.0.1", device="bob")
        )
        self.install()
        self.bob_instance()

    def install(self) -> None:
        """A's apps: one in her user scope, one global (again, if a case removed one)."""
        with self.alice() as api:
            for app_id, scope in ((PRIVATE_APP, "user"), (SHARED_APP, "global")):
                if api.get(f"/api/apps/{app_id}").status_code == 200:
                    continue
                folder = self.sources / app_id
                if not folder.exists():
                    datawriter(folder, app_id)
                ok(
                    api.post(
                        "/api/dist/install",
                        json={"ref": f"local:{folder}", "scope": scope, "autoApprove": True},
                    )
                )

    def bob_instance(self) -> None:
        """B's own instance of the global app, and its app token (the one it was started with
        when it is B's; one issued with owner B for an instance id of no one's otherwise)."""
        lifecycle = self.shell.shell.lifecycle
        iid = self.values.get("instance:b")
        if iid is None or iid not in {i.id for i in lifecycle.all()}:
            with self.shell.client(self.bob_token, timeout=60) as bob:
                mine = ok(bob.post("/api/instances", json={"appId": SHARED_APP, "new": True}))
            iid = self.values["instance:b"] = mine["instanceId"]
        instance = lifecycle.get(iid)
        if instance.owner == BOB and instance.token is not None:
            self.bob_app_token = instance.token
        elif not self.bob_app_token:
            tokens = self.shell.shell.app_tokens
            self.bob_app_token = tokens.issue(SHARED_APP, f"{SHARED_APP}-of-bob", BOB)

    def plant(self) -> None:
        """A's things (again, after a case that broke them: new ids, the same marker)."""
        shell = self.shell
        mark = self.mark
        users = shell.shell.users
        self.install()
        with self.alice() as api:
            for key, app_id in (("instance:a", SHARED_APP), ("instance:private", PRIVATE_APP)):
                answer = ok(api.post("/api/instances", json={"appId": app_id, "new": True}))
                iid = answer["instanceId"]
                self.values[key] = iid
                self.ports.add(answer["port"])
                self.traces.add(iid)
                self.traces.add(shell.shell.lifecycle.get(iid).slug)
                ok(api.post(f"/api/proxy/{iid}/write?name=secret-{mark}", content=mark.encode()))
            ok(api.put(f"/api/kv/os/secret-{mark}", json={"value": mark}))
            ok(api.put(f"/api/kv/app/{SHARED_APP}/secret-{mark}", json={"value": mark}))
            ok(api.put(f"/api/kv/app/{PRIVATE_APP}/secret-{mark}", json={"value": mark}))
            ok(api.put("/api/tools/git", json={"path": shutil.which("git")}))
            for label, app_id, scope in (
                ("shared", SHARED_APP, "global"),
                ("private", PRIVATE_APP, "user"),
            ):
                backup = ok(api.post(f"/api/dist/backups/{app_id}", json={"scope": scope}))
                self.values[f"backup:{label}"] = backup["id"]
                self.traces.add(backup["id"])
            # after the backups: a backup restarts the app's instances, closing their views
            a = self.values["instance:a"]
            # A's host page holds its event stream open: its views stay while it does
            view = ok(api.post(f"/api/instances/{a}/views", json={"client": self.page()}))
            self.values["view"] = view["viewId"]
            activity = api.post(f"/api/instances/{a}/activities", json={})
            self.values["activity"] = (
                activity.json()["activityId"] if activity.status_code == 200 else "act-1"
            )
            grant = ok(
                api.post(f"/api/instances/{a}/grants", json={"user": CAROL, "role": "viewer"})
            )
            self.values["grant"] = grant["id"] if "id" in grant else grant["grantId"]
            self.states = {}
            for iid in (a, self.values["instance:private"]):
                wire = ok(api.get(f"/api/instances/{iid}"))
                self.states[iid] = wire["state"]
                self.ports.add(wire["port"])  # a backup's restart may have moved it
            self.values["theme"] = ok(api.get("/api/os/themes"))[0]["id"]
            self.values["remote"] = self.remote(api) or ""
        self.alice_token, token = shell.on_loop(users.create_token(ALICE, f"token-{mark}", None))
        self.values["token"] = token.id
        self.alice_cookie, session = shell.on_loop(
            users.create_session(
                ALICE, SessionKind.PASSWORD, address="127.0.0.1", device=f"device-{mark}"
            )
        )
        self.values["session"] = session.id
        self.traces |= {
            mark,
            ALICE,
            self.values["view"],
            self.values["grant"],
            token.id,
            session.id,
            self.alice_token,
            self.alice_cookie,
            shell.token,
        }
        if activity.status_code == 200:
            self.traces.add(self.values["activity"])

    def repair(self, problems: list[str]) -> None:
        """Put back what a case broke: a closed view or a restarted instance cheaply (what a
        backup of the global app by B does to A's today), anything else by planting again."""
        light = all(
            " was closed" in p or (p.startswith("instance ") and ", was " in p) for p in problems
        )
        if not light:
            self.plant()
            return
        a = self.values["instance:a"]
        with self.alice() as api:
            view = ok(api.post(f"/api/instances/{a}/views", json={"client": self.page()}))
            self.values["view"] = view["viewId"]
            self.traces.add(view["viewId"])
            for iid in self.states:
                wire = ok(api.get(f"/api/instances/{iid}"))
                self.states[iid] = wire["state"]
                self.ports.add(wire["port"])

    def value(self, path: str, name: str, label: str) -> str:
        """A's value of parameter ``name`` under ``label``."""
        key = f"{path}#{name}" if name == "id" else name
        table: dict[str, Callable[[], str]] = {
            "instanceId": lambda: self.values[f"instance:{label}"],
            "appId": lambda: PRIVATE_APP if label == "private" else SHARED_APP,
            "authority": lambda: PRIVATE_APP,
            "viewId": lambda: self.values["view"],
            "activityId": lambda: self.values["activity"],
            "grantId": lambda: self.values["grant"],
            "action": lambda: label,
            "key": lambda: f"secret-{self.mark}",
            "scope": lambda: label,
            "themeId": lambda: self.values["theme"],
            "name": lambda: label,
            "path": lambda: "health",
            "userId": lambda: ALICE,
            "/api/users/{id}#id": lambda: ALICE,
            "tokenId": lambda: self.values["token"],
            "/api/tokens/{id}#id": lambda: self.values["token"],
            "sessionId": lambda: self.values["session"],
            "/api/sessions/{id}#id": lambda: self.values["session"],
            "backupId": lambda: self.values["backup:shared"],
            "identityId": lambda: "https://example.invalid|alice",
            "provider": lambda: "nosuchprovider",
        }
        return table[key]()

    # --- B's means -----------------------------------------------------------------------

    def headers(self, credential: str) -> dict[str, str]:
        if credential == "cookie":
            origin = f"http://127.0.0.1:{self.shell.settings.port}"
            return {"Cookie": f"{SESSION_COOKIE}={self.bob_cookie}", "Origin": origin}
        token = self.bob_token if credential == "token" else self.bob_app_token
        return {"Authorization": f"Bearer {token}"}

    # --- checks --------------------------------------------------------------------------

    def leaks(self, text: str) -> list[str]:
        """A's traces found in ``text``."""
        found = sorted(t for t in self.traces if t and t in text)
        found += [f"port {p}" for p in sorted(self.ports) if re.search(rf"(?<!\d){p}(?!\d)", text)]
        return found

    def intact(self) -> list[str]:
        """What of A's is no longer as she left it."""
        problems: list[str] = []
        mark = self.mark
        with self.alice() as api:
            for iid, state in self.states.items():
                answer = api.get(f"/api/instances/{iid}")
                if answer.status_code != 200:
                    problems.append(f"instance {iid} is gone ({answer.status_code})")
                    continue
                wire = answer.json()
                if wire["state"] != state:
                    problems.append(f"instance {iid} is {wire['state']}, was {state}")
                if iid == self.values["instance:a"] and wire["views"] < 1:
                    problems.append(f"A's view on {iid} was closed: {wire}")
            problems += self._kept(api)
        with self.shell.client(self.alice_token) as own:
            if own.get("/api/instances").status_code != 200:
                problems.append("A's personal token stopped working")
        with self.shell.anonymous(cookies={SESSION_COOKIE: self.alice_cookie}) as signed_in:
            if signed_in.get("/api/instances").status_code != 200:
                problems.append("A's sign-in was ended")
        files = [
            p
            for p in self.shell.settings.home.rglob(f"secret-{mark}")
            if p.is_file() and p.read_text() == mark
        ]
        if len(files) < 2:
            problems.append(f"A's data files are gone or changed: {files}")
        return problems

    def _kept(self, api: httpx.Client) -> list[str]:
        """A's rows, grant, backups, app, tool and scope remote, as she left them."""
        problems: list[str] = []
        mark = self.mark
        for path in (
            f"/api/kv/os/secret-{mark}",
            f"/api/kv/app/{SHARED_APP}/secret-{mark}",
            f"/api/kv/app/{PRIVATE_APP}/secret-{mark}",
        ):
            answer = api.get(path)
            if answer.status_code != 200 or answer.json()["value"] != mark:
                problems.append(f"{path} is now {answer.status_code} {answer.text[:200]}")
        grants = api.get(f"/api/instances/{self.values['instance:a']}/grants")
        if self.values["grant"] not in grants.text:
            problems.append(f"A's grant is gone: {grants.text[:200]}")
        for label, app_id, scope in (
            ("shared", SHARED_APP, "global"),
            ("private", PRIVATE_APP, "user"),
        ):
            backups = api.get(f"/api/dist/backups/{app_id}?scope={scope}")
            if self.values[f"backup:{label}"] not in backups.text:
                problems.append(f"A's backup of {app_id} is gone: {backups.text[:200]}")
        if api.get(f"/api/apps/{PRIVATE_APP}").status_code != 200:
            problems.append(f"A's app {PRIVATE_APP} is gone")
        tools = api.get("/api/tools")
        if '"git"' not in tools.text:
            problems.append(f"A's tool git is gone: {tools.text[:200]}")
        if (remote := self.remote(api) or "") != self.values.get("remote"):
            problems.append(f"A's user scope remote is now {remote!r}")
        return problems

    @staticmethod
    def remote(api: httpx.Client) -> str | None:
        """The remote of the caller's user scope."""
        for scope in ok(api.get("/api/scopes")):
            if scope["id"] == "user":
                remote: str | None = scope.get("remote")
                return remote
        return None


@dataclass
class Streams:
    """B's event streams, open from before A planted anything."""

    readers: dict[str, SseReader]
    clients: list[httpx.Client]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, Streams]]:
    root = tmp_path_factory.mktemp("isolation")
    system_apps = root / "system-apps"
    shutil.copytree(REPO_DIR / "apps", system_apps)
    shell = launch_shell(root / "home", system_apps, user=ALICE)
    try:
        sources = root / "sources"
        sources.mkdir()
        world = World(shell, sources)
        world.setup_users()
        clients = [shell.anonymous(headers=world.headers(c)) for c in CREDENTIALS]
        readers = {
            credential: SseReader(client)
            for credential, client in zip(CREDENTIALS, clients, strict=True)
        }
        world.plant()
        yield world, Streams(readers, clients)
        for client in clients + world.closing:
            client.close()
    finally:
        shell.stop()


def _normal(text: str, values: list[str]) -> str:
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, "{}")
    return text


def _headers(response: httpx.Response) -> str:
    skip = {"date", "content-length"}
    return "\n".join(f"{k}: {v}" for k, v in response.headers.items() if k not in skip)


def _send(
    world: World, case: Case, values: dict[str, str], body: dict[str, Any] | None
) -> httpx.Response:
    path = case.path
    for name, value in values.items():
        path = path.replace("{" + name + "}", value)
    query = {"scope": world.scope_of(values)} if "appId" in values else {}
    with world.shell.anonymous(headers=world.headers(case.credential), timeout=60) as b:
        return b.request(case.method, path, params=query, json=body)


def test_the_served_document_is_the_one_the_matrix_is_made_of(
    world: tuple[World, Streams],
) -> None:
    with world[0].shell.anonymous() as client:
        assert client.get("/api/openapi.json").json()["paths"] == DOCUMENT["paths"]


def test_every_route_parameter_has_a_value_of_a() -> None:
    """A route with a path parameter nobody gave A's value for, or a body nobody wrote, is a
    route the matrix does not cover: add its row to PARAMETERS or BODIES."""
    missing = sorted(
        {
            f"{method} {path}: parameter {name!r}"
            for method, path, _ in routes_with_ids()
            for name in _names(path)
            if _parameter(path, name) is None
        }
        | {
            f"{method} {path}: body {schema!r}"
            for method, path, operation in routes_with_ids()
            if (schema := _body_schema(operation)) is not None and schema not in BODIES
        }
    )
    assert not missing, "\n".join(missing)
    assert len(matrix()) > 100


@pytest.mark.parametrize("case", _params())
def test_b_gets_nothing_of_a(world: tuple[World, Streams], case: Case) -> None:
    """B's request with A's ids answers as for a missing id (403 or 404), shows nothing of A's,
    and leaves A's things as they were."""
    w, _ = world
    w.bob_instance()
    kinds = {name: PARAMETERS_OF(case.path, name)[label] for name, label in case.labels}
    values = {name: w.value(case.path, name, label) for name, label in case.labels}
    private = (
        any(k.private and not (k.readable and case.method == "GET") for k in kinds.values())
        or case.body in PRIVATE_BODIES
    )
    # a body nobody wrote yet: none (test_every_route_parameter_has_a_value_of_a fails)
    make = BODIES.get(case.body or "", lambda w, v: None)
    body = make(w, values)
    answer = _send(w, case, values, body)
    shown = list(values.values())
    secret_body = body is not None and case.body in PRIVATE_BODIES
    if secret_body:
        assert body is not None
        shown.append(body["backup"])
    failures: list[str] = []
    if answer.status_code >= 500:
        failures.append(f"answered {answer.status_code}: {answer.text[:300]}")
    if private:
        missing = {
            n: twin(v) if kinds[n].private and not kinds[n].fixed else v for n, v in values.items()
        }
        missing_body = body
        hidden = list(missing.values())
        if secret_body:
            assert body is not None
            missing_body = {**body, "backup": twin(body["backup"])}
            hidden.append(missing_body["backup"])
        unknown = _send(w, case, missing, missing_body)
        if answer.status_code not in (403, 404):
            failures.append(f"answered {answer.status_code}, not 403/404: {_text(answer)[:300]}")
        mine, theirs = _normal(_text(answer), shown), _normal(_text(unknown), hidden)
        if (answer.status_code, mine) != (unknown.status_code, theirs):
            failures.append(
                f"answers unlike a missing id: {answer.status_code} {mine[:300]} vs "
                f"{unknown.status_code} {theirs[:300]}"
            )
    text = _normal(answer.text if _textual(answer) else "", shown)
    if not _textual(answer) and w.mark.encode() in answer.content:
        failures.append("A's marker is in the (binary) body")
    if leaked := w.leaks(text):
        failures.append(f"body shows A's {leaked}: {text[:300]}")
    if leaked := w.leaks(_normal(_headers(answer), shown)):
        failures.append(f"headers show A's {leaked}: {_headers(answer)[:300]}")
    if problems := w.intact():
        failures += [f"A's state changed: {p}" for p in problems]
        w.repair(problems)  # the next cases find A's things again
    assert not failures, f"{case.id}:\n" + "\n".join(failures)


def PARAMETERS_OF(path: str, name: str) -> dict[str, Kind]:
    table = _parameter(path, name)
    assert table is not None
    return table


def _text(response: httpx.Response) -> str:
    if _textual(response):
        return response.text
    return f"<{len(response.content)} bytes of {response.headers.get('content-type')}>"


def _textual(response: httpx.Response) -> bool:
    kind: str = response.headers.get("content-type", "")
    return kind.startswith(("application/json", "text/"))


def listing_routes() -> list[Any]:
    out = []
    for path, operations in DOCUMENT["paths"].items():
        if "{" in path or "get" not in operations:
            continue
        queries = [p["name"] for p in operations["get"]["parameters"] if p["in"] == "query"]
        variants: list[dict[str, str]] = [{}] + [
            {q: ALICE if q in {"actor", "user", "owner"} else "1"} for q in queries
        ]
        if path == "/api/instances":
            variants.append({"all": "1"})
        for query in variants:
            for credential in CREDENTIALS:
                label = "&".join(f"{k}={v}" for k, v in query.items())
                out.append(
                    pytest.param(path, query, credential, id=f"GET {path}?{label} [{credential}]")
                )
    return out


@pytest.mark.parametrize(("path", "query", "credential"), listing_routes())
def test_b_lists_nothing_of_a(
    world: tuple[World, Streams], path: str, query: dict[str, str], credential: str
) -> None:
    """Every route without path parameters, read as B, shows nothing of A's."""
    w, _ = world
    if "refresh" in query:
        pytest.skip("refresh fetches the distribution index from the network")
    with w.shell.anonymous(headers=w.headers(credential), timeout=60) as b:
        answer = b.get(path, params=query)
    assert answer.status_code < 500, answer.text
    text = answer.text
    if path == "/api/audit" and answer.status_code == 200:
        # B's own attempts name the ids B typed; every record must be B's own
        records = answer.json()
        assert all(r["actor"] == BOB or r["actor"].startswith("app:") for r in records), text[:500]
        text = json.dumps([r for r in records if r["actor"] != BOB])
    assert not w.leaks(text), f"{answer.status_code} {text[:500]}"
    assert not w.leaks(_headers(answer)), _headers(answer)


def test_b_creates_nothing_from_a_private_app(world: tuple[World, Streams]) -> None:
    """A's user-scope app is not B's to start, directly or by its origin."""
    w, _ = world
    for credential in ("cookie", "token"):
        with w.shell.anonymous(headers=w.headers(credential), timeout=60) as b:
            answer = b.post("/api/instances", json={"appId": PRIVATE_APP, "new": True})
        assert answer.status_code in (403, 404), answer.text
        assert not w.leaks(answer.text.replace(PRIVATE_APP, "")), answer.text


def test_a_s_origin_shows_b_nothing(world: tuple[World, Streams]) -> None:
    """B at the origin of A's instance, with B's cookie or token, reaches no page of A's."""
    w, _ = world
    slug = w.shell.shell.lifecycle.get(w.values["instance:a"]).slug
    host = f"{slug}.{w.shell.settings.app_domain}:{w.shell.settings.port}"
    for credential in CREDENTIALS:
        headers = {**w.headers(credential), "Host": host}
        with w.shell.anonymous(headers=headers) as b:
            answer = b.get(f"/read?name=secret-{w.mark}", follow_redirects=False)
        assert w.mark not in answer.text, (credential, answer.status_code)
        assert answer.status_code in (302, 303, 401, 403, 404), (credential, answer.text[:300])


async def stored_events(shell: RunningShell) -> list[StoredEvent]:
    """Every event the shell recorded, with its owner (the owner is not on the wire)."""
    from atrium.state import events

    async with shell.shell.db.connect() as conn:
        return await events.after(conn, 0, limit=1_000_000)


def test_b_s_event_streams_carry_nothing_of_a(world: tuple[World, Streams]) -> None:
    """B's live streams (open while A planted and B tried everything above) and a replay from
    the first event carry nothing of A's."""
    w, streams = world
    with w.alice() as api:  # more of A's changes, heard (or not) by B's open streams
        ok(api.put(f"/api/kv/os/secret-{w.mark}", json={"value": w.mark}))
        ok(api.post("/api/instances", json={"appId": SHARED_APP, "new": True}))
    heard = {name: len(reader.events) for name, reader in streams.readers.items()}
    with w.shell.client(w.bob_token) as bob:  # and one of B's, that B's streams do hear
        ok(bob.post("/api/instances", json={"appId": SHARED_APP, "new": True}))
    for name, reader in streams.readers.items():
        count = heard[name]

        def more(r: SseReader = reader, n: int = count) -> bool:
            return len(r.events) > n

        wait_for(more, f"B's own event ({name})")
    w.bob_instance()  # B's app token now (a restart of B's instance issued another)
    fresh = [w.shell.anonymous(headers=w.headers(c)) for c in CREDENTIALS]
    w.closing += fresh
    replays = {
        credential: SseReader(client, params={"lastEventId": "0"})
        for credential, client in zip(CREDENTIALS, fresh, strict=True)
    }
    for name, reader in replays.items():  # the history has B's instance start at least
        if name != "app":
            reader.wait(1, f"replayed events ({name})")
    # an app hears less than its user; its replay was queued before the stream's first byte,
    # so it arrives with the connection: a moment to read it (nothing is timed)
    time.sleep(0.5)
    # whose each event is, as the shell itself recorded it (the owner is not on the wire): B's
    # own KV writes under key names copied from A's are B's rows, and B's to hear
    owners = {str(e.id): e.owner for e in w.shell.on_loop(stored_events(w.shell))}
    found = []
    for name, reader in [
        *((f"live {c}", r) for c, r in streams.readers.items()),
        *((f"replay {c}", r) for c, r in replays.items()),
    ]:
        assert reader.status in (None, 200), (name, reader.status)
        for event in reader.events:
            text = json.dumps(event.data)
            if owners.get(event.id) == BOB:
                continue
            if leaked := w.leaks(text):
                found.append(f"{name}: {event.event} shows A's {leaked}: {text[:200]}")
    assert not found, "\n".join(found)
