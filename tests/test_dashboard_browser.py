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
from urllib.parse import urlsplit

import pytest
from conftest import require_binary
from helpers import free_port
from test_dashboard_seed import AT, seed_dashboard

REPO = Path(__file__).resolve().parent.parent
#: Headless Chromium in a container (often as root): no sandbox, no GPU, no background traffic.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: page path -> (title, CSS selector that must appear, how many of it at least).
PAGES = {
    "": ("Overview", ".st-key-slo-chat-error-rate [data-testid='stMetric']", 1),
    "quality": ("Quality", "[data-testid='stVegaLiteChart'] canvas, "
                           "[data-testid='stVegaLiteChart'] svg", 8),
    "server": ("Server", "[data-testid='stVegaLiteChart'] canvas, "
                         "[data-testid='stVegaLiteChart'] svg", 15),
    "business": ("Business", "[data-testid='stVegaLiteChart'] canvas, "
                             "[data-testid='stVegaLiteChart'] svg", 6),
    "anomalies": ("Anomalies", "[data-testid='stVegaLiteChart'] canvas, "
                               "[data-testid='stVegaLiteChart'] svg", 1),
    # Today beside the cheapest candidate (the simulator's estimate of the test fleet's pool): the
    # replicas-over-the-day curves and the waste chart.
    "plan": ("Plan", "[data-testid='stVegaLiteChart'] canvas, "
                     "[data-testid='stVegaLiteChart'] svg", 2),
}
START_TIMEOUT_S = 60.0
RENDER_TIMEOUT_MS = 90_000


def chromium() -> str:
    """Debian's chromium, or end the test (``conftest.require_binary``'s policy)."""
    return require_binary("chromium", also=("chromium-browser",))


def artifacts() -> Path:
    folder = Path(os.environ.get("VIGIL_TEST_ARTIFACTS", REPO / "tests" / "artifacts")) / (
        "dashboard")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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


def check_pages(url: str, shots: Path, profile: Path, prefix: str = "",
                pages: dict[str, tuple[str, str, int]] = PAGES,
                browser_path: str | None = None) -> None:
    """Open every page of the dashboard at ``url`` in headless chromium, wait until its charts
    have rendered (polling, never sleeping), fail on a Streamlit exception, a browser error
    or a request to another host, and save a full-page screenshot of each in ``shots``
    (``browser_path``: the chromium to drive, found by ``chromium()`` when not given)."""
    from playwright.sync_api import sync_playwright

    executable = browser_path or chromium()

    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(profile), executable_path=executable, headless=True,
            args=FLAGS, viewport={"width": 1440, "height": 1000})
        try:
            page = browser.new_page()
            errors: list[str] = []
            outside: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # A chart that fails to draw logs a JavaScript error and leaves an empty frame.
            page.on("console", lambda m: errors.append(m.text) if m.type == "error"
                    and not m.text.startswith("Failed to load resource") else None)
            # The dashboard must not make the browser fetch anything from elsewhere.
            page.on("request", lambda r: outside.append(r.url) if r.url.startswith("http")
                    and urlsplit(r.url).hostname not in ("127.0.0.1", "localhost") else None)
            for path, (title, selector, count) in pages.items():
                page.set_viewport_size({"width": 1440, "height": 1000})
                page.goto(f"{url}/{path}")
                page.wait_for_function(
                    "([sel, n]) => document.querySelectorAll(sel).length >= n",
                    arg=[selector, count], timeout=RENDER_TIMEOUT_MS)
                # The script has finished when Streamlit's "running" indicator is gone.
                page.wait_for_function(
                    "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
                    timeout=RENDER_TIMEOUT_MS)
                assert page.locator("h1").first.inner_text() == title
                exceptions = page.locator("[data-testid='stException']")
                assert exceptions.count() == 0, exceptions.first.inner_text()
                # The whole page in one picture: Streamlit scrolls inside its main block.
                height = page.evaluate(
                    "() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
                page.set_viewport_size({"width": 1440, "height": int(height) + 40})
                page.wait_for_function(
                    "([sel, n]) => document.querySelectorAll(sel).length >= n",
                    arg=[selector, count], timeout=RENDER_TIMEOUT_MS)
                page.screenshot(path=str(shots / f"{prefix}{title.lower()}.png"),
                                full_page=True)
            assert not errors, errors
            assert not outside, outside
        finally:
            browser.close()


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
