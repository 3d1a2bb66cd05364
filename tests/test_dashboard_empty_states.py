"""Empty states name the true cause: a cost figure missing for want of ``up`` says so, and
never "no request finished" beside finished requests (``dashboard.empty_states``, and the
Business page over history ingested with and without ``up``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.apptest import run_page, texts
from support.dashboard_seed import AT
from support.fleet import MODEL

from collector.ingest import ingest_files
from collector.scrape import TargetInfo
from collector.store import Store
from dashboard.empty_states import NO_UP, cost_gap, missing_cost, tier_gap, tokens_gap


def cost(gpu_hours: float | None, requests: float | None, tokens: float | None = None,
         idle: float | None = None) -> dict:
    """A cost block as ``slo.cost.pool.pool_cost`` writes it, with the keys these functions read."""
    c = None if gpu_hours is None else gpu_hours * 2.5
    return {"window": "1h", "gpu_hours": gpu_hours, "cost_usd": c, "requests": requests,
            "output_tokens": tokens, "idle_share": idle,
            "per_1000_requests": None if c is None or not requests else c / requests * 1000}


def test_requests_without_up_name_up_not_requests():
    text = cost_gap([cost(None, 2400.0), cost(None, 0.0)], "per_1000_requests")
    assert text.startswith("Requests finished, but there is no `up` sample")
    assert "No request finished" not in text and NO_UP in text


def test_no_requests_with_gpu_time_is_no_request():
    assert cost_gap([cost(1.0, 0.0), cost(1.0, None)], "per_1000_requests") == (
        "No request finished in this range.")


def test_neither_says_both():
    text = cost_gap([cost(None, None)], "per_1000_requests")
    assert text.startswith("No request finished in this range, and there is no `up` sample")


def test_tokens_and_idle():
    assert cost_gap([cost(None, 10.0, 1280.0)], "per_million_output_tokens").startswith(
        "Tokens were generated, but there is no `up` sample")
    assert cost_gap([cost(1.0, 10.0, 0.0)], "per_million_output_tokens") == (
        "No token was generated in this range.")
    assert cost_gap([cost(None, 10.0)], "idle_cost_usd") == f"No idle cost: {NO_UP}."
    assert "`vllm:num_requests_running`" in cost_gap([cost(1.0, 10.0)], "idle_cost_usd")


def test_now_table_note():
    assert missing_cost(cost(1.0, 2400.0)) is None
    assert missing_cost(cost(None, 0.0)) is None
    note = missing_cost(cost(None, 58_543.0))
    assert note is not None and note.startswith("58,543 requests finished in the last 1h")
    assert "no `up` sample for this pool's targets in that window" in note


def test_tokens_chart_and_tiers():
    assert tokens_gap([cost(1.0, 0.0)]) == "No request finished in this range."
    assert "`vllm:request_generation_tokens` has no observation" in tokens_gap([cost(1.0, 9.0)])
    assert tier_gap([None, {}]) == "No tiered request in this range."
    assert NO_UP in tier_gap([{"premium": {"requests": 3.0, "cost_usd": None}}])
    only_cancels = {"premium": {"requests": 0.0, "cancelled": 2.0, "cost_usd": 1.0}}
    assert "a replica finished none of them" in tier_gap([only_cancels])


# --- the Business page over an ingested history ------------------------------------------------
STEPS = 241  # one hour of 15 s scrapes, ending at AT


def _backfill() -> str:
    """An hour of one replica, as promtool takes it: each series' samples together. 10
    requests and 1,280 tokens finish every 15 s (2,400 requests in the hour)."""
    labels = f'engine="0",model_name="{MODEL}"'
    times = [AT - 15 * (STEPS - 1 - i) for i in range(STEPS)]
    lines = ["# TYPE vllm:request_success counter"]
    lines += [f'vllm:request_success_total{{{labels},finished_reason="stop"}} {10 * i} {t:.3f}'
              for i, t in enumerate(times)]
    lines += ["# TYPE vllm:generation_tokens counter"]
    lines += [f"vllm:generation_tokens_total{{{labels}}} {1280 * i} {t:.3f}"
              for i, t in enumerate(times)]
    lines += ["# TYPE vllm:num_requests_running gauge"]
    lines += [f"vllm:num_requests_running{{{labels}}} 3 {t:.3f}" for t in times]
    return "\n".join([*lines, "# EOF"]) + "\n"


def _history(folder: Path, *, up: bool) -> Path:
    folder.mkdir()
    config = folder / "vigil.toml"
    config.write_text(
        '[store]\npath = "vigil.db"\n[collector]\nscrape_interval = "15s"\n'
        f'[[pools]]\nname = "chat"\nmodel = "{MODEL}"\ngpu = "H100"\n'
        '[[targets]]\nname = "chat-0"\nurl = "http://127.0.0.1:9/metrics"\npool = "chat"\n')
    f = folder / "history.om"
    f.write_text(_backfill())
    with Store(folder / "vigil.db") as store:
        ingest_files(store, TargetInfo("chat-0", "http://127.0.0.1:9/metrics", "chat", "vllm"),
                     [str(f)], at=AT, backfill_up=up)
    return config


def test_business_page_without_up_says_up_is_missing(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(_history(tmp_path / "no-up", up=False), monkeypatch, "business")
    now = at.dataframe[0].value
    assert list(now["requests"]) == [2400.0]  # the table shows the requests ...
    shown = texts(at)
    assert "No request finished" not in shown  # ... and no box denies them
    assert "No cost for `chat`: 2,400 requests finished in the last 1h" in shown
    assert "Requests finished, but there is no `up` sample" in shown
    assert "Tokens were generated, but there is no `up` sample" in shown
    assert f"No idle cost: {NO_UP}." in shown


def test_business_page_with_up_draws_the_cost(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(_history(tmp_path / "up", up=True), monkeypatch, "business")
    now = at.dataframe[0].value
    assert list(now["requests"]) == [2400.0]
    assert now["per 1000 requests"][0] is not None and now["per 1000 requests"][0] > 0
    shown = texts(at)
    assert "no `up` sample" not in shown and "No request finished" not in shown
    assert at.get("vega_lite_chart")
