"""Every generated name in one place: label names, synthetic series, paths, defaults.

Nothing else in the code base spells these strings; import them from here.
"""

from __future__ import annotations

from typing import Final, Literal

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
# vLLM 0.33 V1 names (see tests/fixtures/vllm_metrics_reference.md, section 2).
#: Histograms (base names: the engine appends ``_bucket``/``_sum``/``_count``).
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_E2E = "vllm:e2e_request_latency_seconds"
VLLM_QUEUE_TIME = "vllm:request_queue_time_seconds"
VLLM_ITL = "vllm:inter_token_latency_seconds"
VLLM_PROMPT_TOKENS_HIST = "vllm:request_prompt_tokens"
VLLM_GENERATION_TOKENS_HIST = "vllm:request_generation_tokens"
#: Counters and gauges (full sample names).
VLLM_REQUEST_SUCCESS = "vllm:request_success_total"
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"
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
#: Every ``finished_reason`` vLLM 0.33 labels ``vllm:request_success_total`` with.
VLLM_FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
#: vLLM's API server, instrumented by prometheus-fastapi-instrumentator: one counter per
#: ``handler``, ``method`` and ``status`` (grouped, ``"2xx"``, by default; ``"503"`` when
#: ungrouped). No ``model_name``: a replica's answers, whatever the model.
VLLM_HTTP_REQUESTS = "http_requests_total"
LABEL_HTTP_METHOD = "method"
LABEL_HTTP_STATUS = "status"
#: The method of the inference endpoints: GETs (``/v1/models``) are not requests for service.
HTTP_METHOD_POST = "POST"
#: ``status`` values that are server errors, as a PromQL regex (matches ``5xx`` and ``503``).
HTTP_STATUS_5XX_REGEX = "5.."
#: Histogram sample suffixes.
SUFFIX_BUCKET = "_bucket"
SUFFIX_SUM = "_sum"
SUFFIX_COUNT = "_count"

