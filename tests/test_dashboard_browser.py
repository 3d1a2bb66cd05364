"""End to end in a real browser: `vigil dashboard` on a loopback port over seeded data, Debian's
chromium driven headless by Playwright (no browser download), every page polled until its
charts have rendered, no Streamlit exception anywhere, a screenshot of each page saved.

Screenshots go to ``tests/artifacts/dashboard/<page>.png`` (``VIGIL_TEST_ARTIFACTS`` overrides
the folder). A fresh Streamlit server needs a few seconds: everything is polled, never slept.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.browser import FLAGS, PAGES, RENDER_TIMEOUT_MS, REPO, artifacts, check_pages, chromium
from support.dashboard_seed import AT, seed_dashboard
from support.loopback import free_port

START_TIMEOUT_S = 60.0






@contextlib.contextmanager
def running_dashboard(config: Path, log: Path) -> Iterator[str]:
    """`vigil dashboard` pinned at ``AT`` on a free loopback port; yields its URL once it
    answers its health check; always stopped (its whole process group)."""
    import httpx

    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vigil_shell.cli", "dashboard", "--config", str(config),
             "--listen", f"127.0.0.1:{port}", "--at", repr(AT)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"vigil dashboard exited: {log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/_stcore/health", timeout=2, trust_env=False).text == "ok":
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"no answer after {START_TIMEOUT_S:.0f}s: "
                                     f"{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()




@pytest.mark.slow
def test_every_page_renders_in_chromium(tmp_path: Path) -> None:
    browser_path = chromium()
    config = seed_dashboard(tmp_path / "data", gateway=True)
    shots = artifacts()
    with running_dashboard(config, tmp_path / "dashboard.log") as url:
        check_pages(url, shots, tmp_path / "chromium-profile", browser_path=browser_path)
    # The folder is shared with the demo's browser test: every page's screenshot is there.
    assert {p.name for p in shots.glob("*.png")} >= {
        f"{t.lower()}.png" for t, _, _ in PAGES.values()}


@pytest.mark.slow
def test_controls_live_in_the_url(tmp_path: Path) -> None:
    """A link carries the view: the range and pool in the URL select them, and changing a
    control writes it back into the URL."""
    from playwright.sync_api import sync_playwright

    browser_path = chromium()
    config = seed_dashboard(tmp_path / "data")
    with running_dashboard(config, tmp_path / "dashboard.log") as url, sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=browser_path, headless=True,
            args=FLAGS, viewport={"width": 1440, "height": 1000})
        try:
            page = browser.new_page()
            page.goto(f"{url}/?pool=batch&range=1h")
            page.wait_for_selector(".st-key-pool-batch", timeout=RENDER_TIMEOUT_MS)
            assert page.locator(".st-key-pool-chat").count() == 0
            caption = page.locator("[data-testid='stMain'] [data-testid='stCaptionContainer']")
            assert "range 1h" in caption.first.inner_text()
            # Pick another range in the sidebar: the URL follows.
            page.locator("[data-testid='stSidebar'] [data-testid='stSelectbox']").first.click()
            page.get_by_role("option", name="24h").click()
            page.wait_for_function("() => location.search.includes('range=24h')",
                                   timeout=RENDER_TIMEOUT_MS)
            assert "pool=batch" in page.url
        finally:
            browser.close()
