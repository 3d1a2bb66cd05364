"""The dashboard's controls: time range, pool / model / endpoint filters, refresh interval.

Every control lives in the URL's query parameters (Streamlit's ``bind="query-params"``), so a
copied link opens the same view; ``at`` (Unix seconds or ISO 8601 UTC) pins "now" to a past
instant, which makes a link to an incident stay true tomorrow. ``View`` is the result, a plain
value the pages read; the helpers above ``render_controls`` are pure and tested on their own.

A young store (minutes of data) would fill the default range with emptiness: the default range
is then fitted to the data (``fit_range``: the shortest preset that holds it) and the view
starts at the first sample (``View.data_start_s``), until the store is older than the
configured default. A range the user picked is kept as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dashboard.format import span as format_span
from vigil.config import Config
from vigil.conventions import (
    DASHBOARD_RANGE_CUSTOM,
    DASHBOARD_RANGES,
    ENDPOINT_ALL,
    ENDPOINT_CHAT,
    ENDPOINT_COMPLETIONS,
    QP_AT,
    QP_END,
    QP_ENDPOINT,
    QP_MODEL,
    QP_POOL,
    QP_RANGE,
    QP_REFRESH,
    QP_START,
)
from vigil.durations import format_duration, parse_duration

__all__ = [
    "DEFAULT_RANGE",
    "MIN_SPAN_SCRAPES",
    "REFRESH_OFF",
    "View",
    "fit_range",
    "model_options",
    "parse_at",
    "refresh_options",
    "refresh_seconds",
    "render_controls",
]

#: The range a fresh dashboard shows: enough to see a trend, short enough to load fast.
DEFAULT_RANGE = "6h"
#: A fitted view spans at least this many scrape intervals (a line, not a dot).
MIN_SPAN_SCRAPES = 8
#: Session-state key of the default range the range control was last drawn with.
_FITTED_DEFAULT = "vigil.range-default"
REFRESH_OFF = "off"
#: Refresh intervals offered besides the configured default.
_REFRESH_CHOICES = ("10s", "30s", "1m", "5m")
#: The endpoint choices (``[[slos]] endpoint``'s values).
ENDPOINTS = (ENDPOINT_ALL, ENDPOINT_CHAT, ENDPOINT_COMPLETIONS)


@dataclass(frozen=True)
class View:
    """What the user asked to see.

    ``range_s`` seconds ending at ``end_s`` (Unix seconds) when pinned, else at "now";
    ``pools`` / ``models`` (empty = all), ``endpoint`` (``"all"`` = every endpoint),
    ``refresh_s`` (0 = no auto-refresh; never while pinned: the past does not change).
    ``data_start_s``: the store's first sample (Unix seconds) when the range was fitted to a
    young store; the window then starts there rather than at ``end - range_s`` (nothing is
    stored before it), but spans at least ``min_span_s`` seconds.
    """

    range_key: str
    range_s: float
    end_s: float | None
    pools: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    endpoint: str = ENDPOINT_ALL
    refresh_s: float = 0.0
    data_start_s: float | None = None
    min_span_s: float = 0.0

    @property
    def live(self) -> bool:
        """True when the view follows "now"."""
        return self.end_s is None

    @property
    def fitted(self) -> bool:
        """True when the range was fitted to the data of a young store."""
        return self.data_start_s is not None

    def window(self, now_s: float) -> tuple[float, float]:
        """``(start, end)`` Unix seconds of the range, given the current time: from the first
        sample when the range was fitted and the store is younger than it."""
        end = now_s if self.end_s is None else self.end_s
        start = end - self.range_s
        if self.data_start_s is not None:
            start = max(start, min(self.data_start_s, end - self.min_span_s))
        return start, end


def parse_at(text: str) -> float:
    """A pinned time from the URL: Unix seconds (``1795000000``) or ISO 8601
    (``2026-11-18T11:06:40Z``; a time without a zone is UTC). ``ValueError`` names the text."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"at={text!r} is neither Unix seconds nor an ISO 8601 time "
                "(e.g. 2026-11-18T11:06:40Z)") from None
        seconds = (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"at={text!r} is not a time after 1970")
    return seconds


def fit_range(age_s: float | None, *, scrape_interval_s: float,
              default: str = DEFAULT_RANGE) -> str:
    """The default range for a store whose data reaches ``age_s`` seconds back from the
    view's end (``None``: further back than ``default``, or no data): the shortest preset of
    ``DASHBOARD_RANGES`` not shorter than that age nor than ``MIN_SPAN_SCRAPES`` scrape
    intervals, and never longer than ``default``."""
    limit = DASHBOARD_RANGES[default]
    if age_s is None or not math.isfinite(age_s) or age_s >= limit:
        return default
    need = max(age_s, MIN_SPAN_SCRAPES * scrape_interval_s)
    fits = [k for k, v in sorted(DASHBOARD_RANGES.items(), key=lambda kv: kv[1])
            if need <= v <= limit]
    return fits[0] if fits else default


def refresh_options(default_s: float) -> list[str]:
    """The refresh choices: ``off``, the usual intervals and the configured default (``[dashboard]
    refresh_interval``), shortest first."""
    choices = {REFRESH_OFF, *_REFRESH_CHOICES}
    if default_s > 0:
        choices.add(format_duration(default_s))
    return sorted(choices, key=refresh_seconds)