#: SLO indicators and the default SLO names ``<pool>-<suffix>`` (one per indicator, in this order).
SLO_INDICATORS = ("ttft", "e2e", "error_rate", "availability")
#: Every indicator an SLO may name: the defaults plus ``replica_up`` (the share of scrape time
#: the pool's vLLM targets were up), which no default SLO uses.
INDICATOR_REPLICA_UP = "replica_up"
ALL_INDICATORS = (*SLO_INDICATORS, INDICATOR_REPLICA_UP)
SLO_NAME_SUFFIXES = {
    "ttft": "ttft", "e2e": "e2e", "error_rate": "error-rate", "availability": "availability",
    "replica_up": "replica-up",
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
#: The watchdog's severity (kube-prometheus's convention): routed to a dead-man's switch,
#: never to a person.
SEVERITY_NONE = "none"
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

# --- Prometheus rules (alerts/rules/: `vigil rules prometheus|keda`) ------------------------------
# Recording rules, with the names Sloth users know. ``{window}`` is a Prometheus duration
# ("5m", "1d", "30d"). Every ``slo:*`` series carries LABEL_SLO, LABEL_POOL, LABEL_MODEL_NAME.
RULE_SLI_ERROR = "slo:sli_error:ratio_rate{window}"
RULE_OBJECTIVE = "slo:objective:ratio"
RULE_ERROR_BUDGET = "slo:error_budget:ratio"
RULE_TIME_PERIOD_DAYS = "slo:time_period:days"
RULE_CURRENT_BURN_RATE = "slo:current_burn_rate:ratio"
RULE_PERIOD_BURN_RATE = "slo:period_burn_rate:ratio"
RULE_PERIOD_BUDGET_REMAINING = "slo:period_error_budget_remaining:ratio"
#: ``vector(1)`` per SLO, with LABEL_SPEC_VERSION: what the SLO's recorded ratios mean
#: (``slo.objectives.spec.spec_version``), so a reader knows whether the store's rules are
#: the ones its config would generate (as Sloth's ``sloth_slo_info`` carries its spec).
RULE_SPEC_INFO = "slo:spec_info"
LABEL_SPEC_VERSION = "spec_version"
#: Bumped whenever the generator changes what a recorded SLI means for the same spec (an
#: expression's semantics, not its spelling): readers then fall back to raw queries until
#: the new rules are loaded.
RULES_REVISION = 1
#: Per pool and model (LABEL_POOL, LABEL_MODEL_NAME): ``{signal}`` is a key of
#: slo.objectives.quantiles.LATENCY_HISTOGRAMS ("ttft_seconds", "e2e_seconds"), ``{quantile}``
#: "p95".
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
#: The dead-man's switch: always firing, and `vigil serve`'s evaluations stopped everywhere.
ALERT_WATCHDOG = "VigilWatchdog"
ALERT_EVALUATION_STALE = "VigilEvaluationStale"
#: Rule group names: ``<prefix>-<slo or pool name>``.
GROUP_SLO_SLI = "vigil-slo-sli"
GROUP_SLO_META = "vigil-slo-meta"
GROUP_SLO_PERIOD = "vigil-slo-period"
GROUP_POOL = "vigil-pool"
GROUP_SLO_ALERTS = "vigil-slo-alerts"
GROUP_POOL_ALERTS = "vigil-pool-alerts"
GROUP_META_ALERTS = "vigil-meta-alerts"
#: Files `vigil rules prometheus --out DIR` and `vigil rules keda --out DIR` write.
FILE_SLO_RULES = "vigil-slo-rules.yml"
FILE_ALERT_RULES = "vigil-alert-rules.yml"
FILE_RULES_TEST = "vigil-rules-test.yml"
FILE_SCRAPE_CONFIG = "prometheus-scrape.yml"
FILE_KEDA = "vigil-keda.yml"
#: `vigil rules prometheus --format operator --out DIR`: the Prometheus Operator objects.
FILE_OPERATOR = "vigil-operator.yml"
#: Its PodMonitors' defaults: vLLM production-stack's engine pods (label ``model``, port
#: ``container-port``) and dcgm-exporter's port name (GPU Operator, the exporter's chart).
OPERATOR_POD_SELECTOR = "model={pool}"
OPERATOR_PORT = "container-port"
OPERATOR_DCGM_PORT = "metrics"
#: Scrape jobs are ``<prefix>-<target name>``; ScaledObjects ``<prefix>-<pool name>``.
SCRAPE_JOB_PREFIX = "vigil"
SCALED_OBJECT_PREFIX = "vigil"
#: The KEDA TriggerAuthentication the ScaledObjects share when ``[engine.http]`` carries a
#: credential, and the default name of the Secret it reads (``vigil rules keda
#: --auth-secret``), whose keys are KEDA's own parameter names (bearerToken, username, ...).
KEDA_TRIGGER_AUTH = "vigil-prometheus"
KEDA_AUTH_SECRET = "vigil-prometheus-auth"
#: The label Prometheus adds to every scraped series and the collector does not (dropped).
LABEL_JOB = "job"
# vLLM 0.33's default bucket bounds (seconds), from vllm/v1/metrics/buckets.py in the 0.33.0
# wheel (see tests/fixtures/vllm_metrics_reference.md, section 2). The rules interpolate
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
#: ``inter_token_latency`` (and ``time_per_output_token``): seconds between tokens.
VLLM_INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
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
#: 1 when the SLO's ratios were read from the store's recorded series, 0 when computed from
#: raw series (present only when reading a Prometheus-compatible store with recorded_rules on).
METRIC_SLO_RECORDED = "vigil_slo_recorded"
#: The OTLP receiver's series (serving.otlp.receiver), on its own /metrics and `vigil serve`'s.
METRIC_OTLP_SPANS = "vigil_otlp_spans"
METRIC_OTLP_EXPORTS = "vigil_otlp_exports"
METRIC_OTLP_RECORDS_WRITTEN = "vigil_otlp_records_written"
METRIC_OTLP_RECORDS_DROPPED = "vigil_otlp_records_dropped"
METRIC_OTLP_BUFFERED = "vigil_otlp_buffered_records"
#: Every request record made from spans has an id starting with this (the gateway's never do).
OTLP_RECORD_PREFIX = "otlp-"
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
#: 1 when the last evaluation succeeded, 0 when it failed (the source refused, timed out...);
#: and the failed evaluations since serve started (a counter, without ``_total``).
METRIC_EVALUATION_SUCCESS = "vigil_evaluation_success"
METRIC_EVALUATION_FAILURES = "vigil_evaluation_failures"
#: Copies of `vigil serve` on a shared database ([serve] database): 1 on the copy that holds
#: the leader's lease (the one that delivers), 0 on the others; the lease's term number;
#: how often this copy took the lead (a counter, without ``_total``).
#: The chargeback on `vigil serve`'s /metrics: each tenant's cost this month (a counter that
#: starts again at each month's start in ``[cost] timezone``; the top ``[cost]
#: metrics_tenants`` tenants by name, the rest as ``other``), and each budget's figures.
METRIC_TENANT_COST = "vigil_tenant_cost_usd"
METRIC_BUDGET_AMOUNT = "vigil_budget_amount_usd"
METRIC_BUDGET_SPENT = "vigil_budget_spent_usd"
METRIC_BUDGET_SPENT_RATIO = "vigil_budget_spent_ratio"
METRIC_BUDGET_FORECAST = "vigil_budget_forecast_usd"
LABEL_TENANT = "tenant"
LABEL_BUDGET = "budget"
LABEL_CURRENCY = "currency"
#: What the tenants past ``[cost] metrics_tenants`` are summed as.
TENANT_OTHER = "other"
#: Budget alerts: a share of a monthly budget crossed (labels ``budget``, ``tenant``,
#: ``month``, ``share``), and the trailing rate spending it before the month ends.
ALERT_BUDGET_SPENT = "BudgetSpent"
ALERT_BUDGET_FORECAST = "BudgetForecastExhausted"
LABEL_MONTH = "month"
LABEL_SHARE = "share"
#: `vigil serve`'s route with every budget's status (JSON), which gateways poll to enforce.
SERVE_BUDGETS_PATH = "/budgets"
#: The error code of the gateway's 429 for a spent budget (OpenAI-style body).
ERROR_CODE_BUDGET = "budget_exceeded"
METRIC_SERVE_LEADER = "vigil_serve_leader"
METRIC_SERVE_LEASE_TERM = "vigil_serve_lease_term"
METRIC_SERVE_LEADER_CHANGES = "vigil_serve_leader_acquisitions"
#: The copy's name (``[serve] name``) on the leader series.
LABEL_COPY = "copy"
#: The name of the lease the copies of `vigil serve` elect their leader with.
SERVE_LEASE_NAME = "vigil-serve-alerts"
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

# --- Gateway (serving/gateway/): headers, record values, metric names -----------------------
#: Response headers: the gateway's request id, the replica that served it, the max_tokens sent
#: upstream and why ("512; decision=default"), the cache outcome (CACHE_* below; as a request
#: header, the value "off" opts the request out of the cache).
HEADER_REQUEST_ID = "X-Vigil-Request-Id"
HEADER_REPLICA = "X-Vigil-Replica"
#: Set when a spent budget demoted (or refused) the request: ``demoted; budget="<name>"``.
HEADER_BUDGET = "X-Vigil-Budget"
HEADER_MAX_TOKENS = "X-Vigil-Max-Tokens"
HEADER_CACHE = "X-Vigil-Cache"
CACHE_HIT_L1 = "hit-l1"
CACHE_HIT_L2 = "hit-l2"
CACHE_MISS = "miss"
CACHE_BYPASS = "bypass"
#: Gateway request ids: ``vgl-<32 hex>``.
REQUEST_ID_PREFIX = "vgl-"
#: Recorded endpoints (``chat`` and ``completions`` are the SLO config's endpoint values).
ENDPOINT_CHAT = "chat"
ENDPOINT_COMPLETIONS = "completions"
ENDPOINT_EMBEDDINGS = "embeddings"
ENDPOINT_PATHS = {
    ENDPOINT_CHAT: "/v1/chat/completions",
    ENDPOINT_COMPLETIONS: "/v1/completions",
    ENDPOINT_EMBEDDINGS: "/v1/embeddings",
}
#: max_tokens decisions: the client's value, the gateway's default, the client's value clamped.
MAX_TOKENS_CLIENT = "client"
MAX_TOKENS_DEFAULT = "default"
MAX_TOKENS_CLAMPED = "clamped"
#: Error classes of a record (vigil.model.RequestRecord.error_class); "" = none. Server-side
#: failures (RequestRecord.error) are ERROR_SERVER_CLASSES; the others are not errors.
ERROR_TIMEOUT = "timeout"
ERROR_UPSTREAM_5XX = "upstream_5xx"
ERROR_OOM = "oom"
ERROR_CLIENT_CANCEL = "client_cancel"
ERROR_REJECTED = "rejected"
ERROR_OVER_CAP = "over_cap"
ERROR_BAD_REQUEST = "bad_request"
ERROR_UPSTREAM_4XX = "upstream_4xx"
ERROR_UNAUTHORIZED = "unauthorized"
ERROR_SERVER_CLASSES = (ERROR_TIMEOUT, ERROR_UPSTREAM_5XX, ERROR_OOM)
#: Refused before reaching a replica or the cache: no GPU time, not a served request.
ERROR_REFUSED_CLASSES = (ERROR_REJECTED, ERROR_OVER_CAP, ERROR_BAD_REQUEST, ERROR_UNAUTHORIZED)
#: Where a record's completion_tokens came from: the upstream's usage, a count of streamed
#: content chunks (usage never arrived: a lower bound), or unknown (0 recorded).
TOKENS_USAGE = "usage"
TOKENS_CHUNKS = "chunks"
TOKENS_UNKNOWN = "unknown"
#: HTTP status recorded for a request whose client went away first (nginx's convention).
STATUS_CLIENT_CLOSED = 499
#: SQLite table of per-request records (in GatewayConfig.records_path, beside the batch queue).
GATEWAY_RECORDS_TABLE = "gateway_requests"
#: Metric names (counters without ``_total``: prometheus_client appends it).
METRIC_GW_REQUESTS = "vigil_gateway_requests"
METRIC_GW_TTFT = "vigil_gateway_time_to_first_token_seconds"
METRIC_GW_E2E = "vigil_gateway_e2e_request_latency_seconds"
METRIC_GW_QUEUE_WAIT = "vigil_gateway_queue_wait_seconds"
METRIC_GW_TOKENS = "vigil_gateway_tokens"
METRIC_GW_CACHE_LOOKUPS = "vigil_gateway_cache_lookups"
METRIC_GW_CACHE_LOOKUP_SECONDS = "vigil_gateway_cache_lookup_seconds"
METRIC_GW_QUEUE_DEPTH = "vigil_gateway_queue_depth"
METRIC_GW_REJECTIONS = "vigil_gateway_rejections"
METRIC_GW_CANCELLATIONS = "vigil_gateway_cancellations"
METRIC_GW_UPSTREAM_ERRORS = "vigil_gateway_upstream_errors"
METRIC_GW_COST = "vigil_gateway_cost_usd"
METRIC_GW_SAVED = "vigil_gateway_saved_usd"
METRIC_GW_REPLICA_UP = "vigil_gateway_replica_up"
METRIC_GW_REPLICA_OUTSTANDING = "vigil_gateway_replica_outstanding_requests"
METRIC_GW_REPLICA_KV_USAGE = "vigil_gateway_replica_kv_cache_usage_ratio"
METRIC_GW_RECORDS_DROPPED = "vigil_gateway_records_dropped"
#: Records held in memory, not written yet (the database is slow or unreachable).
METRIC_GW_RECORDS_BUFFERED = "vigil_gateway_records_buffered"
#: Failed attempts to write a batch of records (each batch is retried until written).
METRIC_GW_RECORD_WRITE_FAILURES = "vigil_gateway_record_write_failures"
#: Records dropped because the database refused them (logged with their ids).
METRIC_GW_RECORDS_REJECTED = "vigil_gateway_records_rejected"
#: Entries the semantic cache holds now (gauge).
METRIC_GW_CACHE_ENTRIES = "vigil_gateway_cache_entries"
#: Entries shared through the gateway database, by outcome (LABEL_OUTCOME): ``written`` by
#: this instance, ``applied`` (other instances' entries put into this cache), ``dropped``
#: (not written: the queue was full, the database unreachable) and ``rejected`` (refused by
#: the database for their content).
METRIC_GW_CACHE_SHARED = "vigil_gateway_cache_shared_entries"
LABEL_OUTCOME = "outcome"
#: Labels of the gateway's series (LABEL_POOL as above).
LABEL_TIER = "tier"
LABEL_ENDPOINT = "endpoint"
LABEL_STATUS = "status"
LABEL_REASON = "reason"
LABEL_PHASE = "phase"
LABEL_RESULT = "result"
LABEL_REPLICA = "replica"
LABEL_ERROR_CLASS = "error_class"
LABEL_TOKEN_TYPE = "type"
#: ``phase`` of a cancellation; ``type`` of tokens.
PHASE_BEFORE_FIRST_TOKEN = "before_first_token"
PHASE_AFTER_FIRST_TOKEN = "after_first_token"
TOKEN_PROMPT = "prompt"
TOKEN_COMPLETION = "completion"
#: ``reason`` of a rejection.
REJECT_QUEUE_FULL = "queue_full"
REJECT_NO_REPLICA = "no_replica"
REJECT_OVER_CAP = "over_cap"
REJECT_UNAUTHORIZED = "unauthorized"
REJECT_BAD_REQUEST = "bad_request"
REJECT_TOO_LARGE = "body_too_large"
REJECT_MODEL_NOT_FOUND = "model_not_found"
#: Latency buckets (seconds) of the TTFT and e2e histograms: they include the default SLO
#: thresholds, 0.8 s and 8 s, so an SLO reads a bucket instead of interpolating.
GATEWAY_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 2.5, 5.0, 8.0, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0,
)
#: The vLLM gauges the gateway polls on every replica (``/metrics?name[]=...``).
GATEWAY_POLLED_SERIES = (VLLM_KV_CACHE_USAGE, VLLM_REQUESTS_WAITING, VLLM_REQUESTS_RUNNING)

