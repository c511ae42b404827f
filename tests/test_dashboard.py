"""The dashboard at /ui in a real headless Chromium (Debian's, driven by Playwright), against
the real server on loopback with the bundled demo data: a context's composition drawn against
its budget, the candidates with their reasons, the store's counts, search, and a memory's
record; then, over a store that lived a week and a compaction (tests/storyline.py), the
store's health over time and memories' histories, checked against ctxwarden.store.history.
The screenshots are checked (the plots' colours are on them) and kept for the docs.

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

import storyline
from ctxwarden import Engine
from ctxwarden.server.auth import KeyAuth, issue_key
from ctxwarden.server.http import ServerConfig, create_app
from ctxwarden.store import history
from ctxwarden.store.sqlite import SQLiteStore
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
    # a resource the page asks for and does not get (the favicon, once) is a console error
    tab.on("console", lambda message: message.type == "error" and errors.append(message.text))
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
    # How retrieval was sized for this context, from the report.
    sized = tab.inner_text("#context-retrieval")
    assert sized.startswith("retrieval sized: related_tokens ")
    assert "rrf_k " in sized
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
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(f"{base}/ui/?view=memory")
    tab.fill("#memory-form input[name=id]", "d001")
    tab.click("#memory-form button[type=submit]")
    tab.wait_for_selector("#memory dl")
    tab.fill("#memory-form input[name=id]", "no-such-memory")
    tab.click("#memory-form button[type=submit]")
    tab.wait_for_selector("#error:not([hidden])")
    assert tab.inner_text("#error").startswith("404: no memory with id 'no-such-memory'")
    # the error is the page's answer: no earlier record under it, nothing thrown uncaught
    assert tab.locator("#memory dl").count() == 0
    assert tab.is_hidden("#memory-history")
    assert errors == []


@pytest.fixture
def story(tmp_path: Path) -> Iterator[tuple[Any, str, Engine]]:
    """The dashboard over a store that has lived a week and a compaction (tests/storyline.py)."""
    sync_playwright = _require_browser()
    engine, _clock = storyline.tell(tmp_path / "story.db")
    with engine, serve(create_app(engine)) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield browser.new_page(viewport={"width": 1200, "height": 800}), base, engine
        finally:
            browser.close()


def test_the_store_health_over_time_and_a_memory_history(
    story: tuple[Any, str, Engine],
) -> None:
    tab, base, engine = story
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    requests: list[str] = []
    tab.on("request", lambda request: requests.append(request.url))
    health = history.health(engine.store, engine.config.tenant)

    tab.goto(f"{base}/ui/?view=health")
    tab.wait_for_selector("#health-memories polyline")
    summary = tab.inner_text("#health-summary")
    compactions = health["compactions"]
    assert compactions  # the story compacts
    saved = sum(c["tokens_saved"] for c in compactions)
    assert saved > 0
    assert f"{health['memories']['now']} memories now" in summary
    assert f"{len(compactions)} compactions" in summary
    assert f"saved {saved} tokens" in summary
    # one point per bucket on the memories line; one bar per (bucket, layer) with folds
    points = tab.get_attribute("#health-memories polyline", "points") or ""
    assert len(points.split()) == health["buckets"]
    bars = sum(1 for series in health["folds"].values() for value in series if value)
    assert tab.locator("#health-folds rect[height]:not([width='10'])").count() == bars
    channels = len(health["tokens"]["by_channel"])
    assert channels >= 2
    assert tab.locator("#health-heat text.axis").count() == len(health["heat"]["by_channel"]) + 1
    assert tab.locator("#compactions tbody tr").count() == len(compactions)
    hottest = tab.locator("#hottest tbody tr a").all_inner_texts()
    assert hottest == [m["id"] for m in health["hottest"]]
    # the plots are on the screenshot in their colours
    memories = _colours(tab.locator("#health-memories").screenshot())
    assert (0x3D, 0x5A, 0xFE) in memories  # memories kept
    assert (0xE8, 0xA2, 0x9C) in memories  # retired by the compaction
    assert (0xF2, 0x9D, 0x00) in _colours(tab.locator("#health-folds").screenshot())  # exact
    tokens = _colours(tab.locator("#health-tokens").screenshot())
    assert {(0x3D, 0x5A, 0xFE), (0x00, 0xA3, 0x81)} <= tokens  # two channels at least
    _save(tab.screenshot(full_page=True), "dashboard-health.png")

    # A compacted memory's history: the summary it went into, its sources and its tombstone.
    retired_id = compactions[-1]["summary_id"]
    tab.locator("#compactions tbody tr a", has_text=retired_id).click()
    tab.wait_for_selector("#memory-history:not([hidden]) #history-events tbody tr")
    record = history.memory_history(engine.store, engine.config.tenant, retired_id)
    events = tab.locator("#history-events tbody tr").count()
    assert events == len(record["events"])
    assert "sources retired" in tab.inner_text("#history-summary")
    source = record["sources"][0]["id"]
    tab.locator("#history-events tbody a", has_text=source).first.click()
    tab.wait_for_selector(f"#history-summary:has-text('retired into {retired_id}')")
    text = tab.inner_text("#history-summary")
    assert f"{source} (retired into {retired_id})" in text
    assert "tombstone" in text
    assert "0 earlier versions" in text
    timeline = _colours(tab.locator("#history-timeline").screenshot())
    assert (0xB3, 0x26, 0x1E) in timeline  # the tombstone on the timeline
    assert (0x3D, 0x5A, 0xFE) in timeline  # created
    _save(tab.screenshot(full_page=True), "dashboard-retired.png")

    # A memory still in use: the contexts that included it.
    pinned = "d000"
    tab.fill("#memory-form input[name=id]", pinned)
    tab.click("#memory-form button[type=submit]")
    tab.wait_for_selector(f"#history-summary:has-text('{pinned}:')")
    used = history.memory_history(engine.store, engine.config.tenant, pinned)["inclusions"]
    assert used
    assert f"{len(used)} contexts included it" in tab.inner_text("#history-summary")
    assert (0x00, 0xA3, 0x81) in _colours(tab.locator("#history-timeline").screenshot())
    _save(tab.screenshot(full_page=True), "dashboard-history.png")

    assert errors == []
    assert all(url.startswith(base) for url in requests), requests


@pytest.fixture
def edited(tmp_path: Path) -> Iterator[tuple[Any, str, dict[str, str]]]:
    """Two tenants behind API keys, each with a note ``n1``: tenant ``a`` edited theirs twice
    and has a keyed fact superseded twice (f1 -> f2 -> f3); ``b``'s note was never edited."""
    sync_playwright = _require_browser()
    clock = storyline.Clock(10 * storyline.DAY)
    with Engine.open(tmp_path / "edits.db", clock=clock) as engine:
        day = storyline.DAY
        for tenant, text in (("a", "standup on Tuesday at 10 in room 4"), ("b", "b's own note")):
            note = {"id": "n1", "session": "s", "content": text, "created_at": day}
            engine.ingest([note], tenant=tenant)
        clock.now = 11 * day
        engine.update("n1", "standup on Wednesday at 10 in room 4", tenant="a")
        clock.now = 12 * day
        engine.update("n1", "standup on Wednesday at 9:30 in room 7", tenant="a")
        for id_, at, value in (("f1", 2, "Monday"), ("f2", 3, "Friday"), ("f3", 4, "Sunday")):
            fact = {"id": id_, "session": "s", "kind": "fact", "key": "deploy window",
                    "content": f"the deploy window is {value}", "created_at": at * day}  # fmt: skip
            engine.ingest([fact], tenant="a")
        assert isinstance(engine.store, SQLiteStore)
        keys = {t: issue_key(engine.store, tenant=t, scopes={"read"}) for t in ("a", "b")}
        server = ServerConfig(authenticate=KeyAuth(engine.store))
        with serve(create_app(engine, server)) as base, sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
            )
            try:
                yield browser.new_page(viewport={"width": 1200, "height": 900}), base, keys
            finally:
                browser.close()


