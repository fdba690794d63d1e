"""Sign-in through an OpenID Connect provider, against a local oidc-provider-mock that checks PKCE
(tests/oidc_mock.py): linking by (issuer, subject) only, sign-up, the e-mail rule, and every way a
callback can fail answering a page with the reason, never a 500. The browser run is
tests/e2e/test_oidc_signin.py."""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from atrium.identity import SESSION_COOKIE
from tests.integration.conftest import RunningShell, StartShell
from tests.integration.test_serve import serve_refused
from tests.oidc_mock import MOCK_WARNINGS, MockProvider, mock_provider

pytestmark = MOCK_WARNINGS


@pytest.fixture(scope="module")
def provider() -> Iterator[MockProvider]:
    with mock_provider() as running:
        yield running


@pytest.fixture
def oidc_shell(start_shell: StartShell, provider: MockProvider) -> RunningShell:
    return start_shell(
        oidc_providers=[
            provider.config("mock"),
            provider.config("open", allowSignup=True),
            provider.config("org", allowSignup=True, emailDomains=["example.org"]),
        ]
    )


def to_provider(browser: httpx.Client, provider_id: str) -> str:
    """Start a sign-in; the authorization URL the shell sends the browser to."""
    started = browser.get(f"/auth/oidc/{provider_id}/login")
    assert started.status_code == 302, started.text
    return started.headers["location"]


def at_provider(authorize: str, sub: str) -> str:
    """The person signs in at the provider as ``sub``: the callback URL it sends them back to."""
    assert httpx.get(authorize, timeout=10).status_code == 200
    answered = httpx.post(authorize, data={"sub": sub}, timeout=10)
    assert answered.status_code == 302, answered.text
    return answered.headers["location"]


def sign_in(browser: httpx.Client, provider_id: str, sub: str) -> httpx.Response:
    return browser.get(at_provider(to_provider(browser, provider_id), sub))


def me(shell: RunningShell, response: httpx.Response) -> dict[str, Any]:
    cookie = response.cookies.get(SESSION_COOKIE)
    assert cookie, f"no session cookie: {response.status_code} {response.text[:300]}"
    with shell.anonymous(cookies={SESSION_COOKIE: cookie}) as client:
        answer = client.get("/api/me")
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found


