"""The gateway's own ``/metrics`` (prometheus_client, a registry of its own).

Counters and histograms are updated as requests finish; series that describe a current state
(queue depth per tier, replica health, outstanding requests, KV usage, the record writer's
dropped, buffered and rejected records and failed writes, the semantic cache's size and shared
entries) are read at scrape time by
``_StateCollector`` from the objects that hold that state, so nothing has to keep them in
sync. Names and labels are in ``vigil.conventions`` (Gateway section).

Each labelled series is reached through ``Family.labels``, which remembers its children:
prometheus_client's own ``labels`` takes a lock and checks the label values on every call, and
every request asks for the same few children again (half a dozen per request on the hot path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from serving.gateway.upstream.replicas import Replica
from vigil.conventions import (
    GATEWAY_LATENCY_BUCKETS,
    LABEL_ENDPOINT,
    LABEL_ERROR_CLASS,
    LABEL_OUTCOME,
    LABEL_PHASE,
    LABEL_POOL,
    LABEL_REASON,
    LABEL_REPLICA,
    LABEL_RESULT,
    LABEL_STATUS,
    LABEL_TIER,
    LABEL_TOKEN_TYPE,
    METRIC_GW_CACHE_ENTRIES,
    METRIC_GW_CACHE_LOOKUP_SECONDS,
    METRIC_GW_CACHE_LOOKUPS,
    METRIC_GW_CACHE_SHARED,
    METRIC_GW_CANCELLATIONS,
    METRIC_GW_COST,
    METRIC_GW_E2E,
    METRIC_GW_QUEUE_DEPTH,
    METRIC_GW_QUEUE_WAIT,
    METRIC_GW_RECORD_WRITE_FAILURES,
    METRIC_GW_RECORDS_BUFFERED,
    METRIC_GW_RECORDS_DROPPED,
    METRIC_GW_RECORDS_REJECTED,
    METRIC_GW_REJECTIONS,
    METRIC_GW_REPLICA_KV_USAGE,
    METRIC_GW_REPLICA_OUTSTANDING,
    METRIC_GW_REPLICA_UP,
    METRIC_GW_REQUESTS,
    METRIC_GW_SAVED,
    METRIC_GW_TOKENS,
    METRIC_GW_TTFT,
    METRIC_GW_UPSTREAM_ERRORS,
)

__all__ = ["Family", "GatewayMetrics"]

_M = TypeVar("_M", Counter, Histogram)

#: Cache lookups take milliseconds (embedding + search), not seconds.
_CACHE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0)
_QUEUE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: Sources of the scrape-time gauges: queue depth by (pool, tier), the replicas, the record
#: writer's counts.
QueueDepth = Callable[[], Mapping[tuple[str, str], int]]


class Family(Generic[_M]):
    """A labelled metric whose children are looked up once per label values."""

    __slots__ = ("_children", "metric")

    def __init__(self, metric: _M) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        """The child for ``values`` (in the metric's label order), as ``metric.labels``."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class _StateCollector(Collector):
    def __init__(self, depth: QueueDepth, replicas: Callable[[], Iterable[Replica]],
                 dropped: Callable[[], int], buffered: Callable[[], int],
                 write_failures: Callable[[], int], rejected: Callable[[], int],
                 cache: Callable[[], Any]) -> None:
        self._depth = depth
        self._cache = cache
        self._replicas = replicas
        self._dropped = dropped
        self._buffered = buffered
        self._write_failures = write_failures
        self._rejected = rejected

    def collect(self) -> Iterable[Metric]:
        depth = GaugeMetricFamily(METRIC_GW_QUEUE_DEPTH,
                                  "Requests waiting at the gateway (batch: in the batch queue "
                                  "too), by pool and tier.", labels=[LABEL_POOL, LABEL_TIER])
        for (pool, tier), n in sorted(self._depth().items()):
            depth.add_metric([pool, tier], n)
        up = GaugeMetricFamily(METRIC_GW_REPLICA_UP, "1 if the replica passes health checks.",
                               labels=[LABEL_POOL, LABEL_REPLICA])
        outstanding = GaugeMetricFamily(METRIC_GW_REPLICA_OUTSTANDING,
                                        "Requests the gateway has in flight on the replica.",
                                        labels=[LABEL_POOL, LABEL_REPLICA])
        kv = GaugeMetricFamily(METRIC_GW_REPLICA_KV_USAGE,
                               "The replica's KV-cache usage at the last poll (ratio 0-1).",
                               labels=[LABEL_POOL, LABEL_REPLICA])
        for r in self._replicas():
            up.add_metric([r.pool, r.name], 1.0 if r.healthy else 0.0)
            outstanding.add_metric([r.pool, r.name], r.outstanding)
            if r.kv_usage is not None:
                kv.add_metric([r.pool, r.name], r.kv_usage)
        dropped = GaugeMetricFamily(METRIC_GW_RECORDS_DROPPED,
                                    "Request records lost because the writer fell behind.")
        dropped.add_metric([], self._dropped())
        buffered = GaugeMetricFamily(METRIC_GW_RECORDS_BUFFERED,
                                     "Request records held in memory, not written yet (the "
                                     "database is slow or unreachable).")
        buffered.add_metric([], self._buffered())
        failures = CounterMetricFamily(METRIC_GW_RECORD_WRITE_FAILURES,
                                       "Failed attempts to write a batch of request records "
                                       "(the batch is kept and retried).")
        failures.add_metric([], self._write_failures())
        rejected = CounterMetricFamily(METRIC_GW_RECORDS_REJECTED,
                                       "Request records dropped because the database refused "
                                       "them (logged with their ids).")
        rejected.add_metric([], self._rejected())
        return [depth, up, outstanding, kv, dropped, buffered, failures, rejected,
                *self._cache_families()]

    def _cache_families(self) -> list[Metric]:
        """The semantic cache's size and its shared entries by outcome; none when it is off."""
        stats = self._cache()
        if stats is None:
            return []
        entries = GaugeMetricFamily(METRIC_GW_CACHE_ENTRIES,
                                    "Entries the semantic cache holds on this instance.")
        entries.add_metric([], stats.entries)
        shared = CounterMetricFamily(METRIC_GW_CACHE_SHARED,
                                     "Cache entries shared through the gateway database: "
                                     "written by this instance, applied from the others, "
                                     "dropped (not written) and rejected by the database.",
                                     labels=[LABEL_OUTCOME])
        # CacheStats.shared_dropped includes the rejected ones: each entry counts once here.
        for outcome, n in (("written", stats.shared_written), ("applied", stats.shared_applied),
                           ("dropped", stats.shared_dropped - stats.shared_rejected),
                           ("rejected", stats.shared_rejected)):
            shared.add_metric([outcome], n)
        return [entries, shared]


class GatewayMetrics:
    """Every gateway series, in ``self.registry``.

    ``dropped``, ``buffered``, ``write_failures`` and ``rejected`` read the record writer's
    counts (records; failed attempts) at scrape time; ``cache`` the semantic cache's
    ``CacheStats`` (None: the cache is off).
    """

    def __init__(self, *, depth: QueueDepth, replicas: Callable[[], Iterable[Replica]],
                 dropped: Callable[[], int], buffered: Callable[[], int],
                 write_failures: Callable[[], int], rejected: Callable[[], int],
                 cache: Callable[[], Any] = lambda: None,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Family(Counter(
            METRIC_GW_REQUESTS, "Finished requests by tier and HTTP status.",
            [LABEL_POOL, LABEL_TIER, LABEL_ENDPOINT, LABEL_STATUS], registry=r))
        self.ttft = Family(Histogram(
            METRIC_GW_TTFT, "Time to first token seen at the gateway (streaming requests), "
            "seconds.", [LABEL_POOL, LABEL_TIER], buckets=GATEWAY_LATENCY_BUCKETS, registry=r))
        self.e2e = Family(Histogram(
            METRIC_GW_E2E, "End-to-end latency of served requests at the gateway, seconds.",
            [LABEL_POOL, LABEL_TIER], buckets=GATEWAY_LATENCY_BUCKETS, registry=r))
        self.queue_wait = Family(Histogram(
            METRIC_GW_QUEUE_WAIT, "Time waited at the gateway's admission before going "
            "upstream, seconds.", [LABEL_POOL, LABEL_TIER], buckets=_QUEUE_BUCKETS,
            registry=r))
        self.tokens = Family(Counter(
            METRIC_GW_TOKENS, "Tokens of served requests.",
            [LABEL_POOL, LABEL_TIER, LABEL_TOKEN_TYPE], registry=r))
        self.cache_lookups = Family(Counter(
            METRIC_GW_CACHE_LOOKUPS, "Semantic cache outcomes: hit_l1, hit_l2, miss, bypass.",
            [LABEL_POOL, LABEL_RESULT], registry=r))
        self.cache_seconds = Family(Histogram(
            METRIC_GW_CACHE_LOOKUP_SECONDS, "Semantic cache lookup latency, seconds.",
            [LABEL_POOL], buckets=_CACHE_BUCKETS, registry=r))
        self.rejections = Family(Counter(
            METRIC_GW_REJECTIONS, "Requests refused by the gateway.",
            [LABEL_POOL, LABEL_TIER, LABEL_REASON], registry=r))
        self.cancellations = Family(Counter(
            METRIC_GW_CANCELLATIONS, "Requests whose client went away (the upstream request "
            "was cancelled).", [LABEL_POOL, LABEL_TIER, LABEL_PHASE], registry=r))
        self.upstream_errors = Family(Counter(
            METRIC_GW_UPSTREAM_ERRORS, "Upstream failures: timeout, upstream_5xx, oom.",
            [LABEL_POOL, LABEL_REPLICA, LABEL_ERROR_CLASS], registry=r))
        self.cost = Family(Counter(
            METRIC_GW_COST, "GPU cost attributed to requests (USD).", [LABEL_POOL, LABEL_TIER],
            registry=r))
        self.saved = Family(Counter(
            METRIC_GW_SAVED, "GPU cost the semantic cache saved (USD).",
            [LABEL_POOL, LABEL_TIER], registry=r))
        r.register(_StateCollector(depth, replicas, dropped, buffered, write_failures,
                                   rejected, cache))
