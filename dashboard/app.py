"""The Streamlit entry point (``vigil dashboard`` runs ``streamlit run dashboard/app.py``).

It reads the config (``VIGIL_CONFIG``), asks for a login when one is configured, draws the
controls (kept in the URL) and routes to the pages with ``st.navigation``. The pages live in
``views/``, not ``pages/``: Streamlit takes a ``pages/`` folder beside the entry point for its
older multipage layout (``AppTest`` then reruns a page's file alone, without this script).
"""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from dashboard import data
from dashboard.auth import require_login
from dashboard.controls import parse_at, render_controls
from vigil.conventions import (
    PAGE_ANOMALIES,
    PAGE_BACKTEST,
    PAGE_BUSINESS,
    PAGE_PLAN,
    PAGE_QUALITY,
    PAGE_SERVER,
    QP_AT,
)
from vigil.errors import ConfigError

VIEWS = Path(__file__).resolve().parent / "views"

# No page_icon and no page icons: Streamlit turns a Material icon into a favicon fetched from
# fonts.gstatic.com, and the dashboard keeps the browser on its own server.
st.set_page_config(page_title="Vigil", layout="wide")


def _pinned_at() -> tuple[float | None, bool]:
    """The pinned "now": the URL's ``at`` first, then ``VIGIL_DASHBOARD_AT``; and whether the
    URL set it (only that one can be cleared from the page)."""
    text = st.query_params.get(QP_AT)
    if text:
        try:
            return parse_at(text), True
        except ValueError as exc:
            st.sidebar.warning(f"{exc}; showing now.")
    return data.pinned_at_from_env(), False


def main() -> None:
    path = data.config_path()
    if path is None:
        st.error("No configuration: start the dashboard with `vigil dashboard --config FILE`.")
        st.stop()
    try:
        config, key = data.load(path)
        pinned, by_url = _pinned_at()
    except ConfigError as exc:
        st.error(f"The configuration cannot be used: {exc}")
        st.stop()
    if not require_login(config, os.environ):
        st.stop()
    # "Now" as the pages show it, so that "Pin this moment" pins what is on screen.
    view = render_controls(config, now_s=data.live_now(config), pinned_at=pinned,
                           pinned_by_url=by_url,
                           first_sample=lambda end, span: data.first_sample(key, end, span))
    st.session_state[data.CONTEXT_KEY] = data.Context(config=config, key=key, view=view,
                                                      pinned_at=pinned)
    pages = [
        # The default page is served at "/" (Streamlit ignores its url_path).
        st.Page(VIEWS / "overview.py", title="Overview", default=True),
        st.Page(VIEWS / "quality.py", title="Quality", url_path=PAGE_QUALITY),
        st.Page(VIEWS / "server.py", title="Server", url_path=PAGE_SERVER),
        st.Page(VIEWS / "business.py", title="Business", url_path=PAGE_BUSINESS),
        st.Page(VIEWS / "anomalies.py", title="Anomalies", url_path=PAGE_ANOMALIES),
        st.Page(VIEWS / "plan.py", title="Plan", url_path=PAGE_PLAN),
        st.Page(VIEWS / "backtest.py", title="Backtest", url_path=PAGE_BACKTEST),
    ]
    st.navigation(pages, position="top").run()


main()
