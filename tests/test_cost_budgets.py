"""Budgets: the spend, shares and forecast of each ``[[budgets]]`` entry, and `vigil serve`
alerting on them through the durable outbox: one notification per share crossed (not one
per evaluation), a forecast that fires on a ramp and resolves when it flattens, nothing sent
again after a restart; ``/budgets`` and ``/metrics`` carry the figures."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client.parser import text_string_to_metric_families
from support import chargeback as cb
from support.alerts import Receiver, receiver

from serve.server import Server
from slo.cost.budgets import budget_status, day_starts
from slo.cost.months import month_bounds
from vigil.config import Config, parse_config
from vigil.errors import ConfigError

#: acme spends 0.25 by T0 + 400 (r1), 0.35 by T0 + 2100 (r4), 0.45 by T0 + 4500 (r8).
BUDGETS = [
    {"tenant": "acme", "monthly": 0.4, "alert_at": [0.5, 1.0], "forecast": False,
     "severity": "page"},
    {"tenant": "globex", "pool": "chat", "monthly": 20.0, "alert_at": [0.9]},
]


class VirtualClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _config(tmp: Path, hook: str) -> Config:
    data = cb.config_data(tmp, BUDGETS, forecast_window="1h", evaluation_interval="10s")
    data["alerts"] = {"outbox_path": str(tmp / "outbox.db"), "routes": [{
        "name": "finance", "url": hook, "match": {}, "group_wait": "0s",
        "group_interval": "1s", "repeat_interval": "30d"}]}
    return parse_config(data, file=str(tmp / "vigil.toml"))


def _notifications(rx: Receiver) -> list[dict[str, Any]]:
    """The budget notifications received so far (the history also raises scaling advice)."""
    found = [json.loads(r.body) for r in rx.deduped()]
    return [n for n in found if n["commonLabels"].get("alertname", "").startswith("Budget")]


def _summary(n: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((a["status"], a["labels"]["alertname"], a["labels"].get("share", ""))
                  for a in n["alerts"])


async def _evaluate(server: Server, clock: VirtualClock, t: float) -> None:
    clock.t = t
    await server.evaluate_once()
    clock.t = t + 2  # past group_interval: what is due goes out
    await server.deliver_once()


async def _run(tmp: Path, rx: Receiver) -> tuple[list[list[dict[str, Any]]], dict[str, Any],
                                                 str]:
    config = _config(tmp, rx.url)
    clock = VirtualClock(cb.T0)
    seen: list[list[dict[str, Any]]] = []
    server = Server(config, listen=("127.0.0.1", 0), clock=clock, prometheus_url="")
    await server.start(AsyncIOScheduler())  # never started: this test is the scheduler
    try:
        for t in (600, 900, 1200, 4600):
            await _evaluate(server, clock, cb.T0 + t)
            seen.append(_notifications(rx))
        host, port = server.listen
        async with httpx.AsyncClient() as http:
            budgets = (await http.get(f"http://{host}:{port}/budgets")).json()
            metrics = (await http.get(f"http://{host}:{port}/metrics")).text
    finally:
        await server.stop()
    # A restart: the outbox remembers what was sent.
    server = Server(config, listen=("127.0.0.1", 0), clock=clock, prometheus_url="")
    await server.start(AsyncIOScheduler())
    try:
        await _evaluate(server, clock, cb.T0 + 4700)
        seen.append(_notifications(rx))
        await _evaluate(server, clock, cb.T0 + cb.SPAN_S + 7200)
        seen.append(_notifications(rx))
    finally:
        await server.stop()
    return seen, budgets, metrics


def test_serve_alerts_once_per_share_and_forecasts(tmp_path: Path) -> None:
    cb.write_store(tmp_path / "store.sqlite")
    cb.write_records(tmp_path / "records.sqlite")
    with receiver() as rx:
        seen, budgets, metrics = asyncio.run(_run(tmp_path, rx))
    first = seen[0]
    # acme crossed 50 % (0.25 of 0.40); globex's trailing hour (0.15, r2) would spend its 20
    # before the month ends.
    alerts = sorted(_summary(n) for n in first)
    assert alerts == [[("firing", "BudgetForecastExhausted", "")],
                      [("firing", "BudgetSpent", "50%")]]
    forecast = next(a for n in first for a in n["alerts"]
                    if a["labels"]["alertname"] == "BudgetForecastExhausted")
    assert "would run out on 2026-11-" in forecast["annotations"]["summary"]
    # No new notification while nothing changes.
    assert seen[1] == seen[0] and seen[2] == seen[0]
    # At 4600 acme crossed 100 %: one notification, the 100 % firing and the 50 % resolved
    # together. globex's spending flattened (nothing on chat in the trailing hour): its
    # forecast resolved.
    new = sorted(_summary(n) for n in seen[3][len(seen[2]):])
    assert new == [[("firing", "BudgetSpent", "100%"), ("resolved", "BudgetSpent", "50%")],
                   [("resolved", "BudgetForecastExhausted", "")]]
    # A restart sends nothing already delivered, nor does a later evaluation with no change.
    assert seen[4] == seen[3] and seen[5] == seen[3]

    by_name = {b["name"]: b for b in budgets["budgets"]}
    assert by_name["acme"]["spent"] == pytest.approx(0.45) and by_name["acme"]["over"]
    globex = by_name["globex/chat"]
    assert globex["spent"] == pytest.approx(0.15) and globex["exhausted_at"] is None
    assert globex["forecast"] == pytest.approx(0.15)
    assert budgets["currency"] == "USD"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(metrics) for s in f.samples}
    acme = (("budget", "acme"), ("currency", "USD"), ("tenant", "acme"))
    assert samples[("vigil_budget_spent_ratio", acme)] == pytest.approx(0.45 / 0.4)
    assert samples[("vigil_budget_amount_usd", acme)] == 0.4
    code_globex = (("currency", "USD"), ("pool", "code"), ("tenant", "globex"))
    assert samples[("vigil_tenant_cost_usd_total", code_globex)] == pytest.approx(1.2)


def test_budget_status_shares_and_forecast(tmp_path: Path) -> None:
    config = cb.config(tmp_path, BUDGETS)
    acme = config.budgets[0]
    start, end = month_bounds("2026-11", "UTC")
    at = start + 10 * 86400
    s = budget_status(config, acme, at, 0.2, 0.1, 86400.0)
    assert s.crossed == 0.5 and not s.over and s.month == "2026-11"
    # 0.1 a day from day 10 to day 30: 0.2 + 2.0 by the end; spent on day 12.
    assert s.forecast == pytest.approx(0.2 + 0.1 * (end - at) / 86400)
    assert s.exhausted_at == pytest.approx(at + 2 * 86400)
    flat = budget_status(config, acme, at, 0.2, 0.0, 86400.0)
    assert flat.exhausted_at is None and flat.forecast == pytest.approx(0.2)
    spent = budget_status(config, acme, at, 0.5, 0.1, 86400.0)
    assert spent.crossed == 1.0 and spent.over and spent.exhausted_at is None


def test_days_cut_at_the_zones_midnight() -> None:
    start, _ = month_bounds("2026-11", "Asia/Seoul")
    cuts = day_starts(start + 3600, start + 3 * 86400, "Asia/Seoul")
    assert cuts == [start + 3600, start + 86400, start + 2 * 86400]


@pytest.mark.parametrize(("budget", "said"), [
    ({"tenant": "nobody", "monthly": 10.0}, "tenant 'nobody' is in no [[gateway.api_keys]]"),
    ({"tenant": "acme", "monthly": -5.0}, "greater than 0"),
    ({"tenant": "acme", "monthly": 10.0, "pool": "nope"}, "pool 'nope' does not exist"),
    ({"tenant": "acme", "monthly": 10.0, "alert_at": [0.5, 0.5]}, "listed twice"),
    ({"tenant": "acme", "monthly": 10.0, "enforce": "block"}, "budgets[0].enforce"),
])
def test_a_wrong_budget_names_its_key(tmp_path: Path, budget: dict[str, Any],
                                      said: str) -> None:
    with pytest.raises(ConfigError, match="budgets") as err:
        cb.config(tmp_path, [budget])
    assert said in str(err.value)
