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

# --- Alerts (alerts/): alert labels, annotations, delivery headers and formats --------------
# Alertmanager's reserved label; every alert carries it (and the four below).
LABEL_ALERTNAME = "alertname"
LABEL_SEVERITY = "severity"
#: The model label of an alert (the pool's model); ``pool`` is ``LABEL_POOL`` above.
LABEL_MODEL = "model"
LABEL_SLO = "slo"
ALERT_LABELS = (LABEL_ALERTNAME, LABEL_SEVERITY, LABEL_POOL, LABEL_MODEL, LABEL_SLO)
SEVERITY_PAGE = "page"
SEVERITY_TICKET = "ticket"
#: Annotations: a one-line summary, a description with the values, a dashboard link.
ANNOTATION_SUMMARY = "summary"
ANNOTATION_DESCRIPTION = "description"
ANNOTATION_DASHBOARD_URL = "dashboard_url"
ANNOTATION_RUNBOOK_URL = "runbook_url"
#: Optional annotations that Slack shows as fields ("1.42 s", "< 0.8 s").
ANNOTATION_OBSERVED = "observed"
ANNOTATION_OBJECTIVE = "objective"
ALERT_FIRING = "firing"
ALERT_RESOLVED = "resolved"
#: Route formats (``[[alerts.routes]] format``).
FORMAT_GENERIC = "generic"
FORMAT_SLACK = "slack"
FORMAT_ALERTMANAGER = "alertmanager"
FORMAT_ALERTMANAGER_API = "alertmanager_api"
#: ``"version"`` of the generic JSON payload (docs/alerts.md documents the schema).
GENERIC_PAYLOAD_VERSION = "1"
#: ``"version"`` of Alertmanager's webhook payload that the ``alertmanager`` format speaks.
ALERTMANAGER_WEBHOOK_VERSION = "4"
#: The path of Alertmanager's alert-ingest API (a route's url for ``alertmanager_api``).
ALERTMANAGER_API_ALERTS_PATH = "/api/v2/alerts"
#: Delivery headers: HMAC-SHA256 of the body, the notification's key, the attempt number.
HEADER_SIGNATURE = "X-Vigil-Signature"
SIGNATURE_PREFIX = "sha256="
HEADER_IDEMPOTENCY_KEY = "Idempotency-Key"
HEADER_ATTEMPT = "X-Vigil-Attempt"
ALERTS_USER_AGENT = "vigil-notifier/0.1"
#: Outbox row states: waiting or retrying; acknowledged (2xx); older than max_age, dropped;
#: replaced by a newer snapshot of the same stream (``alertmanager_api`` only).
OUTBOX_PENDING = "pending"
OUTBOX_DONE = "done"
OUTBOX_GIVEN_UP = "given_up"
OUTBOX_SUPERSEDED = "superseded"

# --- Prometheus rules (alerts/rules*.py, alerts/keda.py: `vigil rules prometheus|keda`) ------
# Recording rules, with the names Sloth users know. ``{window}`` is a Prometheus duration
# ("5m", "1d", "30d"). Every ``slo:*`` series carries LABEL_SLO, LABEL_POOL, LABEL_MODEL_NAME.
RULE_SLI_ERROR = "slo:sli_error:ratio_rate{window}"
RULE_OBJECTIVE = "slo:objective:ratio"
RULE_ERROR_BUDGET = "slo:error_budget:ratio"
RULE_TIME_PERIOD_DAYS = "slo:time_period:days"
RULE_CURRENT_BURN_RATE = "slo:current_burn_rate:ratio"
RULE_PERIOD_BURN_RATE = "slo:period_burn_rate:ratio"
RULE_PERIOD_BUDGET_REMAINING = "slo:period_error_budget_remaining:ratio"
#: Per pool and model (LABEL_POOL, LABEL_MODEL_NAME): ``{signal}`` is a key of
#: slo.quantiles.LATENCY_HISTOGRAMS ("ttft_seconds", "e2e_seconds"), ``{quantile}`` "p95".
RULE_QUANTILE = "vigil:{signal}:{quantile}_{window}"
#: Per pool (LABEL_POOL): KV-cache usage mean / max over replicas, waiting requests.
RULE_KV_USAGE_AVG = "vigil:kv_cache_usage:avg"
RULE_KV_USAGE_MAX = "vigil:kv_cache_usage:max"
RULE_QUEUE_LENGTH = "vigil:queue_length:sum"
#: Per pool, over ``[engine] cost_window``: GPU cost (USD) and GPU cost per 1000 requests.
RULE_GPU_COST = "vigil:gpu_cost_usd:sum{window}"
RULE_GPU_COST_PER_1000 = "vigil:gpu_cost_usd_per_1000_requests:ratio{window}"
#: Alerting rules (LABEL_SEVERITY is SEVERITY_PAGE or SEVERITY_TICKET).
ALERT_ERROR_BUDGET_BURN = "ErrorBudgetBurn"
ALERT_ERROR_BUDGET_LOW = "ErrorBudgetLow"
ALERT_KV_CACHE_HIGH = "KvCacheUsageHigh"
ALERT_TARGET_DOWN = "TargetDown"
#: Rule group names: ``<prefix>-<slo or pool name>``.
GROUP_SLO_SLI = "vigil-slo-sli"
GROUP_SLO_META = "vigil-slo-meta"
GROUP_SLO_PERIOD = "vigil-slo-period"
GROUP_POOL = "vigil-pool"
GROUP_SLO_ALERTS = "vigil-slo-alerts"
GROUP_POOL_ALERTS = "vigil-pool-alerts"
#: Files `vigil rules prometheus --out DIR` and `vigil rules keda --out DIR` write.
FILE_SLO_RULES = "vigil-slo-rules.yml"
FILE_ALERT_RULES = "vigil-alert-rules.yml"
FILE_RULES_TEST = "vigil-rules-test.yml"
FILE_SCRAPE_CONFIG = "prometheus-scrape.yml"
FILE_KEDA = "vigil-keda.yml"
#: Scrape jobs are ``<prefix>-<target name>``; ScaledObjects ``<prefix>-<pool name>``.
SCRAPE_JOB_PREFIX = "vigil"
SCALED_OBJECT_PREFIX = "vigil"
#: The label Prometheus adds to every scraped series and the collector does not (dropped).
LABEL_JOB = "job"
# vLLM 0.33's default bucket bounds (seconds), from vllm/v1/metrics/buckets.py in the 0.33.0
# wheel (see /work/shared/fixtures/vllm_metrics_reference.md, section 2). The rules interpolate
# between them; `--custom-histogram-buckets` on the server would make them wrong.
VLLM_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
#: ``request_latency``: e2e, queue, prefill, decode and inference time histograms.
VLLM_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)

