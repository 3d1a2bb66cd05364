"""vLLM 0.33's ``/metrics`` families on a per-replica ``CollectorRegistry``.

Every family of ``tests/fixtures/vllm_v1_metrics_sample.txt`` is declared as vLLM 0.33 declares it
in ``vllm/v1/metrics/loggers.py``: name, type, HELP text, label names and bucket boundaries. Each
replica has its own registry (never prometheus_client's global one) with its own process,
platform and GC collectors, so replicas in one process do not share counters and a restart
starts from zero.

When values are recorded (the invariants of the fixture README hold at every scrape):

- ``request_success`` and every per-request histogram (e2e, queue, prefill, decode, inference,
  prompt/generation tokens, TPOT, params, preemptions, prefill_kv_computed) when a request
  finishes with ``stop`` or ``length``; so each ``_count`` equals the sum of ``request_success``.
- TTFT, ``prompt_tokens`` and ``prompt_tokens_by_source`` at a request's first token;
  ``generation_tokens`` and ITL at every output; ``iteration_tokens_total`` once per step with
  the computed prompt tokens of prefills completing in that step plus the generated tokens.
- ``prefix_cache_queries/hits`` and ``prompt_tokens_cached_by_source{source="device"}`` at each
  admission to the batch (again after a preemption); ``num_preemptions`` at each preemption.

**Client disconnects are not counted**, exactly as in vLLM: a request aborted because its
client went away bypasses statistics (``OutputProcessor.abort_requests``; vllm-project/vllm#31503),
so ``request_success{finished_reason="abort"}`` does not move and the aborted request appears in
no per-request histogram - although its tokens already generated stay counted in
``generation_tokens`` and its TTFT, if it had one, in the TTFT histogram.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from slo.planning.replica.engine import EngineGauges, SpecDecodeConfig
from slo.planning.replica.profiles import Profile
from slo.planning.replica.request import EngineRequest
from vigil.conventions import (
    VLLM_BUCKET_FAMILY_REQUEST_LATENCY,
    VLLM_BUCKET_FAMILY_TTFT,
    VLLM_FINISHED_REASONS,
    VLLM_INTER_TOKEN_LATENCY_BUCKETS,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_TTFT_BUCKETS,
)

__all__ = [
    "E2E_BUCKETS",
    "ITERATION_TOKENS_BUCKETS",
    "ITL_BUCKETS",
    "TTFT_BUCKETS",
    "VllmMetrics",
    "build_1_2_5_buckets",
    "cache_config_labels",
    "new_replica_registry",
]

# Bucket lists of vllm/v1/metrics/buckets.py (0.33); the latency ones are defined once in
# vigil.conventions (the two that --custom-histogram-buckets can replace are the ones the SLO
# rules rely on).
E2E_BUCKETS = VLLM_REQUEST_LATENCY_BUCKETS
TTFT_BUCKETS = VLLM_TTFT_BUCKETS
ITL_BUCKETS = VLLM_INTER_TOKEN_LATENCY_BUCKETS
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)

FINISHED_REASONS = VLLM_FINISHED_REASONS
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


class _ReplicaProcessCollector(ProcessCollector):
    """The process collector, with ``process_start_time_seconds`` = the replica's start.

    All replicas share one OS process; a replica restart must still look like a new process.
    """

    def __init__(self, start_time: float, registry: CollectorRegistry) -> None:
        self._replica_start = start_time
        super().__init__(registry=registry)

    def collect(self) -> Iterable[Metric]:
        for metric in super().collect():
            if metric.name == "process_start_time_seconds":
                yield GaugeMetricFamily(metric.name, metric.documentation,
                                        value=self._replica_start)
            else:
                yield metric


def new_replica_registry(start_time: float) -> CollectorRegistry:
    """A fresh registry with the default process, platform and GC collectors on it."""
    registry = CollectorRegistry()
    _ReplicaProcessCollector(start_time, registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def cache_config_labels(profile: Profile, *, enable_prefix_caching: bool = True) -> dict[str, str]:
    """``vllm:cache_config_info``'s labels (every ``CacheConfig`` field in 0.33, plus engine)."""
    return {
        "_block_size_resolved": "True",
        "block_size": str(profile.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": str(profile.block_size),
        "effective_attention_block_size": str(profile.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(enable_prefix_caching),
        "engine": "0",
        "gpu_memory_utilization": str(profile.gpu_memory_utilization),
        "hash_block_size": str(profile.block_size),
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(profile.kv_cache_max_concurrency),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(profile.kv_cache_size_tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(profile.num_gpu_blocks),
        "num_gpu_blocks_override": str(profile.num_gpu_blocks_override),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "simple_cpu_offload_num_blocks": "None",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


class VllmMetrics:
    """The ``vllm:*`` families of one engine, recording what the engine observes.

    Implements ``slo.planning.replica.engine.EngineObserver``. ``registry`` is the replica's own.
    ``spec_decode`` adds the ``vllm:spec_decode_*`` families; ``max_loras`` (LoRA enabled) adds
    ``vllm:lora_requests_info``.
    """

    def __init__(self, registry: CollectorRegistry, *, model_name: str, profile: Profile,
                 engine_index: str = "0", spec_decode: SpecDecodeConfig | None = None,
                 max_loras: int | None = None, enable_prefix_caching: bool = True,
                 custom_buckets: Mapping[str, Sequence[float]] | None = None) -> None:
        self.registry = registry
        r = registry
        base = ["model_name", "engine"]
        lv = {"model_name": model_name, "engine": engine_index}
        request_tokens = build_1_2_5_buckets(profile.max_model_len)
        # vLLM's --custom-histogram-buckets: a family's list replaces its default bounds.
        custom = dict(custom_buckets or {})
        ttft_buckets = custom.get(VLLM_BUCKET_FAMILY_TTFT, TTFT_BUCKETS)
        latency_buckets = custom.get(VLLM_BUCKET_FAMILY_REQUEST_LATENCY, E2E_BUCKETS)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, base, registry=r)

        def gauge(name: str, doc: str, extra: Sequence[str] = ()) -> Gauge:
            return Gauge(name, doc, [*base, *extra], registry=r)

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, base, buckets=buckets, registry=r)

        # Spec decode first, then MFU counters, then the scheduler/engine families: the order
        # vLLM 0.33 registers them in.
        self._spec_k = spec_decode.num_speculative_tokens if spec_decode else 0
        if spec_decode is not None:
            self.spec_drafts = counter("vllm:spec_decode_num_drafts",
                                       "Number of spec decoding drafts.").labels(**lv)
            self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens",
                                             "Number of draft tokens.").labels(**lv)
            self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens",
                                         "Number of accepted tokens.").labels(**lv)
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted tokens per draft position.", [*base, "position"],
                              registry=r)
            self.spec_accepted_per_pos = [per_pos.labels(**lv, position=str(p))
                                          for p in range(self._spec_k)]

        mfu_doc = " per GPU (for Model Flops Utilization calculations)."
        for name, what in (("vllm:estimated_flops_per_gpu_total",
                            "Estimated number of floating point operations"),
                           ("vllm:estimated_read_bytes_per_gpu_total",
                            "Estimated number of bytes read from memory"),
                           ("vllm:estimated_write_bytes_per_gpu_total",
                            "Estimated number of bytes written to memory")):
            counter(name, what + mfu_doc).labels(**lv)  # stays 0 without --enable-mfu-metrics

        self.running = gauge("vllm:num_requests_running",
                             "Number of requests in model execution batches.").labels(**lv)
        self.waiting = gauge("vllm:num_requests_waiting",
                             "Number of requests waiting to be processed.").labels(**lv)
        by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            ["reason"])
        self.waiting_capacity = by_reason.labels(**lv, reason="capacity")
        self.waiting_deferred = by_reason.labels(**lv, reason="deferred")
        sleep = gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.", ["sleep_state"])
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(**lv, sleep_state=state).set(value)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.").labels(**lv)

        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.").labels(**lv)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.").labels(**lv)
        ext = "from KV connector cross-instance cache sharing, in terms of number of"
        counter("vllm:external_prefix_cache_queries",
                f"External prefix cache queries {ext} queried tokens.").labels(**lv)
        counter("vllm:external_prefix_cache_hits",
                f"External prefix cache hits {ext} cached tokens.").labels(**lv)
        counter("vllm:mm_cache_queries",
                "Multi-modal cache queries, in terms of number of queried items.").labels(**lv)
        counter("vllm:mm_cache_hits",
                "Multi-modal cache hits, in terms of number of cached items.").labels(**lv)
        self.preemptions = counter("vllm:num_preemptions",
                                   "Cumulative number of preemption from the engine.").labels(**lv)
        self.prompt_tokens = counter("vllm:prompt_tokens",
                                     "Number of prefill tokens processed.").labels(**lv)
        by_source = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                            [*base, "source"], registry=r)
        self.prompt_by_source = {s: by_source.labels(**lv, source=s) for s in PROMPT_SOURCES}
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).").labels(**lv)
        cached_by_source = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.", [*base, "source"], registry=r)
        self.cached_by_source = {s: cached_by_source.labels(**lv, source=s)
                                 for s in CACHED_SOURCES}
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.").labels(**lv)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*base, "finished_reason"], registry=r)
        self.success = {f: success.labels(**lv, finished_reason=f) for f in FINISHED_REASONS}
        rejections = Counter("vllm:admission_rejections",
                             "Number of admission attempts rejected by a queue limit, by reason.",
                             ["model_name", "reason"], registry=r)
        self.admission_rejections = {
            reason: rejections.labels(model_name=model_name, reason=reason)
            for reason in ("max_num_queued_reqs", "max_num_queued_tokens")}

        self.h_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                             request_tokens).labels(**lv)
        self.h_generation = hist("vllm:request_generation_tokens",
                                 "Number of generation tokens processed.",
                                 request_tokens).labels(**lv)
        self.h_iteration = hist("vllm:iteration_tokens_total",
                                "Histogram of number of tokens per engine_step.",
                                ITERATION_TOKENS_BUCKETS).labels(**lv)
        self.h_max_gen = hist("vllm:request_max_num_generation_tokens",
                              "Histogram of maximum number of requested generation tokens.",
                              request_tokens).labels(**lv)
        self.h_n = hist("vllm:request_params_n", "Histogram of the n request parameter.",
                        PARAMS_N_BUCKETS).labels(**lv)
        self.h_max_tokens = hist("vllm:request_params_max_tokens",
                                 "Histogram of the max_tokens request parameter.",
                                 request_tokens).labels(**lv)
        self.h_ttft = hist("vllm:time_to_first_token_seconds",
                           "Histogram of time to first token in seconds.",
                           ttft_buckets).labels(**lv)
        self.h_itl = hist("vllm:inter_token_latency_seconds",
                          "Histogram of inter-token latency in seconds.", ITL_BUCKETS).labels(**lv)
        self.h_tpot = hist("vllm:request_time_per_output_token_seconds",
                           "Histogram of time_per_output_token_seconds per request.",
                           ITL_BUCKETS).labels(**lv)
        self.h_e2e = hist("vllm:e2e_request_latency_seconds",
                          "Histogram of e2e request latency in seconds.",
                          latency_buckets).labels(**lv)
        self.h_queue = hist("vllm:request_queue_time_seconds",
                            "Histogram of time spent in WAITING phase for request.",
                            latency_buckets).labels(**lv)
        self.h_inference = hist("vllm:request_inference_time_seconds",
                                "Histogram of time spent in RUNNING phase for request.",
                                latency_buckets).labels(**lv)
        self.h_prefill = hist("vllm:request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.",
                              latency_buckets).labels(**lv)
        self.h_decode = hist("vllm:request_decode_time_seconds",
                             "Histogram of time spent in DECODE phase for request.",
                             latency_buckets).labels(**lv)
        self.h_preemptions = hist("vllm:request_num_preemptions",
                                  "Histogram of the number of times a request was preempted.",
                                  NUM_PREEMPTIONS_BUCKETS).labels(**lv)
        self.h_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            request_tokens).labels(**lv)

        self._lora: Gauge | None = None
        self._max_loras = max_loras
        self._lora_labels: tuple[str, str] | None = None
        self._lora_stamp = 0.0
        if max_loras is not None:
            # No model_name/engine labels; every label combination ever seen stays exported.
            self._lora = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                               ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
                               registry=r)
            self._set_lora((), ())

        info = cache_config_labels(profile, enable_prefix_caching=enable_prefix_caching)
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
              list(info), registry=r).labels(**info).set(1)

    # --- EngineObserver -----------------------------------------------------------------------

    def on_admitted(self, req: EngineRequest, queried_tokens: int, hit_tokens: int) -> None:
        if req.num_preemptions:
            # vLLM counts a preempted request's re-admission apart (its own blocks are often
            # still cached) and leaves it out of vllm:prefix_cache_queries/hits.
            return
        self.prefix_queries.inc(queried_tokens)
        self.prefix_hits.inc(hit_tokens)
        self.cached_by_source["device"].inc(hit_tokens)

    def on_preempted(self, req: EngineRequest) -> None:
        self.preemptions.inc()

    def on_output(self, req: EngineRequest, num_tokens: int, first: bool,
                  latency: float) -> None:
        self.generation_tokens.inc(num_tokens)
        if first:
            self.h_ttft.observe(latency)
            cached = min(req.cached_tokens, req.prompt_len)
            self.prompt_tokens.inc(req.prompt_len)
            self.prompt_by_source["local_compute"].inc(req.prompt_len - cached)
            self.prompt_by_source["local_cache_hit"].inc(cached)
            self.prompt_cached.inc(cached)
        else:
            self.h_itl.observe(latency)

    def on_spec_decode(self, num_drafts: int, num_draft_tokens: int,
                       accepted_per_pos: Sequence[int]) -> None:
        if not self._spec_k:
            return
        self.spec_drafts.inc(num_drafts)
        self.spec_draft_tokens.inc(num_draft_tokens)
        self.spec_accepted.inc(sum(accepted_per_pos))
        for child, n in zip(self.spec_accepted_per_pos, accepted_per_pos, strict=True):
            if n:
                child.inc(n)

    def on_iteration(self, num_tokens: int) -> None:
        self.h_iteration.observe(num_tokens)

    def on_finished(self, req: EngineRequest, now: float) -> None:
        reason = req.finish_reason or "stop"
        self.success[reason].inc()
        arrival = req.arrival_time
        scheduled = req.first_scheduled_time if req.first_scheduled_time is not None else arrival
        first = req.first_token_time if req.first_token_time is not None else now
        last = req.last_token_time if req.last_token_time is not None else now
        gen = req.num_generated
        decode = last - first
        self.h_prompt.observe(req.prompt_len)
        self.h_generation.observe(gen)
        self.h_max_gen.observe(gen)  # n == 1: the max over samples is the one sample
        self.h_n.observe(1)
        self.h_max_tokens.observe(req.max_tokens)
        self.h_e2e.observe(last - arrival)
        self.h_queue.observe(scheduled - arrival)
        self.h_prefill.observe(first - scheduled)
        self.h_decode.observe(decode)
        self.h_inference.observe(last - scheduled)
        self.h_tpot.observe(decode / (gen - 1) if gen > 1 else 0.0)
        self.h_preemptions.observe(req.num_preemptions)
        self.h_kv_computed.observe(req.prompt_len - min(req.cached_tokens, req.prompt_len))

    def on_gauges(self, gauges: EngineGauges) -> None:
        self.running.set(gauges.running)
        self.waiting.set(gauges.waiting)
        self.waiting_capacity.set(gauges.waiting - gauges.deferred)
        self.waiting_deferred.set(gauges.deferred)
        self.kv_usage.set(gauges.kv_usage)
        if self._lora is not None:
            self._set_lora(gauges.running_loras, gauges.waiting_loras)

    # --- API-server side ----------------------------------------------------------------------

    def record_rejection(self, reason: str) -> None:
        """A 503 from ``--max-num-queued-reqs`` / ``--max-num-queued-tokens``."""
        self.admission_rejections[reason].inc()

    def _set_lora(self, running: Sequence[str], waiting: Sequence[str]) -> None:
        if self._lora is None:
            return
        labels = (",".join(running), ",".join(waiting))
        now = time.time()
        # vLLM stamps the current combination on every stats update; doing it only when it
        # changes or once a second keeps the per-step cost low and the value as fresh as a scrape.
        if labels == self._lora_labels and now - self._lora_stamp < 1.0:
            return
        self._lora_labels = labels
        self._lora_stamp = now
        self._lora.labels(max_lora=str(self._max_loras), running_lora_adapters=labels[0],
                          waiting_lora_adapters=labels[1]).set(now)
