"""Cached access to the SLO engine for the pages: the config, the source, the status, series.

* The config and the ``Source`` (``slo.sources.open.open_source``: the embedded store read-only, or
  Prometheus when ``[engine] prometheus_url`` is set) are resources (``st.cache_resource``),
  shared by every session and keyed by the config file's path and modification time, so an
  edited config is picked up. A store that does not exist yet is not cached: it is looked for
  again on the next run.
* The status (``slo.status.evaluate``) and every chart point are data. A chart's times are
  the multiples of its step (``dashboard.timeseries.chart_times``), so a refresh computes
  only the new points. A point older than ``SETTLED_SCRAPES`` scrape intervals can no longer
  change and is kept for an hour; a recent one (its last samples may still be arriving) for a
  few seconds (``st.cache_data``).
* A chart's settled points are computed together: those not cached yet are evaluated on a
  source that answers each query at all of them from one range read
  (``slo.sources.on_grid``), with the same point functions and the same numbers, so the
  first look at a range reads each series once instead of once per point.
* Live "now" is the clock rounded down to the scrape interval: within one interval the data
  cannot differ, so clicks and refreshes reuse the cache.

The gateway's records (``dashboard.gateway_data.open_request_log``) are opened per query
(``GatewayRecords`` opens a connection per read; nothing is shared between threads).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from dashboard import alerts_view, gateway_data, status_view, timeseries
from dashboard.controls import View
from slo.backtest.sli import sli_tracks
from slo.objectives.anomaly import pool_anomalies
from slo.objectives.burn_rate import burn_rate
from slo.objectives.spec import SloSpec, effective_slos
from slo.promql.tracks import Grid
from slo.sources.on_grid import OnGrid, grid_of
from slo.sources.open import open_source
from slo.sources.protocol import RangeSource, RequestLog, Source
from slo.status import evaluate
from vigil.clock import Clock, system_clock
from vigil.config import Config, PoolConfig, load_config
from vigil.conventions import DASHBOARD_ENV_AT, DASHBOARD_ENV_CONFIG
from vigil.errors import ConfigError, StoreError, VigilError

__all__ = [
    "CONTEXT_KEY",
    "SETTLED_SCRAPES",
    "Context",
    "Env",
    "clear_settled_points",
    "config_path",
    "context",
    "empty_states",
    "env",
    "file_mtime_ns",
    "firing_alerts",
    "first_sample",
    "live_now",
    "load",
    "now",
    "pinned_at_from_env",
    "point",
    "series",
    "status",
]

#: Where app.py leaves the page context for the views (session state key).
CONTEXT_KEY = "vigil.context"
#: A chart point this many scrape intervals old is final (its samples have all arrived).
SETTLED_SCRAPES = 2
#: How long a settled point or status stays cached (seconds); a recent one (seconds).
SETTLED_TTL_S = 3600.0
RECENT_TTL_S = 10.0


def config_path() -> str | None:
    """The config file `vigil dashboard` passed (``VIGIL_CONFIG``), read at run time."""
    return os.environ.get(DASHBOARD_ENV_CONFIG) or None


def pinned_at_from_env() -> float | None:
    """A pinned "now" from ``VIGIL_DASHBOARD_AT`` (`vigil dashboard --at`; tests, benchmarks).
    ``ConfigError`` when it is not a number."""
    text = os.environ.get(DASHBOARD_ENV_AT, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{DASHBOARD_ENV_AT}={text!r} is not Unix seconds") from None
    if not math.isfinite(value):
        raise ConfigError(f"{DASHBOARD_ENV_AT}={text!r} is not Unix seconds")
    return value


def file_mtime_ns(path: str) -> int:
    """The file's modification time (ns), 0 when it cannot be read: a cache key that changes
    when the file does."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0  # load_config then says "file not found"


@st.cache_resource(show_spinner=False)
def _config(path: str, mtime_ns: int) -> Config:
    return load_config(path)


def load(path: str) -> tuple[Config, tuple[str, int]]:
    """The config at ``path`` (``ConfigError`` if invalid) and its cache key."""
    key = (str(Path(path).resolve()), file_mtime_ns(path))
    return _config(*key), key


@dataclass(frozen=True)
class Context:
    """What every page needs: the config, its cache key, the user's ``View`` and the pinned
    time (``None`` = live)."""

    config: Config
    key: tuple[str, int]
    view: View
    pinned_at: float | None

    @property
    def path(self) -> str:
        """The config file (absolute)."""
        return self.key[0]


def context() -> Context:
    """The context app.py set for this run (a view cannot run without the entry point)."""
    ctx = st.session_state.get(CONTEXT_KEY)
    if not isinstance(ctx, Context):
        raise RuntimeError("dashboard pages run through dashboard/app.py (vigil dashboard)")
    return ctx


