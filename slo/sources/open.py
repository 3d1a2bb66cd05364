"""Opening what the SLO engine reads, as the configuration says: the ``Source`` of samples
and the gateway's request log.

Every reader opens them here: ``vigil slo status``, ``vigil serve``, ``vigil plan`` and the
dashboard, so that a flag, ``[engine] prometheus_url`` or ``[engine] promql_semantics`` means
the same in all of them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Literal

from slo.sources.protocol import RequestLog, Source
from vigil.config import Config
from vigil.errors import ConfigError, StoreError

__all__ = ["embedded_semantics", "open_source", "request_log"]

#: The readers ``request_log(..., shared=True)`` handed out, by database URL.
_SHARED: dict[str, RequestLog] = {}
_SHARED_LOCK = threading.Lock()


@contextlib.contextmanager
def open_source(config: Config, config_file: str, *, prometheus_url: str = "",
                semantics: Literal["auto", "2", "3"] | None = None) -> Iterator[Source]:
    """The configured ``Source``: a Prometheus API when a URL is given (flag or
    ``[engine] prometheus_url``), else the embedded store opened read-only."""
    sem = semantics or config.engine.promql_semantics
    url = (prometheus_url or config.engine.prometheus_url).rstrip("/")
    if url:
        try:
            from slo.sources.prometheus import PrometheusSource
        except ImportError as exc:
            if exc.name != "slo.sources.prometheus":
                raise
            raise ConfigError("the Prometheus source (slo.sources.prometheus) is not installed yet",
                              file=config_file, key="engine.prometheus_url") from None
        try:
            source = PrometheusSource(url, semantics="3" if sem == "auto" else sem,
                                      lookback_s=config.engine.lookback,
                                      http=config.engine.http, base_dir=config.config_dir(),
                                      dialect=config.engine.dialect)
        except ValueError as exc:  # a URL it cannot use (with a password, say)
            raise ConfigError(f"--prometheus-url or [engine] prometheus_url: {exc}",
                              file=config_file, key="engine.prometheus_url") from None
        if sem == "auto":
            # Follow the server: its own PromQL rules decide what it answers.
            detected = source.server_semantics()
            if detected is not None:
                source.semantics = detected
        try:
            yield source
        finally:
            close = getattr(source, "close", None)
            if callable(close):
                close()
        return

    from collector.store import Store
    from slo.sources.embedded import EmbeddedSource

    path = config.store_path()
    if not path.exists():
        raise StoreError(
            f"no store at {path} yet: run `vigil collect --config {config_file}` first"
        )
    with Store(path, readonly=True) as store:
        yield EmbeddedSource(store, semantics=embedded_semantics(sem),
                             lookback_s=config.engine.lookback)


def request_log(config: Config, *, shared: bool = False) -> RequestLog | None:
    """The gateway's per-request records: per-endpoint SLIs, exact anomalies, cost by tier,
    e2e per 512 tokens. On the ``[gateway] database`` URL when set (a database without the
    table yet reads as no records), else the ``records_path`` file when it exists; ``None``
    without a gateway (the engine then works from vLLM's metrics alone).

    ``shared``: a long-lived process that reads often (the dashboard) gets one reader per
    database URL for the process, thread-safe, so that it does not open a PostgreSQL pool per
    query; a file is opened read-only per read anyway."""
    from slo.sources.request_log import GatewayRecords

    target = config.gateway_database()
    if not isinstance(target, str):
        return GatewayRecords(target) if target.exists() else None
    if not shared:
        return GatewayRecords(target)
    with _SHARED_LOCK:
        log = _SHARED.get(target)
        if log is None:
            log = _SHARED[target] = GatewayRecords(target)
        return log


def embedded_semantics(value: str) -> Literal["2", "3"]:
    """The rules the embedded engine follows for a configured ``promql_semantics``: "auto"
    means Prometheus 3's (there is no server to follow)."""
    if value not in ("auto", "2", "3"):
        raise ValueError(f"promql_semantics must be auto, 2 or 3, not {value!r}")
    return "2" if value == "2" else "3"
