"""The Plan page through Streamlit's ``AppTest`` over a seeded store and saved capacity
profiles: what it shows equals ``slo.planning.plan`` / ``slo.cost.waste`` / ``slo.planning.replay``
computed here for the same store and time, and each missing piece (profiles, history, today's
profile) gives the empty state that names its cause. ``dashboard.plan_data``'s small functions are
tested alone."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest
from support.dashboard_seed import AT, seed_dashboard
from support.fleet import MODEL

from collector.store import Store
from dashboard import format as fmt
from dashboard.plan_data import aligned_range, badge, curve_rows, plan_page, waste_rows
from slo.cost.waste import WasteResult, waste
from slo.planning import estimate as capacity_estimate
from slo.planning.candidates import gather_candidates
from slo.planning.forecast import forecast_from_history
from slo.planning.plan import PlanResult, plan
from slo.planning.profile_store import ProfileStore
from slo.planning.replay import decision_counts, replay_decisions
from slo.sources.embedded import EmbeddedSource
from vigil.capacity import CapacityProfile, ProfileIdentity, SloTarget
from vigil.config import Config, load_config
from vigil.conventions import DASHBOARD_ENV_AT, DASHBOARD_ENV_CONFIG

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "dashboard" / "app.py")
STEP = 900.0  # [capacity] plan_step's default
PAGE_AT = math.floor(AT / STEP) * STEP  # the page plans at the last whole step
RANGE_S = 6 * 3600.0
SLOS = (SloTarget("ttft", "ttft", 0.5, 0.99), SloTarget("e2e", "e2e", 8.0, 0.99))


def profile(gpu: str, rps: float, *, pool: str = "", basis: str = "measured",
            slos: tuple[SloTarget, ...] = SLOS) -> CapacityProfile:
    return CapacityProfile(
        identity=ProfileIdentity(model=MODEL, gpu=gpu), basis=basis,  # type: ignore[arg-type]
        max_concurrency=24, max_goodput_rps=rps, max_output_tokens_per_s=rps * 180,
        slos=slos, source=f"http://127.0.0.1:8000/{gpu}", pool=pool, created_at=AT - 86400,
    )


#: Today's H100 (6.88 USD/h) at 0.5 req/s, and an L40S (1.96 USD/h) at 0.3 req/s: cheaper.
TODAY = profile("H100", 0.5, pool="chat")
CHEAPER = profile("L40S", 0.3)


def run_plan(config: Path, monkeypatch: pytest.MonkeyPatch, at: float = AT,
             **params: str) -> AppTest:
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(config))
    monkeypatch.delenv(DASHBOARD_ENV_AT, raising=False)
    app = AppTest.from_file(APP, default_timeout=120)
    app.query_params["at"] = repr(at)
    app.query_params["range"] = "6h"
    for k, v in params.items():
        app.query_params[k] = v
    app.run()
    app.switch_page("views/plan.py").run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def texts(app: AppTest) -> str:
    return "\n".join([m.value for m in app.markdown] + [c.value for c in app.caption]
                     + [i.value for i in app.info] + [w.value for w in app.warning]
                     + [e.value for e in app.error])


def chart_frames(app: AppTest) -> list[pd.DataFrame]:
    """The data of every chart with a ``series`` column."""
    out = []
    for el in app.get("vega_lite_chart"):
        for d in el.proto.datasets:
            f = pa.ipc.open_stream(d.data.data).read_all().to_pandas()
            if "series" in f:
                out.append(f)
    return out


def chart_of(app: AppTest, series: str) -> pd.DataFrame:
    for f in chart_frames(app):
        if series in set(f["series"]):
            return f
    raise AssertionError(f"no chart with a series {series!r}")


def metrics(app: AppTest, key: str) -> dict[str, Any]:
    return {m.label: m for m in app.get_by_key(key).metric}


def expected(config_path: Path) -> tuple[Config, PlanResult, WasteResult]:
    """The plan and the waste computed straight from the engine for the page's time."""
    config = load_config(config_path)
    pool = config.pool("chat")
    with Store(config.store_path(), readonly=True) as store:
        source = EmbeddedSource(store)
        traffic = forecast_from_history(source, config, pool, PAGE_AT, 7)
        # The very candidates vigil plan compares: saved, observed, estimated.
        candidates, _ = gather_candidates(config, pool, source=source, at_s=PAGE_AT,
                                          span_s=7 * 86400, estimator=capacity_estimate)
        result = plan(config, pool, traffic, candidates)
        assert result.today is not None
        start, end = aligned_range(AT - RANGE_S, AT, STEP)
        found = waste(source, config, pool, result.today.profile.max_goodput_rps, start, end,
                      STEP)
    return config, result, found


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = seed_dashboard(tmp_path_factory.mktemp("plan"))
    store = ProfileStore(config.parent / "vigil-capacity.json")
    store.save(TODAY)
    store.save(CHEAPER)
    return config


