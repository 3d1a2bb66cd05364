"""The four dashboards of ``vigil rules grafana``, from the same config and SLO specs as the rules:

* **SLO overview** (``vigil-slo-overview``): every SLO's objective, attainment over its period,
  error budget left, current burn rate and firing alerts in one table that links to the detail;
  budget left per SLO; the burn rate over every window of the alert table against the page and
  ticket thresholds; when the budget alerts fired.
* **SLO detail** (``vigil-slo-detail``, one SLO chosen by ``$slo``): the SLI against the
  objective over time, the burn-rate windows with the page and ticket thresholds drawn, the
  budget burn-down over the period.
* **Fleet** (``vigil-fleet``): what vLLM's own dashboards show (TTFT, e2e and inter-token
  latency quantiles, running and waiting requests, KV-cache usage, prefix-cache hit rate,
  preemptions, speculative-decoding acceptance, token throughput), DCGM's SM activity, and the
  gateway's requests by endpoint, with the scale-out thresholds drawn on the signals they
  trigger on.
* **Cost** (``vigil-cost``): GPU cost per 1000 requests and per 1M output tokens, the cost over
  the cost window, the share of replicas idle, the gateway's cost by tier, and from `vigil
  serve`'s chargeback each tenant's cost this month and each budget's share spent.

Every dashboard has the variables ``datasource`` and ``pool``; the fleet adds ``model`` and
``endpoint``, the detail ``slo``. Units and thresholds are set on every panel.
"""

from __future__ import annotations

from dataclasses import dataclass

from grafana_foundation_sdk.builders import bargauge, dashboard, timeseries
from grafana_foundation_sdk.models import dashboard as dm

from alerts.rules.grafana import queries as q
from alerts.rules.grafana.panels import (
    GREEN,
    ORANGE,
    RED,
    bar_gauge_panel,
    datasource_variable,
    query_variable,
    stat_panel,
    state_timeline_panel,
    table_panel,
    threshold_lines,
    thresholds,
    timeseries_panel,
)
from alerts.rules.model import prom_duration
from alerts.rules.pipeline import RulesResult
from alerts.rules.promql import number
from slo.objectives.burn_rate import slo_burn_alerts
from slo.objectives.quantiles import QUANTILES, quantile_key
from slo.objectives.sli import replica_label
from vigil.config import PoolConfig
from vigil.conventions import (
    ALERT_ERROR_BUDGET_BURN,
    ALERT_ERROR_BUDGET_LOW,
    DCGM_SM_ACTIVE,
    LABEL_BUDGET,
    LABEL_ENDPOINT,
    LABEL_MODEL_NAME,
    LABEL_POOL,
    LABEL_SLO,
    LABEL_TENANT,
    LABEL_TIER,
    METRIC_GW_COST,
    METRIC_GW_REQUESTS,
    RULE_GPU_COST,
    RULE_GPU_COST_PER_1000,
    RULE_KV_USAGE_AVG,
    RULE_KV_USAGE_MAX,
    RULE_OBJECTIVE,
    RULE_QUANTILE,
    RULE_QUEUE_LENGTH,
    SEVERITY_PAGE,
    SEVERITY_TICKET,
    SUFFIX_BUCKET,
    VLLM_GENERATION_TOKENS,
    VLLM_ITL,
    VLLM_PREEMPTIONS,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_REQUESTS_RUNNING,
    VLLM_SPEC_ACCEPTED_TOKENS,
    VLLM_SPEC_DRAFT_TOKENS,
)

__all__ = ["UID_COST", "UID_DETAIL", "UID_FLEET", "UID_OVERVIEW", "Dashboards", "build"]

UID_OVERVIEW = "vigil-slo-overview"
UID_DETAIL = "vigil-slo-detail"
UID_FLEET = "vigil-fleet"
UID_COST = "vigil-cost"
TAG = "vigil"
#: Every SLO ratio is drawn 0-1 as a percentage.
PERCENT = "percentunit"
#: The ISO 4217 codes Grafana has a currency unit for (``currency<CODE>``, its "Currency"
#: category); another ``[cost] currency`` is written after the value.
GRAFANA_CURRENCIES = frozenset({"USD", "EUR", "GBP", "JPY", "RUB", "UAH", "BRL", "DKK", "ISK",
                                "NOK", "SEK", "CZK", "CHF", "PLN", "ZAR", "INR", "KRW"})
#: A budget's bar turns orange at this share spent (``[[budgets]] alert_at``'s default last
#: warning before 1.0) and red once spent.
BUDGET_WARN_SHARE = 0.8


