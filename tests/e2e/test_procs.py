"""The Processes panel in a real browser, on a desktop and a phone: apps by name with the id in
small print, states in words, memory and CPU columns, Stop and End asked first (cancelling keeps
the instance), and no word broken in the middle at the narrowest width."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from tests.e2e.conftest import ARTIFACTS, Served, axe_serious
from tests.e2e.test_detail import go_home
from tests.e2e.test_host_page import api, app_frame

pytestmark = pytest.mark.e2e

#: cells styled to break inside words (what broke ids mid-word before)
BREAK_STYLES = """() => [...document.querySelectorAll('#procs th, #procs td, #procs td *')]
  .filter((e) => { const s = getComputedStyle(e);
                   return s.wordBreak === 'break-all' || s.overflowWrap === 'anywhere'; })
  .map((e) => e.className || e.tagName)"""
#: the pieces of text between spaces, dots, hyphens and tildes that the layout put on two lines
BROKEN_WORDS = """() => {
  const broken = [];
  for (const cell of document.querySelectorAll('#procs th, #procs td')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(/[^\\s.~\\-\u200b]+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].filter((r) => r.width > 0)
          .map((r) => Math.round(r.top)));
        if (lines.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
}"""


def launch(page: Page, app_id: str) -> str:
    """Open the app from the home; its instance id."""
    go_home(page)
    page.click(f'button.app[data-app-id="{app_id}"]')
    app_frame(page, app_id)
    instance = page.locator(f'iframe[data-app-id="{app_id}"]').first.get_attribute(
        "data-instance-id"
    )
    assert instance
    return instance


def open_procs(page: Page) -> None:
    target = page.locator("#open-procs")
    if not target.is_visible() and page.locator("#open-menu").is_visible():
        page.click("#open-menu")  # a phone: the header's actions are in the Menu sheet
    target.click()
    page.locator("#procs").wait_for(state="visible")


def test_processes_show_names_words_and_ask_before_ending(page: Page, served: Served) -> None:
    size = "phone" if page.viewport_size and page.viewport_size["width"] < 700 else "desktop"
    instance = launch(page, "com.atrium.viewer")
    open_procs(page)
    row = page.locator(f'#proc-rows tr[data-instance-id="{instance}"]')
    row.wait_for()
    assert row.locator("td.app-cell strong").inner_text() == "Viewer"  # the name, not the id
    small = row.locator("td.app-cell .id")
    assert small.inner_text().replace("\u200b", "") == instance
    assert small.get_attribute("title") == instance
    row.locator("td.state", has_text="running").wait_for()  # "running", not "resumed"
    assert "resumed" not in row.locator("td.state").inner_text()
    memory = row.locator("td.usage .memory").inner_text()
    assert memory == "—" or memory[0].isdigit(), memory
    # once the shell has figures: what it holds beside its limit (the default, 1024 MiB)
    row.locator("td.usage .memory", has_text="of 1024\u00a0MiB").wait_for()
    held = row.locator("td.usage .memory").inner_text()
    assert held[0].isdigit(), held
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"procs-{size}.png"))
    assert axe_serious(page) == [], "the processes panel"

    # End asks first, in words; cancelling keeps the instance running
    row.get_by_role("button", name="End Viewer").click()
    page.locator("#confirm").wait_for(state="visible")
    words = page.locator("#confirm-text").inner_text()
    assert "killed at once" in words
    assert "Its data stays" in words
    assert page.locator('#confirm button[value="yes"]').inner_text() == "End it"
    page.screenshot(path=str(ARTIFACTS / f"procs-{size}-confirm.png"))
    page.click('#confirm button[value="no"]')
    page.wait_for_timeout(300)  # nothing happens: there is nothing to wait for
    with api(served) as client:
        assert client.get(f"/api/instances/{instance}").json()["state"] == "resumed"
    assert row.is_visible()

    # Stop asks too; yes stops it and the row says so in words
    row.get_by_role("button", name="Stop Viewer").click()
    assert "with its data kept" in page.locator("#confirm-text").inner_text()
    page.click('#confirm button[value="yes"]')
    row.locator("td.state", has_text="stopped").wait_for()

    # End, confirmed, ends it: the row goes
    row.get_by_role("button", name="End Viewer").click()
    page.click('#confirm button[value="yes"]')
    row.wait_for(state="detached")
    with api(served) as client:
        assert client.get(f"/api/instances/{instance}").status_code == 404


@pytest.fixture
def narrow(browser: Browser, served: Served) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 360, "height": 740})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{served.url}/login?token={served.token}")
    page.wait_for_selector("body[data-ready=true]")
    yield page
    context.close()


def test_no_word_in_the_processes_panel_breaks_in_the_middle_at_360_px(
    narrow: Page, served: Served
) -> None:
    page = narrow
    launched = [launch(page, app) for app in ("test.icon.nofont", "test.theme.override")]
    open_procs(page)
    for instance in launched:
        page.locator(f'#proc-rows tr[data-instance-id="{instance}"]').wait_for()
    page.wait_for_timeout(200)
    assert page.evaluate(BREAK_STYLES) == [], "a style that breaks words"
    assert page.evaluate(BROKEN_WORDS) == [], "words split over two lines"
    overflow = page.evaluate(
        """() => [...document.querySelectorAll('#procs td, #procs th')]
             .filter((c) => c.scrollWidth > c.clientWidth + 1).map((c) => c.textContent)"""
    )
    assert overflow == [], "cells whose text runs out of them"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "procs-narrow.png"))
    with api(served) as client:
        for instance in launched:
            client.delete(f"/api/instances/{instance}")


def test_a_button_pressed_while_the_table_redraws_still_acts(page: Page, served: Served) -> None:
    """An instance event redraws the table at any moment; one that lands between the press and
    the release of a button must not swallow the click (it did: the row was replaced under the
    pointer, and the release landed on a new button)."""
    instance = launch(page, "com.atrium.viewer")
    open_procs(page)
    button = page.locator(f'#proc-rows tr[data-instance-id="{instance}"] button:text-is("Share")')
    box = button.bounding_box()
    assert box
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.evaluate("window.atrium.refreshProcs()")  # what every lifecycle event does
    page.mouse.up()
    page.locator("#share[open]").wait_for(timeout=5_000)
    page.click("#share-close")
    with api(served) as client:
        client.delete(f"/api/instances/{instance}")