def refused(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert words in html.unescape(response.text), response.text
    assert SESSION_COOKIE not in response.cookies


def test_providers_are_listed_for_anyone_without_their_secrets(oidc_shell: RunningShell) -> None:
    with oidc_shell.anonymous() as client:
        listed = client.get("/api/auth/providers")
    assert listed.status_code == 200
    assert [p["id"] for p in listed.json()] == ["mock", "open", "org"]
    assert listed.json()[0] == {
        "id": "mock",
        "displayName": "Mock mock",
        "loginUrl": "/auth/oidc/mock/login",
    }
    assert "secret" not in listed.text


def test_a_linked_identity_signs_in_as_its_user(
    oidc_shell: RunningShell, provider: MockProvider
) -> None:
    oidc_shell.add_user("bob", name="Bob")
    with oidc_shell.client() as admin:
        linked = admin.post(
            "/api/users/bob/identities", json={"issuer": provider.issuer, "subject": "bob-sub"}
        )
        assert linked.status_code == 201, linked.text
        assert admin.get("/api/users/bob/identities").json()[0]["subject"] == "bob-sub"
    with oidc_shell.anonymous() as browser:
        authorize = to_provider(browser, "mock")
        query = parse_qs(urlsplit(authorize).query)
        assert query["code_challenge_method"] == ["S256"]
        assert query["nonce"]
        assert query["state"]
        assert query["code_challenge"]
        done = browser.get(at_provider(authorize, "bob-sub"))
    assert done.status_code == 303
    assert done.headers["location"] == "/"
    assert me(oidc_shell, done) == {"id": "bob", "name": "Bob", "role": "member"}
    kinds = [s.kind.value for s in oidc_shell.shell.users.sessions_of("bob")]
    assert kinds == ["oidc"]


def test_an_unknown_subject_is_refused_with_a_page_naming_the_admin(
    oidc_shell: RunningShell, provider: MockProvider
) -> None:
    with oidc_shell.anonymous() as browser:
        done = sign_in(browser, "mock", "stranger")
    refused(done, 403, "an admin must add you")
    assert "stranger" in done.text
    assert provider.issuer in done.text
    assert [u.id for u in oidc_shell.shell.users.all()] == ["default"]


def test_sign_up_makes_a_member_with_a_valid_unique_id(
    oidc_shell: RunningShell, provider: MockProvider
) -> None:
    oidc_shell.add_user("carol.smith")
    provider.set_user("carol-1", preferred_username="Carol.Smith", name="Carol S")
    with oidc_shell.anonymous() as browser:
        first = sign_in(browser, "open", "carol-1")
    assert me(oidc_shell, first) == {"id": "carol.smith-2", "name": "Carol S", "role": "member"}
    provider.set_user("odd-2", email="@@Weird Name!@example.net")
    with oidc_shell.anonymous() as browser:
        second = sign_in(browser, "open", "odd-2")
    assert me(oidc_shell, second)["id"] == "user"
    provider.set_user("ctl-3", preferred_username="ctl", name="Bell\x07 Name")
    with oidc_shell.anonymous() as browser:
        third = sign_in(browser, "open", "ctl-3")
    assert me(oidc_shell, third)["name"] == "Bell Name"
    with oidc_shell.anonymous() as browser:  # the same subject again: the same member
        again = sign_in(browser, "open", "carol-1")
    assert me(oidc_shell, again)["id"] == "carol.smith-2"


def test_the_email_domain_rule_needs_a_verified_address_of_the_domain(
    oidc_shell: RunningShell, provider: MockProvider
) -> None:
    provider.set_user("unverified", email="u@example.org", email_verified=False)
    provider.set_user("elsewhere", email="e@example.com", email_verified=True)
    provider.set_user("good", email="g@Example.org", email_verified=True)
    with oidc_shell.anonymous() as browser:
        refused(sign_in(browser, "org", "unverified"), 403, "not verified")
        refused(sign_in(browser, "org", "elsewhere"), 403, "example.com may not sign in")
        assert me(oidc_shell, sign_in(browser, "org", "good"))["id"] == "g"


def test_the_same_email_with_another_subject_is_not_the_linked_user(
    oidc_shell: RunningShell, provider: MockProvider
) -> None:
    oidc_shell.add_user("bob")
    provider.set_user("bob-sub", email="bob@example.org", email_verified=True)
    provider.set_user("impostor", email="bob@example.org", email_verified=True)
    with oidc_shell.client() as admin:
        admin.post(
            "/api/users/bob/identities",
            json={"issuer": provider.issuer, "subject": "bob-sub", "email": "bob@example.org"},
        ).raise_for_status()
    with oidc_shell.anonymous() as browser:
        refused(sign_in(browser, "mock", "impostor"), 403, "an admin must add you")
        made = me(oidc_shell, sign_in(browser, "open", "impostor"))
    assert made["id"] != "bob"
    assert made["role"] == "member"


def test_a_disabled_user_is_refused(oidc_shell: RunningShell, provider: MockProvider) -> None:
    oidc_shell.add_user("dave")
    with oidc_shell.client() as admin:
        admin.post(
            "/api/users/dave/identities", json={"issuer": provider.issuer, "subject": "dave-sub"}
        ).raise_for_status()
        admin.patch("/api/users/dave", json={"disabled": True}).raise_for_status()
    with oidc_shell.anonymous() as browser:
        refused(sign_in(browser, "mock", "dave-sub"), 403, "disabled")


def test_a_tampered_state_another_browser_and_a_replay_are_refused(
    oidc_shell: RunningShell, provider: MockProvider
) -> None:
    oidc_shell.add_user("erin")
    oidc_shell.on_loop(oidc_shell.shell.users.link(provider.issuer, "erin-sub", "erin", None))
    with oidc_shell.anonymous() as browser:
        callback = at_provider(to_provider(browser, "mock"), "erin-sub")
        parts = urlsplit(callback)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        tampered = f"{parts.path}?{urlencode({**query, 'state': query['state'] + 'x'})}"
        refused(browser.get(tampered), 400, "start it again")
    with oidc_shell.anonymous() as browser:
        callback = at_provider(to_provider(browser, "mock"), "erin-sub")
        with oidc_shell.anonymous() as elsewhere:  # the code carried to another browser
            refused(elsewhere.get(callback), 400, "not started in this browser")
        assert me(oidc_shell, browser.get(callback))["id"] == "erin"
        refused(browser.get(callback), 400, "start it again")  # the same answer replayed


def test_a_provider_error_and_unknown_provider_are_pages(
    oidc_shell: RunningShell, provider: MockProvider
) -> None:
    oidc_shell.add_user("ivy")
    oidc_shell.on_loop(oidc_shell.shell.users.link(provider.issuer, "ivy-sub", "ivy", None))
    with oidc_shell.anonymous() as browser:
        callback = at_provider(to_provider(browser, "mock"), "ivy-sub")
        started = browser.cookies["atrium_oidc"]
        answer = browser.get(
            "/auth/oidc/mock/callback?error=access_denied&error_description=no+thanks&state=s"
        )
        refused(answer, 400, "access_denied (no thanks)")
        # the sign-in that answer ended is over: its code does not sign in afterwards, even
        # with the cookie the error page told the browser to forget
        kept = {"atrium_oidc": started}
        with oidc_shell.anonymous(cookies=kept) as again:
            refused(again.get(callback), 400, "start it again")
        refused(browser.get("/auth/oidc/nope/login"), 404, "no sign-in provider 'nope'")
        refused(browser.get("/auth/oidc/nope/callback?code=c&state=s"), 404, "'nope'")


def test_a_wrong_nonce_or_pkce_verifier_fails_the_sign_in(
    oidc_shell: RunningShell, provider: MockProvider
) -> None:
    oidc_shell.add_user("fay")
    oidc_shell.on_loop(oidc_shell.shell.users.link(provider.issuer, "fay-sub", "fay", None))

    def tamper(key: str) -> None:
        """Change what the shell holds for the sign-ins in progress (its own memory)."""
        for _, session in oidc_shell.server.app.state.oidc.pending._flows.values():
            for value in session.values():
                value["data"][key] = value["data"][key][:-4] + "AAAA"

    for key, words in (("nonce", "ID token is not valid"), ("code_verifier", "refused")):
        with oidc_shell.anonymous() as browser:
            callback = at_provider(to_provider(browser, "mock"), "fay-sub")
            tamper(key)
            refused(browser.get(callback), 400, words)


def test_the_mock_provider_refuses_a_wrong_pkce_verifier(provider: MockProvider) -> None:
    """The fixture's own PKCE check, straight at the token endpoint."""
    verifier = "v" * 50
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    params = {
        "response_type": "code",
        "client_id": "direct",
        "redirect_uri": "http://127.0.0.1:9/cb",
        "scope": "openid",
        "nonce": "n",
        "state": "s",
        "code_challenge": challenge.rstrip(b"=").decode(),
        "code_challenge_method": "S256",
    }
    authorize = f"{provider.issuer}/oauth2/authorize?{urlencode(params)}"
    code = parse_qs(urlsplit(at_provider(authorize, "pk")).query)["code"][0]
    token = f"{provider.issuer}/oauth2/token"
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": params["redirect_uri"],
    }
    auth = ("direct", "secret")
    wrong = httpx.post(token, data={**form, "code_verifier": "w" * 50}, auth=auth, timeout=10)
    assert wrong.status_code == 400, wrong.text
    assert wrong.json()["error"] == "invalid_grant"
    right = httpx.post(token, data={**form, "code_verifier": verifier}, auth=auth, timeout=10)
    assert right.status_code == 200, right.text
    assert "id_token" in right.json()