@dataclass(frozen=True)
class Dashboards:
    """The built dashboards (grafana-foundation-sdk models), by uid."""

    by_uid: dict[str, dashboard.Dashboard]


def _base(uid: str, title: str, description: str, time_from: str) -> dashboard.Dashboard:
    link = (dashboard.DashboardLink("Vigil").type(dm.DashboardLinkType.DASHBOARDS)
            .tags([TAG]).as_dropdown(True).include_vars(True).keep_time(True))
    return (dashboard.Dashboard(title).uid(uid).description(description).tags([TAG])
            .editable().refresh("1m").time(time_from, "now").timezone("browser")
            .link(link).with_variable(datasource_variable())
            .with_variable(query_variable("pool", "Pool",
                                          f"label_values({RULE_QUEUE_LENGTH}, {LABEL_POOL})")))


def _alerts_query() -> str:
    names = f"{ALERT_ERROR_BUDGET_BURN}|{ALERT_ERROR_BUDGET_LOW}"
    return (f"max by ({LABEL_SLO}, alertname, severity) (ALERTS{{alertname=~\"{names}\", "
            f"alertstate=\"firing\", {LABEL_POOL}=~\"{q.POOL_VAR}\", "
            f"{LABEL_SLO}=~\"{q.SLO_VAR}\"}})")


def _burn_panel(result: RulesResult, title: str, width: int) -> timeseries.Panel:
    """The burn rate over every window of the alert table, against the page and ticket
    factors: dashed threshold lines when every SLO has the same factors (SLOs of one period),
    else one reference series per SLO and severity."""
    specs = result.validated.specs
    windows = result.validated.windows_s
    panel = timeseries_panel(
        title, [(f"{{{{{LABEL_SLO}}}}} {prom_duration(w)}", q.burn_rate(w)) for w in windows],
        unit="x", minimum=0, width=width, height=9,
        lines=[] if _shared_factors(result) is not None else [
            (f"{{{{{LABEL_SLO}}}}} {severity} threshold", expr)
            for severity in (SEVERITY_PAGE, SEVERITY_TICKET)
            if (expr := q.burn_threshold(result.config, specs, severity)) is not None],
        description="How many times faster than exactly on budget each SLO spends its error "
                    "budget, over each window of [engine] burn_rate_alerts. An alert fires "
                    "when both windows of a row are above the row's factor.")
    shared = _shared_factors(result)
    if shared is None:
        return panel
    steps: list[tuple[float | None, str]] = [(None, GREEN)]
    steps += [(factor, ORANGE if severity == SEVERITY_TICKET else RED)
              for severity, factor in sorted(shared.items(), key=lambda kv: kv[1])]
    return threshold_lines(panel, thresholds(*steps))


def _shared_factors(result: RulesResult) -> dict[str, float] | None:
    """Severity -> the lowest factor of its rows, when it is the same for every SLO (the
    factors depend on the period only); None when SLOs differ."""
    seen: set[tuple[tuple[str, float], ...]] = set()
    for spec in result.validated.specs:
        rows = slo_burn_alerts(result.config.engine.burn_rate_alerts, spec.period_s)
        by: dict[str, float] = {}
        for r in rows:
            by[r.severity] = min(by.get(r.severity, r.factor), r.factor)
        seen.add(tuple(sorted(by.items())))
    return dict(next(iter(seen))) if len(seen) == 1 else None


