"""One scrape of one target: fetch, parse, label, and turn into points for the store.

Kept free of scheduling and storage so that ``vigil collect``, ``vigil ingest`` and the tests
share exactly one path from exposition bytes to stored points.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import httpx
from prometheus_client.metrics_core import Metric

from collector.exposition import normalise_vllm_names, parse, wire_name
from collector.vllm_families import VersionAnswer, parse_version
from vigil.conventions import (
    EXPORTED_PREFIX,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_POOL,
    SCRAPE_ACCEPT,
    SERIES_SCRAPE_DURATION,
    SERIES_SCRAPE_SAMPLES,
    SERIES_UP,
    USER_AGENT,
    VLLM_VERSION_PATH,
)
from vigil.errors import ParseError, ScrapeError
from vigil.model import Labels, SeriesKey

__all__ = [
    "Fetched",
    "ScrapeResult",
    "TargetInfo",
    "fetch",
    "fetch_once",
    "fetch_version",
    "parse_fetched",
    "points_from_families",
    "root_cause",
    "scrape",
    "scrape_points",
    "scrape_series_points",
    "stale_points",
    "target_end_points",
    "timestamp_ms",
    "version_url",
]

#: The series every scrape writes besides the exposition's.
SCRAPE_SERIES = (SERIES_UP, SERIES_SCRAPE_DURATION, SERIES_SCRAPE_SAMPLES)

#: The longest wait for ``GET /version`` (seconds; the scrape timeout when shorter). It is asked
#: once per target and exposition, only when a family is missing: never on a healthy scrape.
VERSION_TIMEOUT_S = 2.0
#: A version answer is a few dozen bytes; a bigger body is not one.
_VERSION_MAX_BYTES = 4096

#: One row for ``Store.write``: series, family type, Unix ms, value (None = stale marker).
StorePoint = tuple[SeriesKey, str, int, float | None]


class TargetInfo(NamedTuple):
    """What the collector needs to know of a target (taken from ``TargetConfig``).

    ``extra_labels`` are the target's own labels (``[[targets]] labels``, a discovered
    group's labels), sorted name/value pairs; ``labels()`` adds instance, pool and kind,
    which always win.
    """

    name: str
    url: str
    pool: str
    kind: str
    extra_labels: Labels = ()

    def labels(self) -> dict[str, str]:
        """Every target label of the target's series: its own plus instance, pool, kind."""
        own = {LABEL_INSTANCE: self.name, LABEL_POOL: self.pool, LABEL_KIND: self.kind}
        return {**dict(self.extra_labels), **own} if self.extra_labels else own


class ScrapeResult(NamedTuple):
    """The outcome of one scrape.

    ``started`` is Unix seconds (the sample timestamp, as in Prometheus), ``duration`` seconds.
    A successful scrape carries either parsed ``families`` or, from the repeat-scrape fast path
    (``collector.layout``), the ready ``points``; a failed one has neither and ``error`` says why.
    """

    target: TargetInfo
    started: float
    duration: float
    families: list[Metric] | None
    error: str
    points: list[StorePoint] | None = None

    @property
    def up(self) -> bool:
        return self.families is not None or self.points is not None

    @property
    def samples(self) -> int:
        if self.points is not None:
            return len(self.points)
        return sum(len(f.samples) for f in self.families) if self.families else 0


class Fetched(NamedTuple):
    """An HTTP fetch: the body and its content type, or the error; ``duration`` seconds."""

    body: bytes | None
    content_type: str | None
    duration: float
    error: str


def timestamp_ms(ts: Any) -> int:
    """A parsed sample timestamp (float seconds or prometheus_client ``Timestamp``) in ms."""
    if hasattr(ts, "sec"):
        return int(ts.sec) * 1000 + int(ts.nsec) // 1_000_000
    return round(float(ts) * 1000)


def _target_labels(sample_labels: dict[str, str], target: dict[str, str]) -> Labels:
    """Merge target labels in; a clashing scraped label becomes ``exported_<name>``.

    This is Prometheus's behaviour with ``honor_labels: false`` (its default), so that both
    backends store the same label sets.
    """
    merged = dict(target)
    for k, v in sample_labels.items():
        if v == "":
            continue
        if k in target:
            merged[EXPORTED_PREFIX + k] = v
        else:
            merged[k] = v
    return tuple(sorted(merged.items()))