def live_now(config: Config, clock: Clock = system_clock) -> float:
    """"Now" as the dashboard shows it: the clock rounded down to the scrape interval (the
    data cannot change within one, so reruns within it reuse the cache)."""
    quantum = max(1.0, config.collector.scrape_interval)
    return math.floor(clock() / quantum) * quantum


def now(ctx: Context, clock: Clock = system_clock) -> float:
    """The end of the view (Unix seconds): the pinned end, or ``live_now``."""
    return ctx.view.end_s if ctx.view.end_s is not None else live_now(ctx.config, clock)


class _SourceHandle:
    """An open ``Source`` and what closes it (kept open while it is cached)."""

    def __init__(self, config: Config, path: str):
        self._stack = contextlib.ExitStack()
        self.source: Source = self._stack.enter_context(open_source(config, path))

    def close(self) -> None:
        """Close the store connection or the HTTP client."""
        self._stack.close()


# A few configs at most (an edited config is a new entry); an evicted source is closed.
@st.cache_resource(show_spinner=False, max_entries=4, on_release=_SourceHandle.close)
def _source(path: str, mtime_ns: int) -> _SourceHandle:
    return _SourceHandle(_config(path, mtime_ns), path)


@dataclass(frozen=True)
class Env:
    """The engine's inputs for one query: config, source and the gateway's records."""

    config: Config
    source: Source
    log: RequestLog | None

    def spec(self, name: str) -> SloSpec:
        """The effective SLO called ``name``."""
        for s in effective_slos(self.config):
            if s.name == name:
                return s
        raise KeyError(name)


def env(key: tuple[str, int]) -> Env:
    """Config, source and request log for the config ``key``."""
    config = _config(*key)
    return Env(config, _source(*key).source, gateway_data.open_request_log(config))


def _status(key: tuple[str, int], at_s: float) -> dict[str, Any]:
    e = env(key)
    return evaluate(e.config, e.source, at_s, request_log=e.log)


_status_settled = st.cache_data(ttl=SETTLED_TTL_S, max_entries=64, show_spinner=False)(_status)
_status_recent = st.cache_data(ttl=RECENT_TTL_S, max_entries=16, show_spinner=False)(_status)


def _settled(ctx: Context, t: float, clock: Clock) -> bool:
    """True when no sample can still arrive for time ``t`` (pinned in the past, or old)."""
    return t <= clock() - SETTLED_SCRAPES * ctx.config.collector.scrape_interval


def status(ctx: Context, at_s: float, clock: Clock = system_clock) -> dict[str, Any]:
    """``slo.status.evaluate`` at ``at_s`` with the gateway's records when they exist."""
    fn = _status_settled if _settled(ctx, at_s, clock) else _status_recent
    return fn(ctx.key, at_s)


# --- chart points --------------------------------------------------------------------------------
def _anomalies(e: Env, t: float, pool: str, window_s: float) -> list[dict[str, Any]]:
    """The histogram estimate (no request log) of one window."""
    return pool_anomalies(e.source, e.config, e.config.pool(pool), t, window_s=window_s)


def _exact_anomalies(e: Env, t: float, pool: str, window_s: float) -> dict[str, Any] | None:
    """With the gateway's records: how many the window holds, and its anomalous requests
    joined with their records (only these rows are kept, not the window's records)."""
    if e.log is None:
        return None
    records = list(e.log.records(pool, t, window_s))
    found = pool_anomalies(e.source, e.config, e.config.pool(pool), t, window_s=window_s,
                           request_log=e.log) if records else []
    return {"records": len(records), "rows": gateway_data.anomaly_rows(found, records)}


def _pool(e: Env, name: str) -> PoolConfig | str:
    """The configured pool called ``name`` (its series chosen by its selector where the source
    is a Prometheus), or the bare name for a pool the config no longer has."""
    try:
        return e.config.pool(name)
    except KeyError:
        return name