def overview(result: RulesResult) -> dashboard.Dashboard:
    specs = result.validated.specs
    d = _base(UID_OVERVIEW, "Vigil / SLO overview",
              "Every SLO Vigil's rules record: attainment, budget, burn rates, alerts.", "now-24h")
    d = d.with_variable(query_variable(
        "slo", "SLO", f"label_values({RULE_OBJECTIVE}{{{LABEL_POOL}=~\"{q.POOL_VAR}\"}}, "
                      f"{LABEL_SLO})"))
    detail = (dashboard.DashboardLink("SLO detail").type(dm.DashboardLinkType.LINK)
              .url(f"/d/{UID_DETAIL}").include_vars(True).keep_time(True))
    columns = [("objective", q.objective()),
               *[(f"attainment {legend}", expr) for legend, expr in q.attainment(specs)],
               ("budget left", q.budget_remaining()),
               ("burn rate now", q.current_burn_rate())]
    d = d.with_row(dashboard.Row("SLOs"))
    d = d.with_panel(table_panel(
        "SLOs", columns, link=detail, height=4 + 2 * max(1, len(specs)),
        description="Per SLO: its objective, the share of good events over its period, the "
                    "error budget left and the burn rate over [engine] window; the same "
                    "numbers as `vigil slo status`."))
    d = d.with_panel(stat_panel(
        "Error budget left", [(f"{{{{{LABEL_SLO}}}}}", q.budget_remaining())], unit=PERCENT,
        steps=thresholds((None, RED), (0.0, ORANGE), (0.25, GREEN)), width=12, height=7,
        decimals=1, description="The share of the period's error budget not yet spent."))
    d = d.with_panel(stat_panel(
        "Burn rate now", [(f"{{{{{LABEL_SLO}}}}}", q.current_burn_rate())], unit="x",
        steps=thresholds((None, GREEN), (1.0, ORANGE), (_lowest_factor(result), RED)),
        width=12, height=7, decimals=2,
        description="The burn rate over [engine] window: 1 spends the budget exactly over "
                    "the period."))
    d = d.with_row(dashboard.Row("Burn rates and alerts"))
    d = d.with_panel(_burn_panel(result, "Burn rate by window", 24))
    d = d.with_panel(state_timeline_panel(
        "Budget alerts firing", [("{{slo}} {{alertname}} {{severity}}", _alerts_query())],
        description="ErrorBudgetBurn (page, ticket) and ErrorBudgetLow, from Prometheus's "
                    "ALERTS series."))
    return d


def _lowest_factor(result: RulesResult) -> float:
    """The lowest alert factor of any SLO: a burn rate above it is an alert's, at least."""
    factors = [r.factor for s in result.validated.specs
               for r in slo_burn_alerts(result.config.engine.burn_rate_alerts, s.period_s)]
    return min(factors) if factors else 1.0


def detail(result: RulesResult) -> dashboard.Dashboard:
    specs = result.validated.specs
    window = result.validated.current_window_s
    d = _base(UID_DETAIL, "Vigil / SLO detail",
              "One SLO: its SLI against the objective, its burn-rate windows against the alert "
              "thresholds, its error budget over the period.", "now-7d")
    first = specs[0].name if specs else ""
    d = d.with_variable(query_variable(
        "slo", "SLO", f"label_values({RULE_OBJECTIVE}{{{LABEL_POOL}=~\"{q.POOL_VAR}\"}}, "
                      f"{LABEL_SLO})", multi=False).current(
        dm.VariableOption(text=first, value=first)))
    ((legend, sli),) = q.attainment(specs, window)
    d = d.with_panel(stat_panel("Objective", [("{{slo}}", q.objective())], unit=PERCENT,
                                width=6, height=5, decimals=2))
    d = d.with_panel(stat_panel("Error budget left", [("{{slo}}", q.budget_remaining())],
                                unit=PERCENT, width=6, height=5, decimals=1,
                                steps=thresholds((None, RED), (0.0, ORANGE), (0.25, GREEN))))
    d = d.with_panel(stat_panel("Burn rate now", [("{{slo}}", q.current_burn_rate())],
                                unit="x", width=6, height=5, decimals=2,
                                steps=thresholds((None, GREEN), (1.0, ORANGE),
                                                 (_lowest_factor(result), RED))))
    d = d.with_panel(stat_panel(
        "Good events over the period",
        [(f"{legend_}", expr) for legend_, expr in q.attainment(specs)], unit=PERCENT,
        width=6, height=5, decimals=3))
    d = d.with_panel(timeseries_panel(
        f"SLI over {legend} against the objective", [(f"{{{{{LABEL_SLO}}}}} SLI", sli)],
        lines=[("{{slo}} objective", q.objective())], unit=PERCENT, maximum=1, width=24,
        description="The share of good events over [engine] window; the dashed line is the "
                    "objective."))
    d = d.with_panel(_burn_panel(result, "Burn rate by window", 24))
    d = d.with_panel(timeseries_panel(
        "Error budget left over the period", [("{{slo}}", q.budget_remaining())],
        unit=PERCENT, maximum=1, width=24,
        description="The budget burn-down: 1 at the start of a clean period, 0 when spent."))
    d = d.with_panel(state_timeline_panel(
        "Budget alerts firing", [("{{alertname}} {{severity}}", _alerts_query())]))
    return d


