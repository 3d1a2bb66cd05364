"""Every page through Streamlit's ``AppTest`` over a seeded store: what is shown equals `vigil
slo status --json` for the same time, the filters change what is shown, and missing things
(store, targets, pools, gateway records) give the empty state that says what to do."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest
from support.apptest import APP, REPO, run_page, texts
from support.dashboard_seed import AT, config_toml, seed_dashboard
from support.fleet import MODEL, OTHER_MODEL

from collector.store import Store
from dashboard import format as fmt
from dashboard.timeseries import burn_point
from slo.objectives.quantiles import histogram_figures
from slo.objectives.spec import effective_slos
from slo.sources.embedded import EmbeddedSource
from vigil.config import load_config
from vigil.conventions import DASHBOARD_ENV_AT, DASHBOARD_ENV_CONFIG
from vigil.durations import parse_duration

PAGES = ("quality", "server", "business", "anomalies")


def slo_status(config: Path, at: float = AT) -> dict[str, Any]:
    """`vigil slo status --json` for ``config`` at ``at``, from the real command."""
    proc = subprocess.run(
        [sys.executable, "-m", "vigil_shell.cli", "slo", "status", "--config", str(config),
         "--json", "--at", repr(at)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)




def charts(at: AppTest) -> list[tuple[dict[str, Any], list[pd.DataFrame]]]:
    """Every Vega-Lite chart on the page: its spec and its datasets as frames."""
    out = []
    for el in at.get("vega_lite_chart"):
        frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas()
                  for d in el.proto.datasets]
        out.append((json.loads(el.proto.spec), frames))
    return out


def chart_with_label(at: AppTest, label: str) -> pd.DataFrame:
    """The data (series, value over time) of the chart whose rules include ``label``."""
    for _, frames in charts(at):
        if any("label" in f and label in set(f["label"]) for f in frames):
            return next(f for f in frames if "series" in f)
    raise AssertionError(f"no chart with a line labelled {label!r}")




@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_dashboard(tmp_path_factory.mktemp("app"))


@pytest.fixture(scope="module")
def status(seeded: Path) -> dict[str, Any]:
    return slo_status(seeded)


@pytest.fixture(scope="module")
def with_gateway(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_dashboard(tmp_path_factory.mktemp("gw"), gateway=True)


# --- Overview -----------------------------------------------------------------------------------
def _tile_values(at: AppTest, slo: dict[str, Any]) -> None:
    tile = at.get_by_key(f"slo-{slo['name']}")
    assert tile.metric[0].value == fmt.percent(slo["sli"], 2)
    progress = tile.get("progress")[0].proto.text
    assert fmt.percent(slo["budget_remaining"], 1) in progress
    state = ("page" if "page" in slo["alerts"] else "ticket" if slo["alerts"] else "ok")
    assert f"-badge[{state}]" in tile.markdown[0].value
    now = fmt.percent(slo["current"]["sli"], 2)
    assert any(now in c.value for c in tile.caption)


def test_overview_shows_the_status_of_vigil_slo_status(seeded: Path, status: dict[str, Any],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch)
    assert at.title[0].value == "Overview"
    assert "2026-11-18 11:06:40Z" in at.caption[0].value
    for slo in status["slos"]:
        _tile_values(at, slo)
    for name, pool in status["pools"].items():
        block = at.get_by_key(f"pool-{name}")
        metrics = {m.label: m for m in block.metric}
        cost = metrics["GPU cost per 1000 requests"]
        assert cost.value == fmt.usd(pool["cost"]["per_1000_requests"])
        scaling = pool["scaling"]
        assert metrics["Replicas: current → desired"].value == (
            f"{scaling['current']} → {scaling['desired']}")
        shown = "\n".join(m.value for m in block.markdown)
        for reason in scaling["reasons"]:
            assert reason in shown
        kv = pool["kv_cache_usage"]
        assert metrics["KV-cache usage (mean / max)"].value == (
            f"{fmt.percent(kv['avg'], 0)} / {fmt.percent(kv['max'], 0)}")
        assert metrics["Queue (waiting requests)"].value == fmt.count(pool["queue_length"])
        assert metrics["TTFT p95 (pool)"].value == fmt.seconds(
            scaling["signals"]["ttft_p95_seconds"])
        assert any(fmt.usd(pool["cost"]["per_million_output_tokens"]) in c.value
                   for c in block.caption)
    assert status["pools"]["chat"]["scaling"]["action"] == "scale_out"  # as seeded


def test_overview_lists_the_alerts_of_the_shown_status(seeded: Path, status: dict[str, Any],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch)
    alerts = at.dataframe[0].value
    burning = {(r["name"], sev) for r in status["slos"] for sev in r["alerts"]}
    shown = {(r.subject, r.severity) for r in alerts.itertuples() if r.alert == "ErrorBudgetBurn"}
    assert shown == burning
    assert alerts.iloc[0]["severity"] == "page"
    assert "evaluated here" in texts(at)


def test_pool_filter_keeps_one_pool(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch, pool=["batch"])
    assert at.sidebar.multiselect(key="pool").value == ["batch"]
    assert at.get_by_key("pool-batch") is not None
    with pytest.raises(KeyError):
        at.get_by_key("pool-chat")
    assert all(r.pool == "batch" for r in at.dataframe[0].value.itertuples())


def test_model_and_endpoint_filters_select_the_slos(seeded: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch, model=[OTHER_MODEL])
    at.get_by_key("slo-batch-ttft")
    with pytest.raises(KeyError):
        at.get_by_key("slo-chat-ttft")
    at = run_page(seeded, monkeypatch, endpoint="chat")
    with pytest.raises(KeyError):
        at.get_by_key("slo-chat-ttft")
    assert "No SLO of this pool matches the filters." in texts(at)


def test_changing_a_filter_in_the_sidebar_reruns_with_it(seeded: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch)
    at.get_by_key("pool-chat")
    at.sidebar.multiselect(key="pool").set_value(["batch"]).run()
    with pytest.raises(KeyError):
        at.get_by_key("pool-chat")


# --- Quality ------------------------------------------------------------------------------------
def test_quality_charts_end_at_the_status_values(seeded: Path, status: dict[str, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch, "quality")
    assert at.title[0].value == "Quality"
    ttft = chart_with_label(at, "SLO chat-ttft ≤ 800 ms")
    last = ttft[ttft["time"] == ttft["time"].max()].set_index("series")["value"]
    want = histogram_figures(status["pools"]["chat"]["models"][MODEL]["quantiles"]["ttft_seconds"])
    assert last.to_dict() == pytest.approx(want, rel=1e-12)
    assert ttft["time"].max() == pd.Timestamp(AT, unit="s", tz="UTC")
    e2e = chart_with_label(at, "SLO batch-e2e ≤ 8.00 s")
    last = e2e[e2e["time"] == e2e["time"].max()].set_index("series")["value"]
    want = histogram_figures(
        status["pools"]["batch"]["models"][OTHER_MODEL]["quantiles"]["e2e_seconds"])
    assert last.to_dict() == pytest.approx(want, rel=1e-12)
    # 6 h at a 5-minute step: 72 grid points and the end, never more than 120.
    assert ttft["time"].nunique() == 73


def test_quality_burn_rates_are_the_status_windows(seeded: Path, status: dict[str, Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch, "quality")
    table = at.dataframe[0].value.set_index("SLO")
    for slo in status["slos"]:
        for window, v in slo["windows"].items():
            shown = table.loc[slo["name"], window]
            assert (pd.isna(shown) and v["burn_rate"] is None) or shown == pytest.approx(
                v["burn_rate"], rel=1e-12)
    # The SLO drawn by default is the one that pages, with the alert table's factors.
    assert at.selectbox(key="slo").value == "chat-error-rate"
    specs = [spec for spec, _ in charts(at)]
    bars = next(f for s, fs in charts(at) for f in fs if "window" in f)
    err = next(s for s in status["slos"] if s["name"] == "chat-error-rate")
    assert bars.set_index("window")["burn rate"].to_dict() == pytest.approx(
        {w: v["burn_rate"] for w, v in err["windows"].items()}, rel=1e-12)
    assert specs and any("14.4x page (1h & 5m)" in set(f.get("label", []))
                         for _, fs in charts(at) for f in fs)


@pytest.mark.parametrize("slo", ["chat-error-rate", "chat-ttft"])
def test_quality_burn_history_is_the_engines_burn_rate_at_every_point(
        seeded: Path, monkeypatch: pytest.MonkeyPatch, slo: str) -> None:
    # The history is computed over the whole range at once (range queries); each point must
    # still be what the engine answers at that instant.
    at = run_page(seeded, monkeypatch, "quality")
    at.selectbox(key="slo").set_value(slo).run()
    history = next(f for _, fs in charts(at) for f in fs
                   if "series" in f and f["series"].str.endswith(" window").all())
    config = load_config(seeded)
    spec = next(s for s in effective_slos(config) if s.name == slo)
    with Store(config.store_path(), readonly=True) as store:
        source = EmbeddedSource(store)
        for series, points in history.groupby("series"):
            window = parse_duration(str(series).removesuffix(" window"))
            for t, shown in zip(points["time"], points["value"], strict=True):
                want = burn_point(spec, source, pd.Timestamp(t).timestamp(), window)
                assert shown == pytest.approx(want["burn_rate"], rel=1e-12), (series, t)
    assert len(history) > 100


def test_quality_range_sets_the_points(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch, "quality", range="1h")
    ttft = chart_with_label(at, "SLO chat-ttft ≤ 800 ms")
    # 1 h at a 1-minute step: 60 grid points and the end.
    assert ttft["time"].nunique() == 61
    # The first is the first whole minute inside the range (the grid is the step's multiples).
    first = math.ceil((AT - 3600) / 60) * 60
    assert ttft["time"].min() == pd.Timestamp(first, unit="s", tz="UTC")


def test_custom_range_from_the_url(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch, "quality", range="custom", start="2026-11-18T08:00",
                  end="2026-11-18T10:00")
    assert "range 2h" in at.caption[0].value and "2026-11-18 10:00:00Z" in at.caption[0].value
    ttft = chart_with_label(at, "SLO chat-ttft ≤ 800 ms")
    assert ttft["time"].min() == pd.Timestamp("2026-11-18T08:00:00Z")
    assert ttft["time"].max() == pd.Timestamp("2026-11-18T10:00:00Z")
    backwards = run_page(seeded, monkeypatch, range="custom", start="2026-11-18T10:00",
                         end="2026-11-18T08:00")
    assert "“To” must be after “From”" in backwards.sidebar.warning[0].value
    assert "range 1h" in backwards.caption[0].value


def test_quality_error_classes_from_vllm_and_the_gateway(
        with_gateway: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(with_gateway, monkeypatch, "quality", range="1h")
    errors = chart_with_label(at, "SLO chat-error-rate: 0.50%")
    assert {"5xx / OOM (vLLM error)", "aborted by the server", "gateway: timeout",
            "gateway: upstream 5xx"} <= set(errors["series"])


# --- Server, Business, Anomalies ----------------------------------------------------------------
def test_server_page(seeded: Path, status: dict[str, Any],
                     monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch, "server")
    assert at.title[0].value == "Server"
    kv = chart_with_label(at, "KV alert > 90%")
    assert {"chat-0", "chat-1", "pool mean"} <= set(kv["series"])
    last = kv[(kv["time"] == kv["time"].max()) & (kv["series"] == "pool mean")]["value"]
    assert list(last) == [pytest.approx(status["pools"]["chat"]["kv_cache_usage"]["avg"])]
    queue = chart_with_label(at, "scale out > 50")
    assert queue[queue["time"] == queue["time"].max()]["value"].iloc[0] == (
        status["pools"]["chat"]["queue_length"])
    all_series = {s for _, fs in charts(at) for f in fs if "series" in f for s in f["series"]}
    assert {"chat-0-gpu gpu 0", "preemptions", "prefix-cache hit rate",
            "acceptance rate"} <= all_series
    assert "Speculative decoding is not enabled in this pool" in texts(at)  # batch


def test_business_page(seeded: Path, status: dict[str, Any],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch, "business")
    now = at.dataframe[0].value.set_index("pool")
    for name, pool in status["pools"].items():
        row = now.loc[next(i for i in now.index if i.startswith(name + " "))]
        assert row["per 1000 requests"] == pool["cost"]["per_1000_requests"]
        assert row["idle cost"] == pool["cost"]["idle_cost_usd"]
    assert "No gateway data." in texts(at)
    what_if = next(m for m in at.metric if m.label == "Cost per 1000 requests")
    assert what_if.value == fmt.usd(status["pools"]["chat"]["cost"]["per_1000_requests"])
    at.number_input(key="whatif-replicas-chat").set_value(1).run()
    what_if = next(m for m in at.metric if m.label == "Cost per 1000 requests")
    assert what_if.value == fmt.usd(status["pools"]["chat"]["cost"]["per_1000_requests"] / 2)


def test_business_page_with_gateway_records(with_gateway: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(with_gateway, monkeypatch, "business", range="1h")
    saved = next(m for m in at.metric if m.label == "Saved by the semantic cache")
    assert saved.value == fmt.usd(28 * 0.0012)  # seeded l2 hits: every 11th of 300
    tiers = next(f for _, fs in charts(at) for f in fs if "tier" in f)
    per_1000 = tiers.set_index("tier")["per 1000 requests"].to_dict()
    assert set(per_1000) == {"premium", "standard", "batch"}
    assert per_1000["premium"] > per_1000["standard"]


def test_anomalies_page_histogram_estimate(seeded: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    from collector.store import Store
    from slo.objectives.anomaly import pool_anomalies
    from slo.sources.embedded import EmbeddedSource
    from vigil.config import load_config

    at = run_page(seeded, monkeypatch, "anomalies")
    assert "No gateway data." in texts(at)
    table = at.dataframe[0].value
    newest = table[table["window end"] == fmt.timestamp(AT)]
    config = load_config(seeded)
    with Store(seeded.parent / "vigil.db", readonly=True) as store:
        want = {a["pool"]: a for p in config.pools
                for a in pool_anomalies(EmbeddedSource(store), config, p, AT)}
    assert set(newest["pool"]) == set(want) == {"chat", "batch"}
    for _, row in newest.iterrows():
        assert row["at least"] == want[row["pool"]]["requests_above"]
        assert row["threshold tokens"] == pytest.approx(want[row["pool"]]["threshold_tokens"])
    assert at.get("vega_lite_chart")


def test_anomalies_page_exact_requests_from_the_gateway(
        with_gateway: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(with_gateway, monkeypatch, "anomalies")
    exact, estimate = (d.value for d in at.dataframe)  # exact first, then the estimate
    assert list(exact["tokens"]) == [60_400]  # 400 prompt + 60,000 generated
    assert list(exact["tier"]) == ["premium"]
    assert list(exact["pool"]) == ["chat"]
    # batch has no records: its estimate comes from the histograms.
    assert set(estimate["pool"]) == {"batch"}


# --- empty states -------------------------------------------------------------------------------
def test_no_store_yet_says_to_start_vigil_serve(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    config = seed_dashboard(tmp_path, store=False)
    for page in (None, *PAGES):
        at = run_page(config, monkeypatch, page)
        assert "No data yet." in texts(at) and "vigil serve --config" in texts(at), page
        assert not at.get("vega_lite_chart")


def test_empty_store_shows_no_data_everywhere(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from collector.store import Store

    config = seed_dashboard(tmp_path, store=False)
    Store(tmp_path / "vigil.db").close()
    at = run_page(config, monkeypatch)
    assert "No `up` sample from any target in the last lookback." in texts(at)
    assert at.get_by_key("slo-chat-ttft").metric[0].value == fmt.NULL
    assert at.get_by_key("pool-chat").metric[0].value == fmt.NULL
    for page in PAGES:
        at = run_page(config, monkeypatch, page)
        assert not at.get("vega_lite_chart"), page
    at = run_page(config, monkeypatch, "quality")
    assert "No TTFT observation for" in texts(at)


def test_no_targets_configured(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = seeded.parent / "no-targets.toml"  # the same store, no [[targets]]
    config.write_text(config_toml(targets=False))
    at = run_page(config, monkeypatch)
    assert "No targets are configured." in texts(at)
    at = run_page(config, monkeypatch, "server")
    assert "No DCGM exporter target in this pool" in texts(at)


def test_no_pools_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "vigil.toml"
    config.write_text('[store]\npath = "vigil.db"\n')
    from collector.store import Store

    Store(tmp_path / "vigil.db").close()
    at = run_page(config, monkeypatch)
    assert "No pools are configured." in texts(at)


def test_target_down_is_named(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(seeded))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["at"] = repr(AT - 8000)  # batch-0 was down then
    at.run()
    assert not at.exception
    assert "Target down:" in texts(at) and "`batch-0`" in texts(at)
    assert "`chat-0`" not in texts(at)


def test_bad_config_and_missing_config_are_messages(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DASHBOARD_ENV_CONFIG, raising=False)
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert "vigil dashboard --config FILE" in at.error[0].value
    bad = tmp_path / "bad.toml"
    bad.write_text("[[pools]]\nname = 3\n")
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(bad))
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert "pools[0].name" in at.error[0].value


def test_bad_at_falls_back_to_now_with_a_warning(seeded: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(seeded))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["at"] = "yesterday"
    at.run()
    assert not at.exception
    assert "at='yesterday'" in at.sidebar.warning[0].value
    assert "(live" in at.caption[0].value


def test_pinned_by_environment(seeded: Path, status: dict[str, Any],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(seeded))
    monkeypatch.setenv(DASHBOARD_ENV_AT, repr(AT))
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception
    assert at.get_by_key("slo-chat-ttft").metric[0].value == fmt.percent(
        status["slos"][0]["sli"], 2)
    assert not any(b.label == "Back to now" for b in at.sidebar.button)


# --- login ----------------------------------------------------------------------------------------
def test_password_login_comes_before_any_page(seeded: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config = seeded.parent / "with-password.toml"
    config.write_text(seeded.read_text() + '\n[dashboard]\npassword_env = "VIGIL_TEST_DASH_PW"\n')
    monkeypatch.setenv("VIGIL_TEST_DASH_PW", "correct horse")
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(config))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["at"] = repr(AT)
    at.run()
    assert not at.exception
    assert at.text_input[0].proto.type == at.text_input[0].proto.PASSWORD
    assert not at.metric and not at.get("vega_lite_chart")
    at.text_input[0].input("wrong")
    at.button[0].click().run()
    assert "Wrong password." in at.error[0].value and not at.metric
    at.text_input[0].input("correct horse")
    at.button[0].click().run()
    assert not at.exception
    assert at.title[0].value == "Overview" and at.metric


# --- Prometheus as the source -------------------------------------------------------------------
@pytest.fixture(scope="module")
def prometheus_config(seeded: Path) -> Iterator[Path]:
    from support.prometheus import PromSeries, require_prometheus, run_prometheus

    from collector.store import Store

    binaries = require_prometheus()
    series = []
    with Store(seeded.parent / "vigil.db", readonly=True) as store:
        for name in store.metric_names():
            for key, points in store.points(name).items():
                series.append(PromSeries(name, key.as_dict(), [
                    (p.ts_ms, p.value) for p in points if p.value is not None]))
    with run_prometheus(series, binaries=binaries) as server:
        config = seeded.parent / "prometheus.toml"
        config.write_text(seeded.read_text().replace(
            "[collector]", f'[engine]\nprometheus_url = "{server.base_url}"\n\n[collector]'))
        yield config


@pytest.mark.slow
def test_prometheus_source_shows_what_vigil_slo_status_reads_there(
        prometheus_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    status = slo_status(prometheus_config)
    assert status["source"] == "prometheus"
    at = run_page(prometheus_config, monkeypatch)
    assert "source prometheus" in at.caption[0].value
    for slo in status["slos"]:
        _tile_values(at, slo)
    block = at.get_by_key("pool-chat")
    assert block.metric[0].value == fmt.usd(status["pools"]["chat"]["cost"]["per_1000_requests"])
    at = run_page(prometheus_config, monkeypatch, "quality", range="1h")
    ttft = chart_with_label(at, "SLO chat-ttft ≤ 800 ms")
    last = ttft[ttft["time"] == ttft["time"].max()].set_index("series")["value"]
    assert last.to_dict() == pytest.approx(histogram_figures(
        status["pools"]["chat"]["models"][MODEL]["quantiles"]["ttft_seconds"]), rel=1e-9)


def test_oidc_login_button_when_st_login_is_configured(seeded: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(seeded))
    at = AppTest.from_file(APP, default_timeout=120)
    at.secrets["auth"] = {"redirect_uri": "http://127.0.0.1:8501/oauth2callback",
                          "cookie_secret": "not-a-real-secret", "client_id": "vigil",
                          "client_secret": "x",
                          "server_metadata_url": "https://id.example/.well-known/openid-configuration"}
    at.query_params["at"] = repr(AT)
    at.run()
    assert not at.exception
    assert [b.label for b in at.button] == ["Log in"]
    assert not at.metric and at.title[0].value == "Vigil"


# --- pinning ------------------------------------------------------------------------------------
def test_pin_this_moment_then_back_to_now(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(seeded))
    monkeypatch.delenv(DASHBOARD_ENV_AT, raising=False)
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert "(live, refreshing every 30s)" in at.caption[0].value
    assert at.sidebar.selectbox(key="refresh").value == "30s"
    at.sidebar.button[0].click().run()  # "Pin this moment to the URL"
    assert not at.exception
    assert "(pinned)" in at.caption[0].value
    assert float(at.query_params["at"]) > AT
    back = next(b for b in at.sidebar.button if b.label == "Back to now")
    back.click().run()
    assert "(live" in at.caption[0].value and "at" not in at.query_params


def test_unreachable_prometheus_is_an_error_message(seeded: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from support.loopback import free_port

    config = seeded.parent / "prometheus-down.toml"
    config.write_text(seeded.read_text().replace(
        "[collector]", f'[engine]\nprometheus_url = "http://127.0.0.1:{free_port()}"\n\n'
                       "[collector]"))
    for page in (None, "quality"):
        at = run_page(config, monkeypatch, page)
        assert "Prometheus at http://127.0.0.1:" in at.error[0].value, page
        assert not at.get("vega_lite_chart")


def test_the_servers_warnings_are_shown(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Thanos querier that answers without one of its stores says so in `warnings`: the
    Overview shows it above the figures."""
    from support.loopback import serve_http

    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []},
                       "warnings": ["partial response: store 10.0.0.3:10901 unreachable"]})
    with serve_http(lambda _req: (200, "application/json", body.encode())) as server:
        config = seeded.parent / "prometheus-partial.toml"
        config.write_text(seeded.read_text().replace(
            "[collector]", f'[engine]\nprometheus_url = "{server.url}"\n'
                           'promql_semantics = "3"\n\n[collector]'))
        at = run_page(config, monkeypatch, None)
    assert not at.exception
    warned = [w.value for w in at.warning if w.value.startswith("**Warning:**")]
    assert warned and "store 10.0.0.3:10901 unreachable" in warned[0]


