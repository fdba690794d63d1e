"""Sign-in through an OpenID Connect provider in Chromium: `atrium serve` and a local
oidc-provider-mock that checks PKCE (tests/oidc_mock.py), the browser going from the shell to the
provider's form and back. The shell is opened at 127.0.0.1 and the provider at localhost, so the
return from the provider is a cross-site navigation, as with a real provider."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from playwright.sync_api import Browser, Page, Request, Route

from atrium.identity import SESSION_COOKIE
from tests.conftest import REPO_DIR
from tests.e2e.conftest import ARTIFACTS, Served, serve_on
from tests.oidc_mock import MOCK_WARNINGS, MockProvider, mock_provider

pytestmark = [pytest.mark.e2e, MOCK_WARNINGS]


@pytest.fixture(scope="module")
def provider() -> Iterator[MockProvider]:
    with mock_provider() as running:
        yield running


@pytest.fixture(scope="module")
def oidc_served(
    tmp_path_factory: pytest.TempPathFactory, provider: MockProvider
) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("oidc")
    with serve_on(
        root,
        clean_log=True,
        ATRIUM_SYSTEM_APPS=str(REPO_DIR / "apps"),
        ATRIUM_OIDC_PROVIDERS=provider.env(provider.config("mock")),
    ) as served:
        # the shell at 127.0.0.1, the provider at localhost: the return is cross-site
        yield replace(served, url=served.url.replace("localhost", "127.0.0.1"))


@pytest.fixture
def fresh(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A browser context with no cookies."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"))
    context.close()


def admin(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.url, timeout=30, headers={"Authorization": f"Bearer {served.token}"}
    )


def at_provider(page: Page, served: Served, sub: str) -> None:
    """Start the sign-in at the shell and sign in at the provider's form as ``sub``."""
    page.goto(f"{served.url}/auth/oidc/mock/login")
    page.fill("input[name=sub]", sub)
    page.click("button:has-text('Authorize')")


def test_a_linked_identity_signs_in_in_the_browser(
    fresh: Page, oidc_served: Served, provider: MockProvider
) -> None:
    with admin(oidc_served) as client:
        client.post("/api/users", json={"id": "bob", "name": "Bob"}).raise_for_status()
        client.post(
            "/api/users/bob/identities", json={"issuer": provider.issuer, "subject": "bob-sub"}
        ).raise_for_status()
    at_provider(fresh, oidc_served, "bob-sub")
    fresh.wait_for_url(f"{oidc_served.url}/")
    who = fresh.evaluate("fetch('/api/me').then((r) => r.json())")
    assert who == {"id": "bob", "name": "Bob", "role": "member"}
    cookies = {c["name"]: c for c in fresh.context.cookies()}
    assert cookies[SESSION_COOKIE]["httpOnly"]
    assert cookies[SESSION_COOKIE]["sameSite"] == "Strict"
    assert "atrium_oidc" not in cookies  # the sign-in in progress is over
    sessions = fresh.evaluate("fetch('/api/sessions').then((r) => r.json())")
    assert [s["kind"] for s in sessions] == ["oidc"]


def test_the_sign_in_page_has_a_button_per_provider(
    fresh: Page, oidc_served: Served, provider: MockProvider
) -> None:
    with admin(oidc_served) as client:
        client.post("/api/users", json={"id": "carol", "name": "Carol"}).raise_for_status()
        client.post(
            "/api/users/carol/identities", json={"issuer": provider.issuer, "subject": "carol-sub"}
        ).raise_for_status()
    fresh.goto(f"{oidc_served.url}/")
    fresh.wait_for_selector("body[data-signin=true]")
    fresh.click("a:has-text('Sign in with Mock mock')")
    fresh.fill("input[name=sub]", "carol-sub")
    fresh.click("button:has-text('Authorize')")
    fresh.wait_for_selector("body[data-ready=true]")
    assert fresh.text_content("#open-account") == "Carol"


def test_an_unknown_subject_sees_the_refusal_page(fresh: Page, oidc_served: Served) -> None:
    answers: list[int] = []
    fresh.on("response", lambda r: answers.append(r.status) if "/callback" in r.url else None)
    at_provider(fresh, oidc_served, "nobody-here")
    fresh.wait_for_selector("#reason")
    assert "an admin must add you" in fresh.inner_text("#reason")
    assert answers == [403]
    names = {c["name"] for c in fresh.context.cookies()}
    assert SESSION_COOKIE not in names


def test_a_tampered_state_is_refused_in_the_browser(
    fresh: Page, oidc_served: Served, provider: MockProvider
) -> None:
    with admin(oidc_served) as client:
        client.post("/api/users", json={"id": "tess"}).raise_for_status()
        client.post(
            "/api/users/tess/identities", json={"issuer": provider.issuer, "subject": "tess-sub"}
        ).raise_for_status()

    def tamper(route: Route, request: Request) -> None:
        """The provider's answer sends the browser back with a state that is not the one sent."""
        if request.method != "POST":
            route.continue_()
            return
        answer = route.fetch(max_redirects=0)
        headers = {
            **answer.headers,
            "location": answer.headers["location"].replace("state=", "state=x"),
        }
        route.fulfill(response=answer, headers=headers)

    fresh.route("**/oauth2/authorize*", tamper)
    at_provider(fresh, oidc_served, "tess-sub")
    fresh.wait_for_selector("#reason")
    assert "start it again" in fresh.inner_text("#reason")
    assert SESSION_COOKIE not in {c["name"] for c in fresh.context.cookies()}


def test_denying_at_the_provider_is_a_page(fresh: Page, oidc_served: Served) -> None:
    fresh.goto(f"{oidc_served.url}/auth/oidc/mock/login")
    fresh.click("button:has-text('Deny')")
    fresh.wait_for_selector("#reason")
    assert "access_denied" in fresh.inner_text("#reason")