# --- OpenTelemetry GenAI (serving/gateway/telemetry/otel.py: `[gateway.otel]`) ---------------
# The GenAI semantic conventions (open-telemetry/semantic-conventions-genai,
# docs/gen-ai/gen-ai-metrics.md and gen-ai-spans.md; status Development).
#: Model-server metrics (histograms, seconds) and the token usage (histogram, {token}).
OTEL_SERVER_REQUEST_DURATION = "gen_ai.server.request.duration"
OTEL_SERVER_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
OTEL_SERVER_TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
OTEL_TOKEN_USAGE = "gen_ai.client.token.usage"
#: The advised explicit bucket boundaries of each.
OTEL_REQUEST_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12,
                                 10.24, 20.48, 40.96, 81.92)
OTEL_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0)
OTEL_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
OTEL_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                      16777216, 67108864)
#: Attributes.
OTEL_OPERATION = "gen_ai.operation.name"
OTEL_PROVIDER = "gen_ai.provider.name"
OTEL_REQUEST_MODEL = "gen_ai.request.model"
OTEL_RESPONSE_MODEL = "gen_ai.response.model"
OTEL_RESPONSE_ID = "gen_ai.response.id"
OTEL_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
OTEL_REQUEST_STREAM = "gen_ai.request.stream"
OTEL_TOKEN_TYPE = "gen_ai.token.type"
OTEL_INPUT_TOKENS = "gen_ai.usage.input_tokens"
OTEL_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
OTEL_ERROR_TYPE = "error.type"
OTEL_SERVER_ADDRESS = "server.address"
OTEL_SERVER_PORT = "server.port"
OTEL_HTTP_STATUS = "http.response.status_code"
#: gen_ai.operation.name of each gateway endpoint (the conventions' well-known values).
OTEL_OPERATIONS = {ENDPOINT_CHAT: "chat", ENDPOINT_COMPLETIONS: "text_completion",
                   ENDPOINT_EMBEDDINGS: "embeddings"}