# --- Exporter (alerts/exporter.py: `/metrics` of `vigil serve`) -----------------------------
#: Alerts `vigil serve` raises besides the four above (alerts/conditions.py).
ALERT_TOKEN_ANOMALY = "TokenAnomaly"
ALERT_SCALING_CHANGED = "ScalingRecommendationChanged"
#: The per-replica label of KvCacheUsageHigh and TargetDown is LABEL_INSTANCE.
#: Metric names (Prometheus conventions: unit suffixes, ``_ratio`` 0-1, ``_total`` counters).
METRIC_SLI_ERROR_RATIO = "vigil_slo_sli_error_ratio"
METRIC_BURN_RATE = "vigil_slo_burn_rate_ratio"
METRIC_BUDGET_REMAINING = "vigil_slo_error_budget_remaining_ratio"
METRIC_OBJECTIVE = "vigil_slo_objective_ratio"
METRIC_LATENCY = "vigil_latency_seconds"
METRIC_COST_PER_1000 = "vigil_cost_per_1000_requests_usd"
METRIC_COST_PER_MILLION_TOKENS = "vigil_cost_per_million_output_tokens_usd"
METRIC_DESIRED_REPLICAS = "vigil_scaling_desired_replicas"
METRIC_CURRENT_REPLICAS = "vigil_scaling_current_replicas"
METRIC_SCALING_ACTION = "vigil_scaling_action"
METRIC_KV_USAGE = "vigil_kv_cache_usage_ratio"
METRIC_QUEUE_LENGTH = "vigil_queue_length"
METRIC_ANOMALOUS_REQUESTS = "vigil_anomalous_requests"
METRIC_ALERTS_FIRING = "vigil_alerts_firing"
#: Counters: prometheus_client appends ``_total``; these are the family names without it.
METRIC_NOTIFICATIONS_DELIVERED = "vigil_notifications_delivered"
METRIC_NOTIFICATION_FAILURES = "vigil_notification_failures"
METRIC_NOTIFICATIONS_GIVEN_UP = "vigil_notifications_given_up"
METRIC_NOTIFICATION_QUEUE_DEPTH = "vigil_notification_queue_depth"
METRIC_NOTIFICATION_OLDEST_AGE = "vigil_notification_oldest_undelivered_age_seconds"
METRIC_TARGET_UP = "vigil_target_up"
METRIC_TARGET_SCRAPE_DURATION = "vigil_target_scrape_duration_seconds"
METRIC_EVALUATION_DURATION = "vigil_evaluation_duration_seconds"
METRIC_LAST_EVALUATION = "vigil_last_evaluation_timestamp_seconds"
#: Labels of the exporter's series (LABEL_POOL, LABEL_MODEL_NAME, LABEL_SLO, ... as above).
LABEL_WINDOW = "window"
LABEL_SIGNAL = "signal"
LABEL_QUANTILE = "quantile"
LABEL_STAT = "stat"
LABEL_ACTION = "action"
LABEL_ROUTE = "route"
#: Scaling actions (``pools.<pool>.scaling.action``); KEDA reads the desired replicas.
SCALING_ACTIONS = ("scale_out", "scale_in", "hold")
#: `vigil serve`'s default HTTP listen address (loopback: the exporter has no auth).
SERVE_DEFAULT_LISTEN = "127.0.0.1:9464"
