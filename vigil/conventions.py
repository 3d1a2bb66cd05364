"""Every generated name in one place: label names, synthetic series, paths, defaults.

Nothing else in the code base spells these strings; import them from here.
"""

from __future__ import annotations

# --- labels the collector adds to every stored series --------------------------------------
LABEL_INSTANCE = "instance"  # the target's name from config
LABEL_POOL = "pool"
LABEL_KIND = "kind"  # "vllm" | "dcgm"
TARGET_LABELS = (LABEL_INSTANCE, LABEL_POOL, LABEL_KIND)
#: Like Prometheus with honor_labels=false: a scraped label that clashes gets this prefix.
EXPORTED_PREFIX = "exported_"

# --- series the collector writes for every scrape, like Prometheus --------------------------
SERIES_UP = "up"
SERIES_SCRAPE_DURATION = "scrape_duration_seconds"
SERIES_SCRAPE_SAMPLES = "scrape_samples_scraped"
SCRAPE_SERIES = (SERIES_UP, SERIES_SCRAPE_DURATION, SERIES_SCRAPE_SAMPLES)

# --- target kinds ---------------------------------------------------------------------------
KIND_VLLM = "vllm"
KIND_DCGM = "dcgm"
TARGET_KINDS = (KIND_VLLM, KIND_DCGM)

# --- vLLM metric names (vLLM 0.33 V1) --------------------------------------------------------
VLLM_PREFIX = "vllm:"
#: prometheus_client >= 0.22 escapes ':' to '_' in OpenMetrics sample names (client_python#1177).
VLLM_ESCAPED_PREFIX = "vllm_"

# --- simulator layout -----------------------------------------------------------------------
#: Each simulated replica serves its DCGM-exporter-style endpoint on its own port at this path
#: (a real dcgm-exporter listens on :9400/metrics; one port per replica keeps the demo simple).
SIM_DCGM_PATH = "/dcgm/metrics"

# --- HTTP -----------------------------------------------------------------------------------
#: The scraper asks for the classic text format so that vLLM's names keep their ':'.
SCRAPE_ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
USER_AGENT = "vigil-collector/0.1"

# --- SLO engine (slo/): the vLLM series it reads and the names it generates ----------------
# vLLM 0.33 V1 names (see /work/shared/fixtures/vllm_metrics_reference.md, section 2).
#: Histograms (base names: the engine appends ``_bucket``/``_sum``/``_count``).
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_E2E = "vllm:e2e_request_latency_seconds"
VLLM_QUEUE_TIME = "vllm:request_queue_time_seconds"
VLLM_ITL = "vllm:inter_token_latency_seconds"
VLLM_PROMPT_TOKENS_HIST = "vllm:request_prompt_tokens"
VLLM_GENERATION_TOKENS_HIST = "vllm:request_generation_tokens"
#: Counters and gauges (full sample names).
VLLM_REQUEST_SUCCESS = "vllm:request_success_total"
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
VLLM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_REQUESTS_RUNNING = "vllm:num_requests_running"
#: vLLM's labels.
LABEL_MODEL_NAME = "model_name"
LABEL_FINISHED_REASON = "finished_reason"
LABEL_LE = "le"
#: The ``finished_reason`` that is a server-side failure (HTTP 500); the others are not errors.
FINISHED_REASON_ERROR = "error"
#: Histogram sample suffixes.
SUFFIX_BUCKET = "_bucket"
SUFFIX_SUM = "_sum"
SUFFIX_COUNT = "_count"

#: SLO indicators and the seed SLO names ``<pool>-<suffix>`` (one per indicator, in this order).
SLO_INDICATORS = ("ttft", "e2e", "error_rate", "availability")
SLO_NAME_SUFFIXES = {
    "ttft": "ttft", "e2e": "e2e", "error_rate": "error-rate", "availability": "availability",
}
LATENCY_INDICATORS = ("ttft", "e2e")
#: The endpoint value meaning "every endpoint together" (vLLM's own metrics have no endpoint).
ENDPOINT_ALL = "all"
#: ``"source"`` of the status JSON.
SOURCE_EMBEDDED = "embedded"
SOURCE_PROMETHEUS = "prometheus"
#: ``"kind"`` of an anomaly entry.
ANOMALY_HISTOGRAM_LOWER_BOUND = "histogram_lower_bound"
ANOMALY_REQUEST = "request"