#: gen_ai.provider.name: vLLM is not among the well-known values, which allow a custom one.
OTEL_PROVIDER_VLLM = "vllm"
#: Vigil's own attributes of a request span (and of the metrics: low cardinality).
OTEL_VIGIL_POOL = "vigil.pool"
OTEL_VIGIL_TIER = "vigil.tier"
OTEL_VIGIL_CACHE = "vigil.cache.hit"
OTEL_VIGIL_REPLICA = "vigil.replica"
OTEL_VIGIL_REQUEST_ID = "vigil.request.id"
OTEL_VIGIL_QUEUE = "vigil.queue.seconds"
#: OTLP/HTTP paths under [gateway.otel] endpoint.
OTEL_TRACES_PATH = "/v1/traces"
OTEL_METRICS_PATH = "/v1/metrics"


# --- Gateway batch queue (serving/gateway/batch/: the OpenAI batches API) ---------------------
#: SQLite tables in the gateway's records database (``[gateway] records_path``).
BATCH_TABLE_FILES = "batch_files"
BATCH_TABLE_BATCHES = "batch_batches"
BATCH_TABLE_REQUESTS = "batch_requests"
#: Object ids, spelled as OpenAI's: ``file-...``, ``batch_...``, ``batch_req_...``.
BATCH_FILE_ID_PREFIX = "file-"
BATCH_ID_PREFIX = "batch_"
BATCH_REQUEST_ID_PREFIX = "batch_req_"
#: Batchable endpoints (the ``url`` of an input line) -> the gateway's endpoint name.
BATCH_ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
#: File purposes: what callers upload, what the queue writes.
BATCH_PURPOSE_INPUT = "batch"
BATCH_PURPOSE_OUTPUT = "batch_output"
#: OpenAI's batch statuses (openai/types/batch.py).
BATCH_STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired",
                  "cancelling", "cancelled")
