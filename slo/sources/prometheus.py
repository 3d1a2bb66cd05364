"""``PrometheusSource``: the ``Source`` protocol answered by a Prometheus-compatible server.

Every method builds one PromQL expression and evaluates it on the server with an instant
query (``/api/v1/query`` through ``prometheus_api_client.PrometheusConnect.custom_query``), so
the per-series functions *and* the aggregations (``sum by``) run there, as they would in a
Grafana panel. Thanos, Mimir, Cortex and VictoriaMetrics serve the same API.

=====================  ===================================================================
method                 query
=====================  ===================================================================
``increase``           ``sum by (<by>) (increase(<m>{<matchers>}[<w>]))``
``bucket_increase``    ``sum by (<by>, le) (increase(<m>_bucket{<matchers>}[<w>]))``,
                       regrouped client-side into ``(le, count)`` lists per ``<by>`` group
``instant``            ``<m>{<matchers>}``
``avg_over_time``      ``avg_over_time(<m>{<matchers>}[<w>])``
``samples``            ``<m>{<matchers>}[<range>]`` (a matrix: raw samples)
=====================  ===================================================================

Exactness on the wire:

* **Evaluation time**: the API rounds ``time=`` to a millisecond (web/api/v1/api.go
  ``parseTime``); we send the millisecond ``slo.promql.lookup.eval_time_ms`` computes, spelled so
  that the server parses it back to exactly that millisecond (checked, not assumed), so both
  sources evaluate at the same instant.
* **Durations** are sent in milliseconds (``[300000ms]``): PromQL durations are whole
  milliseconds (``model.ParseDuration``), and ``slo.promql.lookup.duration_ms`` is the same
  truncation.
* **Values** are parsed with ``float()``: Go writes the shortest string that round-trips a
  float64 (``strconv.FormatFloat(v, 'f', -1, 64)``), and ``NaN``/``+Inf``/``-Inf``.
* **Matchers** (equality ones as a mapping, or a ``Selector`` with all four operators, as a
  pool's ``selector`` gives them) are PromQL string literals with ``\\``, ``"`` and control
  characters escaped, so any label value selects exactly itself. A metric name that is not a
  plain identifier (or is a PromQL keyword) is matched as ``{__name__="..."}``.
* **Lookback**: instant selectors look back ``--query.lookback-delta`` on the server; we also
  send ``lookback_delta`` (honoured since Prometheus 2.43, and by Thanos; 2.42 ignores it), so
  ``lookback_s`` should equal the server's flag on older servers (both default to 5m).

**VictoriaMetrics** (``dialect="metricsql"``): MetricsQL's ``increase`` neither extrapolates nor
keeps to its window, so every ``increase`` is written as PromQL's, rebuilt from MetricsQL
functions (``slo.promql.metricsql``), following ``semantics``; the ``*_over_time`` ranges gain a
millisecond for 2.42's closed left edge.

Which PromQL rules apply is the server's business: ``semantics`` does not change the queries.
It is reported in the status JSON and used for what the SLO engine computes client-side from
these answers (the ``avg`` across replicas), so set it to match the server ("2" for 2.x up to
2.42, "3" for 3.x).

How requests are sent (headers, credentials, TLS, proxy, the Thanos querier's ``dedup`` and
``partial_response``) is ``[engine.http]`` (``slo.sources.http_client``). The API's
``warnings`` (a Thanos store that did not answer, a result cut by a limit) are collected from
every answer and handed out by ``take_warnings``: a budget computed from partial data says so.

Errors (connection refused, timeouts, HTTP errors with Prometheus's own message, answers that
are not Prometheus's JSON) raise ``SourceError`` naming the URL and the query, and say what a
person can do: a refused credential names the credential sent (never its value), a missing
tenant header, an unknown certificate authority, a 429 or 503 with its ``Retry-After``, an
HTML page where JSON was expected, a query past the server's sample or series limit.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import math
import re
import threading
import warnings
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from slo.promql.lookup import Semantics, SemanticsLike, duration_ms, eval_time_ms, semantics_of
from slo.promql.metricsql import metricsql_increase
from slo.promql.quantile import Bucket
from slo.promql.tracks import Grid, Track

# One definition of the (le, count) regrouping for both sources: the same `le` parsing and
# the same skipping of a malformed `le` (histogram_quantile's rule).
from slo.sources.embedded import _le_groups, _le_track_groups
from slo.sources.http_client import (
    build_session,
    describe,
    forget_token,
    mount_tls,
    redact,
    thanos_params,
)
from slo.sources.protocol import BucketTracks, LeChoice, Matchers, Tracks
from vigil.config import HttpClientConfig
from vigil.config.base import USE_BASIC_AUTH, refuse_password
from vigil.conventions import LABEL_LE, SOURCE_PROMETHEUS, SUFFIX_BUCKET
from vigil.errors import SourceError
from vigil.model import Labels, Point, labels_of
from vigil.selectors import Selector, promql_string

__all__ = [
    "PrometheusSource",
    "SourceError",
    "format_duration_ms",
    "format_eval_time",
    "promql_string",
    "selector",
]

log = logging.getLogger("vigil.sources.prometheus")

_NAME = "__name__"
#: The most points one series of a range query may have: Prometheus refuses more
#: ("exceeded maximum resolution of 11,000 points per timeseries").
MAX_RANGE_POINTS = 11_000
#: PromQL metric names and label names (Prometheus 2.x/3.x without UTF-8 quoting).
_METRIC_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: Words the PromQL lexer reads as keywords, not as a metric name (promql/parser/lex.go:
#: ``key``, aggregators and ``ItemType`` keywords; matched case-insensitively there).
_KEYWORDS = frozenset({
    "and", "or", "unless", "atan2", "by", "without", "on", "ignoring", "group_left",
    "group_right", "bool", "offset", "start", "end", "inf", "nan", "sum", "avg", "count",
    "min", "max", "group", "stddev", "stdvar", "topk", "bottomk", "count_values", "quantile",
    "limitk", "limit_ratio", "smoothed", "anchored",
})
#: The ``error`` of Prometheus's JSON error body, as prometheus_api_client embeds it.
#: The title of an HTML page answered in place of JSON (a proxy's login or error page).
_TITLE_RE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_STATUS_RE = re.compile(r"HTTP Status Code (\d+) \((b(['\"]).*\3)\)", re.DOTALL)


# --- PromQL text -------------------------------------------------------------------------------
def _label_name(name: str) -> str:
    if not _LABEL_RE.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid Prometheus label name")
    return name


def selector(metric: str, matchers: Matchers) -> str:
    """The vector selector ``metric{k="v", ...}``: a mapping's equality matchers in sorted
    order, a ``Selector``'s matchers (``=``, ``!=``, ``=~``, ``!~``) in its order; ``""`` matches
    series without the label, as in the embedded store."""
    if isinstance(matchers, Selector):
        given = [(m.name, m.op, m.value) for m in matchers]
    else:
        given = [(k, "=", v) for k, v in sorted(matchers.items())]
    parts = [f"{_label_name(k)}{op}{promql_string(v)}" for k, op, v in given if k != _NAME]
    names = [(op, v) for k, op, v in given if k == _NAME]
    plain = names == [] or names == [("=", metric)]
    if _METRIC_RE.fullmatch(metric) and metric.lower() not in _KEYWORDS and plain:
        return f"{metric}{{{','.join(parts)}}}" if parts else metric
    # A second __name__ matcher selects nothing (or narrows by regex), as in the store;
    # PromQL allows it only inside braces.
    names_text = [f"{_NAME}={promql_string(metric)}"] + [
        f"{_NAME}{op}{promql_string(v)}" for op, v in names if (op, v) != ("=", metric)]
    return "{" + ",".join(names_text + parts) + "}"


def format_duration_ms(seconds: float) -> str:
    """A range in whole milliseconds, ``300000ms`` (``duration_ms``'s truncation). PromQL
    rejects an empty range, so less than 1 ms is a ValueError."""
    ms = duration_ms(seconds)
    if ms < 1:
        raise ValueError(f"a PromQL range must be at least 1ms, not {seconds!r} s")
    return f"{ms}ms"


def format_eval_time(at_s: float) -> str:
    """``time=`` for ``at_s`` (Unix seconds): the millisecond ``eval_time_ms(at_s)`` as a
    decimal that the API's ``parseTime`` reads back as exactly that millisecond."""
    ms = eval_time_ms(at_s)
    sign, mag = ("-", -ms) if ms < 0 else ("", ms)
    candidates = [f"{sign}{mag // 1000}.{mag % 1000:03d}", repr(ms / 1000)]
    x = ms / 1000
    for _ in range(4):
        x = math.nextafter(x, math.inf)
        candidates.append(repr(x))
    for text in candidates:
        if eval_time_ms(float(text)) == ms:
            return text
    raise ValueError(f"no decimal spelling of {ms} ms survives the API's time parsing")


def _by_clause(by: Sequence[str]) -> str:
    return f" by ({', '.join(_label_name(b) for b in by)})" if by else ""


# --- the source --------------------------------------------------------------------------------
class PrometheusSource:
    """The ``Source`` protocol over a Prometheus-compatible HTTP API at ``url``.

    ``semantics``: the PromQL rules the *server* follows (reported, and used for client-side
    means; see the module docstring); ``lookback_s``: instant-selector lookback, seconds;
    ``timeout_s``: per-request HTTP timeout, seconds (default ``http.timeout``); ``http``: how
    requests authenticate (``[engine.http]``), its relative files relative to ``base_dir``.
    Not retried: a failure is reported at once (the caller, e.g. ``vigil serve``, evaluates
    again on its next tick).
    """

    #: What ``slo.status`` reports as ``"source"``.
    kind = SOURCE_PROMETHEUS
    #: The server scraped the replicas itself: a pool's series carry its own labels
    #: (``PoolConfig.series(external=True)``), not the labels Vigil's collector adds.
    external: bool = True

    def __init__(
        self, url: str, *, semantics: SemanticsLike = "3", lookback_s: float = 300.0,
        timeout_s: float | None = None, http: HttpClientConfig | None = None,
        base_dir: Path | None = None, dialect: str = "promql",
    ) -> None:
        http = http or HttpClientConfig()
        timeout_s = http.timeout if timeout_s is None else timeout_s
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the Prometheus URL must start with http:// or https://: {url!r}")
        refuse_password(url, "the Prometheus URL", USE_BASIC_AUTH)
        if lookback_s <= 0 or not math.isfinite(lookback_s):
            raise ValueError(f"lookback_s must be a positive number of seconds, not {lookback_s!r}")
        if timeout_s <= 0 or not math.isfinite(timeout_s):
            raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
        if dialect not in ("promql", "metricsql"):
            raise ValueError(f"dialect must be 'promql' or 'metricsql', not {dialect!r}")
        self.url = url.rstrip("/")
        self.dialect = dialect
        self.semantics: Semantics = semantics_of(semantics)
        self.lookback_s = float(lookback_s)
        self.timeout_s = float(timeout_s)
        self.http = http
        self._base_dir = base_dir
        self._params = thanos_params(http)
        session = build_session(http, self.url, base_dir=base_dir)
        # prometheus_api_client keeps only an answer's `data.result`: the API's `warnings`
        # and a refused answer's headers are read here, from every response it receives.
        session.hooks["response"].append(self._observe)
        self._session = session
        # Per thread: the response a call got, and the warnings of the evaluation running on
        # that thread (the dashboard's sessions share one source).
        self._seen = threading.local()
        self._retention: float | None = None
        self._retention_known = False
        # The library's default retries 3 times with backoff on 5xx and refused
        # connections: seconds of waiting before a dead server is reported. read=False:
        # urllib3 re-raises a read timeout as such (not as "max retries exceeded").
        retry = Retry(total=0, read=False, raise_on_status=False)
        self._client = PrometheusConnect(url=self.url, session=session,
                                         timeout=self.timeout_s, retry=retry)
        mount_tls(session, http, self.url, max_retries=retry)
        if http.tls.insecure_skip_verify and self.url.startswith("https://"):
            # Said once here; urllib3 would otherwise warn at every request.
            log.warning("%s: TLS certificates are not checked ([engine.http.tls] "
                        "insecure_skip_verify): anyone on the path can read and change the "
                        "answers", self.url)

    def _observe(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        """Every answer: keep a refused one's facts for the message, collect warnings."""
        self._seen.response = response
        if response.status_code in (401, 403):
            forget_token(self._session)  # a revoked or rotated OAuth2 token: fetch another
        if response.status_code != 200:
            return
        # Prometheus writes `warnings` after `data`: parse again only when they are there.
        if b'"warnings"' in response.content or b'"infos"' in response.content:
            try:
                body = response.json()
            except ValueError:
                return
            seen = self._thread_warnings()
            for w in (body.get("warnings") or []) + (body.get("infos") or []):
                if isinstance(w, str) and w not in seen:
                    seen.append(w)

    def _thread_warnings(self) -> list[str]:
        found: list[str] | None = getattr(self._seen, "warnings", None)
        if found is None:
            found = self._seen.warnings = []
        return found

    def take_warnings(self) -> list[str]:
        """The API's warnings to this thread's queries since its last call (a partial
        answer, a truncated result), each once; cleared."""
        out = self._thread_warnings()
        self._seen.warnings = []
        return out

    def retention_s(self) -> float | None:
        """How far back the server keeps samples (seconds), from the time part of
        ``storageRetention`` in ``/api/v1/status/runtimeinfo`` (``"15d"``, ``"15d or
        10GiB"``); None when it does not say (Thanos, Mimir and VictoriaMetrics answer
        otherwise, or a size-only retention). Asked once per source: it changes only when the
        server restarts."""
        if self._retention_known:
            return self._retention
        from vigil.durations import parse_duration

        found: float | None = None
        try:
            response = self._session.get(f"{self.url}/api/v1/status/runtimeinfo",
                                         timeout=self.timeout_s)
            if response.status_code == 200:
                text = str(response.json()["data"]["storageRetention"])
                for part in text.split(" or "):
                    try:
                        found = parse_duration(part.strip())
                        break
                    except ValueError:
                        continue  # the size part ("10GiB")
        except (requests.RequestException, ValueError, KeyError, TypeError):
            found = None
        self._retention, self._retention_known = found, True
        return found

    def credential(self) -> str:
        """Which credential the requests carry, never its value (``http_client.describe``)."""
        return describe(self.http, self._base_dir)

    def server_semantics(self) -> Semantics | None:
        """The PromQL rules the server itself follows, from its major version
        (``/api/v1/status/buildinfo``): 2.x -> ``"2"``, 3.x and later -> ``"3"``. ``None``
        when it does not say (Thanos, Mimir and VictoriaMetrics may not serve the endpoint),
        and for a MetricsQL store: the version VictoriaMetrics reports there is the Prometheus
        API it imitates, not rules it follows (Vigil's expressions then follow 3.x's)."""
        if self.dialect == "metricsql":
            return None
        try:
            response = self._session.get(
                f"{self.url}/api/v1/status/buildinfo", timeout=self.timeout_s
            )
            response.raise_for_status()
            version = str(response.json()["data"]["version"])
        except (requests.RequestException, ValueError, KeyError, TypeError):
            return None
        major = version.lstrip("v").split(".", 1)[0]
        if not major.isdigit() or int(major) < 2:
            return None
        return semantics_of("2" if int(major) == 2 else "3")

    def __repr__(self) -> str:
        return (f"PrometheusSource({self.url!r}, semantics={self.semantics.value!r}, "
                f"lookback_s={self.lookback_s:g}, dialect={self.dialect!r})")

    def close(self) -> None:
        """Close the HTTP session (idempotent)."""
        self._client.close()

    def __enter__(self) -> PrometheusSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- HTTP ------------------------------------------------------------------------------
    def query(self, expr: str, at_s: float) -> list[dict[str, Any]]:
        """Evaluate ``expr`` at ``at_s`` (Unix seconds); the ``result`` list of the answer."""
        params = {
            "time": format_eval_time(at_s),
            "lookback_delta": format_duration_ms(self.lookback_s),
            **self._params,
        }
        return self._ask(expr, lambda: self._client.custom_query(expr, params=params))

    def query_range(self, expr: str, grid: Grid) -> list[dict[str, Any]]:
        """Evaluate ``expr`` at every instant of ``grid`` (``/api/v1/query_range``); the
        ``result`` matrix. A grid of more than ``MAX_RANGE_POINTS`` instants is asked in
        parts, the limit a Prometheus puts on the points of one range query's series."""
        out: dict[str, dict[str, Any]] = {}
        step = format_duration_ms(grid.step_ms / 1000)
        for first in range(0, grid.n, MAX_RANGE_POINTS):
            part = Grid(grid.start_ms + first * grid.step_ms, grid.step_ms,
                        min(MAX_RANGE_POINTS, grid.n - first))
            params = {
                "start": format_eval_time(part.start_ms / 1000),
                "end": format_eval_time(part.end_ms / 1000),
                "lookback_delta": format_duration_ms(self.lookback_s),
                **self._params,
            }
            # The library rounds its datetimes to seconds: `params` carries the exact ones.
            when = datetime.fromtimestamp(part.start_ms / 1000, tz=UTC)
            result = self._ask(expr, functools.partial(
                self._client.custom_query_range, expr, start_time=when, end_time=when,
                step=step, params=params))
            for item in result:
                try:
                    key = json.dumps(item["metric"], sort_keys=True)
                    values = item["values"]
                except (KeyError, TypeError) as exc:
                    raise SourceError(f"expected a range answer, got {str(item)[:200]!r} "
                                      f"({exc})", url=self.url, query=expr) from None
                got = out.setdefault(key, {"metric": item["metric"], "values": []})
                got["values"].extend(values)
        return list(out.values())

    def _ask(self, expr: str, call: Callable[[], Any]) -> list[dict[str, Any]]:
        """Run one API call, its failures as ``SourceError`` naming the URL and the query,
        without any secret the request carried (a proxy may echo a refused token)."""
        try:
            return self._ask_once(expr, call)
        except SourceError as exc:
            reason = redact(exc.reason, self._session)
            if reason == exc.reason:
                raise
            raise SourceError(reason, url=self.url, query=expr) from None

    def _ask_once(self, expr: str, call: Callable[[], Any]) -> list[dict[str, Any]]:
        self._seen.response = None
        try:
            if self.http.tls.insecure_skip_verify:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
                    result = call()
            else:
                result = call()
        except PrometheusApiClientException as exc:
            raise SourceError(self._refused(_http_error(str(exc))), url=self.url,
                              query=expr) from None
        except requests.exceptions.SSLError as exc:
            raise SourceError(_tls_error(_root_cause(exc)), url=self.url, query=expr) from None
        except requests.Timeout:
            raise SourceError(f"no answer within {self.timeout_s:g} s", url=self.url,
                              query=expr) from None
        except (requests.ConnectionError, urllib3.exceptions.HTTPError) as exc:
            if isinstance(_innermost(exc), TimeoutError | urllib3.exceptions.TimeoutError):
                raise SourceError(f"no answer within {self.timeout_s:g} s", url=self.url,
                                  query=expr) from None
            raise SourceError(f"cannot connect: {_root_cause(exc)}", url=self.url,
                              query=expr) from None
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            # ValueError/KeyError/TypeError: a 200 answer that is not Prometheus's JSON
            # (e.g. a web UI or proxy page at this URL).
            html = self._html_page()
            raise SourceError(html or f"not a Prometheus API answer ({type(exc).__name__}: "
                              f"{exc})", url=self.url, query=expr) from None
        if not isinstance(result, list):
            raise SourceError(f"unexpected answer {str(result)[:200]!r}", url=self.url,
                              query=expr)
        return result

    def _html_page(self) -> str:
        """The message for an HTML page answered where JSON was expected, or ""."""
        response: requests.Response | None = getattr(self._seen, "response", None)
        ctype = response.headers.get("Content-Type", "") if response is not None else ""
        if response is None or "html" not in ctype.lower():
            return ""
        title = _page_title(response)
        named = f", {title!r}" if title else ""
        if "ssl certificate" in title.lower():
            # nginx answers a missing or unknown client certificate with this page.
            return (f"HTTP {response.status_code}{named}: the server wants a client certificate "
                    "it trusts: set [engine.http.tls] cert_file and key_file")
        return (f"HTTP {response.status_code}: an HTML page ({ctype.split(';')[0]}{named}) "
                "where Prometheus's JSON API was expected: the login page of a proxy in front "
                "of it, or a URL without the API's path prefix (Mimir's /prometheus, "
                "VictoriaMetrics cluster's /select/<tenant>/prometheus)")

    def _refused(self, text: str) -> str:
        """The message of a refused answer (``text``: status and Prometheus's own error), with
        what the response's headers and body say a person should do."""
        response: requests.Response | None = getattr(self._seen, "response", None)
        if response is None or response.status_code == 200:
            return text
        status = response.status_code
        html = self._html_page()
        # vmauth answers an unknown bearer token or password with 400 ("cannot find the
        # provided auth token ..."): a refused credential as much as a 401.
        refused = status in (401, 403) or (status == 400 and "auth token" in response.text)
        if html and not refused:
            return html
        if html:
            # A proxy's error page, not Prometheus's JSON: its title is the message.
            title = _page_title(response)
            text = f"HTTP {status}" + (f" ({title})" if title else "")
        if refused:
            body = response.text.lower()
            if "org id" in body or "orgid" in body or "tenant" in body:
                return (f"{text}: no tenant, or one the server does not know: Mimir and Cortex "
                        "need the X-Scope-OrgID header ([engine.http] headers); sent "
                        f"{self.credential()}")
            asks = response.headers.get("WWW-Authenticate", "")
            asked = f"; the server asks for {asks.split(' ', 1)[0]}" if asks else ""
            if status == 400:
                text = "HTTP 400"  # vmauth's body repeats the credential it refused
            return (f"{text}: the server refused the credential (sent {self.credential()})"
                    f"{asked}; check [engine.http]")
        wait = response.headers.get("Retry-After", "").strip()
        if status in (429, 503) and wait:
            # Seconds, or an HTTP date (RFC 9110 10.2.3).
            when = f"{wait} s" if wait.isdigit() else f"until {wait}"
            return f"{text}; the server asks to wait {when} before asking again (Retry-After)"
        return text + _limit_hint(text)

    def _tracks(self, expr: str, grid: Grid) -> dict[Labels, Track]:
        """A range answer as tracks over ``grid``, keyed by labels without ``__name__``."""
        out: dict[Labels, Track] = {}
        for item in self.query_range(expr, grid):
            values = np.full(grid.n, np.nan)
            present = np.zeros(grid.n, dtype=np.bool_)
            try:
                metric = {k: v for k, v in item["metric"].items() if k != _NAME}
                for t, v in item["values"]:
                    i = (round(float(t) * 1000) - grid.start_ms) // grid.step_ms
                    values[i] = float(v)
                    present[i] = True
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise SourceError(f"expected a range answer, got {str(item)[:200]!r} "
                                  f"({exc})", url=self.url, query=expr) from None
            out[labels_of(metric)] = Track(values, present)
        return dict(sorted(out.items()))

    def _vector(self, expr: str, at_s: float) -> dict[Labels, float]:
        """An instant vector, keyed by labels without ``__name__`` (as the embedded source
        keys series), in label order."""
        out: dict[Labels, float] = {}
        for item in self.query(expr, at_s):
            try:
                metric = {k: v for k, v in item["metric"].items() if k != _NAME}
                out[labels_of(metric)] = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise SourceError(f"expected an instant vector, got {str(item)[:200]!r} "
                                  f"({exc})", url=self.url, query=expr) from None
        return dict(sorted(out.items()))

    # --- the expressions, in the store's language --------------------------------------------
    def _increase(self, series: str, window_s: float) -> str:
        """PromQL's ``increase(<series>[w])`` (per series), in the store's language: on
        VictoriaMetrics, rebuilt from MetricsQL functions (``slo.promql.metricsql``), since
        its own ``increase`` neither extrapolates nor keeps to the window; the PromQL rules
        followed are ``semantics``."""
        if self.dialect == "metricsql":
            return metricsql_increase(series, window_s, self.semantics)
        return f"increase({series}[{format_duration_ms(window_s)}])"

    def _over_time(self, function: str, series: str, window_s: float) -> str:
        """``<function>(<series>[w])``. MetricsQL's ranges are left-open, as Prometheus 3's:
        to follow 2.42's closed left edge the range is one millisecond longer (timestamps
        are whole milliseconds)."""
        extra = 0.001 if self.dialect == "metricsql" and self.semantics is Semantics.V2 else 0.0
        return f"{function}({series}[{format_duration_ms(window_s + extra)}])"

    # --- the Source protocol ---------------------------------------------------------------
    def increase(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float,
        by: Sequence[str] = (),
    ) -> dict[Labels, float]:
        """``sum by (by) (increase(metric{matchers}[window]))`` at ``at_s``."""
        expr = f"sum{_by_clause(by)} ({self._increase(selector(metric, matchers), window_s)})"
        return self._vector(expr, at_s)

    def bucket_increase(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float,
        by: Sequence[str] = (),
    ) -> dict[Labels, list[Bucket]]:
        """Per ``by`` group, the ``(le, increase)`` buckets of
        ``sum by (by, le) (increase(metric_bucket{matchers}[window]))``."""
        by = tuple(by)
        if LABEL_LE in by:
            raise ValueError("'le' is always part of the grouping; do not list it in `by`")
        expr = (f"sum{_by_clause((*by, LABEL_LE))} "
                f"({self._increase(selector(metric + SUFFIX_BUCKET, matchers), window_s)})")
        return _le_groups(self._vector(expr, at_s), by)

    def instant(self, metric: str, matchers: Matchers, at_s: float) -> dict[Labels, float]:
        """``metric{matchers}`` at ``at_s``: each series' latest value within the lookback."""
        return self._vector(selector(metric, matchers), at_s)

    def avg_over_time(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float
    ) -> dict[Labels, float]:
        """``avg_over_time(metric{matchers}[window])`` per series."""
        expr = self._over_time("avg_over_time", selector(metric, matchers), window_s)
        return self._vector(expr, at_s)

    def samples(
        self, metric: str, matchers: Matchers, at_s: float, range_s: float
    ) -> dict[Labels, list[Point]]:
        """The raw samples of ``metric{matchers}[range]`` at ``at_s`` (the server drops stale
        markers from range vectors); series without samples are absent."""
        expr = f"{selector(metric, matchers)}[{format_duration_ms(range_s)}]"
        out: dict[Labels, list[Point]] = {}
        for item in self.query(expr, at_s):
            try:
                metric_labels = {k: v for k, v in item["metric"].items() if k != _NAME}
                # Timestamps are seconds with millisecond decimals: round, don't truncate.
                pts = [Point(round(float(t) * 1000), float(v)) for t, v in item["values"]]
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise SourceError(f"expected a range vector, got {str(item)[:200]!r} ({exc})",
                                  url=self.url, query=expr) from None
            if pts:
                out[labels_of(metric_labels)] = pts
        return dict(sorted(out.items()))

    # --- ranges (slo.sources.protocol.RangeSource) ------------------------------------------
    def increase_range(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
        by: Sequence[str] = (),
    ) -> Tracks:
        """``sum by (by) (increase(metric{matchers}[w]))`` at every instant of ``grid``: one
        range query per window."""
        return {w: self._tracks(f"sum{_by_clause(by)} "
                                f"({self._increase(selector(metric, matchers), w)})", grid)
                for w in windows_s}

    def bucket_increase_range(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
        by: Sequence[str] = (), *, les: LeChoice | None = None,
    ) -> BucketTracks:
        """Per ``by`` group, the ``(le, track)`` buckets of ``sum by (by, le)
        (increase(metric_bucket{matchers}[w]))`` at every instant of ``grid``; the server
        sums every bound, ``les`` chooses the ones kept."""
        by = tuple(by)
        if LABEL_LE in by:
            raise ValueError("'le' is always part of the grouping; do not list it in `by`")
        out: BucketTracks = {}
        for w in windows_s:
            expr = (f"sum{_by_clause((*by, LABEL_LE))} "
                    f"({self._increase(selector(metric + SUFFIX_BUCKET, matchers), w)})")
            groups = _le_track_groups(self._tracks(expr, grid), by)
            if les is not None:
                for key, buckets in groups.items():
                    wanted = frozenset(les(sorted({le for le, _ in buckets})))
                    groups[key] = [(le, t) for le, t in buckets if le in wanted]
            out[w] = groups
        return out

    def avg_over_time_range(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
    ) -> Tracks:
        """``avg_over_time(metric{matchers}[w])`` per series at every instant of ``grid``."""
        return {w: self._tracks(self._over_time("avg_over_time", selector(metric, matchers), w),
                                grid) for w in windows_s}

    def instant_range(self, metric: str, matchers: Matchers, grid: Grid) -> dict[Labels, Track]:
        """``metric{matchers}`` per series at every instant of ``grid``: one range query."""
        return self._tracks(selector(metric, matchers), grid)


#: Words of the limits a store puts on one query, in its error, and what the limit is called.
_LIMITS = (
    ("maxsamplesperquery", "VictoriaMetrics' -search.maxSamplesPerQuery"),
    ("maxuniquetimeseries", "VictoriaMetrics' -search.maxUniqueTimeseries"),
    ("too many samples", "Prometheus's --query.max-samples"),
    ("max_fetched_series", "Mimir's max_fetched_series_per_query"),
    ("max_fetched_chunk", "Mimir's max_fetched_chunk_bytes_per_query"),
    ("exceeded maximum resolution", "the 11,000 points of one series of a range query"),
    ("the query time range exceeds", "the store's max_query_length"),
)


def _limit_hint(text: str) -> str:
    low = text.lower()
    for word, name in _LIMITS:
        if word in low:
            return (f"; the query is past the server's limit ({name}): shorten the window, or "
                    "let the server evaluate Vigil's recording rules (vigil rules prometheus)")
    return ""


def _page_title(response: requests.Response) -> str:
    """The ``<title>`` of an HTML answer, white space folded (at most 120 characters)."""
    found = _TITLE_RE.search(response.text[:4096])
    return " ".join(found.group(1).split())[:120] if found else ""


def _tls_error(cause: str) -> str:
    """A TLS failure with what to set."""
    low = cause.lower()
    if "certificate verify failed" in low and ("hostname" in low or "ip address" in low):
        hint = ("the certificate is for another name: set [engine.http.tls] server_name to "
                "the name it carries")
    elif "certificate verify failed" in low:
        hint = ("the server's certificate is not signed by a CA Vigil trusts: set "
                "[engine.http.tls] ca_file to the CA bundle that signs it")
    elif "certificate required" in low or "handshake failure" in low:
        hint = ("the server asks for a client certificate: set [engine.http.tls] cert_file "
                "and key_file")
    elif "wrong version number" in low:
        hint = "the server does not speak TLS on this port: use http://"
    else:
        hint = "check [engine.http.tls]"
    return f"TLS failed ({cause}): {hint}"


def _http_error(text: str) -> str:
    """Prometheus's own ``error`` from prometheus_api_client's "HTTP Status Code N (b'...')"
    message, e.g. ``HTTP 400 (bad_data): 1:6: parse error: ...``; the raw text otherwise."""
    m = _STATUS_RE.search(text)
    if m is None:
        return text
    status = m.group(1)
    try:
        body = ast.literal_eval(m.group(2)).decode("utf-8", "replace")
    except (ValueError, SyntaxError):
        return text
    try:
        data = json.loads(body)
    except ValueError:
        return f"HTTP {status}: {body.strip()[:300]}"
    if isinstance(data, dict) and "error" in data:
        kind = data.get("errorType")
        return f"HTTP {status}" + (f" ({kind})" if kind else "") + f": {data['error']}"
    return f"HTTP {status}: {body.strip()[:300]}"


def _innermost(exc: BaseException) -> BaseException:
    """The exception at the bottom of a requests/urllib3 chain (``args[0]``, the ``reason``
    of urllib3's ``MaxRetryError``, ``__cause__``/``__context__``)."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = getattr(exc, "reason", None)
        if not isinstance(nxt, BaseException) and exc.args and isinstance(exc.args[0],
                                                                           BaseException):
            nxt = exc.args[0]
        if not isinstance(nxt, BaseException):
            nxt = exc.__cause__ or exc.__context__
        if nxt is None:
            break
        exc = nxt
    return exc


def _root_cause(exc: BaseException) -> str:
    """The innermost reason of a requests/urllib3 connection error ("Connection refused")."""
    text = str(_innermost(exc))
    return text.split("] ", 1)[-1] if "] " in text else text
