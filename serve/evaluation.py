"""One evaluation of `vigil serve`: the status from the store or a Prometheus, target health,
per-replica KV usage, and this month's chargeback and budgets (``EvaluationResult``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from slo.cost.budgets import BudgetStatus, BudgetTracker
from slo.cost.ledger import Line
from slo.cost.months import month_of
from slo.scaling.signals import kv_usage_of_fleet
from vigil.config import Config, TargetConfig
from vigil.conventions import (
    LABEL_INSTANCE,
    SERIES_SCRAPE_DURATION,
    SERIES_SCRAPE_SAMPLES,
    SERIES_UP,
    TARGET_KINDS,
)
from vigil.errors import SourceError, StoreError
from vigil.model import Point, TargetHealth

__all__ = ["Chargeback", "ChargebackResult", "EvaluationResult", "Evaluator",
           "PrometheusEvaluator", "StoreEvaluator"]

log = logging.getLogger("vigil.serve")


class EvaluationResult:
    """What the evaluation thread hands back: the status dict, target health, per-replica
    KV usage ``{(pool, instance): ratio}``, consecutive failed scrapes per target, and the
    time it took (seconds)."""

    def __init__(self, status: dict[str, Any], targets: list[TargetHealth],
                 kv_usage: dict[tuple[str, str], float], down_streaks: dict[str, int],
                 duration: float, chargeback: ChargebackResult | None = None):
        self.status = status
        self.targets = targets
        self.kv_usage = kv_usage
        self.down_streaks = down_streaks
        self.duration = duration
        self.chargeback = chargeback


class ChargebackResult:
    """This month's chargeback lines and every budget's status, as of ``at`` (Unix s)."""

    def __init__(self, at: float, budgets: list[BudgetStatus], lines: list[Line]) -> None:
        self.at = at
        self.budgets = budgets
        self.lines = lines


class Chargeback:
    """The month's chargeback and budgets for ``/metrics``, ``/budgets`` and the budget
    alerts, recomputed at most every ``[cost] evaluation_interval`` (``BudgetTracker`` keeps
    the closed days). Runs on the evaluation thread. Nothing to do without gateway records
    and without budgets."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.tracker = BudgetTracker(config)
        self.last: ChargebackResult | None = None

    def evaluate(self, source: Any, records: Any, at_s: float) -> ChargebackResult | None:
        if records is None and not self.config.budgets:
            return None
        tz = self.config.cost.timezone
        last = self.last
        if (last is not None and at_s - last.at < self.config.cost.evaluation_interval
                and month_of(last.at, tz) == month_of(at_s, tz)):
            return last
        try:
            budgets = self.tracker.evaluate(source, records, at_s)
        except (SourceError, StoreError) as exc:
            # The budgets keep their last figures (their alerts neither fire nor resolve on
            # an outage); the next evaluation tries again.
            log.error("chargeback at %.3f not computed: %s", at_s, exc)
            return last
        self.last = ChargebackResult(at_s, budgets, self.tracker.month_lines)
        return self.last


def _trailing_failures(points: list[Point]) -> int:
    """How many of the last samples of an ``up`` series are 0 (consecutive failed scrapes)."""
    streak = 0
    for p in sorted((p for p in points if p.value is not None), key=lambda p: p.ts_ms,
                    reverse=True):
        if p.value != 0.0:
            break
        streak += 1
    return streak


class StoreEvaluator:
    """Reads Vigil's own store (which the collector of this process fills) through its own
    read-only connection; every call runs on the one evaluation thread."""

    def __init__(self, config: Config):
        self.config = config
        self._store: Any = None
        self._chargeback = Chargeback(config)

    def describe(self) -> str:
        from slo.sources.open import embedded_semantics

        sem = embedded_semantics(self.config.engine.promql_semantics)
        return f"store {self.config.store_path()} (PromQL {sem})"

    def _source(self) -> Any:
        from collector.store import Store
        from slo.sources.embedded import EmbeddedSource

        if self._store is None:
            self._store = Store(self.config.store_path(), readonly=True)
        from slo.sources.open import embedded_semantics

        return EmbeddedSource(self._store,
                              semantics=embedded_semantics(self.config.engine.promql_semantics),
                              lookback_s=self.config.engine.lookback)

    def evaluate(self, at_s: float, targets: Sequence[TargetConfig]) -> EvaluationResult:
        """The status at ``at_s``; ``targets``: the ones the collector scrapes now (static
        and discovered)."""
        from slo.sources.open import request_log
        from slo.status import evaluate

        t0 = time.perf_counter()
        source = self._source()
        records = request_log(self.config)
        status = evaluate(self.config, source, at_s, request_log=records)
        health = list(self._store.target_health())
        return EvaluationResult(status, health, kv_usage_of_fleet(self.config, source, at_s),
                                self._down_streaks(at_s, targets), time.perf_counter() - t0,
                                self._chargeback.evaluate(source, records, at_s))

    def _down_streaks(self, at_s: float, targets: Sequence[TargetConfig]) -> dict[str, int]:
        """Consecutive failed scrapes (``up == 0``) at the end of each target's ``up`` series."""
        n = self.config.alerts.target_down_scrapes
        out: dict[str, int] = {}
        for t in targets:
            # Enough history for n scrapes plus slack for late ones (seconds).
            span = (n + 2) * self.config.scrape_interval(t) * 2
            series = self._store.points(SERIES_UP, {LABEL_INSTANCE: t.name},
                                        start_ms=int((at_s - span) * 1000))
            out[t.name] = _trailing_failures([p for pts in series.values() for p in pts])
        return out

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