#: ``error.code`` of the error-file lines written by the queue itself.
BATCH_ERROR_EXPIRED = "batch_expired"
BATCH_ERROR_CANCELLED = "batch_cancelled"
BATCH_ERROR_UPSTREAM = "upstream_error"
#: ``errors.data[].code`` of a batch that failed validation.
BATCH_ERROR_INVALID_LINE = "invalid_request"

# --- vLLM launch profiles (serving/vllm_args.py: `vigil vllm-args`, `vigil vllm-serve`) -----
#: ``--custom-histogram-buckets`` family keys (vllm/v1/metrics/buckets.py, vLLM >= 0.33):
#: TTFT, and request_latency (e2e, queue, prefill, decode and inference time).
VLLM_BUCKET_FAMILY_TTFT = "time_to_first_token"
VLLM_BUCKET_FAMILY_REQUEST_LATENCY = "request_latency"
#: ``--speculative-config`` methods that need no draft model (vllm/config/speculative.py).
VLLM_SPEC_METHODS_WITHOUT_MODEL = ("ngram", "ngram_gpu", "suffix", "mtp")
#: Methods that need a draft/head checkpoint besides the method name.
VLLM_SPEC_METHODS_NEEDING_MODEL = ("eagle", "eagle3", "medusa", "mlp_speculator", "draft_model",
                                   "dflash", "dspark", "custom_class", "extract_hidden_states")

