"""Reading the SLO series a store recorded (``slo.objectives.recorded``), against a real
Prometheus holding recorded series as its ruler would have written them: one SLO whose rules
are current, one whose rules are of another config, one whose ruler stopped, one never
loaded, and an HA pair of rulers read without deduplication.

Each case is what a team meets: rules not loaded yet, a config changed without reloading
the rules, a ruler that died. Every one but the first is computed from raw series, and the
status JSON, its warnings and the readable table say which and why.
"""

from __future__ import annotations

import math
import tomllib
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture

from alerts.rules.pipeline import generate
from slo.objectives.burn_rate import budget_remaining, burn_rate
from slo.objectives.recorded import read_recorded, recorded_query
from slo.objectives.spec import effective_slos, spec_version
from slo.sources.prometheus import PrometheusSource
from slo.status import evaluate
from vigil.config import Config, parse_config
from vigil.conventions import LABEL_SPEC_VERSION, METRIC_SLO_RECORDED, RULE_SPEC_INFO
from vigil_shell.slo_status_cli import format_table

#: The evaluation instant (Unix s) and the ratios the current SLO's rules recorded.
T = 1_700_000_000.0
CURRENT = {"5m": 0.004, "30m": 0.003, "1h": 0.0025, "2h": 0.002, "6h": float("nan"),
           "1d": 0.0015, "3d": 0.001}
PERIOD_RATIO = 0.0012

CONFIG = """
[engine]
prometheus_url = "http://127.0.0.1:9"

[[pools]]
name = "chat"
model = "m"

[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"

[[slos]]
name = "chat-e2e"
pool = "chat"
indicator = "e2e"

[[slos]]
name = "chat-errors"
pool = "chat"
indicator = "error_rate"

[[slos]]
name = "chat-up"
pool = "chat"
indicator = "replica_up"
"""


def _config() -> Config:
    return parse_config(tomllib.loads(CONFIG), file="vigil.toml")


def _labels(slo: str, **extra: str) -> dict[str, str]:
    return {"slo": slo, "pool": "chat", "model_name": "m", **extra}


