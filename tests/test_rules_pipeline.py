"""``alerts.rules.pipeline``: each step of the pipeline, asserted on its structured output.

The numbers the expressions compute are checked against Prometheus elsewhere
(``test_rules_vs_prometheus.py``, ``test_rules_promtool.py``); here: which rules exist, their
names, labels, windows, groups and intervals, which buckets an SLI reads for each kind of
threshold, the alert conditions, the scrape jobs, and the promtool test's inputs.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.fleet import MODEL, OTHER_MODEL

from alerts.rules.model import Origin, Rule, prom_duration
from alerts.rules.pipeline import RulesOptions, generate, rules_options, validate
from alerts.rules.promql import le_label, number, sli_error_expr
from alerts.rules.promtool_tests import (
    INPUT_STEPS,
    EngineExpectations,
    eval_time_for,
    pool_inputs,
    render_template,
    series_source,
)
from alerts.rules.scrape_config import scrape_configs
from collector.store import Store
from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec
from slo.sources.embedded import EmbeddedSource
from vigil import conventions as c
from vigil.config import Config, load_config, parse_config
from vigil.errors import ConfigError
from vigil.model import SeriesKey, labels_of

GOLDEN = Path(__file__).resolve().parent / "golden" / "rules"
DAY = 86400.0


def _config(**extra: Any) -> Config:
    base: dict[str, Any] = {
        "pools": [{"name": "chat", "model": MODEL},
                  {"name": "batch", "model": OTHER_MODEL, "gpu": "L40S", "gpus_per_replica": 2}],
        "targets": [
            {"name": "chat-0", "url": "http://127.0.0.1:8000/metrics", "pool": "chat"},
            {"name": "chat-0-gpu", "url": "http://127.0.0.1:8000/dcgm/metrics", "pool": "chat",
             "kind": "dcgm"},
        ],
    }
    return parse_config({**base, **extra})


def _spec(indicator: str, threshold: float | None = None, **kw: Any) -> SloSpec:
    fields: dict[str, Any] = {"name": "s", "pool": "chat", "model": MODEL, "endpoint": "all",
                              "indicator": indicator, "objective": 0.95,
                              "threshold_seconds": threshold, "period_s": 30 * DAY}
    return SloSpec(**{**fields, **kw})


def _les(expr: str) -> list[str]:
    return re.findall(r'le="([^"]+)"', expr)


# --- step 1: validate ---------------------------------------------------------------------


def test_validate_takes_the_default_slos_and_every_window() -> None:
    v = validate(_config())
    assert [s.name for s in v.specs] == [
        "chat-ttft", "chat-e2e", "chat-error-rate", "chat-availability",
        "batch-ttft", "batch-e2e", "batch-error-rate", "batch-availability"]
    assert v.windows_s == (300.0, 1800.0, 3600.0, 7200.0, 21600.0, DAY, 3 * DAY)
    assert v.current_window_s == 300.0 and v.skipped == ()


def test_validate_adds_the_engine_window_and_skips_per_endpoint_slos() -> None:
    v = validate(_config(engine={"window": "2m"}, slos=[
        {"name": "a", "pool": "chat", "indicator": "ttft"},
        {"name": "b", "pool": "chat", "indicator": "ttft", "endpoint": "chat"},
    ]))
    assert v.windows_s[0] == 120.0 and v.current_window_s == 120.0
    assert [s.name for s in v.specs] == ["a"]
    (name, reason), = v.skipped
    assert name == "b" and "request log" in reason


def test_validate_refuses_an_objective_without_a_budget() -> None:
    with pytest.raises(ConfigError, match="objective must be between 0 and 1") as err:
        validate(_config(slo_defaults={"ttft_objective": 1.0}))
    assert err.value.key == "slo_defaults.ttft_objective"


# --- the SLI expressions: which buckets, which constants -----------------------------------


def test_threshold_inside_a_bucket_interpolates_between_its_bounds() -> None:
    expr = sli_error_expr(_spec("ttft", 0.8), 300)
    assert _les(expr) == ["0.75", "1.0", "0.75", "+Inf"]
    assert "* (0.8 - 0.75) / (1.0 - 0.75)" in expr
    assert "vllm:time_to_first_token_seconds_bucket{" in expr
    assert f'model_name="{MODEL}"' in expr and "[5m]" in expr
    assert expr.startswith("1 - (") and "> 0)" in expr  # no requests: absent, not NaN


@pytest.mark.parametrize("indicator, threshold, les, tail", [
    ("ttft", 1.0, ["1.0", "+Inf"], None),                      # on a bound: exact
    ("e2e", 0.3, ["0.3", "+Inf"], None),                       # the lowest bound itself
    ("ttft", 0.0005, ["0.001", "+Inf"], "* 0.0005 / 0.001"),   # below it: from 0
    ("e2e", 0.1, ["0.3", "+Inf"], "* 0.1 / 0.3"),
    ("ttft", 3000.0, ["2560.0", "+Inf"], None),                # above the highest finite bound
    ("e2e", 8.0, ["5.0", "10.0", "5.0", "+Inf"], "* (8.0 - 5.0) / (10.0 - 5.0)"),
])
def test_thresholds_use_the_buckets_bucket_fraction_below_uses(
    indicator: str, threshold: float, les: list[str], tail: str | None
) -> None:
    expr = sli_error_expr(_spec(indicator, threshold), 300)
    assert _les(expr) == les
    if tail:
        assert tail in expr
    else:
        assert " * " not in expr


@pytest.mark.parametrize("threshold", [0.0, -1.0, math.inf, math.nan, None])
def test_latency_thresholds_must_be_positive_and_finite(threshold: float | None) -> None:
    with pytest.raises(ValueError, match="threshold"):
        sli_error_expr(_spec("ttft", threshold), 300)


def test_error_rate_and_availability_expressions() -> None:
    err = sli_error_expr(_spec("error_rate"), 3600)
    assert 'finished_reason="error"' in err and "\n    or\n    0 * sum by (pool) (" in err
    assert 'method="POST", status=~"5.."}[1h]' in err and "clamp_min(" in err
    assert err.count("vllm:request_success_total{") == 8 and "[1h]" in err
    avail = sli_error_expr(_spec("availability"), 300)
    every = 'sum by (pool) (increase(http_requests_total{pool="chat", kind="vllm", method="POST"}'
    assert avail == (
        "(\n"
        f'  {every[:-1]}, status=~"5.."}}[5m]))\n'
        "  or\n"
        f"  0 * {every}[5m]))\n"
        ")\n/\n"
        f"({every}[5m])) > 0)")
    up = sli_error_expr(_spec("replica_up"), 300)
    assert up == '1 - avg by (pool) (avg_over_time(up{pool="chat", kind="vllm"}[5m]))'


def test_le_labels_are_spelled_as_vllm_spells_them() -> None:
    assert [le_label(b) for b in (0.001, 1.0, 2560.0, math.inf)] == [
        "0.001", "1.0", "2560.0", "+Inf"]
    assert [number(x) for x in (0.95, 3600.0, 1.0, 6.88)] == ["0.95", "3600", "1", "6.88"]
    assert [prom_duration(s) for s in (300, 86400, 5400, 1.5)] == ["5m", "1d", "1h30m",
                                                                   "1500ms"]


# --- steps 2-4: recording rules -------------------------------------------------------------


def test_sli_groups_hold_one_rule_per_window() -> None:
    result = generate(_config())
    group = result.slo_groups[0]
    assert group.name == "vigil-slo-sli-chat-ttft" and group.interval_s == 30.0
    assert [r.record for r in group.rules] == [
        f"slo:sli_error:ratio_rate{w}" for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d")]
    for rule in group.rules:
        assert rule.labels == {"slo": "chat-ttft", "pool": "chat", "model_name": MODEL}
        assert rule.origin.kind == "sli_error" and rule.origin.slo == "chat-ttft"


def test_meta_and_period_groups() -> None:
    result = generate(_config(), RulesOptions(interval_s=20.0, period_interval_s=600.0))
    by_name = {g.name: g for g in result.slo_groups}
    meta = by_name["vigil-slo-meta-chat-e2e"]
    period = by_name["vigil-slo-period-chat-e2e"]
    assert (meta.interval_s, period.interval_s) == (20.0, 600.0)
    assert {g.interval_s for g in result.pool_groups + result.alert_groups} == {20.0}
    rules = {r.record: r for r in meta.rules + period.rules}
    assert rules["slo:objective:ratio"].expr == "vector(0.95)"
    assert rules["slo:error_budget:ratio"].expr == "vector(1 - 0.95)"
    assert rules["slo:time_period:days"].expr == "vector(30)"
    assert rules["slo:current_burn_rate:ratio"].expr == (
        'slo:sli_error:ratio_rate5m{slo="chat-e2e"} / (1 - 0.95)')
    assert "[30d]" in rules["slo:sli_error:ratio_rate30d"].expr
    assert rules["slo:period_burn_rate:ratio"].expr == (
        'slo:sli_error:ratio_rate30d{slo="chat-e2e"} / (1 - 0.95)')
    assert rules["slo:period_error_budget_remaining:ratio"].expr == (
        '1 - slo:period_burn_rate:ratio{slo="chat-e2e"}')
    # The order inside a group is the order of evaluation: the period ratio comes first.
    assert period.rules[0].record == "slo:sli_error:ratio_rate30d"


def test_intervals_come_from_the_rules_section_unless_given() -> None:
    config = _config(rules={"interval": "20s", "period_interval": "10m"})
    result = generate(config)
    groups = result.slo_groups + result.pool_groups + result.alert_groups
    assert {g.interval_s for g in groups if "-period-" in g.name} == {600.0}
    assert {g.interval_s for g in groups if "-period-" not in g.name} == {20.0}
    assert result.tests["evaluation_interval"] == "20s"
    assert rules_options(config, interval_s=45.0) == RulesOptions(interval_s=45.0,
                                                                  period_interval_s=600.0)
    assert rules_options(_config()) == RulesOptions()


def test_a_period_that_is_a_burn_window_is_recorded_once() -> None:
    result = generate(_config(slos=[{"name": "e", "pool": "chat", "indicator": "error_rate",
                                     "period": "3d"}]))
    records = Counter((r.record, r.labels.get("slo")) for r in result.rules() if r.record)
    assert records[("slo:sli_error:ratio_rate3d", "e")] == 1
    period = next(g for g in result.slo_groups if g.name == "vigil-slo-period-e")
    assert [r.record for r in period.rules] == [
        "slo:period_burn_rate:ratio", "slo:period_error_budget_remaining:ratio"]


def test_standalone_expressions_read_raw_series_only() -> None:
    for rule in generate(_config()).rules():
        names = set(re.findall(r"\b((?:slo|vigil):[a-z0-9_:]+)\{", rule.standalone))
        assert names == set(), (rule.name, names)
        if rule.expr == rule.standalone:
            continue
        # The only difference: recorded series replaced by parenthesised expressions.
        assert rule.standalone.count("increase(") + rule.standalone.count("avg_over_time(") > 0


def test_pool_group_records_quantiles_kv_queue_and_cost() -> None:
    result = generate(_config(engine={"window": "2m", "cost_window": "30m"},
                              prices={"L40S": 2.0}))
    batch = result.pool_groups[1]
    assert batch.name == "vigil-pool-batch"
    rules = {r.record: r for r in batch.rules}
    assert list(rules) == [
        "vigil:ttft_seconds:p50_2m", "vigil:ttft_seconds:p95_2m", "vigil:ttft_seconds:p99_2m",
        "vigil:e2e_seconds:p50_2m", "vigil:e2e_seconds:p95_2m", "vigil:e2e_seconds:p99_2m",
        "vigil:kv_cache_usage:avg", "vigil:kv_cache_usage:max", "vigil:queue_length:sum",
        "vigil:gpu_cost_usd:sum30m", "vigil:gpu_cost_usd_per_1000_requests:ratio30m"]
    assert all(r.labels == {"pool": "batch"} for r in batch.rules)
    assert rules["vigil:ttft_seconds:p95_2m"].expr == (
        "histogram_quantile(0.95, sum by (pool, model_name, le) (increase("
        'vllm:time_to_first_token_seconds_bucket{pool="batch", kind="vllm"}[2m]))) >= 0')
    assert rules["vigil:kv_cache_usage:max"].expr == (
        'max by (pool) (avg by (pool, instance) (vllm:kv_cache_usage_perc{pool="batch", '
        'kind="vllm"}))')
    assert rules["vigil:gpu_cost_usd:sum30m"].expr == (
        'sum by (pool) (clamp_max(sum_over_time(up{pool="batch", kind="vllm"}[30m]) * 15, 1800))'
        " / 3600 * 2 * 2")
    per = rules["vigil:gpu_cost_usd_per_1000_requests:ratio30m"]
    assert per.expr.startswith('vigil:gpu_cost_usd:sum30m{pool="batch"}\n/\n')
    assert per.expr.endswith("> 0)\n* 1000")


# --- step 5: alerts ------------------------------------------------------------------------


def _alerts(result: Any, name: str) -> list[Rule]:
    return [r for r in result.rules() if r.alert == name]


def test_burn_alerts_follow_the_table() -> None:
    result = generate(_config())
    burn = [r for r in _alerts(result, "ErrorBudgetBurn") if r.labels["slo"] == "chat-ttft"]
    assert [r.labels["severity"] for r in burn] == ["page", "ticket"]
    page, ticket = burn
    assert page.labels == {"severity": "page", "slo": "chat-ttft", "pool": "chat",
                           "model": MODEL}
    assert page.expr == (
        "(\n"
        '  slo:sli_error:ratio_rate1h{slo="chat-ttft"} / (1 - 0.95) > 14.4\n'
        "  and\n"
        '  slo:sli_error:ratio_rate5m{slo="chat-ttft"} / (1 - 0.95) > 14.4\n'
        ")\n"
        "or\n"
        "(\n"
        '  slo:sli_error:ratio_rate6h{slo="chat-ttft"} / (1 - 0.95) > 6\n'
        "  and\n"
        '  slo:sli_error:ratio_rate30m{slo="chat-ttft"} / (1 - 0.95) > 6\n'
        ")")
    assert "ratio_rate1d" in ticket.expr and "ratio_rate3d" in ticket.expr
    assert page.for_s == 0 and "for" not in page.to_dict()
    assert "$value" not in str(page.annotations)


def test_a_custom_table_gives_its_own_severities() -> None:
    table = [{"severity": "page", "factor": 10, "long_window": "1h", "short_window": "5m"}]
    result = generate(_config(engine={"burn_rate_alerts": table}))
    assert {r.labels["severity"] for r in _alerts(result, "ErrorBudgetBurn")} == {"page"}
    assert result.validated.windows_s == (300.0, 3600.0)


def test_budget_low_kv_high_and_target_down() -> None:
    result = generate(_config(alerts={"budget_low_ratio": 0.2, "target_down_scrapes": 4,
                                      "kv_usage_high": 0.85}),
                      RulesOptions(kv_alert_for_s=120))
    low = _alerts(result, "ErrorBudgetLow")[0]
    assert low.expr == 'slo:period_error_budget_remaining:ratio{slo="chat-ttft"} < 0.2'
    kv = _alerts(result, "KvCacheUsageHigh")[0]
    assert kv.expr == ('avg by (pool, instance) (vllm:kv_cache_usage_perc{pool="chat", '
                       'kind="vllm"}) > 0.85')
    assert kv.for_s == 120 and kv.to_dict()["for"] == "2m"
    down, batch = _alerts(result, "TargetDown")
    assert down.expr == 'up{pool="chat"} == 0'
    assert down.for_s == 3 * 15.0
    assert down.labels == {"severity": "ticket", "pool": "chat", "model": MODEL}
    # batch has no target: a PodMonitor or the team's relabelled jobs scrape it, so its
    # up{pool, kind} is watched as a whole.
    assert batch.expr == ('up{pool="batch", kind="vllm"} == 0\nor\n'
                          'up{pool="batch", kind="dcgm"} == 0')
    assert batch.for_s == 3 * 15.0 and batch.labels["pool"] == "batch"


def test_target_down_splits_a_pool_whose_targets_scrape_at_different_rates() -> None:
    config = _config(targets=[
        {"name": "a", "url": "http://h:1/metrics", "pool": "chat"},
        {"name": "b", "url": "http://h:2/metrics", "pool": "chat", "scrape_interval": "1m"},
    ], alerts={"target_down_scrapes": 1})
    rules = [r for r in _alerts(generate(config), "TargetDown") if r.origin.pool == "chat"]
    assert [(r.expr, r.for_s, r.origin.instance) for r in rules] == [
        ('up{pool="chat", instance="a"} == 0', 0.0, "a"),
        ('up{pool="chat", instance="b"} == 0', 0.0, "b")]
    assert all(r.labels["instance"] == r.origin.instance for r in rules)


@pytest.mark.parametrize("case", ["defaults", "fleet"])
def test_every_rule_is_unique_and_named_from_conventions(case: str) -> None:
    result = generate(load_config(GOLDEN / case / "vigil.toml"))
    seen = Counter((r.name, tuple(sorted(r.labels.items()))) for r in result.rules())
    assert max(seen.values()) == 1  # promtool's duplicate-rule lint
    templates = [c.RULE_SLI_ERROR, c.RULE_QUANTILE, c.RULE_GPU_COST, c.RULE_GPU_COST_PER_1000]
    patterns = [re.escape(t).replace(r"\{window\}", ".+").replace(r"\{signal\}", ".+")
                .replace(r"\{quantile\}", ".+") for t in templates]
    fixed = {c.RULE_OBJECTIVE, c.RULE_ERROR_BUDGET, c.RULE_TIME_PERIOD_DAYS, c.RULE_SPEC_INFO,
             c.RULE_CURRENT_BURN_RATE, c.RULE_PERIOD_BURN_RATE, c.RULE_PERIOD_BUDGET_REMAINING,
             c.RULE_KV_USAGE_AVG, c.RULE_KV_USAGE_MAX, c.RULE_QUEUE_LENGTH}
    for rule in result.rules():
        if rule.record:
            assert rule.record in fixed or any(re.fullmatch(p, rule.record) for p in patterns)
        else:
            assert rule.alert in {c.ALERT_ERROR_BUDGET_BURN, c.ALERT_ERROR_BUDGET_LOW,
                                  c.ALERT_KV_CACHE_HIGH, c.ALERT_TARGET_DOWN, c.ALERT_WATCHDOG,
                                  c.ALERT_EVALUATION_STALE}
    prefixes = (c.GROUP_SLO_SLI, c.GROUP_SLO_META, c.GROUP_SLO_PERIOD, c.GROUP_POOL,
                c.GROUP_SLO_ALERTS, c.GROUP_POOL_ALERTS, c.GROUP_META_ALERTS)
    groups = [*result.recording_groups, *result.alert_groups]
    assert all(g.name.startswith(prefixes) for g in groups)
    assert len({g.name for g in groups}) == len(groups)


def test_a_rule_is_either_recording_or_alerting() -> None:
    with pytest.raises(ValueError):
        Rule(expr="x", origin=Origin("queue"))
    with pytest.raises(ValueError):
        Rule(expr="x", origin=Origin("queue"), record="a", alert="B")
    with pytest.raises(ValueError):
        RulesOptions(interval_s=0)


# --- step 6: scrape config ------------------------------------------------------------------


def test_one_scrape_job_per_target_labelled_like_the_collector() -> None:
    config = _config(targets=[
        {"name": "chat-0", "url": "https://h.svc:8443/v1/metrics?x=1&x=2", "pool": "chat",
         "scrape_interval": "30s", "scrape_timeout": "20s"},
        {"name": "gpu", "url": "http://10.0.0.1:9400", "pool": "chat", "kind": "dcgm"},
    ])
    first, second = scrape_configs(config)["scrape_configs"]
    assert first["job_name"] == "vigil-chat-0"
    assert (first["scheme"], first["metrics_path"], first["params"]) == (
        "https", "/v1/metrics", {"x": ["1", "2"]})
    assert (first["scrape_interval"], first["scrape_timeout"]) == ("30s", "20s")
    assert first["static_configs"] == [{"targets": ["h.svc:8443"],
                                        "labels": {"pool": "chat", "kind": "vllm"}}]
    # `job` stays Prometheus's own: the job's name.
    assert first["relabel_configs"] == [{"target_label": "instance", "replacement": "chat-0"}]
    assert first["metric_relabel_configs"][0]["replacement"] == "vllm:${1}"
    assert (second["metrics_path"], second["scrape_interval"]) == ("/", "15s")
    assert "params" not in second


def test_credentials_in_a_target_url_are_refused() -> None:
    config = _config(targets=[{"name": "a", "url": "http://u:p@h:1/metrics", "pool": "chat"}])
    with pytest.raises(ConfigError, match="credentials") as err:
        scrape_configs(config)
    assert err.value.key == "targets[0].url"


# --- step 7: the promtool tests' inputs and expectations -----------------------------------


def test_eval_time_is_a_multiple_of_the_interval_off_the_sample_grid() -> None:
    assert eval_time_for(30.0) == 7170.0  # 1h59m30s
    assert eval_time_for(45.0) == 7155.0
    assert eval_time_for(60.0) == 7140.0  # no choice: on the grid
    for interval in (1.0, 7.0, 30.0, 45.0, 90.0):
        t = eval_time_for(interval)
        assert t % interval == 0 and t <= INPUT_STEPS * 60


def test_templates_render_like_prometheus() -> None:
    labels = {"slo": "chat-ttft", "pool": "chat"}
    assert render_template("SLO {{ $labels.slo }} of {{ $labels.pool }}{{ $labels.x }}",
                           labels) == "SLO chat-ttft of chat"


def test_promtool_document_reads_both_rule_files() -> None:
    result = generate(_config(), RulesOptions(interval_s=15.0))
    doc = result.tests
    assert doc["rule_files"] == ["vigil-slo-rules.yml", "vigil-alert-rules.yml"]
    assert doc["evaluation_interval"] == "15s"
    assert [t["name"] for t in doc["tests"]] == [
        "pool chat", "pool batch", "one copy of vigil serve stuck, another live",
        "every copy of vigil serve stuck"]
    chat = doc["tests"][0]
    recorded = [r for r in result.rules() if r.record and r.origin.pool == "chat"]
    assert len(chat["promql_expr_test"]) == len(recorded)
    assert {t["alertname"] for t in chat["alert_rule_test"]} == {
        "ErrorBudgetBurn", "ErrorBudgetLow", "KvCacheUsageHigh", "TargetDown"}
    # The default SLOs on the synthetic fleet: availability (2 % of the answers are 5xx, the
    # down replica answers none), the error rate and TTFT file tickets.
    burn = next(t for t in chat["alert_rule_test"] if t["alertname"] == "ErrorBudgetBurn")
    fired = sorted((a["exp_labels"]["slo"], a["exp_labels"]["severity"])
                   for a in burn["exp_alerts"])
    assert fired == [("chat-availability", "ticket"), ("chat-error-rate", "ticket"),
                     ("chat-ttft", "ticket")]


def test_series_source_answers_like_the_embedded_source(tmp_path: Path) -> None:
    """The promtool tests' expected values come from ``series_source`` (a
    ``slo.sources.memory.MemorySource``): on the same samples it must give the engine's
    floats, bit for bit."""
    config = _config()
    pool = config.pools[0]
    inputs = pool_inputs(config, pool, validate(config).specs)
    rows = [(SeriesKey(s.name, labels_of(s.labels)),
             "gauge" if s.step == 0 else "counter", p.ts_ms, p.value)
            for s in inputs for p in s.points()]
    memory = series_source(inputs, semantics="2")
    with Store(tmp_path / "v.db") as store:
        store.write(rows)
        embedded = EmbeddedSource(store, semantics="2")
        at = eval_time_for(30.0)
        for spec in validate(config).specs:
            if spec.pool != pool.name:
                continue
            for window in (300.0, 3600.0, 30 * DAY):
                ours = error_ratio(spec, memory, at, window)
                assert ours == error_ratio(spec, embedded, at, window), (spec.name, window)
                assert ours.error_ratio is not None


@pytest.mark.parametrize("case", ["defaults", "fleet"])
def test_prometheus_3_rules_expect_the_same_numbers(case: str) -> None:
    """Evaluated between two samples, the synthetic fleet gives the same floats under the
    3.x rules (left-open ranges, Kahan sums) as under 2.42's, so the generated tests hold for
    a Prometheus 3 promtool too."""
    config = load_config(GOLDEN / case / "vigil.toml")
    result = generate(config)
    at = eval_time_for(30.0)
    for pool in config.pools:
        specs = [s for s in result.validated.specs if s.pool == pool.name]
        inputs = pool_inputs(config, pool, specs)
        v2 = EngineExpectations(config, pool, specs, series_source(inputs, semantics="2"), at)
        v3 = EngineExpectations(config, pool, specs, series_source(inputs, semantics="3"), at)
        for rule in result.rules():
            if rule.record and rule.origin.pool == pool.name:
                assert v2.recorded(rule) == v3.recorded(rule), rule.record


def test_metricsql_rules_spell_each_increase_once_and_fit_victoriametrics_limit() -> None:
    """``[engine] dialect = "metricsql"``: every increase is a call of the WITH template of
    its window, defined once per rule, so each rule stays under VictoriaMetrics' default
    ``-search.maxQueryLen`` (16 KiB); no promtool test file (promtool cannot run MetricsQL)."""
    config = load_config(GOLDEN / "fleet" / "vigil.toml")
    engine = config.engine.model_copy(update={"dialect": "metricsql"})
    result = generate(config.model_copy(update={"engine": engine}))
    exprs = [r.expr for r in result.rules()]
    assert not any(re.search(r"\bincrease\(", e) for e in exprs)
    with_increase = [e for e in exprs if "promql_increase_" in e]
    assert with_increase and all(e.startswith("WITH (\n") for e in with_increase)
    assert all(e.count("increase_prometheus(series[") <= 2 * e.count(") = (") for e in exprs)
    assert max(len(e) for e in exprs) < 16384
    assert c.FILE_RULES_TEST not in result.files()
    assert "Written in MetricsQL" in result.files()[c.FILE_SLO_RULES]