def points_from_families(
    families: Iterable[Metric], target: TargetInfo, ts_ms: int, *, honor_timestamps: bool = True
) -> list[StorePoint]:
    """Points for the store: target labels attached, ``vllm_`` names folded to ``vllm:``.

    A sample that carries its own timestamp keeps it (``honor_timestamps``, Prometheus's
    default); the others get ``ts_ms``.
    """
    tlabels = target.labels()
    out: list[StorePoint] = []
    append = out.append
    # The label merge is the hot path for 1,000 targets; the same label dict object is shared
    # by histogram buckets of one child only in content, so cache on the frozen items.
    cache: dict[tuple[tuple[str, str], ...], Labels] = {}
    for fam in normalise_vllm_names(list(families)):
        ftype = fam.type
        added_total = fam.type == "counter"
        for s in fam.samples:
            items = tuple(s.labels.items())
            labels = cache.get(items)
            if labels is None:
                labels = cache[items] = _target_labels(s.labels, tlabels)
            ts = ts_ms if (s.timestamp is None or not honor_timestamps) else timestamp_ms(
                s.timestamp
            )
            name = wire_name(fam, s.name) if added_total else s.name
            append((SeriesKey(name, labels), ftype, ts, float(s.value)))
    return out


def scrape_points(result: ScrapeResult) -> list[StorePoint]:
    """All points one scrape writes: the exposition's plus ``up``, duration, sample count."""
    ts_ms = round(result.started * 1000)
    if result.points is not None:
        points = list(result.points)
    elif result.families:
        points = points_from_families(result.families, result.target, ts_ms)
    else:
        points = []
    points.extend(scrape_series_points(result))
    return points


def scrape_series_points(result: ScrapeResult) -> list[StorePoint]:
    """``up``, ``scrape_duration_seconds`` and ``scrape_samples_scraped`` of one scrape."""
    ts_ms = round(result.started * 1000)
    labels = tuple(sorted(result.target.labels().items()))
    return [
        (SeriesKey(SERIES_UP, labels), "gauge", ts_ms, 1.0 if result.up else 0.0),
        (SeriesKey(SERIES_SCRAPE_DURATION, labels), "gauge", ts_ms, round(result.duration, 6)),
        (SeriesKey(SERIES_SCRAPE_SAMPLES, labels), "gauge", ts_ms, float(result.samples)),
    ]


async def fetch(
    client: httpx.AsyncClient, url: str, *, timeout: float, max_body_bytes: int, target: str
) -> tuple[bytes, str | None]:
    """GET an exposition; return (body, content type). Raises ``ScrapeError`` with a reason."""
    headers = {
        "Accept": SCRAPE_ACCEPT,
        "User-Agent": USER_AGENT,
        "X-Prometheus-Scrape-Timeout-Seconds": f"{timeout:g}",
    }
    try:
        try:
            return await _get(client, url, headers, timeout, max_body_bytes, target)
        except httpx.RemoteProtocolError as exc:
            # The server closed a kept-alive connection just as we reused it (its keep-alive
            # timeout equals our interval: uvicorn's 5 s vs a 5 s scrape): nothing was sent
            # back, so the GET is retried once on a new connection, as Go's http.Transport
            # (Prometheus) retries a request on a connection the server closed while idle.
            if "without sending a response" not in str(exc):
                raise
            return await _get(client, url, headers, timeout, max_body_bytes, target)
    except ScrapeError:
        raise
    except httpx.TimeoutException:
        raise ScrapeError(f"timeout after {timeout:g}s", target=target) from None
    except httpx.ConnectError as exc:
        raise ScrapeError(f"connection failed: {root_cause(exc)}", target=target) from None
    except httpx.HTTPError as exc:
        raise ScrapeError(f"{type(exc).__name__}: {root_cause(exc)}", target=target) from None