def _open_memory(tab: Any, id_: str) -> None:
    tab.fill("#memory-form input[name=id]", id_)
    tab.click("#memory-form button[type=submit]")
    tab.wait_for_selector(f"#history-summary:has-text('{id_}:')")


def test_a_memory_history_shows_its_versions_and_supersession(
    edited: tuple[Any, str, dict[str, str]], tmp_path: Path
) -> None:
    tab, base, keys = edited
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(f"{base}/ui/?view=memory")
    tab.fill("#key", keys["a"])
    tab.dispatch_event("#key", "change")

    # The edits: each old text with when it was in force and a word diff against what replaced it.
    _open_memory(tab, "n1")
    assert "2 earlier versions" in tab.inner_text("#history-summary")
    versions = tab.locator("#history-versions li")
    assert versions.count() == 2
    first, second = versions.nth(0), versions.nth(1)
    assert "version 1: in force from 1970-01-02" in first.inner_text()
    assert "replaced 1970-01-12" in first.inner_text()
    assert first.locator("del").all_inner_texts() == ["Tuesday"]
    assert first.locator("ins").all_inner_texts() == ["Wednesday"]
    assert second.locator("del").all_inner_texts() == ["10", "4"]
    assert second.locator("ins").all_inner_texts() == ["9:30", "7"]
    assert tab.is_visible("#history-links-none")
    edits = tab.locator("#history-events tbody td:nth-child(2)", has_text="edited")
    assert edits.count() == 2
    diff = _colours(tab.locator("#history-versions").screenshot())
    assert (0xFB, 0xE1, 0xDF) in diff  # removed words
    assert (0xD9, 0xF2, 0xE4) in diff  # added words
    assert (0xAB, 0x47, 0xBC) in _colours(tab.locator("#history-timeline").screenshot())  # edited
    shot = tab.screenshot(full_page=True)
    (tmp_path / "dashboard-versions.png").write_bytes(shot)
    _save(shot, "dashboard-versions.png")

    # The links: clickable ids that open the other memory's history.
    _open_memory(tab, "f2")
    links = tab.locator("#history-links li")
    assert links.count() == 2
    assert links.nth(0).inner_text().startswith("superseded by f3, in force until 1970-01-05")
    assert "(same key 'deploy window')" in links.nth(0).inner_text()
    assert links.nth(1).inner_text().startswith("supersedes f1 (created 1970-01-03")
    assert tab.is_hidden("#history-versions-none") is False
    shot = tab.screenshot(full_page=True)
    (tmp_path / "dashboard-supersession.png").write_bytes(shot)
    _save(shot, "dashboard-supersession.png")
    links.nth(1).locator("a", has_text="f1").click()
    tab.wait_for_selector("#history-summary:has-text('f1:')")
    assert "superseded by f2" in tab.inner_text("#history-summary")
    assert tab.locator("#history-links li").all_inner_texts()[0].startswith("superseded by f2")
    assert "the deploy window is Monday" in tab.inner_text("#memory dl")

    # Tenant b's key: its own n1, no versions, and none of a's texts or facts.
    tab.fill("#key", keys["b"])
    tab.dispatch_event("#key", "change")
    _open_memory(tab, "n1")
    assert "0 earlier versions" in tab.inner_text("#history-summary")
    assert tab.locator("#history-versions li").count() == 0
    page = tab.inner_text("main")
    assert "b's own note" in page
    assert "standup" not in page
    tab.fill("#memory-form input[name=id]", "f2")
    tab.click("#memory-form button[type=submit]")
    tab.wait_for_selector("#error:not([hidden])")
    assert tab.inner_text("#error").startswith("404: no memory with id 'f2'")
    assert errors == []