def test_a_provider_that_cannot_be_reached_is_a_502_page(start_shell: StartShell) -> None:
    down = {
        "id": "down",
        "issuer": "http://127.0.0.1:9",
        "clientId": "c",
        "clientSecret": "s",
        "displayName": "Down",
    }
    shell = start_shell(oidc_providers=[down])
    with shell.anonymous() as browser:
        refused(browser.get("/auth/oidc/down/login"), 502, "could not be reached")
        refused(browser.get("/auth/oidc/down/callback?code=c&state=s"), 400, "start it again")


def test_identities_are_admin_only_and_one_user_each(
    oidc_shell: RunningShell, provider: MockProvider
) -> None:
    member = oidc_shell.add_user("gus")
    oidc_shell.add_user("hal")
    link = {"issuer": provider.issuer, "subject": "g"}
    with oidc_shell.client(member) as client:
        assert client.post("/api/users/gus/identities", json=link).status_code == 403
        assert client.get("/api/users/gus/identities").status_code == 403
    with oidc_shell.client() as admin:
        assert admin.post("/api/users/gus/identities", json=link).status_code == 201
        taken = admin.post("/api/users/hal/identities", json=link)
        assert taken.status_code == 409
        assert taken.json()["error"]["code"] == "identity_linked"
        assert admin.post("/api/users/nobody/identities", json=link).status_code == 404
        assert admin.post("/api/users/gus/identities", json={"issuer": "x"}).status_code == 400
        gone = admin.delete("/api/users/hal/identities", params=link)
        assert gone.status_code == 404
        assert admin.delete("/api/users/gus/identities", params=link).status_code == 200
        assert admin.get("/api/users/gus/identities").json() == []
    with oidc_shell.anonymous() as browser:
        refused(sign_in(browser, "mock", "g"), 403, "an admin must add you")


def test_a_bad_provider_list_stops_serve_without_printing_secrets(home: Path) -> None:
    bad = [
        {"id": "a", "issuer": "https://a.example", "clientId": "c", "displayName": "A"},
        {"id": "b", "issuer": "https://b.example", "clientId": "c", "clientSecret": "s3cr3t-value"},
    ]
    lines = serve_refused(home, ATRIUM_OIDC_PROVIDERS=json.dumps(bad))
    assert [line.split(":", 2)[1].strip() for line in lines] == [
        "ATRIUM_OIDC_PROVIDERS at 0.clientSecret",
        "ATRIUM_OIDC_PROVIDERS at 1.displayName",
    ]
    assert not any("s3cr3t" in line for line in lines)
    (line,) = serve_refused(home, ATRIUM_OIDC_PROVIDERS='[{"clientSecret": "s3cr3t')
    assert "ATRIUM_OIDC_PROVIDERS: not valid JSON" in line
    assert "s3cr3t" not in line


def test_a_discovery_document_of_another_issuer_is_refused(
    start_shell: StartShell, provider: MockProvider
) -> None:
    """The issuer configured must be the one the provider's discovery document names (here a
    trailing slash apart): tokens are checked against that document's issuer."""
    shell = start_shell(
        oidc_providers=[{**provider.config("slash"), "issuer": provider.issuer + "/"}]
    )
    with shell.anonymous() as browser:
        refused(browser.get("/auth/oidc/slash/login"), 502, "names another issuer")