# --- Dashboard (dashboard/: `vigil dashboard`, the Streamlit app) ----------------------------
#: Environment variables `vigil dashboard` hands to the Streamlit process: the config file and,
#: optionally, a pinned evaluation time (Unix seconds) instead of "now" (tests, benchmarks).
DASHBOARD_ENV_CONFIG = "VIGIL_CONFIG"
DASHBOARD_ENV_AT = "VIGIL_DASHBOARD_AT"
#: Addresses that stay on this machine; any other bind address requires authentication.
LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")
#: URL query parameters of the dashboard's controls (the view a link shows).
QP_RANGE = "range"
QP_START = "start"
QP_END = "end"
QP_AT = "at"
QP_POOL = "pool"
QP_MODEL = "model"
QP_ENDPOINT = "endpoint"
QP_REFRESH = "refresh"
QP_SLO = "slo"
#: Time ranges offered (label -> seconds); "custom" takes QP_START / QP_END.
DASHBOARD_RANGES = {"15m": 900.0, "1h": 3600.0, "6h": 21600.0, "24h": 86400.0,
                    "7d": 7 * 86400.0, "30d": 30 * 86400.0}
DASHBOARD_RANGE_CUSTOM = "custom"
#: Pages (their URL paths; the Overview is the default page, at "/").
PAGE_QUALITY = "quality"
PAGE_SERVER = "server"
PAGE_BUSINESS = "business"
PAGE_ANOMALIES = "anomalies"
PAGE_PLAN = "plan"
PAGE_BACKTEST = "backtest"
#: More vLLM 0.33 series the Server page charts (counters: full sample names; the iteration
#: histogram's base name ends in ``_total``, which is part of vLLM's name).
VLLM_ITERATION_TOKENS = "vllm:iteration_tokens_total"
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
VLLM_SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
#: ``finished_reason`` of a request the server aborted (not an error; see slo/objectives/sli.py).
FINISHED_REASON_ABORT = "abort"
#: DCGM exporter fields for GPU SM utilisation: the profiling ratio (0-1) when the exporter
#: collects it, else the coarse utilisation in percent; and the GPU index label.
DCGM_SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
LABEL_GPU = "gpu"

