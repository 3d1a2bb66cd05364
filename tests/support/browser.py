"""The dashboard in headless Chromium: the browser binary, where screenshots go, and a check
that every page renders without an exception or an error box."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from conftest import require_binary

REPO = Path(__file__).resolve().parents[2]


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
    # The first SLO's alerts replayed over the range: its burn-rate timeline.
    "backtest": ("Backtest", "[data-testid='stVegaLiteChart'] canvas, "
                             "[data-testid='stVegaLiteChart'] svg", 1),
}


RENDER_TIMEOUT_MS = 90_000


def chromium() -> str:
    """Debian's chromium, or end the test (``conftest.require_binary``'s policy)."""
    return require_binary("chromium", also=("chromium-browser",))


def artifacts() -> Path:
    folder = Path(os.environ.get("VIGIL_TEST_ARTIFACTS", REPO / "tests" / "artifacts")) / (
        "dashboard")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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
