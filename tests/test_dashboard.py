"""The dashboard at /ui in a real headless Chromium (Debian's, driven by Playwright), against
the real server on loopback with the bundled demo data: a context's composition drawn against
its budget, the candidates with their reasons, the store's counts, search, and a memory's
record. The screenshots are checked (the bar's colours are on them) and kept for the docs.

Skips when Chromium or Playwright is missing, unless CTXWARDEN_REQUIRE_BROWSER=1 (CI).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from ctxwarden import Engine
from ctxwarden.server.http import create_app
from serving import serve

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _require_browser() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if CHROMIUM is None or sync_playwright is None:
        if os.environ.get("CTXWARDEN_REQUIRE_BROWSER") == "1":
            pytest.fail("CTXWARDEN_REQUIRE_BROWSER=1 but chromium or playwright is missing")
        pytest.skip("needs Debian's chromium and the playwright package")
    return sync_playwright


@pytest.fixture
def page(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    sync_playwright = _require_browser()
    sample = resources.files("ctxwarden").joinpath("data/demo.jsonl").read_text(encoding="utf-8")
    records = [json.loads(line) for line in sample.splitlines() if line.strip()]
    with (
        Engine.open(tmp_path / "demo.db") as engine,
        serve(create_app(engine)) as base,
        sync_playwright() as playwright,
    ):
        engine.ingest(records)
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 800})
            yield tab, base
        finally:
            browser.close()


def _colours(png: bytes) -> set[tuple[int, int, int]]:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        rgb = image.convert("RGB")
        return {color for _count, color in rgb.getcolors(maxcolors=rgb.width * rgb.height)}


def _save(png: bytes, name: str) -> None:
    # CTXWARDEN_SCREENSHOTS=docs/img keeps them for the docs page: what it shows is what the
    # test saw
    folder = os.environ.get("CTXWARDEN_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_bytes(png)


def test_the_dashboard_in_headless_chromium(page: tuple[Any, str]) -> None:
    tab, base = page
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    requests: list[str] = []
    tab.on("request", lambda request: requests.append(request.url))

    # A context's composition: a stacked bar of blocks against the budget.
    tab.goto(f"{base}/ui/")
    tab.fill("input[name=session]", "team")
    tab.fill("input[name=query]", "When is the standup now, and who owns the release checklist?")
    tab.fill("input[name=budget]", "450")
    tab.click("#context-form button[type=submit]")
    tab.wait_for_selector("#candidates tbody tr")
    summary = tab.inner_text("#context-summary")
    used = int(summary.split(" of ")[0])
    assert 0 < used <= 450
    assert "of 450 tokens" in summary
    bars = tab.locator("#context-bar rect").count()
    legend = tab.locator("#context-legend span").count()
    assert bars == legend >= 3  # fixed parts and blocks, one rect each
    reasons = tab.locator("#candidates tbody td:nth-child(3)").all_inner_texts()
    assert "in" in reasons
    bar = tab.locator("#context-bar").screenshot()
    colours = _colours(bar)
    assert (0x3D, 0x5A, 0xFE) in colours  # the first block's colour
    assert (0xB3, 0x26, 0x1E) in colours  # the budget line
    _save(tab.screenshot(full_page=True), "dashboard-context.png")

    # The store's health: counts per channel and the top folded families.
    tab.click("nav button[data-view=store]")
    tab.wait_for_selector("#store-chart rect")
    assert "memories from" in tab.inner_text("#store-summary")
    assert tab.locator("#store-chart rect").count() >= 1
    _save(tab.screenshot(full_page=True), "dashboard-store.png")

    # Search, then a memory's record.
    tab.click("nav button[data-view=search]")
    tab.fill("#search-form input[name=query]", "standup")
    tab.select_option("#search-form select[name=scope]", "tenant")
    tab.click("#search-form button[type=submit]")
    tab.wait_for_selector("#hits tbody tr")
    first = tab.locator("#hits tbody tr a").first
    memory_id = first.inner_text()
    first.click()
    tab.wait_for_selector("#memory dl")
    record = tab.inner_text("#memory dl")
    assert memory_id in record
    assert "standup" in record.lower()
    _save(tab.screenshot(full_page=True), "dashboard-memory.png")

    assert errors == []
    # everything the page loaded came from the server itself: no CDN
    assert all(url.startswith(base) for url in requests), requests


def test_the_dashboard_shows_api_errors(page: tuple[Any, str]) -> None:
    tab, base = page
    tab.goto(f"{base}/ui/?view=memory")
    tab.fill("#memory-form input[name=id]", "no-such-memory")
    tab.click("#memory-form button[type=submit]")
    tab.wait_for_selector("#error:not([hidden])")
    assert tab.inner_text("#error").startswith("404: no memory with id 'no-such-memory'")
