"""`vigil serve`: collector, SLO evaluation, alerting and the exporter in one process.

One asyncio loop runs one ``AsyncIOScheduler`` with these jobs:

* ``scrape:<target>`` (per target, every scrape interval) and ``compact``: the collector's;
* ``evaluate`` (every ``[engine] evaluation_interval``): ``slo.status.evaluate`` on a thread
  of its own (CPU work; it reads the store through its own read-only connection), then the
  alert conditions, ``Notifier.process`` and a delivery round;
* ``deliver`` (every second): retries and group timers (``Notifier.process`` again when a
  group_wait/group_interval is due, then ``deliver_due``).

With ``[serve] database`` several copies share the outbox there, and a ``lease`` job (every
second or so, on a thread of its own) keeps the leader's lease (``alerts.leadership``): the
copy holding it groups and delivers, the others evaluate and stand by until it is theirs.

With ``[engine] prometheus_url`` (or ``--prometheus-url``) there is no collector and no
store: a Prometheus scrapes the replicas, ``evaluate`` reads it (``slo.sources.prometheus``), and
replica health (``TargetDown``) comes from its ``up`` series, each replica named by its pool's
replica label. A failed evaluation (the source unreachable) leaves the alerts as they were and
is tried again on the next tick.

The HTTP server (``/metrics``, ``/healthz``) runs on a thread: a scrape never waits for the
loop. SIGTERM or SIGINT stops the scheduler, lets scrapes, the evaluation and deliveries under
way finish, then closes everything; the exit code is 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client.exposition import choose_encoder

from alerts.conditions import ConditionState, evaluate_conditions, kv_usage_by_replica
from alerts.exporter import Exporter, LeaderRole, Snapshot
from alerts.leadership import Leadership
from alerts.model import Alert
from alerts.notifier import Notifier, NotifierCounters, redact_url
from slo.cost.budgets import BudgetStatus, BudgetTracker
from slo.cost.ledger import Line, top_tenants
from slo.cost.months import month_of
from vigil.cli_options import add_config_option, add_listen_option, add_prometheus_url_option
from vigil.cli_options import parse_listen as _parse_host_port
from vigil.clock import Clock, system_clock
from vigil.config import Config, TargetConfig, check_http_url
from vigil.conventions import (
    LABEL_INSTANCE,
    LABEL_POOL,
    SERIES_SCRAPE_DURATION,
    SERIES_SCRAPE_SAMPLES,
    SERIES_UP,
    SERVE_BUDGETS_PATH,
    SERVE_DEFAULT_LISTEN,
    TARGET_KINDS,
    TENANT_OTHER,
    VLLM_KV_CACHE_USAGE,
)
from vigil.errors import ConfigError, LeaseLost, SourceError, StoreError
from vigil.http_server import threading_http_server
from vigil.model import Point, TargetHealth

__all__ = ["EvaluationResult", "Server", "add_arguments", "parse_listen", "run"]

log = logging.getLogger("vigil.serve")

#: Seconds between delivery rounds (retries are due at whole-second granularity anyway).
DELIVERY_INTERVAL = 1.0
#: How long shutdown waits for in-flight evaluation and deliveries (seconds).
SHUTDOWN_GRACE = 15.0
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `vigil serve` (``--config`` included)."""
    add_config_option(p)
    add_listen_option(p, default=SERVE_DEFAULT_LISTEN,
                      help=f"address of /metrics and /healthz (default {SERVE_DEFAULT_LISTEN})")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen (the endpoint has no authentication)")
    add_prometheus_url_option(p, help="evaluate from this Prometheus-compatible API, which "
                                      "scrapes the replicas itself: no collector, no store "
                                      "(default: [engine] prometheus_url)")


def parse_listen(value: str, *, allow_remote: bool = False) -> tuple[str, int]:
    """``"host:port"`` -> (host, port); ``ConfigError`` for a bad or non-loopback address
    (port 0: the kernel picks one)."""
    host, port = _parse_host_port(value, allow_port_zero=True)
    if host not in _LOOPBACK and not allow_remote:
        raise ConfigError(f"--listen {value}: not a loopback address; /metrics has no "
                          "authentication (pass --allow-remote to bind it anyway)")
    return host, port