def _pool_ratio(result: RulesResult, numerator: str, denominator: str) -> str:
    """Per pool and model: ``rate(numerator) / rate(denominator)``, over each pool's series."""
    def build(pool: PoolConfig) -> str:
        by = q.by_clause(pool)
        return (f"sum by ({by}) (rate({q.model_matcher(pool, numerator)}[{q.RATE_INTERVAL}]))"
                f" / sum by ({by}) (rate({q.model_matcher(pool, denominator)}"
                f"[{q.RATE_INTERVAL}]))")
    return q.per_pool(result.config, build)


def _pool_rate(result: RulesResult, metric: str) -> str:
    def build(pool: PoolConfig) -> str:
        return (f"sum by ({q.by_clause(pool)}) (rate({q.model_matcher(pool, metric)}"
                f"[{q.RATE_INTERVAL}]))")
    return q.per_pool(result.config, build)


def _pool_sum(result: RulesResult, metric: str) -> str:
    def build(pool: PoolConfig) -> str:
        return f"sum by ({q.by_clause(pool)}) ({q.model_matcher(pool, metric)})"
    return q.per_pool(result.config, build)


def _itl_quantile(result: RulesResult, quantile: float) -> str:
    def build(pool: PoolConfig) -> str:
        return (f"histogram_quantile({number(quantile)}, sum by ({q.by_clause(pool, 'le')}) "
                f"(rate({q.model_matcher(pool, VLLM_ITL + SUFFIX_BUCKET)}"
                f"[{q.RATE_INTERVAL}])))")
    return q.per_pool(result.config, build)


