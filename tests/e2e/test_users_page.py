"""The host page with several users, in Chromium: the sign-in page a browser without a session
gets, the account menu (sign out, personal tokens, sign-ins), the admin Users panel, and sharing
an instance (the Share dialog and "Shared with me")."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.e2e.conftest import ARTIFACTS, OFF_SCREEN, VIEWPORTS, Served, axe_serious, tap

pytestmark = pytest.mark.e2e

PASSWORD = "correct horse battery"  # a test account's password
_ids = count()


def make_user(served: Served, prefix: str, role: str = "member", name: str | None = None) -> str:
    """A user with ``PASSWORD``, added through the API with the bootstrap admin's token."""
    user_id = f"{prefix}{next(_ids)}"
    answer = httpx.post(
        f"{served.url}/api/users",
        headers={"Authorization": f"Bearer {served.token}"},
        json={"id": user_id, "name": name or user_id.title(), "role": role, "password": PASSWORD},
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    return user_id


@pytest.fixture(params=list(VIEWPORTS))
def fresh(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A browser context with no cookies, on a desktop and on a phone; what it leaves on
    screen fits it."""
    width, height = VIEWPORTS[request.param]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"))
    found = page.evaluate(OFF_SCREEN)
    context.close()
    assert found["scroll"] <= found["width"], f"the page scrolls sideways: {found}"
    assert found["out"] == [], f"controls outside the viewport: {found['out']}"


def sign_in(page: Page, served: Served, user: str, password: str = PASSWORD) -> None:
    page.goto(f"{served.url}/")
    page.wait_for_selector("body[data-signin=true]")
    page.fill("#signin-user", user)
    page.fill("#signin-password", password)
    page.click("#signin-go")


def test_without_a_session_the_page_is_a_sign_in_form(fresh: Page, served: Served) -> None:
    user = make_user(served, "ada", name="Ada Lovelace")
    fresh.goto(f"{served.url}/")
    fresh.wait_for_selector("body[data-signin=true]")
    assert fresh.is_visible("#signin-form")
    assert not fresh.is_visible("header.bar")
    assert fresh.evaluate("document.activeElement.id") == "signin-user"
    assert axe_serious(fresh) == []

    sign_in(fresh, served, user, "not the password")
    fresh.wait_for_selector("#signin-result:has-text('Wrong user or password')")
    assert fresh.input_value("#signin-password") == ""

    sign_in(fresh, served, user)
    fresh.wait_for_selector("body[data-ready=true]")
    assert fresh.text_content("#open-account") == "Ada Lovelace"
    assert not fresh.is_visible("#open-users"), "a member sees no Users panel"
    tap(fresh, "#open-account")
    fresh.wait_for_selector("#session-rows li:has-text('(this one)')")
    assert "Ada Lovelace" in (fresh.text_content("#account-who") or "")
    assert axe_serious(fresh) == []

    fresh.click("#signout")
    fresh.wait_for_selector("body[data-signin=true]")
    assert not fresh.is_visible("header.bar")


def test_an_admin_adds_a_user_in_the_panel_who_then_signs_in(
    page: Page, served: Served, browser: Browser
) -> None:
    tap(page, "#open-users")
    page.wait_for_selector(f"#user-rows tr[data-user-id='{served_admin(served)}']")
    assert axe_serious(page) == []
    user_id = f"grace{next(_ids)}"
    page.fill("#user-id", user_id)
    page.fill("#user-name", "Grace Hopper")
    page.fill("#user-password", PASSWORD)
    page.click("#user-form button[type=submit]")
    page.wait_for_selector(f"#user-rows tr[data-user-id='{user_id}']")

    other = browser.new_context().new_page()
    try:
        sign_in(other, served, user_id)
        other.wait_for_selector("body[data-ready=true]")
        assert other.text_content("#open-account") == "Grace Hopper"
        assert not other.is_visible("#open-users")
    finally:
        other.context.close()

    # disable, then she cannot sign in; the last admin cannot be disabled
    page.click(f"button[aria-label='Disable {user_id}']")
    page.wait_for_selector(f"#user-rows tr[data-user-id='{user_id}'] td:has-text('disabled')")
    page.click(f"button[aria-label='Disable {served_admin(served)}']")
    page.wait_for_selector("#users-result:not(:empty)")
    assert "admin" in (page.text_content("#users-result") or "")


def served_admin(served: Served) -> str:
    me = httpx.get(
        f"{served.url}/api/me", headers={"Authorization": f"Bearer {served.token}"}, timeout=30
    )
    user_id: str = me.json()["id"]
    return user_id


def test_a_personal_token_is_shown_once_and_revoked(page: Page, served: Served) -> None:
    tap(page, "#open-account")
    page.fill("#token-name", "laptop cli")
    page.fill("#token-days", "30")
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#token-new:not([hidden])")
    secret = page.input_value("#token-secret")
    assert axe_serious(page) == []
    me = httpx.get(f"{served.url}/api/me", headers={"Authorization": f"Bearer {secret}"})
    assert me.status_code == 200
    page.click("button[aria-label='Revoke token laptop cli']")
    page.wait_for_selector("#token-rows li:has-text('laptop cli')", state="detached")
    me = httpx.get(f"{served.url}/api/me", headers={"Authorization": f"Bearer {secret}"})
    assert me.status_code == 401


def test_a_shared_instance_appears_under_shared_with_me(
    page: Page, served: Served, browser: Browser
) -> None:
    grantee = make_user(served, "lin", name="Lin")
    page.evaluate("window.atrium.launch('test.sdk.echo')")
    page.wait_for_selector("iframe[data-app-id='test.sdk.echo']")
    instance_id = page.get_attribute("iframe[data-app-id='test.sdk.echo']", "data-instance-id")
    page.evaluate("window.atrium.refreshProcs()")
    tap(page, "#open-procs")
    page.click(f"#proc-rows tr[data-instance-id='{instance_id}'] button:text-is('Share')")
    page.wait_for_selector("#share[open]")
    page.fill("#share-user", grantee)
    page.select_option("#share-role", "viewer")
    page.click("#share-go")
    page.wait_for_selector(f"#grant-rows li:has-text('{'Lin'} · viewer')")
    assert axe_serious(page) == []
    page.click("#share-close")

    other = browser.new_context().new_page()
    try:
        sign_in(other, served, grantee)
        other.wait_for_selector("body[data-ready=true]")
        other.wait_for_selector("#shared-title:not([hidden])")
        other.click(f"#shared button:has-text('{served_admin(served)}')")
        other.wait_for_selector(f"iframe[data-instance-id='{instance_id}']")

        # the owner revokes: the grantee's tab closes, the page says why, the list empties
        page.click(f"#proc-rows tr[data-instance-id='{instance_id}'] button:text-is('Share')")
        page.click(f"button[aria-label='Stop sharing with {grantee}']")
        page.wait_for_selector("#grant-rows li", state="detached")
        other.wait_for_selector(f"iframe[data-instance-id='{instance_id}']", state="detached")
        other.wait_for_selector(".toast:has-text('stopped sharing')")
        other.wait_for_selector("#shared-title", state="hidden")
        page.click("#share-close")
    finally:
        other.context.close()


def test_too_many_wrong_passwords_ask_to_wait(fresh: Page, served: Served) -> None:
    user = make_user(served, "eve")
    for _ in range(5):
        sign_in(fresh, served, user, "wrong password")
        fresh.wait_for_selector("#signin-result:has-text('Wrong user or password')")
    sign_in(fresh, served, user)
    fresh.wait_for_selector("#signin-result:has-text('Too many attempts')")
    assert fresh.is_visible("#signin-form")
