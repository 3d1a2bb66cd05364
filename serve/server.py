"""The runtime of `vigil serve`: collector, SLO evaluation, alerting and the exporter in one
process.

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

import asyncio
import json
import logging
import signal
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from alerts.conditions import ConditionState, evaluate_conditions
from alerts.exporter import Exporter, LeaderRole, Snapshot
from alerts.leadership import Leadership
from alerts.model import Alert
from alerts.notifier import Notifier, NotifierCounters, redact_url
from serve.evaluation import (
    ChargebackResult,
    EvaluationResult,
    Evaluator,
    PrometheusEvaluator,
    StoreEvaluator,
)
from serve.http import http_server
from slo.cost.ledger import top_tenants
from vigil.clock import Clock, system_clock
from vigil.config import Config
from vigil.conventions import (
    TENANT_OTHER,
)
from vigil.errors import LeaseLost, SourceError, StoreError
from vigil.http_server import parse_listen

__all__ = ["DELIVERY_INTERVAL", "SHUTDOWN_GRACE", "Server", "serve_until_stopped"]

log = logging.getLogger("vigil.serve")

#: Seconds between delivery rounds (retries are due at whole-second granularity anyway).
DELIVERY_INTERVAL = 1.0
#: How long shutdown waits for in-flight evaluation and deliveries (seconds).
SHUTDOWN_GRACE = 15.0


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
        self._evaluator: Evaluator
        if url:
            self.collector: Any = None
            self._evaluator = PrometheusEvaluator(config, url)
        else:
            from collector.service import Collector

            self.collector = Collector(config, clock=clock)
            self._evaluator = StoreEvaluator(config)
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
        self._http = http_server(host, port, self.exporter, self.healthy, self.budgets_json)
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
                *parse_listen(self.config.otlp.listen, allow_port_zero=True))
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


async def serve_until_stopped(config: Config, listen: tuple[str, int],
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