# --- Semantic cache (serving/cache/) ---------------------------------------------------------
#: The request header is HEADER_CACHE (above); this value (case-insensitive) opts out.
CACHE_OPT_OUT = "off"
#: ``CacheHit.layer``: the exact hash or the embedding similarity.
CACHE_LAYER_L1 = "l1"
CACHE_LAYER_L2 = "l2"
#: Why a request bypassed the cache (``CacheDecision.bypass``; a metric ``reason`` label).
CACHE_BYPASS_DISABLED = "disabled"
CACHE_BYPASS_ENDPOINT = "endpoint"
CACHE_BYPASS_POOL = "pool"
CACHE_BYPASS_TENANT = "tenant"
CACHE_BYPASS_OPT_OUT = "opt_out"
CACHE_BYPASS_PERSONAL = "personal"
CACHE_BYPASS_TOOLS = "tools"
CACHE_BYPASS_N = "n"
CACHE_BYPASS_LOGPROBS = "logprobs"
CACHE_BYPASS_SAMPLED = "sampled"
CACHE_BYPASS_CONTENT = "content"
CACHE_BYPASS_MALFORMED = "malformed"
CACHE_BYPASS_REASONS = (
    CACHE_BYPASS_DISABLED, CACHE_BYPASS_ENDPOINT, CACHE_BYPASS_POOL, CACHE_BYPASS_TENANT,
    CACHE_BYPASS_OPT_OUT, CACHE_BYPASS_PERSONAL, CACHE_BYPASS_TOOLS, CACHE_BYPASS_N,
    CACHE_BYPASS_LOGPROBS, CACHE_BYPASS_SAMPLED, CACHE_BYPASS_CONTENT, CACHE_BYPASS_MALFORMED,
)
#: Why a completed-looking response was not stored (``CacheStats.refused`` keys).
CACHE_REFUSED_NOT_COMPLETE = "incomplete"
CACHE_REFUSED_ERROR = "error"
CACHE_REFUSED_TOOL_CALLS = "tool_calls"

# --- vLLM names across releases (collector/vllm_families.py: the families a target lacks) ---
#: The KV-cache configuration, an info-style gauge (=1) whose labels carry ``num_gpu_blocks``
#: and ``block_size``; it has no ``model_name`` label.
VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info"
#: vLLM's API server answers ``GET /version`` with ``{"version": "0.32.0"}``; /metrics carries
#: no version, so the collector asks here when a target lacks a family it needs.
VLLM_VERSION_PATH = "/version"
#: Names before a rename (tests/fixtures/vllm_metrics_reference.md, section 3): KV-cache
#: usage and the prefix-cache counters were ``gpu_*`` before 0.9 (0.8's counters counted
#: blocks), the inter-token histogram was ``time_per_output_token`` before 0.10.
VLLM_OLD_GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"
VLLM_OLD_GPU_PREFIX_CACHE_QUERIES = "vllm:gpu_prefix_cache_queries_total"
VLLM_OLD_GPU_PREFIX_CACHE_HITS = "vllm:gpu_prefix_cache_hits_total"
VLLM_OLD_TIME_PER_OUTPUT_TOKEN = "vllm:time_per_output_token_seconds"
#: Names only the V0 engine exposed (the default engine before vLLM 0.8): any of them in a
#: scrape means a V0 server. The hit-rate gauge stood where V1 has the prefix-cache counters.
VLLM_V0_GPU_PREFIX_CACHE_HIT_RATE = "vllm:gpu_prefix_cache_hit_rate"
VLLM_V0_NUM_REQUESTS_SWAPPED = "vllm:num_requests_swapped"
VLLM_V0_CPU_CACHE_USAGE = "vllm:cpu_cache_usage_perc"
VLLM_V0_TIME_IN_QUEUE = "vllm:time_in_queue_requests"

# --- Gateway tiers (serving/gateway/tiers.py; serving/loadgen/ sends as them) ----------------
# ``Final``: mypy reads each name as its literal type, so that it fits ``Tier`` where one is due.

#: The gateway's tiers (``[[gateway.api_keys]] tier``), best served first.
TIER_PREMIUM: Final = "premium"
TIER_STANDARD: Final = "standard"
TIER_BATCH: Final = "batch"
TIERS = (TIER_PREMIUM, TIER_STANDARD, TIER_BATCH)
#: A tier's name as a type: Python needs the values spelled out (the same as TIERS').
Tier = Literal["premium", "standard", "batch"]
#: vLLM's request ``priority`` per tier: lower is served first (``--scheduling-policy priority``).
TIER_PRIORITY: dict[str, int] = {TIER_PREMIUM: 0, TIER_STANDARD: 1, TIER_BATCH: 2}