def refresh_seconds(choice: str) -> float:
    """Seconds of a refresh choice (``off`` = 0)."""
    return 0.0 if choice == REFRESH_OFF else parse_duration(choice)


def model_options(config: Config) -> list[str]:
    """Every model the config names (pools and SLOs), sorted."""
    return sorted({p.model for p in config.pools} | {s.model for s in config.slos if s.model})


def _naive_utc(seconds: float) -> datetime:
    # st.datetime_input works with naive datetimes; the dashboard's are UTC throughout.
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)


def _seconds(dt: datetime) -> float:
    return dt.replace(tzinfo=UTC).timestamp()


def render_controls(config: Config, *, now_s: float, pinned_at: float | None,
                    pinned_by_url: bool,
                    first_sample: Callable[[float, float], float | None] | None = None
                    ) -> View:
    """Draw the controls in the sidebar and return the ``View``. ``now_s`` is the clock's
    time, ``pinned_at`` a pinned "now" (``at`` or ``VIGIL_DASHBOARD_AT``);
    ``first_sample(end_s, range_s)`` the time of the store's first sample when it is younger
    than ``range_s`` at ``end_s``, else ``None`` (then the default range is not fitted)."""
    import streamlit as st

    sb = st.sidebar
    ranges = [*DASHBOARD_RANGES, DASHBOARD_RANGE_CUSTOM]
    scrape_s = config.collector.scrape_interval
    view_end = pinned_at if pinned_at is not None else now_s
    first = first_sample(view_end, DASHBOARD_RANGES[DEFAULT_RANGE]) if first_sample else None
    default = fit_range(None if first is None else view_end - first, scrape_interval_s=scrape_s)
    # While the control holds the default it drew last time, it follows the data as the
    # store grows (15m, then 1h, then 6h); a range the user picked stays.
    previous = st.session_state.get(_FITTED_DEFAULT)
    if previous not in (None, default) and st.session_state.get(QP_RANGE) == previous:
        st.session_state[QP_RANGE] = default
    st.session_state[_FITTED_DEFAULT] = default
    # No format_func on bound widgets: the URL holds what the option displays, and "1h" makes
    # a cleaner link than "last 1h".
    range_key = sb.selectbox(
        "Time range (the last …)", ranges, index=ranges.index(default), key=QP_RANGE,
        bind="query-params", help="How far back the charts go; the tiles show its end. "
        f"On a store younger than {DEFAULT_RANGE} the default fits its data.")
    fitted = first is not None and range_key == default
    if fitted:
        sb.caption(f"Fitted to the data: the store holds {format_span(view_end - first)}.")
    end_s = pinned_at
    if range_key == DASHBOARD_RANGE_CUSTOM:
        # Defaults on the hour, so they stay the same from one rerun to the next.
        anchor = math.ceil((pinned_at or now_s) / 3600.0) * 3600.0
        start = sb.datetime_input("From (UTC)", value=_naive_utc(anchor - 6 * 3600), key=QP_START,
                                  bind="query-params", step=timedelta(minutes=5))
        end = sb.datetime_input("To (UTC)", value=_naive_utc(anchor), key=QP_END,
                                bind="query-params", step=timedelta(minutes=5))
        start_s = _seconds(start) if start else anchor - 6 * 3600
        end_s = _seconds(end) if end else anchor
        if end_s <= start_s:
            sb.warning("“To” must be after “From”: showing the hour before “To”.")
            start_s = end_s - 3600.0
        range_s = end_s - start_s
    else:
        range_s = DASHBOARD_RANGES[range_key]

    pools = sb.multiselect("Pools", [p.name for p in config.pools], key=QP_POOL,
                           bind="query-params", placeholder="All pools")
    models = sb.multiselect("Models", model_options(config), key=QP_MODEL,
                            bind="query-params", placeholder="All models")
    endpoint = sb.selectbox(
        "Endpoint", ENDPOINTS, key=QP_ENDPOINT, bind="query-params",
        help="The SLOs of one endpoint (chat or completions; they need the gateway's "
             "records), or all of them.")
    live = end_s is None
    refresh_s = 0.0
    if live:
        choices = refresh_options(config.dashboard.refresh_interval)
        default = (format_duration(config.dashboard.refresh_interval)
                   if config.dashboard.refresh_interval > 0 else REFRESH_OFF)
        refresh = sb.selectbox("Auto-refresh every", choices, index=choices.index(default),
                               key=QP_REFRESH, bind="query-params")
        refresh_s = refresh_seconds(refresh)
        if sb.button("Pin this moment to the URL", help="Freeze “now” so that the link shows "
                     "this view later (an incident link)."):
            st.query_params[QP_AT] = f"{now_s:.0f}"
            st.rerun()
    elif pinned_at is not None and range_key != DASHBOARD_RANGE_CUSTOM:
        sb.caption(f"Pinned at {_naive_utc(pinned_at):%Y-%m-%d %H:%M:%S} UTC")
        if pinned_by_url and sb.button("Back to now"):
            del st.query_params[QP_AT]
            st.rerun()
    return View(range_key=range_key, range_s=range_s, end_s=end_s, pools=tuple(pools),
                models=tuple(models), endpoint=endpoint or ENDPOINT_ALL, refresh_s=refresh_s,
                data_start_s=first if fitted else None,
                min_span_s=MIN_SPAN_SCRAPES * scrape_s)