async def _get(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], timeout: float,
    max_body_bytes: int, target: str,
) -> tuple[bytes, str | None]:
    async with client.stream("GET", url, headers=headers, timeout=timeout) as resp:
        if resp.status_code != 200:
            raise ScrapeError(
                f"server returned HTTP status {resp.status_code} {resp.reason_phrase}",
                target=target,
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > max_body_bytes:
                raise ScrapeError(
                    f"body exceeds the limit of {max_body_bytes} bytes "
                    "([collector] max_body_bytes)",
                    target=target,
                )
            chunks.append(chunk)
        return b"".join(chunks), resp.headers.get("content-type")


def root_cause(exc: BaseException) -> str:
    """The innermost cause of ``exc`` as text ("connection refused" for a refusal)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = str(exc) or type(exc).__name__
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text


async def fetch_once(
    client: httpx.AsyncClient,
    target: TargetInfo,
    *,
    timeout: float,
    max_body_bytes: int,
    perf: Any = time.perf_counter,
) -> Fetched:
    """Fetch ``target``'s exposition once; never raises for target problems."""
    t0 = perf()
    try:
        # httpx's timeout bounds each read, not the whole request: a target trickling a byte
        # at a time would hold the scrape far past its timeout. This is the real deadline.
        async with asyncio.timeout(timeout):
            body, ctype = await fetch(
                client, target.url, timeout=timeout, max_body_bytes=max_body_bytes,
                target=target.name,
            )
    except ScrapeError as exc:
        return Fetched(None, None, perf() - t0, exc.reason)
    except TimeoutError:
        return Fetched(None, None, perf() - t0, f"timeout after {timeout:g}s")
    except Exception as exc:
        return Fetched(None, None, perf() - t0, f"{type(exc).__name__}: {exc}")
    return Fetched(body, ctype, perf() - t0, "")


def version_url(metrics_url: str) -> str:
    """Where a vLLM server whose metrics are at ``metrics_url`` answers ``GET /version``:
    beside ``/metrics`` (so a path prefix added by a proxy is kept), else at the root."""
    url = httpx.URL(metrics_url)
    path = url.path
    base = path[: -len("/metrics")] if path.endswith("/metrics") else ""
    return str(url.copy_with(path=base + VLLM_VERSION_PATH, query=None, fragment=None))


async def fetch_version(
    client: httpx.AsyncClient, target: TargetInfo, *, timeout: float
) -> VersionAnswer:
    """Ask ``target``'s server for its vLLM version; never raises for target problems (the
    answer then says why there is no version)."""
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("GET", version_url(target.url), timeout=timeout,
                                     headers={"User-Agent": USER_AGENT}) as resp:
                if resp.status_code != 200:
                    return VersionAnswer("", f"HTTP {resp.status_code}")
                body = b""
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > _VERSION_MAX_BYTES:
                        return VersionAnswer("", "answer too long")
    except (TimeoutError, httpx.TimeoutException):
        return VersionAnswer("", f"no answer within {timeout:g}s")
    except httpx.HTTPError as exc:
        return VersionAnswer("", root_cause(exc))
    return parse_version(body)


def parse_fetched(target: TargetInfo, fetched: Fetched, now: float) -> ScrapeResult:
    """Parse a fetched body in full; a malformed one becomes a failed scrape with the reason.

    ``now`` is the scrape's timestamp (Unix seconds); the parse time counts in the duration,
    as it does in Prometheus's ``scrape_duration_seconds``.
    """
    if fetched.body is None:
        return ScrapeResult(target, now, fetched.duration, None, fetched.error)
    t0 = time.perf_counter()
    try:
        families = parse(fetched.body, content_type=fetched.content_type, source=target.name)
    except ParseError as exc:
        where = f"line {exc.line}: " if exc.line else ""
        return ScrapeResult(
            target, now, fetched.duration + time.perf_counter() - t0, None,
            f"parse error: {where}{exc.reason}",
        )
    return ScrapeResult(target, now, fetched.duration + time.perf_counter() - t0, families, "")


async def scrape(
    client: httpx.AsyncClient,
    target: TargetInfo,
    *,
    timeout: float,
    max_body_bytes: int,
    now: float,
) -> ScrapeResult:
    """Fetch and parse ``target`` once. Never raises for target problems: they become ``error``.

    ``now`` is the scrape's timestamp (Unix seconds, from the injected clock).
    """
    fetched = await fetch_once(client, target, timeout=timeout, max_body_bytes=max_body_bytes)
    return parse_fetched(target, fetched, now)


def stale_points(
    previous: Sequence[tuple[SeriesKey, str]], current: set[SeriesKey], ts_ms: int
) -> list[StorePoint]:
    """Staleness markers for series seen in the previous scrape but not in this one.

    Prometheus writes these so that an instant query stops returning a series at once rather
    than 5 minutes later; a failed scrape marks every series of the previous scrape stale.
    """
    return [(key, ftype, ts_ms, None) for key, ftype in previous if key not in current]


def target_end_points(
    previous: Sequence[tuple[SeriesKey, str]], target: TargetInfo, ts_ms: int
) -> list[StorePoint]:
    """Staleness markers for every series of a target that is no longer scraped: those of its
    last scrape ``previous`` and its ``up`` and ``scrape_*`` series.

    Prometheus ends a vanished target's series this way, so that queries stop returning them
    at once, and ``up`` stops counting as time the replica ran.
    """
    labels = tuple(sorted(target.labels().items()))
    return stale_points(previous, set(), ts_ms) + [
        (SeriesKey(name, labels), "gauge", ts_ms, None) for name in SCRAPE_SERIES
    ]