def fleet(result: RulesResult) -> dashboard.Dashboard:
    config = result.config
    window = prom_duration(config.engine.window)
    scaling = config.scaling
    model_filter = {LABEL_MODEL_NAME: q.MODEL_VAR}
    first_quantile = RULE_QUANTILE.format(signal="ttft_seconds", quantile=quantile_key(0.5),
                                          window=window)
    d = _base(UID_FLEET, "Vigil / fleet",
              "The vLLM replicas of each pool: latency, load, KV cache, caches, speculative "
              "decoding, throughput, GPU activity, with the scale-out thresholds.", "now-6h")
    d = d.with_variable(query_variable(
        "model", "Model", f"label_values({first_quantile}{{{LABEL_POOL}=~\"{q.POOL_VAR}\"}}, "
                          f"{LABEL_MODEL_NAME})"))
    d = d.with_variable(query_variable(
        "endpoint", "Endpoint", f"label_values({METRIC_GW_REQUESTS}_total"
                                f"{{{LABEL_POOL}=~\"{q.POOL_VAR}\"}}, {LABEL_ENDPOINT})"))
    d = d.with_row(dashboard.Row("Latency"))
    for signal, title in (("ttft_seconds", "Time to first token"),
                          ("e2e_seconds", "End-to-end latency")):
        d = d.with_panel(timeseries_panel(
            f"{title} (p50, p95, p99 over {window})",
            [(f"{{{{{LABEL_POOL}}}}} {{{{{LABEL_MODEL_NAME}}}}} {quantile_key(quantile)}",
              RULE_QUANTILE.format(signal=signal, quantile=quantile_key(quantile),
                                   window=window) + q.pool_filter(model_filter))
             for quantile in QUANTILES], unit="s", minimum=0, width=8,
            description="Vigil's recorded quantiles per pool and model, as the SLO engine "
                        "computes them from vLLM's histograms."))
    d = d.with_panel(timeseries_panel(
        "Inter-token latency (p50, p95, p99)",
        [(f"{{{{{LABEL_POOL}}}}} {{{{{LABEL_MODEL_NAME}}}}} {quantile_key(quantile)}",
          _itl_quantile(result, quantile)) for quantile in QUANTILES],
        unit="s", minimum=0, width=8))
    d = d.with_row(dashboard.Row("Load and scaling signals"))
    d = d.with_panel(threshold_lines(timeseries_panel(
        "Requests waiting", [(f"{{{{{LABEL_POOL}}}}}", f"{RULE_QUEUE_LENGTH}{q.pool_filter()}")],
        unit="short", minimum=0, width=8,
        description="Requests in vLLM's queues, summed over the pool; the dashed line is "
                    "[scaling] scale_out_queue_length."),
        thresholds((None, GREEN), (scaling.scale_out_queue_length, RED))))
    d = d.with_panel(timeseries_panel(
        "Requests running", [("{{pool}} {{model_name}}", _pool_sum(result, VLLM_REQUESTS_RUNNING))],
        unit="short", minimum=0, width=8))
    d = d.with_panel(threshold_lines(timeseries_panel(
        "KV-cache usage", [("{{pool}} mean", f"{RULE_KV_USAGE_AVG}{q.pool_filter()}"),
                           ("{{pool}} max", f"{RULE_KV_USAGE_MAX}{q.pool_filter()}")],
        unit=PERCENT, minimum=0, maximum=1, width=8,
        description="Mean and highest KV-cache usage of the pool's replicas; the dashed lines "
                    "are [scaling] scale_out_kv_usage and [alerts] kv_usage_high."),
        thresholds((None, GREEN), (scaling.scale_out_kv_usage, ORANGE),
                   (config.alerts.kv_usage_high, RED))))
    d = d.with_row(dashboard.Row("Caches, preemption, speculative decoding, throughput"))
    d = d.with_panel(timeseries_panel(
        "Prefix-cache hit rate", [("{{pool}} {{model_name}}", _pool_ratio(
            result, VLLM_PREFIX_CACHE_HITS, VLLM_PREFIX_CACHE_QUERIES))],
        unit=PERCENT, minimum=0, maximum=1, width=6))
    d = d.with_panel(timeseries_panel(
        "Preemptions", [("{{pool}} {{model_name}}", _pool_rate(result, VLLM_PREEMPTIONS))],
        unit="ops", minimum=0, width=6,
        description="Requests preempted per second: the KV cache ran out."))
    d = d.with_panel(timeseries_panel(
        "Speculative decoding acceptance", [("{{pool}} {{model_name}}", _pool_ratio(
            result, VLLM_SPEC_ACCEPTED_TOKENS, VLLM_SPEC_DRAFT_TOKENS))],
        unit=PERCENT, minimum=0, maximum=1, width=6,
        description="Accepted draft tokens per proposed draft token (pools without "
                    "speculative decoding show nothing)."))
    d = d.with_panel(timeseries_panel(
        "Output tokens per second",
        [("{{pool}} {{model_name}}", _pool_rate(result, VLLM_GENERATION_TOKENS))],
        unit="short", minimum=0, width=6))
    d = d.with_row(dashboard.Row("GPU and gateway"))
    d = d.with_panel(timeseries_panel(
        "SM activity (DCGM)", [("{{pool}}", q.per_pool(config, lambda pool: (
            f"avg by ({q.by_pool(pool)}) ({q.dcgm_series(pool, DCGM_SM_ACTIVE)})")))],
        unit=PERCENT, minimum=0, maximum=1, width=12,
        description="The mean share of time the GPUs' SMs were busy (DCGM_FI_PROF_SM_ACTIVE); "
                    "nothing without a DCGM exporter."))
    d = d.with_panel(timeseries_panel(
        "Gateway requests by endpoint",
        [("{{pool}} {{endpoint}} {{status}}",
          f"sum by ({LABEL_POOL}, {LABEL_ENDPOINT}, status) (rate({METRIC_GW_REQUESTS}_total"
          f"{q.pool_filter({LABEL_ENDPOINT: q.ENDPOINT_VAR})}[{q.RATE_INTERVAL}]))")],
        unit="reqps", minimum=0, width=12,
        description="Requests finished by Vigil's gateway per endpoint and HTTP status."))
    return d


