"""The pages in a real browser: the system's Chromium (driven by playwright, which downloads no
browser here) against the app served by uvicorn on loopback. Opens the shot list, clicks a
shot and checks that its thumbnails and contact sheets decoded and its failed frames show
their reasons."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from api.app import create_app
from bench.common import free_port
from schemas.catalog import open_catalog
from schemas.settings import Settings
from tests.api_fixtures import REASON_1007, A, fill

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The app over a filled SQLite catalog, served by uvicorn in a thread; yields its URL."""
    monkeypatch.delenv("SVFX_API_TOKEN", raising=False)
    root = tmp_path / "studio"
    root.mkdir()
    catalog = open_catalog(f"sqlite:///{tmp_path}/catalog.db")
    fill(catalog, root)
    settings = Settings(home=root / "home", allowed_roots=[str(root)])
    app = create_app(settings, engine=catalog.engine)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("uvicorn did not start", pytrace=False)
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        catalog.close()


def test_shot_page_in_chromium(served: str) -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does, as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page()
            outside: list[str] = []
            page.on(
                "request",
                lambda r: None if r.url.startswith(served) else outside.append(r.url),
            )
            page.goto(f"{served}/", wait_until="load")
            assert page.title() == "svfx catalog"
            page.click(f'a.shot[href="/shots/{A}"]')
            page.wait_for_url(f"{served}/shots/{A}")
            page.wait_for_load_state("load")
            thumbs = page.locator("img.thumb")
            assert thumbs.count() == 3 * 6  # normal, seg, pose: the 6 frames that did not fail
            # loading="lazy": bring every thumbnail into view so each one is fetched
            for i in range(thumbs.count()):
                thumbs.nth(i).scroll_into_view_if_needed()
            page.wait_for_function(
                "() => [...document.images].every(i => i.complete)", timeout=15_000
            )
            sizes = page.evaluate(
                "() => [...document.images].map(i => [i.getAttribute('src'), i.naturalWidth])"
            )
            assert len(sizes) == 3 * 6 + 2  # thumbnails and the normal and seg contact sheets
            assert all(width > 0 for _, width in sizes), sizes
            failed = page.locator("table.failed").inner_text()
            assert "1002" in failed and "<script>alert(1)</script>" in failed
            assert REASON_1007 in failed
            assert outside == []  # nothing fetched from anywhere else
        finally:
            browser.close()