# --- HTTP ---------------------------------------------------------------------------------
def _http_server(host: str, port: int, exporter: Exporter,
                 healthy: Callable[[], tuple[bool, str]],
                 budgets: Callable[[], bytes]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
                self._reply(200, ctype, encoder(exporter.registry))
            elif path == "/healthz":
                ok, text = healthy()
                self._reply(200 if ok else 503, "text/plain; charset=utf-8",
                            (text + "\n").encode())
            elif path == SERVE_BUDGETS_PATH:
                self._reply(200, "application/json", budgets())
            else:
                self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")

        def _reply(self, status: int, ctype: str, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the scraper left; nothing to tell it

        def log_message(self, *args: object) -> None:
            pass  # a scrape every few seconds is not worth a log line

    return threading_http_server(host, port, Handler)


# --- one evaluation -----------------------------------------------------------------------
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


class _Chargeback:
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


def _replica_kv_usage(config: Config, source: Any, at_s: float) -> dict[tuple[str, str], float]:
    """``{(pool, replica): mean KV usage}``: each pool's ``vllm:kv_cache_usage_perc`` read
    through its own matchers, its replicas told apart by the source's replica label."""
    from slo.objectives.sli import pool_series, replica_label

    out: dict[tuple[str, str], float] = {}
    for pool in config.pools:
        label = replica_label(pool, source)
        vector = source.instant(VLLM_KV_CACHE_USAGE, pool_series(pool, source), at_s)
        # Re-keyed to the (pool, instance) pairs the conditions name alerts by; the other
        # labels (engine, model_name) keep a replica's engines apart, to be averaged.
        keyed = {tuple(sorted({**dict(labels), LABEL_POOL: pool.name,
                               LABEL_INSTANCE: dict(labels).get(label, "")}.items())): v
                 for labels, v in vector.items()}
        out.update(kv_usage_by_replica(keyed, {}))
    return out


def _trailing_failures(points: list[Point]) -> int:
    """How many of the last samples of an ``up`` series are 0 (consecutive failed scrapes)."""
    streak = 0
    for p in sorted((p for p in points if p.value is not None), key=lambda p: p.ts_ms,
                    reverse=True):
        if p.value != 0.0:
            break
        streak += 1
    return streak


class _StoreEvaluator:
    """Reads Vigil's own store (which the collector of this process fills) through its own
    read-only connection; every call runs on the one evaluation thread."""

    def __init__(self, config: Config):
        self.config = config
        self._store: Any = None
        self._chargeback = _Chargeback(config)

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
        return EvaluationResult(status, health, _replica_kv_usage(self.config, source, at_s),
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


class _PrometheusEvaluator:
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
        self._chargeback = _Chargeback(config)

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
        targets, streaks = self._replicas(at_s)
        return EvaluationResult(status, targets, _replica_kv_usage(self.config, source, at_s),
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


_Evaluator = _StoreEvaluator | _PrometheusEvaluator


# --- the server ---------------------------------------------------------------------------
class Server:
    """Everything `vigil serve` runs, on the caller's asyncio loop (see the module docstring).

    ``clock`` gives "now" (Unix seconds) for evaluations and alerts. ``prometheus_url``
    (default ``[engine] prometheus_url``): evaluate from that Prometheus-compatible API, with
    no collector and no store; "" reads the store the collector fills.
    """

    def __init__(self, config: Config, *, listen: tuple[str, int] = ("127.0.0.1", 9464),
                 clock: Clock = system_clock, prometheus_url: str | None = None):
        self.config = config
        self.clock = clock
        self.listen = listen
        url = (config.engine.prometheus_url if prometheus_url is None
               else prometheus_url).rstrip("/")
        self._evaluator: _Evaluator
        if url:
            self.collector: Any = None
            self._evaluator = _PrometheusEvaluator(config, url)
        else:
            from collector.service import Collector

            self.collector = Collector(config, clock=clock)
            self._evaluator = _StoreEvaluator(config)
        self.notifier: Notifier | None = None
        self.exporter = Exporter()
        self.state = ConditionState()
        self.alerts: list[Alert] = []
        self.evaluations = 0
        #: Evaluations that failed since the last one that succeeded.
        self.failures = 0
        #: Evaluations that failed since the process started.
        self.failed_total = 0
        self.last_error = ""
        self._eval_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vigil-eval")
        #: With ``[serve] database``: this copy's side of the leader's lease (None until the
        #: database was first reached), and the thread its blocking calls run on.
        self.leadership: Leadership | None = None
        self._lease_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vigil-lease")
        self._lease_error = ""
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._deliver_lock = asyncio.Lock()
        self._http: ThreadingHTTPServer | None = None
        #: With ``[otlp] listen``: the OTLP/HTTP receiver writing request records from spans
        #: (``serving.otlp.receiver.OtlpReceiver``), its counters on ``/metrics``.
        self.otlp: Any = None
        self.otlp_listen: tuple[str, int] = ("", 0)
        self._last: EvaluationResult | None = None
        #: This month's chargeback and budgets (``/budgets``, ``/metrics``, budget alerts).
        self.chargeback: ChargebackResult | None = None

    # --- jobs: each starts its own task so that shutdown can wait for it --------------------
    def _spawn(self, name: str, make: Callable[[], Awaitable[Any]]) -> None:
        running = self._tasks.get(name)
        if running is not None and not running.done():
            log.warning("%s still running; skipping this round", name)
            return
        task = asyncio.ensure_future(make())
        self._tasks[name] = task
        task.add_done_callback(self._log_failure)

    @staticmethod
    def _log_failure(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("job failed", exc_info=task.exception())

    async def _evaluate_job(self) -> None:
        self._spawn("evaluate", self.evaluate_once)

    async def _deliver_job(self) -> None:
        self._spawn("deliver", self.deliver_once)

    async def _lease_job(self) -> None:
        self._spawn("lease", self.lease_once)

    # --- the leader's lease ([serve] database) ----------------------------------------------
    @property
    def shared(self) -> bool:
        """Whether copies share the outbox and elect a leader (``[serve] database``)."""
        return bool(self.config.serve.database)

    def _acting(self) -> bool:
        """Whether this copy queues and delivers now: always with its own outbox; with a
        shared one, only while it leads (a deadline passed without a tick noticing counts as
        lost, and the notifier is dropped at once)."""
        if self.notifier is None:
            return False
        if self.leadership is None or self.leadership.leads():
            return True
        self.leadership.step_down("the lease's deadline passed before it could be renewed")
        self._drop_notifier()
        return False

    def _drop_notifier(self) -> None:
        notifier, self.notifier = self.notifier, None
        if notifier is not None:
            notifier.close()

    async def lease_once(self) -> None:
        """One try for the leader's lease; takes the lead or steps down as it finds."""
        loop = asyncio.get_running_loop()
        cfg = self.config.serve
        if self.leadership is None:
            try:
                self.leadership = await loop.run_in_executor(
                    self._lease_thread,
                    lambda: Leadership(cfg.database, cfg.name, cfg.lease_duration))
            except StoreError as exc:
                if str(exc) != self._lease_error:
                    log.error("standing by: cannot reach the shared database: %s", exc)
                self._lease_error = str(exc)
                self._publish()
                return
            self._lease_error = ""
        lead = self.leadership
        turn = await loop.run_in_executor(self._lease_thread, lead.tick)
        # A term this copy leads in without a notifier (building it failed before): build it.
        rebuild = turn.kind == "kept" and self.notifier is None
        if turn.kind in ("lost", "became") or rebuild:
            # Under the delivery lock: a delivery round under way ends before its notifier
            # is closed or replaced.
            async with self._deliver_lock:
                self._drop_notifier()
                if turn.kind != "lost":
                    await self._take_lead(lead, turn.term)
        self._publish()

    async def _take_lead(self, lead: Leadership, term: int) -> None:
        """Build the notifier of term ``term``: it picks up the groups and unacknowledged
        notifications where the previous leader left them (the shared notification log and
        outbox). A copy that cannot gives the term up at once, so that another can lead."""
        loop = asyncio.get_running_loop()
        # An attempt must end before the lease can pass: no stored timeout may exceed half of
        # it (the config check holds the routes' own to that already).
        cap = self.config.serve.lease_duration / 2
        try:
            self.notifier = await loop.run_in_executor(
                self._lease_thread, lambda: Notifier(
                    self.config, self.config.outbox_target(), clock=self.clock,
                    fence=lead.fence(), max_timeout=cap))
        except Exception as exc:
            if isinstance(exc, StoreError):
                log.error("cannot deliver: the shared outbox cannot be opened: %s", exc)
            else:
                log.exception("cannot deliver: building the notifier failed")
            lead.step_down(f"could not open the shared outbox: {exc}")
            await loop.run_in_executor(self._lease_thread, lead.release, term)
        else:
            log.warning("%s: delivering alerts from now on", lead.describe())

    async def evaluate_once(self) -> list[Alert]:
        """One evaluation: status, conditions, notifier, exporter; returns the alerts."""
        now = self.clock()
        loop = asyncio.get_running_loop()
        # Taken on the loop, where discovery changes the collector's targets.
        targets = list(self.collector.targets) if self.collector is not None else []
        try:
            result = await loop.run_in_executor(self._eval_thread, self._evaluator.evaluate, now,
                                                targets)
        except Exception as exc:
            # A broken evaluation must not kill serve; /healthz and the log say so. The
            # condition state is kept as it was: alerts firing or pending before the failure
            # are still there when the source answers again, none resolved by the outage.
            self.failures += 1
            self.failed_total += 1
            self.last_error = f"evaluation from {self.source} failed: {exc}"
            self._publish()
            if isinstance(exc, SourceError):
                log.error("evaluation at %.3f failed (%d in a row): %s", now, self.failures,
                          exc)
            else:
                log.exception("evaluation at %.3f failed", now)
            return self.alerts
        if self.failures:
            log.warning("evaluation from %s recovered after %d failed", self.source,
                        self.failures)
        self.failures = 0
        self.last_error = ""
        if result.chargeback is not None:
            self.chargeback = result.chargeback
        alerts, self.state = evaluate_conditions(
            self.config, result.status, result.targets, self.state, now,
            kv_usage=result.kv_usage, down_streaks=result.down_streaks,
            budgets=self.chargeback.budgets if self.chargeback else (),
        )
        for a in alerts:
            if a.starts_at == now and a.firing:
                log.warning("alert firing: %s %s", a.name, dict(a.labels))
            elif not a.firing:
                log.info("alert resolved: %s %s", a.name, dict(a.labels))
        self.alerts = [a for a in alerts if a.firing]
        self._last = result
        self.evaluations += 1
        async with self._deliver_lock:
            if self._acting():
                assert self.notifier is not None
                try:
                    self.notifier.process(now, alerts)
                except LeaseLost as exc:
                    self._lost(exc)
                except StoreError as exc:
                    # The outbox's database is away: the grouping state is unchanged, and the
                    # next evaluation queues what is due then.
                    log.error("alert notifications not queued: %s", exc)
        self._publish()
        await self.deliver_once()
        return alerts

    def _lost(self, exc: LeaseLost) -> None:
        assert self.leadership is not None
        self.leadership.step_down(str(exc))
        self._drop_notifier()

    async def deliver_once(self) -> None:
        """Advance group timers and send what is due (retries included)."""
        async with self._deliver_lock:
            if not self._acting():
                return
            notifier = self.notifier
            assert notifier is not None
            now = self.clock()
            wake = notifier.next_wakeup()
            try:
                if wake is not None and wake <= now and self.evaluations:
                    # Timers (group_wait, group_interval) only advance in process(). Not
                    # before the first evaluation: self.alerts is not known yet, and
                    # process() would replace the alerts the previous process saved with
                    # none (a retry left in the outbox is due at once after a restart;
                    # deliver_due sends it).
                    notifier.process(now, self.alerts)
                await notifier.deliver_due(now)
            except LeaseLost as exc:
                self._lost(exc)
            except StoreError as exc:
                log.error("alert delivery round failed: %s", exc)
        self._publish()

    def _counters(self) -> NotifierCounters | None:
        """The notifier's counters, or None while there is no notifier or its outbox cannot
        be read (the exporter then leaves the outbox's series out)."""
        if self.notifier is None:
            return None
        try:
            return self.notifier.counters(self.clock())
        except StoreError as exc:
            log.warning("outbox counters not read: %s", exc)
            return None

    def _publish(self) -> None:
        r = self._last
        role = None
        if self.shared:
            lead = self.leadership
            role = LeaderRole(
                copy=lead.name if lead else (self.config.serve.name or "unknown"),
                leader=self.notifier is not None and bool(lead and lead.leads()),
                term=(lead.seen.token if lead and lead.seen else 0),
                acquisitions=lead.acquisitions if lead else 0)
        self.exporter.update(Snapshot(
            status=r.status if r else None,
            alerts=tuple(self.alerts),
            counters=self._counters(),
            leadership=role,
            evaluation_ok=(None if not (self.evaluations or self.failures)
                           else not self.last_error),
            evaluation_failures=self.failed_total,
            targets=tuple(r.targets) if r else (),
            evaluation_duration=r.duration if r else None,
            evaluated_at=r.status.get("at") if r else None,
            routes=tuple(x.name for x in self.config.alerts.routes),
            tenant_costs=(top_tenants(self.chargeback.lines, self.config.cost.metrics_tenants,
                                      TENANT_OTHER) if self.chargeback else ()),
            budgets=tuple(self.chargeback.budgets) if self.chargeback else (),
            currency=self.config.cost.currency,
        ))

    def budgets_json(self) -> bytes:
        """``/budgets``: every budget's status as of the last chargeback (``at`` null and no
        budgets before the first), which gateways poll to enforce them."""
        cb = self.chargeback
        return json.dumps({
            "at": cb.at if cb else None, "currency": self.config.cost.currency,
            "budgets": [b.as_dict() for b in cb.budgets] if cb else [],
        }, allow_nan=False).encode()

    @property
    def source(self) -> str:
        """Where the evaluation reads, e.g. ``store vigil.db`` or ``Prometheus http://...
        (PromQL 2)``."""
        return self._evaluator.describe()

    def healthy(self) -> tuple[bool, str]:
        """(ok, text) for ``/healthz``: not ok while the last evaluation failed; both say
        where the evaluation reads."""
        if self.last_error:
            return False, self.last_error
        text = (f"ok: {self.evaluations} evaluations from {self.source}, "
                f"{len(self.alerts)} alerts firing")
        warned = (self._last.status.get("warnings") if self._last is not None else None)
        if warned:
            # Still 200: the evaluation ran, but on what the server could give (or from raw
            # series where the store's recorded ones were expected).
            text += "; warnings: " + "; ".join(warned)
        if self.shared:
            # A standby is healthy: it evaluates, and takes over when the leader goes.
            role = (self.leadership.describe() if self.leadership is not None
                    else f"standby: cannot reach the shared database: {self._lease_error}")
            text += f"; {role}"
        return True, text

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self, scheduler: AsyncIOScheduler) -> None:
        """Open the store (reading it), the outbox and the HTTP server; add every job to
        ``scheduler``."""
        if self.collector is not None:
            await self.collector.open()
        if self.shared:
            # The first try before anything is scheduled: a copy that starts alone leads
            # from its first evaluation.
            await self.lease_once()
        else:
            self.notifier = Notifier(self.config, self.config.outbox_path(), clock=self.clock)
        self._publish()
        if self.config.otlp.listen:
            self._start_otlp()
        host, port = self.listen
        self._http = _http_server(host, port, self.exporter, self.healthy, self.budgets_json)
        self.listen = (host, int(self._http.server_address[1]))
        threading.Thread(target=self._http.serve_forever, name="vigil-http",
                         daemon=True).start()
        now = datetime.now(UTC)
        if self.collector is not None:
            self.collector.schedule(scheduler, now)
        interval = self.config.engine.evaluation_interval
        scheduler.add_job(self._evaluate_job, "interval", seconds=interval,
                          next_run_time=now + timedelta(seconds=interval), id="evaluate",
                          coalesce=True, max_instances=1,
                          misfire_grace_time=max(1, int(interval)))
        scheduler.add_job(self._deliver_job, "interval", seconds=DELIVERY_INTERVAL,
                          next_run_time=now + timedelta(seconds=DELIVERY_INTERVAL),
                          id="deliver", coalesce=True, max_instances=1)
        if self.shared:
            tick = min(1.0, self.config.serve.lease_duration / 3.0)
            scheduler.add_job(self._lease_job, "interval", seconds=tick,
                              next_run_time=now + timedelta(seconds=tick), id="lease",
                              coalesce=True, max_instances=1)

    def _start_otlp(self) -> None:
        """The OTLP receiver on ``[otlp] listen``, its counters on ``/metrics``. Imported
        here: it needs OpenTelemetry's protobuf classes (the ``gateway`` extra)."""
        from serving.otlp.receiver import OtlpCollector, OtlpReceiver

        collector = self.collector
        # Discovered replicas too: an engine's span is placed by the target it came from.
        receiver = OtlpReceiver(self.config, clock=self.clock, targets=(
            (lambda: collector.targets) if collector is not None else None))
        receiver.start()
        try:
            self.otlp_listen = receiver.serve_http(
                *_parse_host_port(self.config.otlp.listen, allow_port_zero=True))
        except BaseException:
            receiver.close()
            raise
        self.otlp = receiver
        self.exporter.registry.register(OtlpCollector(receiver))

    async def stop(self) -> None:
        """After the scheduler stopped: let work under way finish, then close everything."""
        if self.otlp is not None:
            # First: no more exports taken, and every request held is written.
            await asyncio.get_running_loop().run_in_executor(None, self.otlp.close)
        if self.collector is not None:
            await self.collector.finish()
        pending = [t for t in self._tasks.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=SHUTDOWN_GRACE)
        for t in pending:
            if not t.done():
                t.cancel()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        await asyncio.get_running_loop().run_in_executor(self._eval_thread,
                                                         self._evaluator.close)
        self._eval_thread.shutdown(wait=True)
        self._drop_notifier()
        if self.leadership is not None:
            # Released after the last delivery: a standby takes over at its next tick
            # instead of waiting for the lease to run out (a drained node, a rolling update).
            lead = self.leadership
            await asyncio.get_running_loop().run_in_executor(self._lease_thread, lead.release)
            lead.close()
        self._lease_thread.shutdown(wait=True)
        if self.collector is not None:
            await self.collector.close()

    def _outbox_text(self) -> str:
        if not self.shared:
            return str(self.config.outbox_path())
        from vigil.storage.database import redact_url as redact_db_url

        role = self.leadership.describe() if self.leadership else "standby"
        return (f"{redact_db_url(self.config.serve.database)} shared by every copy, "
                f"lease {self.config.serve.lease_duration:g}s; {role}")

    def banner(self) -> str:
        """What runs where, printed at start."""
        cfg = self.config
        host, port = self.listen
        if self.collector is None:
            head = "vigil serve: no collector and no store (Prometheus scrapes the replicas)"
        else:
            found = f" and {len(cfg.discovery)} discovery sources" if cfg.discovery else ""
            head = (f"vigil serve: {len(cfg.targets)} targets{found} every "
                    f"{cfg.collector.scrape_interval:g}s into {cfg.store_path()}")
        lines = [
            head,
            f"  evaluation every {cfg.engine.evaluation_interval:g}s from {self.source}, "
            f"window {cfg.engine.window:g}s",
            f"  alerts: outbox {self._outbox_text()}, {len(cfg.alerts.routes)} routes"
            + "".join(f"\n    {r.name}: {r.format} -> {redact_url(r.url)} match {dict(r.match)}"
                      for r in cfg.alerts.routes),
            f"  metrics: http://{host}:{port}/metrics  health: http://{host}:{port}/healthz",
        ]
        if self.otlp is not None:
            o_host, o_port = self.otlp_listen
            o_host = f"[{o_host}]" if ":" in o_host else o_host
            lines.append(f"  otlp: POST http://{o_host}:{o_port}/v1/traces -> request records "
                         f"in {self.otlp.display}")
        lines.append("  (SIGTERM or Ctrl-C stops)")
        return "\n".join(lines)


async def serve(config: Config, listen: tuple[str, int],
                stop: asyncio.Event | None = None, *, prometheus_url: str | None = None) -> int:
    """Run until ``stop`` is set or SIGTERM/SIGINT arrives; returns the exit code.
    ``prometheus_url``: ``Server``'s."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = Server(config, listen=listen, prometheus_url=prometheus_url)
    scheduler = AsyncIOScheduler(timezone=UTC)
    try:
        await server.start(scheduler)
        scheduler.start()
        print(server.banner(), flush=True)
        await stop.wait()
        print("vigil serve: stopping", flush=True)
    finally:
        if scheduler.running:
            scheduler.shutdown(wait=False)
        await server.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    scrapes = f"{server.collector.scrapes} scrapes and " if server.collector else ""
    print(f"vigil serve: stopped after {scrapes}{server.evaluations} evaluations", flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    """`vigil serve --config F [--listen HOST:PORT] [--allow-remote] [--prometheus-url URL]`."""
    from vigil.config import load_config

    config = load_config(args.config)
    listen = parse_listen(args.listen, allow_remote=args.allow_remote)
    url = (getattr(args, "prometheus_url", None) or config.engine.prometheus_url).rstrip("/")
    if url:
        from vigil.config.base import USE_BASIC_AUTH, refuse_password

        try:
            check_http_url(refuse_password(url, "the URL", USE_BASIC_AUTH))
        except ValueError as exc:
            raise ConfigError(f"--prometheus-url: {exc}") from None
    elif not config.targets and not config.discovery:
        raise ConfigError("no [[targets]] or [[discovery]] to scrape (or give "
                          "[engine] prometheus_url to read a Prometheus that scrapes them)",
                          file=args.config, key="targets")
    return asyncio.run(serve(config, listen, prometheus_url=url))


def main(argv: list[str] | None = None) -> int:
    """``python -m vigil_shell.serve ARGS``: exactly ``vigil serve ARGS``."""
    import sys

    from vigil_shell.cli import main as vigil_main

    return vigil_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