def _every(step_s: float, first_s: float, last_s: float, value: float) -> list[tuple[int, float]]:
    n = int((last_s - first_s) // step_s)
    return [(round((first_s + i * step_s) * 1000), value) for i in range(n + 1)]


def _series() -> list[PromSeries]:
    specs = {s.name: s for s in effective_slos(_config())}
    out: list[PromSeries] = []
    # chat-ttft: rules current, evaluated every 30 s (the period group every 5 min), by two
    # rulers of an HA pair whose samples differ by a replica label and 10 s.
    for replica, offset in (("a", 0.0), ("b", -10.0)):
        extra = {"prometheus_replica": replica}
        version = {LABEL_SPEC_VERSION: spec_version(specs["chat-ttft"])}
        out.append(PromSeries(RULE_SPEC_INFO, _labels("chat-ttft", **version, **extra),
                              _every(30, T - 900 + offset, T + offset, 1.0)))
        for window, ratio in CURRENT.items():
            # The later replica's samples are the newest: its value is the one read.
            value = ratio if replica == "a" or math.isnan(ratio) else ratio * 2
            out.append(PromSeries(f"slo:sli_error:ratio_rate{window}",
                                  _labels("chat-ttft", **extra),
                                  _every(30, T - 900 + offset, T + offset, value)))
        out.append(PromSeries("slo:sli_error:ratio_rate30d", _labels("chat-ttft", **extra),
                              _every(300, T - 880 + offset, T - 280 + offset, PERIOD_RATIO)))
    # chat-e2e: rules of another config (another threshold).
    out.append(PromSeries(RULE_SPEC_INFO, _labels("chat-e2e", spec_version="0123456789ab"),
                          _every(30, T - 900, T, 1.0)))
    out.append(PromSeries("slo:sli_error:ratio_rate5m", _labels("chat-e2e"),
                          _every(30, T - 900, T, 0.5)))
    # chat-errors: the ruler stopped 4 minutes ago.
    out.append(PromSeries(RULE_SPEC_INFO, _labels("chat-errors", spec_version=spec_version(
        specs["chat-errors"])), _every(30, T - 900, T - 240, 1.0)))
    # chat-up: never loaded. Something unrelated to hold the store's time range.
    out.append(PromSeries("unrelated_total", {"job": "x"}, _every(60, T - 900, T, 1.0)))
    return out


prom = prometheus_fixture(_series)


def _source(server: PrometheusServer) -> PrometheusSource:
    return PrometheusSource(server.base_url, semantics="2")


def _windows() -> set[float]:
    return set(generate(_config()).validated.windows_s)


def test_one_query_reads_what_the_current_rules_recorded(prom: PrometheusServer) -> None:
    config = _config()
    specs = effective_slos(config)
    with _source(prom) as source:
        read = read_recorded(source, specs, T, windows_s=_windows(), interval_s=30.0,
                             period_interval_s=300.0)
    assert sorted(read.slos) == ["chat-ttft"]
    got = read.slos["chat-ttft"]
    assert got.version == spec_version(specs[0])
    assert got.age_s == 0.0
    # The newest sample of either replica wins: replica a's, 10 s younger.
    assert got.ratios[300.0] == CURRENT["5m"]
    assert got.ratios[86400.0] == CURRENT["1d"]
    assert got.ratios[21600.0] is None  # NaN: no requests in the window
    assert got.ratios[30 * 86400.0] == PERIOD_RATIO
    assert got.ages[30 * 86400.0] == 280.0  # the period group's last evaluation
    assert got.windows == frozenset({*_windows(), 30 * 86400.0})


def test_every_other_slo_falls_back_and_says_why(prom: PrometheusServer) -> None:
    specs = effective_slos(_config())
    with _source(prom) as source:
        read = read_recorded(source, specs, T, windows_s=_windows(), interval_s=30.0,
                             period_interval_s=300.0)
    why = read.fallback
    assert set(why) == {"chat-e2e", "chat-errors", "chat-up"}
    assert "spec version 0123456789ab" in why["chat-e2e"]
    assert spec_version(specs[1]) in why["chat-e2e"]
    assert "last ran 4m" in why["chat-errors"]
    assert f"no {RULE_SPEC_INFO}" in why["chat-up"]
    assert "vigil rules prometheus" in why["chat-up"]


def test_a_stale_period_figure_is_no_data_not_an_old_number(prom: PrometheusServer) -> None:
    """Twenty minutes on, the period group's samples are older than two of its intervals:
    the SLO's rules are current (spec_info is fresh) but the period has no data."""
    specs = effective_slos(_config())[:1]
    with _source(prom) as source:
        read = read_recorded(source, specs, T + 10, windows_s=_windows(), interval_s=30.0,
                             period_interval_s=120.0)
    got = read.slos["chat-ttft"]
    assert 30 * 86400.0 not in got.ratios
    assert got.ratios[300.0] == CURRENT["5m"]


def test_status_takes_the_recorded_ratios_and_flags_the_rest(prom: PrometheusServer) -> None:
    config = _config()
    specs = {s.name: s for s in effective_slos(config)}
    with _source(prom) as source:
        status = evaluate(config, source, T)
    by_name = {s["name"]: s for s in status["slos"]}
    ttft = by_name["chat-ttft"]
    assert ttft["read"] == "recorded"
    assert ttft["recorded"] == {"spec_version": spec_version(specs["chat-ttft"]),
                                "age_seconds": 0.0}
    objective = specs["chat-ttft"].objective
    for key, ratio in CURRENT.items():
        want = None if math.isnan(ratio) else ratio
        assert ttft["windows"][key] == {"error_ratio": want,
                                        "burn_rate": burn_rate(want, objective)}
    assert ttft["period_error_ratio"] == PERIOD_RATIO
    assert ttft["budget_remaining"] == budget_remaining(PERIOD_RATIO, objective)
    assert ttft["interpolated"] is None  # the recorded ratio does not say
    for name in ("chat-e2e", "chat-errors", "chat-up"):
        assert by_name[name]["read"] == "raw"
        assert by_name[name]["recorded"] is None
        # The raw series are not in this store: no data, not the other config's 0.5.
        assert by_name[name]["windows"]["5m"]["error_ratio"] is None
    assert status["recorded_rules"]["read"] == ["chat-ttft"]
    assert set(status["recorded_rules"]["fallback"]) == {"chat-e2e", "chat-errors",
                                                         "chat-up"}
    warnings = [w for w in status.get("warnings", []) if "raw series" in w]
    assert len(warnings) == 3, warnings
    assert any(w.startswith("SLO chat-e2e computed from raw series") for w in warnings)
    table = format_table(status)
    assert "1 read from the store's recorded series, 3 computed from raw series" in table


def test_off_reads_raw_series_only(prom: PrometheusServer) -> None:
    config = _config()
    engine = config.engine.model_copy(update={"recorded_rules": "off"})
    config = config.model_copy(update={"engine": engine})
    with _source(prom) as source:
        status = evaluate(config, source, T)
    assert "recorded_rules" not in status
    assert {s["read"] for s in status["slos"]} == {"raw"}
    assert not any("raw series" in w for w in status.get("warnings", []))


@pytest.mark.parametrize("names", [["a.b", "c+d"], ["chat-ttft"]])
def test_the_query_selects_exactly_the_names_given(prom: PrometheusServer,
                                                   names: list[str]) -> None:
    """SLO names are matched literally (a regex metacharacter selects only itself)."""
    with _source(prom) as source:
        result: list[dict[str, Any]] = source.query(recorded_query(names, 60.0), T)
    slos = {item["metric"]["slo"] for item in result}
    assert slos <= set(names)
    assert bool(slos) == ("chat-ttft" in names)


def test_metrics_say_which_slos_were_read_from_recorded_series(prom: PrometheusServer) -> None:
    """``vigil serve``'s ``/metrics``: ``vigil_slo_recorded`` 1 or 0 per SLO, so an alert
    can watch for SLOs that fell back to raw series."""
    from alerts.exporter import Exporter, Snapshot
    from alerts.notifier import NotifierCounters

    with _source(prom) as source:
        status = evaluate(_config(), source, T)
    exporter = Exporter()
    exporter.update(Snapshot(status, [], NotifierCounters(), [], 0.1, T))
    text = exporter.exposition().decode()
    got = {fam.samples[i].labels["slo"]: fam.samples[i].value
           for fam in text_string_to_metric_families(text) if fam.name == METRIC_SLO_RECORDED
           for i in range(len(fam.samples))}
    assert got == {"chat-ttft": 1.0, "chat-e2e": 0.0, "chat-errors": 0.0, "chat-up": 0.0}


def test_the_backtest_replays_the_recorded_ratios_where_the_rules_ran(
        prom: PrometheusServer) -> None:
    """``vigil slo backtest`` over a history the store's rules covered replays the recorded
    ratios (what its alerts saw); an SLO whose rules were of another config, or stopped
    part-way, is computed from raw series, and says why."""
    from slo.backtest.run import backtest

    with _source(prom) as source:
        result = backtest(_config(), source, T - 600, T + 120, interval_s=30.0)
    by_name = {r.spec.name: r for r in result.slos}
    ttft = by_name["chat-ttft"]
    assert ttft.read == "recorded" and ttft.read_reason == ""
    five = ttft.ratios[300.0]
    assert five.present.all() and set(five.values.tolist()) == {CURRENT["5m"]}
    assert not ttft.ratios[21600.0].present.any()  # NaN recorded: no requests
    assert by_name["chat-e2e"].read == "raw"
    assert "spec version 0123456789ab" in by_name["chat-e2e"].read_reason
    assert by_name["chat-errors"].read == "raw"
    assert "part of the history only" in by_name["chat-errors"].read_reason
    assert "no slo:spec_info" in by_name["chat-up"].read_reason
    doc = result.to_dict()
    assert doc["slos"]["chat-ttft"]["read"] == "recorded"
    assert doc["slos"]["chat-e2e"]["read_reason"].startswith("the store's rules over")