def cost(result: RulesResult) -> dashboard.Dashboard:
    config = result.config
    window = prom_duration(config.engine.cost_window)
    cost_rule = RULE_GPU_COST.format(window=window)
    per_1000 = RULE_GPU_COST_PER_1000.format(window=window)
    d = _base(UID_COST, "Vigil / cost",
              "What the GPUs cost per request and per token, how much of the time they idled, "
              "and which tier spent it.", "now-7d")
    d = d.with_panel(stat_panel(
        f"GPU cost per 1000 requests ({window})", [("{{pool}}", f"{per_1000}{q.pool_filter()}")],
        unit="currencyUSD", width=8, decimals=3))
    d = d.with_panel(stat_panel(
        f"GPU cost ({window})", [("{{pool}}", f"{cost_rule}{q.pool_filter()}")],
        unit="currencyUSD", width=8, decimals=2))

    def tokens(pool: PoolConfig) -> str:
        by = q.by_pool(pool)
        return (f"sum by ({by}) (increase({q.series(pool, VLLM_GENERATION_TOKENS)}"
                f"[{window}]))")

    per_million = (f"{cost_rule}{q.pool_filter()}\n/ on ({LABEL_POOL})\n"
                   f"({q.per_pool(config, tokens)})\n* 1e6")
    d = d.with_panel(stat_panel(
        f"GPU cost per 1M output tokens ({window})", [("{{pool}}", per_million)],
        unit="currencyUSD", width=8, decimals=2))
    d = d.with_panel(timeseries_panel(
        f"GPU cost per 1000 requests over time ({window} windows)",
        [("{{pool}}", f"{per_1000}{q.pool_filter()}")], unit="currencyUSD", minimum=0,
        width=12))

    def idle(pool: PoolConfig) -> str:
        by = q.by_pool(pool)
        running = q.series(pool, VLLM_REQUESTS_RUNNING)
        # One value per replica (its data-parallel engines summed), 1 when nothing runs.
        replica = ", ".join(filter(None, (by, replica_label(pool, external=True))))
        return f"avg by ({by}) (sum by ({replica}) ({running}) == bool 0)"

    d = d.with_panel(timeseries_panel(
        "Replicas idle", [("{{pool}}", q.per_pool(config, idle))], unit=PERCENT, minimum=0,
        maximum=1, width=12,
        description="The share of the pool's replicas with no request running: GPU time "
                    "paid for and not used."))
    gw_cost = f"{METRIC_GW_COST}_total{q.pool_filter()}"
    gw_requests = f"{METRIC_GW_REQUESTS}_total{q.pool_filter()}"
    d = d.with_panel(timeseries_panel(
        "Gateway cost by tier (USD per hour)",
        [("{{pool}} {{tier}}", f"sum by ({LABEL_POOL}, {LABEL_TIER}) (rate({gw_cost}"
                               f"[{q.RATE_INTERVAL}])) * 3600")],
        unit="currencyUSD", minimum=0, width=12,
        description="The GPU cost the gateway attributes to each tier's requests."))
    d = d.with_panel(timeseries_panel(
        f"Gateway cost per 1000 requests by tier ({window})",
        [("{{pool}} {{tier}}",
          f"sum by ({LABEL_POOL}, {LABEL_TIER}) (increase({gw_cost}[{window}]))\n"
          f"/ sum by ({LABEL_POOL}, {LABEL_TIER}) (increase({gw_requests}[{window}])) * 1000")],
        unit="currencyUSD", minimum=0, width=12))
    for panel in _chargeback_panels(result):
        d = d.with_panel(panel)
    return d


def currency_unit(code: str) -> str:
    """Grafana's unit for amounts in the ISO 4217 ``code``: its currency unit when it has one
    (``currencyEUR``), else the code after the value (a custom ``suffix:`` unit)."""
    return f"currency{code}" if code in GRAFANA_CURRENCIES else f"suffix: {code}"


def _chargeback_panels(result: RulesResult) -> list[bargauge.Panel]:
    """Each tenant's cost this month and each budget's share spent, from `vigil serve`'s
    ``/metrics`` (its chargeback; no recording rule holds them)."""
    cost = result.config.cost
    return [
        bar_gauge_panel(
            "Cost by tenant this month",
            [(f"{{{{{LABEL_TENANT}}}}}", q.tenant_cost_this_month())],
            unit=currency_unit(cost.currency), minimum=0, decimals=2,
            steps=thresholds((None, GREEN)),
            description=f"Each tenant's GPU cost since the month began ({cost.currency}, "
                        f"months in {cost.timezone}), as `vigil serve` attributes it: the top "
                        "[cost] metrics_tenants tenants by name, the rest as `other`; "
                        "`(idle)` is billed GPU time with nothing running, `(unattributed)` "
                        "traffic vLLM counted that no gateway or OTLP record knows. The value "
                        "at the end of the time range: the month up to then. Needs Prometheus "
                        "to scrape `vigil serve`."),
        bar_gauge_panel(
            "Budgets spent this month",
            [(f"{{{{{LABEL_BUDGET}}}}}", q.budget_spent_share())],
            unit=PERCENT, minimum=0, maximum=1, decimals=1,
            steps=thresholds((None, GREEN), (BUDGET_WARN_SHARE, ORANGE), (1.0, RED)),
            description="Each [[budgets]] entry's spend this month over its monthly amount "
                        "(100 % = spent; the alerts fire at its alert_at shares). A budget "
                        "covers every pool unless it names one: $pool does not narrow this "
                        "panel. No data without [[budgets]]."),
    ]


def build(result: RulesResult) -> Dashboards:
    """The four dashboards of ``result``'s config and SLOs."""
    boards = (overview(result), detail(result), fleet(result), cost(result))
    return Dashboards({b.build().uid or "": b for b in boards})