class PrometheusEvaluator:
    """Reads a Prometheus-compatible API that scrapes the replicas itself: the SLO status,
    and each replica's health from Prometheus's ``up`` (the pool's replica label naming it).

    ``[engine] promql_semantics = "auto"`` follows the server's major version, asked again
    until the server has answered once (it may be down when `vigil serve` starts)."""

    def __init__(self, config: Config, url: str):
        from slo.sources.prometheus import PrometheusSource

        self.config = config
        sem = config.engine.promql_semantics
        interval = config.engine.evaluation_interval
        # One slow query must not hold the evaluation for much longer than its interval.
        self.source = PrometheusSource(url, semantics="3" if sem == "auto" else sem,
                                       lookback_s=config.engine.lookback,
                                       timeout_s=min(config.engine.http.timeout,
                                                     max(1.0, interval)),
                                       http=config.engine.http, base_dir=config.config_dir(),
                                       dialect=config.engine.dialect)
        self._follow_server = sem == "auto"
        self._chargeback = Chargeback(config)

    def describe(self) -> str:
        sem = "the server's" if self._follow_server else self.source.semantics.value
        language = " in MetricsQL" if self.source.dialect == "metricsql" else ""
        return f"Prometheus {self.source.url} (PromQL {sem}{language})"

    def evaluate(self, at_s: float, targets: Sequence[TargetConfig] = ()) -> EvaluationResult:
        """The status at ``at_s``; ``targets`` is unused (Prometheus knows its own)."""
        from slo.sources.open import request_log
        from slo.status import evaluate

        t0 = time.perf_counter()
        source = self.source
        detected = source.server_semantics() if self._follow_server else None
        if detected is not None:
            source.semantics = detected
        records = request_log(self.config)
        status = evaluate(self.config, source, at_s, request_log=records)
        if self._follow_server:
            # The server answered: it said its version, or it never will (Thanos, Mimir...),
            # and the default stands.
            self._follow_server = False
        health, streaks = self._replicas(at_s)
        return EvaluationResult(status, health, kv_usage_of_fleet(self.config, source, at_s),
                                streaks, time.perf_counter() - t0,
                                self._chargeback.evaluate(source, records, at_s))

    def _replicas(self, at_s: float) -> tuple[list[TargetHealth], dict[str, int]]:
        """Per replica of every pool (vLLM and DCGM series): its latest scrape as target
        health, and its consecutive failed scrapes, from Prometheus's ``up``,
        ``scrape_duration_seconds`` and ``scrape_samples_scraped``. A replica whose ``up`` is
        stale (gone from discovery) is left out, as the ``up == 0`` rule forgets it."""
        from slo.objectives.sli import replica_label, up_matchers

        source = self.source
        n = self.config.alerts.target_down_scrapes
        health: dict[str, TargetHealth] = {}
        streaks: dict[str, int] = {}
        for pool in self.config.pools:
            label = replica_label(pool, source)
            # Enough history for target_down_scrapes scrapes at the pool's interval, and at
            # least the lookback, within which the interval must fall for `up` to be current.
            interval = (self.config.unlisted_scrape_interval(pool)
                        or self.config.collector.scrape_interval)
            span = max(self.config.engine.lookback, 2 * (n + 2) * interval)
            for kind in TARGET_KINDS:
                matchers = up_matchers(pool, source, kind)
                if matchers is None:  # a DCGM selector choosing GPUs, not an exporter
                    continue
                current = source.instant(SERIES_UP, matchers, at_s)
                if not current:
                    continue
                history = source.samples(SERIES_UP, matchers, at_s, span)
                took = source.instant(SERIES_SCRAPE_DURATION, matchers, at_s)
                counted = source.instant(SERIES_SCRAPE_SAMPLES, matchers, at_s)
                for labels, value in current.items():
                    d = dict(labels)
                    name = d.get(label) or d.get(LABEL_INSTANCE, "")
                    points = history.get(labels, [])
                    last = max((p.ts_ms for p in points), default=0) / 1000.0
                    health[name] = TargetHealth(
                        name, pool.name, kind, d.get(LABEL_INSTANCE, ""), value == 1.0,
                        last or at_s, took.get(labels, 0.0), int(counted.get(labels, 0.0)),
                        "" if value == 1.0 else "up == 0 in Prometheus")
                    streaks[name] = _trailing_failures(points)
        return sorted(health.values()), streaks

    def close(self) -> None:
        self.source.close()


Evaluator = StoreEvaluator | PrometheusEvaluator


# --- the server ---------------------------------------------------------------------------