#: kind -> the engine evaluation of one point: ``fn(env, t, *args)``. Pools travel as names
#: (cache keys) and are resolved to their configuration here.
_POINTS: dict[str, Callable[..., Any]] = {
    "quantile": lambda e, t, pool, w, metric: timeseries.quantile_point(
        e.source, _pool(e, pool), t, w, metric),
    "mean": lambda e, t, pool, w, metric: timeseries.mean_point(e.source, _pool(e, pool), t, w,
                                                                metric),
    "finished": lambda e, t, pool, w, model: timeseries.finished_point(
        e.source, _pool(e, pool), t, w, model),
    "burn": lambda e, t, slo, w: timeseries.burn_point(e.spec(slo), e.source, t, w, e.log),
    "kv": lambda e, t, pool: timeseries.kv_point(e.source, e.config.pool(pool), t),
    "queue": lambda e, t, pool: timeseries.queue_point(e.source, e.config.pool(pool), t),
    "sm": lambda e, t, pool: timeseries.sm_point(e.source, _pool(e, pool), t),
    "ratio": lambda e, t, pool, w, num, den: timeseries.counter_ratio_point(
        e.source, _pool(e, pool), t, w, num, den),
    "rate": lambda e, t, pool, w, metric: timeseries.counter_rate_point(
        e.source, _pool(e, pool), t, w, metric),
    "distribution": lambda e, t, pool, w, metric: timeseries.histogram_distribution(
        e.source, _pool(e, pool), t, w, metric),
    "cost": lambda e, t, pool, w: timeseries.cost_point(e.source, e.config,
                                                        e.config.pool(pool), t, w),
    "anomalies": _anomalies,
    "exact_anomalies": _exact_anomalies,
    "tier": lambda e, t, pool, w: (None if e.log is None else timeseries.cost_point(
        e.source, e.config, e.config.pool(pool), t, w, e.log)["by_tier"] or {}),
    "savings": lambda e, t, pool, w: (None if e.log is None
                                      else gateway_data.savings_point(e.log, pool, t, w)),
    "error_classes": lambda e, t, pool, w, model: (
        None if e.log is None else gateway_data.error_class_point(e.log, pool, t, w, model)),
    "targets": lambda e, t: status_view.target_states(e.config, e.source, t),
    "first_sample": lambda e, t, range_s: timeseries.first_sample(e.source, t, range_s),
}


def _burn_range(e: Env, grid: Grid, slo: str, w: float) -> list[dict[str, float | None]]:
    """``burn_point`` at every instant of ``grid``: ``slo.backtest.sli.sli_tracks``, the
    engine's ``error_ratio`` at each instant from range queries of only the series it reads
    (a latency SLO: the buckets around its threshold, not the whole histogram)."""
    spec = e.spec(slo)
    track = sli_tracks(spec, e.source, grid, [w], request_log=e.log)[w]
    ratios = [float(v) if there else None
              for v, there in zip(track.values.tolist(), track.present.tolist(), strict=True)]
    return [{"error_ratio": r, "burn_rate": burn_rate(r, spec.objective)} for r in ratios]


#: kind -> the evaluation of every instant of a ``Grid`` at once, where the engine has one
#: (``fn(env, grid, *args)``, a value per instant, each the point function's there).
_RANGES: dict[str, Callable[..., list[Any]]] = {"burn": _burn_range}


def _point(key: tuple[str, int], kind: str, args: tuple[Any, ...], t: float) -> Any:
    return _POINTS[kind](env(key), t, *args)


_point_settled = st.cache_data(ttl=SETTLED_TTL_S, max_entries=50_000,
                               show_spinner=False)(_point)
_point_recent = st.cache_data(ttl=RECENT_TTL_S, max_entries=2_000, show_spinner=False)(_point)


def point(ctx: Context, kind: str, t: float, *args: Any, clock: Clock = system_clock) -> Any:
    """One engine evaluation of ``kind`` (a key of ``_POINTS``) at ``t``, cached."""
    fn = _point_settled if _settled(ctx, t, clock) else _point_recent
    return fn(ctx.key, kind, tuple(args), t)


class _SettledPoints:
    """Settled chart points of every session, by ``(config key, kind, args, t)``, each kept
    ``ttl_s`` seconds, the ``max_entries`` most recently used.

    Written here rather than with ``st.cache_data``: a series computes its missing points
    in one batch (``slo.sources.on_grid``), so it must first know which of its points are
    cached, which a ``st.cache_data`` function cannot tell without computing the others one
    by one. Values are only read to build a series, which ``st.cache_data`` then copies."""

    def __init__(self, max_entries: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: OrderedDict[Any, tuple[float, Any]] = OrderedDict()
        self._max = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[Any]) -> dict[Any, Any]:
        """The cached values of ``keys`` that are present and fresh."""
        now = self._clock()
        out: dict[Any, Any] = {}
        with self._lock:
            for k in keys:
                hit = self._entries.get(k)
                if hit is None:
                    continue
                if now - hit[0] > self._ttl_s:
                    del self._entries[k]
                    continue
                self._entries.move_to_end(k)
                out[k] = hit[1]
        return out

    def clear(self) -> None:
        """Forget every point."""
        with self._lock:
            self._entries.clear()

    def put(self, key: Any, value: Any) -> None:
        """Keep ``value`` for ``key``, dropping the least recently used beyond the bound."""
        with self._lock:
            self._entries[key] = (self._clock(), value)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)


_SETTLED_POINTS = _SettledPoints(max_entries=50_000, ttl_s=SETTLED_TTL_S)