@pytest.fixture(scope="module")
def no_profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_dashboard(tmp_path_factory.mktemp("plan-empty"))


# --- the page ---------------------------------------------------------------------------------


def test_today_beside_the_cheapest_that_meets_the_slos(seeded: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _, result, _ = expected(seeded)
    today, best = result.today, result.best
    assert today is not None and best is not None
    assert best.profile == CHEAPER and today.profile == TODAY  # as the profiles were chosen
    app = run_plan(seeded, monkeypatch)
    assert app.title[0].value == "Plan"
    for key, c in (("plan-today", today), ("plan-best", best)):
        shown = metrics(app, key)
        assert shown["Replicas (peak of the day)"].value == fmt.count(c.peak_replicas)
        assert shown["Cost per 1000 requests"].value == fmt.usd(c.cost_per_1000_requests)
        assert shown["Cost per month"].value == fmt.usd(c.cost_per_month_usd)
        assert shown["Headroom"].value == fmt.percent(c.headroom, 0)
        block = "\n".join(m.value for m in app.get_by_key(key).markdown)
        # Each figure carries the plan's basis: measured profile, observed traffic.
        assert block.count(badge(c.basis)) == 4
        assert c.basis == "observed"
    month = metrics(app, "plan-best")["Cost per month"]
    assert month.delta == f"{best.cost_per_month_usd - today.cost_per_month_usd:+,.0f} USD vs today"
    assert best.cost_per_month_usd < today.cost_per_month_usd


def test_the_replicas_curves_are_the_plans(seeded: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _, result, _ = expected(seeded)
    app = run_plan(seeded, monkeypatch)
    today_name = f"today: {TODAY.identity.label()}"
    best_name = f"cheapest: {CHEAPER.identity.label()}"
    frame = chart_of(app, today_name)
    assert result.today is not None and result.best is not None
    for name, c in ((today_name, result.today), (best_name, result.best)):
        shown = frame[frame["series"] == name]["value"].tolist()
        assert shown == [float(n) for _, n in c.replicas_curve]
    assert len(result.today.replicas_curve) == 96  # a day of 15-minute steps


def test_the_waste_chart_is_used_against_the_lower_bound(seeded: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    _, _, found = expected(seeded)
    app = run_plan(seeded, monkeypatch)
    frame = chart_of(app, "lower bound")
    used = frame[frame["series"] == "used"]["value"].tolist()
    bound = frame[frame["series"] == "lower bound"]["value"].tolist()
    assert used == pytest.approx([s.used_gpu_hours for s in found.steps])
    assert bound == pytest.approx([s.lower_bound_gpu_hours for s in found.steps
                                   if s.lower_bound_gpu_hours is not None])
    # The whole 15-minute steps within the 6 h: AT is 400 s past a step, so 23, not 24.
    assert AT % STEP == 400 and len(used) == 23
    # ~1 req/s on two replicas of 0.5 req/s each: under the bound (the stored scale-out).
    assert found.waste_gpu_hours < 0
    assert "below the lower bound" in texts(app)
    labels = {m.label: m.value for m in app.metric}
    assert labels["Waste"] == f"{found.waste_gpu_hours:,.1f} GPU-h"
    assert labels["Waste (USD)"] == fmt.usd(found.waste_usd)


def test_the_replay_summary_counts_the_policys_decisions(seeded: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    app = run_plan(seeded, monkeypatch, range="1h")
    assert "Off: switch on to replay" in texts(app)
    app.toggle(key="plan-replay").set_value(True).run()
    assert not app.exception, [e.value for e in app.exception]
    config = load_config(seeded)
    start, end = aligned_range(AT - 3600, AT, STEP)
    with Store(config.store_path(), readonly=True) as store:
        counts = decision_counts(replay_decisions(EmbeddedSource(store), config,
                                                  config.pool("chat"), start, end, STEP))
    labels = {m.label: m.value for m in app.metric}
    assert labels["Scale-outs advised"] == fmt.count(counts["scale_out"])
    assert labels["Scale-ins advised"] == fmt.count(counts["scale_in"])
    assert labels["Holds"] == fmt.count(counts["hold"])
    # The quarter-hours within the hour: AT is 400 s past one, so 4 of them.
    assert sum(counts.values()) == 4
    desired = chart_of(app, "desired")
    assert len(desired[desired["series"] == "desired"]) == 4


def test_no_profile_saved_names_the_command(no_profiles: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_plan(no_profiles, monkeypatch)
    shown = texts(app)
    # Nothing saved: the plan stands on the simulator's estimate, says so, and names the
    # command that would measure today's configuration instead.
    assert "Today's capacity is estimated, not measured" in shown
    assert (f"vigil capacity --config {no_profiles.resolve()} --pool chat --url <a replica's "
            "URL> --save") in shown
    assert "No traffic history" not in shown  # the store has it
    assert badge("estimated") in shown


def test_no_history_yet_says_so(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_plan(seeded, monkeypatch, at=AT - 30 * 86400)
    shown = texts(app)
    assert "No traffic history yet" in shown
    assert "vllm:request_success_total" in shown
    assert "No capacity profile saved" not in shown


def test_without_todays_profile_the_cheapest_is_still_shown(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    config = seed_dashboard(tmp_path)
    ProfileStore(config.parent / "vigil-capacity.json").save(CHEAPER)
    app = run_plan(config, monkeypatch)
    shown = texts(app)
    # Today's configuration has only the simulator's estimate: shown as such, with the
    # command that measures it; the saved profile of another GPU is still a candidate.
    assert "Today's capacity is estimated, not measured" in shown
    assert "--pool chat --url <a replica's URL> --save" in shown
    assert metrics(app, "plan-best")["Cost per month"].value.startswith("$")


def test_another_pool_is_chosen_in_the_selectbox(seeded: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_plan(seeded, monkeypatch)
    app.selectbox(key="plan-pool").set_value("batch").run()
    assert not app.exception
    # Both profiles are of the chat pool's model, and the simulator has no calibration of
    # the batch pool's: nothing to plan for it, and the page says why.
    shown = texts(app)
    assert "No capacity profile** for pool `batch`" in shown
    assert "no calibration of" in shown


def test_no_store_yet_says_to_start_vigil_serve(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    config = seed_dashboard(tmp_path, store=False)
    app = run_plan(config, monkeypatch)
    assert "No data yet." in texts(app) and "vigil serve --config" in texts(app)
    assert not app.get("vega_lite_chart")


def test_an_empty_store_has_no_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    config = seed_dashboard(tmp_path, store=False)
    Store(tmp_path / "vigil.db").close()
    ProfileStore(tmp_path / "vigil-capacity.json").save(TODAY)
    app = run_plan(config, monkeypatch)
    assert "No traffic history yet" in texts(app)
    # Today's profile is there: the waste is missing for want of GPU time, and says so.
    assert "No waste figure: no `up` sample for this pool's targets" in texts(app)
    assert not app.get("vega_lite_chart")


# --- the page's functions ---------------------------------------------------------------------


def test_aligned_range_and_badge() -> None:
    assert aligned_range(100.0, 2000.0, 900.0) == (900.0, 1800.0)
    assert aligned_range(900.0, 1800.0, 900.0) == (900.0, 1800.0)
    assert badge("measured") == ":green-badge[measured]"
    assert badge("estimated") == ":orange-badge[estimated]"
    assert badge("other") == ":gray-badge[other]"


def test_plan_page_names_a_malformed_profile_file(no_profiles: Path) -> None:
    config = load_config(no_profiles)
    path = config.capacity_profiles_path()
    path.write_text("[]", encoding="utf-8")
    try:
        with Store(config.store_path(), readonly=True) as store:
            page = plan_page(config, str(no_profiles), EmbeddedSource(store),
                             config.pool("chat"), PAGE_AT, range_s=(AT - 3600, AT))
    finally:
        path.unlink()
    assert page.result is None and page.profiles == ()
    assert page.profiles_note is not None and str(path) in page.profiles_note
    assert page.traffic is not None and page.traffic.basis == "observed"
    json.dumps(page.profiles_note)


def test_curve_and_waste_rows(seeded: Path) -> None:
    _, result, found = expected(seeded)
    assert result.today is not None
    rows = curve_rows([("a", result.today)])
    assert rows[0] == (0.0, "a", float(result.today.replicas_curve[0][1]))
    wr = waste_rows(found)
    assert len(wr) == 2 * len(found.steps)
    assert {s for _, s, _ in wr} == {"used", "lower bound"}
