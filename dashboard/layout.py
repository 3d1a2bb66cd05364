"""Small pieces every page draws the same way: the page header, a chart or its empty note,
the fragment that refreshes a page, and the list of pools the filters leave."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import format as fmt
from dashboard.data import Context
from vigil.config import PoolConfig
from vigil.conventions import ENDPOINT_ALL

__all__ = ["chart", "header", "live_fragment", "pools"]


def header(ctx: Context, title: str | None, at_s: float, extra: str = "") -> None:
    """The page title (unless ``None``: drawn already) and one line saying which instant and
    range the page shows, and when the range was fitted to a young store's data, that."""
    if title is not None:
        st.title(title)
    v = ctx.view
    mode = (f"live, refreshing every {fmt.duration(v.refresh_s)}" if v.live and v.refresh_s
            else "live" if v.live else "pinned")
    parts = [f"**{fmt.timestamp(at_s)}** ({mode})",
             f"range {fmt.duration(v.range_s)}"]
    if v.data_start_s is not None and at_s - v.data_start_s < v.range_s:
        parts.append(f"showing the {fmt.span(at_s - v.data_start_s)} of data the store has")
    if v.pools:
        parts.append("pools " + ", ".join(v.pools))
    if v.models:
        parts.append("models " + ", ".join(v.models))
    if v.endpoint != ENDPOINT_ALL:
        parts.append(f"endpoint {v.endpoint}")
    if extra:
        parts.append(extra)
    st.caption(" · ".join(parts))


def chart(spec: alt.TopLevelMixin | None, data: pd.DataFrame | None, empty: str) -> None:
    """``st.altair_chart(spec)`` when ``data`` has rows, else a short note saying what is
    missing (an empty chart reads as "everything is 0")."""
    if spec is None or data is None or data.empty:
        st.caption(f":material/info: {empty}")
        return
    st.altair_chart(spec, width="stretch")


def pools(ctx: Context) -> list[PoolConfig]:
    """The configured pools the filters keep, in config order."""
    return [p for p in ctx.config.pools if not ctx.view.pools or p.name in ctx.view.pools]


def live_fragment(ctx: Context, body: Callable[[], Any]) -> None:
    """Run ``body`` in a fragment that reruns every ``refresh`` seconds in live views (only
    the page's content refreshes, not the controls)."""
    every = ctx.view.refresh_s if ctx.view.live and ctx.view.refresh_s > 0 else None
    st.fragment(body, run_every=every)()