# --- a young store ------------------------------------------------------------------------------
#: How much data the young store holds (minutes after `vigil serve` first started).
YOUNG_S = 360.0


@pytest.fixture(scope="module")
def young(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import support.dashboard_seed as test_dashboard_seed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(test_dashboard_seed, "SPAN_S", YOUNG_S)
        return seed_dashboard(tmp_path_factory.mktemp("young"))


def test_young_store_fits_the_default_range_to_its_data(young: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(young, monkeypatch)
    assert at.selectbox(key="range").value == "15m"
    assert "showing the 6 min of data the store has" in at.caption[0].value
    assert any("the store holds 6 min" in c.value for c in at.sidebar.caption)
    at.switch_page("views/quality.py").run()
    assert not at.exception, [e.value for e in at.exception]
    ttft = chart_with_label(at, "SLO chat-ttft ≤ 800 ms")
    # On the scrape interval (30 s) from the first sample: a line, not two dots.
    times = sorted(ttft["time"].unique())
    assert times[0] >= pd.Timestamp(AT - YOUNG_S, unit="s", tz="UTC")
    assert times[-1] == pd.Timestamp(AT, unit="s", tz="UTC")
    assert len(times) >= 9
    # The grid's multiples of 30 s, then the end itself.
    assert {b - a for a, b in itertools.pairwise(times[:-1])} == {pd.Timedelta(seconds=30)}


def test_young_store_keeps_a_range_the_user_picked(young: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(young, monkeypatch, range="6h")
    assert at.selectbox(key="range").value == "6h"
    assert "range 6h" in at.caption[0].value and "showing the" not in at.caption[0].value
    at = run_page(young, monkeypatch, range="1h")
    assert "showing the" not in at.caption[0].value


def test_fitted_range_follows_the_store_as_it_grows(young: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(young, monkeypatch)
    assert at.selectbox(key="range").value == "15m"
    # Half an hour later (pinned there), the data reaches 36 min back: the default is 1 h.
    at.query_params["at"] = repr(AT + 1800)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="range").value == "1h"
    assert "showing the 36 min of data the store has" in at.caption[0].value
    # Once the user picks a range, it stays.
    at.selectbox(key="range").select("15m").run()
    at.query_params["at"] = repr(AT + 4 * 3600)
    at.run()
    assert at.selectbox(key="range").value == "15m"


def test_old_store_keeps_the_default_range(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(seeded, monkeypatch)
    assert at.selectbox(key="range").value == "6h"
    assert "showing the" not in at.caption[0].value
    assert not any("Fitted" in c.value for c in at.sidebar.caption)