def clear_settled_points() -> None:
    """Forget every settled chart point (``st.cache_data.clear()`` does not reach them)."""
    _SETTLED_POINTS.clear()


def _settled_series(key: tuple[str, int], kind: str, args: tuple[Any, ...],
                    times: tuple[float, ...]) -> list[tuple[float, Any]]:
    """The settled points at ``times``: those cached, and the others computed together, on a
    source that answers them from one range read per query where they lie on a grid (the
    first look at a range reads each series once, not once per point)."""
    keys = [(key, kind, args, t) for t in times]
    found = _SETTLED_POINTS.get_many(keys)
    missing = [t for t, k in zip(times, keys, strict=True) if k not in found]
    if missing:
        e = env(key)
        source = e.source
        grid = grid_of(missing)
        if grid is not None and isinstance(source, RangeSource):
            if kind in _RANGES:
                wanted = set(keys)
                instants = grid.instants_ms().tolist()
                for at_ms, value in zip(instants, _RANGES[kind](e, grid, *args), strict=True):
                    k = (key, kind, args, at_ms / 1000.0)
                    _SETTLED_POINTS.put(k, value)
                    if k in wanted:
                        found[k] = value
            source = OnGrid(source, grid)
        batch = Env(e.config, source, e.log)
        for t in missing:
            k = (key, kind, args, t)
            if k not in found:
                found[k] = _POINTS[kind](batch, t, *args)
                _SETTLED_POINTS.put(k, found[k])
    return [(t, found[k]) for t, k in zip(times, keys, strict=True)]


# One lookup for a whole settled series: a point lookup costs ~0.4 ms (hashing, copying), so a
# page of a thousand points would spend half a second on cache hits alone.
_series_settled = st.cache_data(ttl=SETTLED_TTL_S, max_entries=2_000,
                                show_spinner=False)(_settled_series)


def series(ctx: Context, kind: str, times: Sequence[float], *args: Any,
           clock: Clock = system_clock) -> list[tuple[float, Any]]:
    """``point`` at each of ``times``: ``[(t, value)]``. The settled times are looked up as one
    cached series (their points cached one by one underneath, so a series that gained a
    point reuses the others); the recent ones point by point."""
    settled = tuple(t for t in times if _settled(ctx, t, clock))
    out = _series_settled(ctx.key, kind, tuple(args), settled) if settled else []
    return [*out, *((t, point(ctx, kind, t, *args, clock=clock))
                    for t in times[len(settled):])]


def first_sample(key: tuple[str, int], end_s: float, range_s: float,
                 clock: Clock = system_clock) -> float | None:
    """``timeseries.first_sample`` of the config ``key``'s source (Unix seconds; ``None``:
    data older than ``range_s``, none at all, or no store yet, which the pages then tell),
    cached like a chart point. The controls call it before a ``Context`` exists."""
    config = _config(*key)
    settled = end_s <= clock() - SETTLED_SCRAPES * config.collector.scrape_interval
    fn = _point_settled if settled else _point_recent
    try:
        return fn(key, "first_sample", (range_s,), end_s)
    except VigilError:
        return None


def firing_alerts(ctx: Context, at_s: float, clock: Clock = system_clock
                  ) -> tuple[list[dict[str, Any]], str]:
    """The firing alerts and where they come from (``alerts_view.FROM_SERVE`` or
    ``FROM_CONDITIONS``): `vigil serve`'s when the view is live and it runs here, else the
    conditions evaluated over the status at ``at_s``."""
    if ctx.view.live:
        served = alerts_view.served_alerts(ctx.config.outbox_path(), clock())
        if served is not None:
            return served, alerts_view.FROM_SERVE
    e = env(ctx.key)
    rows = alerts_view.evaluated_alerts(e.config, status(ctx, at_s, clock), e.source, at_s)
    return rows, alerts_view.FROM_CONDITIONS


# --- empty states --------------------------------------------------------------------------------
@contextlib.contextmanager
def empty_states(ctx: Context) -> Iterator[None]:
    """Turn the engine's expected failures into a message that says what to do, never a stack
    trace: no store yet (start the collector), Prometheus unreachable, any other VigilError."""
    try:
        yield
    except StoreError as exc:
        if "no store at" in str(exc):
            st.info(f"**No data yet.** There is no store at `{ctx.config.store_path()}` yet: "
                    f"start `vigil serve --config {ctx.path}` (it scrapes the targets into "
                    "the store), or point `[engine] prometheus_url` at a Prometheus that "
                    "scrapes them.", icon=":material/hourglass_empty:")
        else:
            st.error(f"The store cannot be read: {exc}", icon=":material/error:")
    except VigilError as exc:
        st.error(f"{exc}", icon=":material/error:")
