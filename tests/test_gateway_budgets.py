"""Budgets at the gateway (serving/gateway/budgets.py): a spent budget demotes a tenant's new
requests to the batch tier or refuses them with an OpenAI-style 429, from what `vigil serve`'s
/budgets says (here a loopback HTTP server), failing open when it cannot be read, and never
cutting a request already running."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.gateway import (
    KEYS,
    MODEL,
    OTHER,
    POOL,
    PREMIUM,
    STANDARD,
    GatewayHandle,
    running_gateway,
    scripted_upstream,
    wait_until,
)
from support.loopback import Answer, LoopbackServer, Responder, free_port

from collector.exposition import parse
from serving.gateway.budgets import (
    BudgetPoller,
    BudgetState,
    decide,
    enforced_budgets,
    header_value,
    parse_budgets,
)
from serving.gateway.front.api_keys import key_sha256
from serving.sim.testing import running_fleet
from slo.cost.months import month_of, next_month
from vigil.config import Config, parse_config
from vigil.conventions import ERROR_CODE_BUDGET, ERROR_REFUSED_CLASSES
from vigil.errors import ConfigError

CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
OTHER_POOL = "other"
#: The month the gateway's clock is in (the tests' budgets are of this month).
MONTH = month_of(time.time(), "UTC")


# --- helpers ---------------------------------------------------------------------------------

def _config(tmp_path: Path, upstream_urls: list[str], *, budgets: list[dict[str, Any]],
            budgets_url: str = "", **gateway: Any) -> Config:
    """The support config (pool ``chat`` on ``upstream_urls``, one key per tier) plus a pool
    ``other`` without replicas, ``[[budgets]]`` and the gateway's budget settings."""
    return parse_config({
        "pools": [{"name": POOL, "model": MODEL, "gpu": "H100"},
                  {"name": OTHER_POOL, "model": "other-model", "gpu": "H100"}],
        "targets": [{"name": f"{POOL}-{i}", "url": f"{u.rstrip('/')}/metrics", "pool": POOL}
                    for i, u in enumerate(upstream_urls)],
        "gateway": {
            "records_path": str(tmp_path / "gateway.db"),
            "health_interval": "0.2s",
            "api_keys": [{"sha256": key_sha256(k), "tenant": t, "tier": tier}
                         for k, (t, tier) in KEYS.items()],
            "budgets_url": budgets_url,
            "budgets_poll_interval": "0.1s",
            **gateway,
        },
        "budgets": budgets,
    })


def _status(name: str, tenant: str, *, pool: str = "", tier: str = "", over: bool = True,
            enforce: str = "refuse", monthly: float = 1000.0, spent: float = 1012.4,
            month: str = MONTH) -> dict[str, Any]:
    """One budget as serve's /budgets shows it."""
    return {"name": name, "tenant": tenant, "pool": pool, "tier": tier, "month": month,
            "monthly": monthly, "spent": spent, "share": spent / monthly, "over": over,
            "crossed": 1.0 if over else None, "forecast": 1500.0, "exhausted_at": None,
            "enforce": enforce, "severity": "ticket", "currency": "USD"}


def _json(*budgets: dict[str, Any], at: float | None = 1763000000.0) -> Answer:
    body = {"at": at, "currency": "USD", "budgets": list(budgets)}
    return 200, "application/json", json.dumps(body).encode()


def _budget(tenant: str, enforce: str, **kw: Any) -> dict[str, Any]:
    """A ``[[budgets]]`` entry of 1000 a month."""
    return {"tenant": tenant, "monthly": 1000.0, "enforce": enforce, **kw}


def _state(name: str = "b", tenant: str = "acme", *, pool: str = "", tier: str = "",
           over: bool = True, enforce: str = "refuse", spent: float = 1100.0,
           month: str = "2026-11") -> BudgetState:
    return BudgetState(name=name, tenant=tenant, pool=pool, tier=tier, month=month,
                       monthly=1000.0, spent=spent, over=over, enforce=enforce, currency="USD")


def _sees(gw: GatewayHandle, tenant: str, tier: str, action: str | None) -> bool:
    """The gateway's last known state gives ``action`` (None: nothing) to such a request."""
    found = gw.gateway.budgets.decide(tenant, POOL, tier)
    return (found.enforce if found is not None else None) == action


def _always(answer: Answer) -> Responder:
    return lambda req: answer


def _polled(server: LoopbackServer, after: int, n: int = 1) -> bool:
    return len(server.recorded()) >= after + n


def _rejections(gw: GatewayHandle) -> list[tuple[str, str, float]]:
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    fam = {f.name: f for f in parse(text)}["vigil_gateway_rejections"]
    return [(s.labels["tier"], s.labels["reason"], s.value) for s in fam.samples
            if s.name.endswith("_total")]


# --- the decision (pure) ---------------------------------------------------------------------

def test_refuse_wins_over_demote_and_the_most_overspent_names_it() -> None:
    demote = _state("d", enforce="demote", spent=3000.0)
    refuse_a = _state("r1", spent=1100.0)
    refuse_b = _state("r2", spent=1500.0)
    assert decide([demote, refuse_a, refuse_b], tenant="acme", pool="chat",
                  tier="standard") is refuse_b
    assert decide([demote], tenant="acme", pool="chat", tier="standard") is demote
    assert decide([], tenant="acme", pool="chat", tier="standard") is None


def test_a_budget_applies_to_its_tenant_pool_and_tier_only() -> None:
    every = _state("every")
    chat = _state("chat", pool="chat")
    other_pool = _state("other-pool", pool="other")
    premium = _state("premium", tier="premium")
    globex = _state("globex", tenant="globex")

    def found(tenant: str, pool: str, tier: str, *budgets: BudgetState) -> BudgetState | None:
        return decide(budgets, tenant=tenant, pool=pool, tier=tier)

    assert found("acme", "chat", "standard", every) is every
    assert found("acme", "chat", "standard", chat) is chat
    assert found("acme", "chat", "standard", other_pool) is None
    assert found("acme", "other", "standard", other_pool) is other_pool
    assert found("acme", "chat", "standard", premium) is None
    assert found("acme", "chat", "premium", premium) is premium
    assert found("acme", "chat", "standard", globex) is None
    assert found("globex", "chat", "batch", globex) is globex


def test_only_spent_enforced_budgets_of_this_month_count() -> None:
    assert decide([_state(over=False)], tenant="acme", pool="p", tier="standard") is None
    assert decide([_state(enforce="off")], tenant="acme", pool="p", tier="standard") is None
    old = _state(month="2026-10")
    assert decide([old], tenant="acme", pool="p", tier="standard", month="2026-11") is None
    assert decide([old], tenant="acme", pool="p", tier="standard", month="2026-10") is old
    assert decide([old], tenant="acme", pool="p", tier="standard") is old  # no month: kept


def test_a_request_demoted_into_a_refusing_batch_tier_is_refused() -> None:
    demote = _state("all", enforce="demote")
    batch = _state("batch-only", tier="batch")
    assert decide([demote, batch], tenant="acme", pool="p", tier="premium") is batch
    # A batch budget that only demotes changes nothing more.
    soft = _state("batch-only", tier="batch", enforce="demote")
    assert decide([demote, soft], tenant="acme", pool="p", tier="premium") is demote


def test_the_header_names_the_budget_whatever_its_name() -> None:
    assert header_value("demote", _state("acme")) == 'demoted; budget="acme"'
    assert header_value("refuse", _state("acme")) == 'refused; budget="acme"'
    odd = header_value("demote", _state('a"b\\c\u00e9\u4e2d'))
    assert odd == 'demoted; budget="a\\"b\\\\c\\u00e9\\u4e2d"'
    odd.encode("ascii")  # a valid header value


def test_parse_budgets_reads_serves_answer() -> None:
    at, found = parse_budgets(json.loads(_json(_status("acme", "acme"))[2]))
    assert at == 1763000000.0
    assert found == [BudgetState("acme", "acme", "", "", MONTH, 1000.0, 1012.4, True,
                                 "refuse", "USD")]
    assert parse_budgets({"at": None, "currency": "USD", "budgets": []}) == (None, [])


@pytest.mark.parametrize("data", [
    [], {"at": 1.0}, {"at": "x", "budgets": []}, {"at": 1.0, "budgets": {}},
    {"at": 1.0, "budgets": [1]},
    {"at": 1.0, "budgets": [{**_status("a", "a"), "over": "yes"}]},
    {"at": 1.0, "budgets": [{**_status("a", "a"), "spent": None}]},
    {"at": 1.0, "budgets": [{**_status("a", "a"), "monthly": 0}]},
    {"at": 1.0, "budgets": [{**_status("a", "a"), "month": "November"}]},
    {"at": 1.0, "budgets": [{**_status("a", "a"), "tenant": 3}]},
    {"at": 1.0, "budgets": [{**_status("a", "a"), "spent": float("nan")}]},
])
def test_parse_budgets_refuses_what_is_not_the_expected_shape(data: Any) -> None:
    with pytest.raises(ValueError):
        parse_budgets(data)


# --- config --------------------------------------------------------------------------------------

def test_budgets_url_is_an_http_url_without_a_password(tmp_path: Path) -> None:
    cfg = _config(tmp_path, [], budgets=[], budgets_url="http://serve:9464/budgets")
    assert (cfg.gateway.budgets_url, cfg.gateway.budgets_poll_interval) == (
        "http://serve:9464/budgets", 0.1)
    assert parse_config({}).gateway.budgets_poll_interval == 30.0
    with pytest.raises(ConfigError, match="password") as err:
        _config(tmp_path, [], budgets=[], budgets_url="http://u:hunter2@serve:9464/budgets")
    assert "hunter2" not in str(err.value)
    with pytest.raises(ConfigError, match="http"):
        _config(tmp_path, [], budgets=[], budgets_url="serve:9464/budgets")
    with pytest.raises(ConfigError, match="budgets_poll_interval"):
        _config(tmp_path, [], budgets=[], budgets_poll_interval=0)


def test_only_budgets_that_enforce_are_enforced(tmp_path: Path) -> None:
    cfg = _config(tmp_path, [], budgets=[
        _budget("acme", "refuse"), _budget("acme", "demote", pool=OTHER_POOL, name="acme-o"),
        _budget("globex", "off")])
    assert enforced_budgets(cfg) == {("acme", "acme", "", ""): "refuse",
                                     ("acme-o", "acme", OTHER_POOL, ""): "demote"}


# --- the poller --------------------------------------------------------------------------------

def test_no_enforcing_budget_means_no_polling(tmp_path: Path, http_server: LoopbackServer,
                                              caplog: pytest.LogCaptureFixture) -> None:
    cfg = _config(tmp_path, [], budgets=[_budget("acme", "off")],
                  budgets_url=f"{http_server.url}/budgets")
    poller = BudgetPoller(cfg)

    async def main() -> None:
        await poller.start()
        await poller.aclose()

    with caplog.at_level(logging.WARNING, logger="vigil.gateway.budgets"):
        asyncio.run(main())
    assert not poller.enabled and http_server.recorded() == []
    assert [r.getMessage() for r in caplog.records if "budgets_url is set" in r.getMessage()]


def test_the_gateways_config_says_what_is_enforced(tmp_path: Path,
                                                   http_server: LoopbackServer) -> None:
    cfg = _config(tmp_path, [], budgets=[_budget("acme", "demote")],
                  budgets_url=f"{http_server.url}/budgets")
    # Serve says "refuse" (its config differs) and knows a budget this gateway does not.
    http_server.respond = lambda req: _json(_status("acme", "acme", enforce="refuse"),
                                            _status("globex", "globex"))
    poller = BudgetPoller(cfg)

    async def main() -> None:
        await poller.start()
        try:
            found = poller.decide("acme", POOL, "standard")
            assert found is not None and (found.name, found.enforce) == ("acme", "demote")
            assert poller.decide("globex", POOL, "standard") is None
        finally:
            await poller.aclose()

    asyncio.run(main())
    assert http_server.recorded()[0].path == "/budgets"


def test_a_month_that_ended_lifts_its_budgets_even_while_serve_is_down(
        tmp_path: Path, http_server: LoopbackServer) -> None:
    cfg = _config(tmp_path, [], budgets=[_budget("acme", "refuse")],
                  budgets_url=f"{http_server.url}/budgets")
    now = [1763000000.0]  # 2025-11-13 UTC: the test's clock
    month = month_of(now[0], "UTC")
    http_server.respond = lambda req: _json(_status("acme", "acme", month=month))
    poller = BudgetPoller(cfg, clock=lambda: now[0])

    async def main() -> None:
        await poller.start()
        try:
            assert poller.decide("acme", POOL, "standard") is not None
            http_server.respond = lambda req: (503, "text/plain", b"down")
            assert not await poller.poll_once()
            assert poller.decide("acme", POOL, "standard") is not None  # the last state
            now[0] += 40 * 86400  # the next month
            assert month_of(now[0], "UTC") == next_month(month)
            assert not await poller.poll_once()
            assert poller.decide("acme", POOL, "standard") is None
        finally:
            await poller.aclose()

    asyncio.run(main())


def test_an_answer_without_figures_keeps_the_last_state(tmp_path: Path,
                                                        http_server: LoopbackServer) -> None:
    cfg = _config(tmp_path, [], budgets=[_budget("acme", "refuse")],
                  budgets_url=f"{http_server.url}/budgets")
    http_server.respond = lambda req: _json(_status("acme", "acme"))
    poller = BudgetPoller(cfg)

    async def main() -> None:
        await poller.start()
        try:
            # Serve restarted: no chargeback computed yet.
            http_server.respond = lambda req: _json(at=None)
            assert not await poller.poll_once()
            assert poller.decide("acme", POOL, "standard") is not None
            # Its first figures: the budget is not spent after all.
            http_server.respond = lambda req: _json(_status("acme", "acme", over=False,
                                                            spent=10.0))
            assert await poller.poll_once()
            assert poller.decide("acme", POOL, "standard") is None
        finally:
            await poller.aclose()

    asyncio.run(main())


# --- end to end: the gateway -------------------------------------------------------------------

def test_a_spent_demote_budget_makes_requests_batch(tmp_path: Path,
                                                    http_server: LoopbackServer) -> None:
    http_server.respond = lambda req: _json(_status("acme-monthly", "acme", enforce="demote"))
    with scripted_upstream() as up:
        cfg = _config(tmp_path, [up.url], budgets=[_budget("acme", "demote",
                                                           name="acme-monthly")],
                      budgets_url=f"{http_server.url}/budgets")
        with running_gateway(cfg) as gw:
            for key in (STANDARD, PREMIUM):
                with gw.http(key=key) as c:
                    r = c.post(CHAT, json=BODY)
                assert r.status_code == 200
                assert r.headers["x-vigil-budget"] == 'demoted; budget="acme-monthly"'
                assert up.bodies[-1]["priority"] == 2  # vLLM schedules it as batch
                rec = gw.record(r.headers["x-vigil-request-id"])
                assert (rec.tenant, rec.tier, rec.status, rec.error_class) == (
                    "acme", "batch", 200, "")
            # Another tenant's requests are untouched.
            with gw.http(key=OTHER) as c:
                r = c.post(CHAT, json=BODY)
            assert r.status_code == 200 and "x-vigil-budget" not in r.headers
            assert up.bodies[-1]["priority"] == 1
            assert gw.record(r.headers["x-vigil-request-id"]).tier == "standard"


def test_a_spent_refuse_budget_answers_429(tmp_path: Path, http_server: LoopbackServer) -> None:
    http_server.respond = lambda req: _json(_status("acme", "acme"))
    with scripted_upstream() as up:
        cfg = _config(tmp_path, [up.url], budgets=[_budget("acme", "refuse")],
                      budgets_url=f"{http_server.url}/budgets")
        with running_gateway(cfg) as gw:
            with gw.http(key=STANDARD) as c:
                r = c.post(CHAT, json=BODY)
                streamed = c.post(CHAT, json={**BODY, "stream": True})
            assert r.status_code == 429 and streamed.status_code == 429
            assert r.json() == {"error": {
                "message": 'budget "acme" of 1000.00 USD for ' + MONTH + " is spent "
                           "(1012.40 USD): new requests are refused until the month ends",
                "type": "insufficient_quota", "param": None, "code": ERROR_CODE_BUDGET}}
            assert r.headers["x-vigil-budget"] == 'refused; budget="acme"'
            assert r.headers["x-should-retry"] == "false"
            assert "retry-after" not in r.headers
            # The official client sees OpenAI's own quota error.
            with pytest.raises(openai.RateLimitError) as err:
                gw.client(STANDARD).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "x"}])
            assert err.value.code == ERROR_CODE_BUDGET
            assert up.bodies == []  # no replica saw any of them
            rec = gw.record(r.headers["x-vigil-request-id"])
            assert rec.error_class in ERROR_REFUSED_CLASSES
            assert (rec.status, rec.tier, rec.error, rec.replica, rec.cost_usd) == (
                429, "standard", False, "", None)
            assert 'budget "acme"' in rec.message
            assert _rejections(gw) == [("standard", ERROR_CODE_BUDGET, 3.0)]


def test_budgets_of_other_tenants_pools_and_tiers_do_not_apply(
        tmp_path: Path, http_server: LoopbackServer) -> None:
    http_server.respond = lambda req: _json(
        _status("acme-other", "acme", pool=OTHER_POOL), _status("acme-premium", "acme",
                                                                tier="premium"),
        _status("globex", "globex"))
    with scripted_upstream() as up:
        cfg = _config(tmp_path, [up.url], budgets=[
            _budget("acme", "refuse", name="acme-other", pool=OTHER_POOL),
            _budget("acme", "refuse", name="acme-premium", tier="premium"),
            _budget("globex", "refuse")], budgets_url=f"{http_server.url}/budgets")
        with running_gateway(cfg) as gw:
            with gw.http(key=STANDARD) as c:
                assert c.post(CHAT, json=BODY).status_code == 200
                # acme's budget of the other pool applies there.
                r = c.post(CHAT, json={**BODY, "model": "other-model"})
                assert r.status_code == 429
                assert 'budget "acme-other"' in r.json()["error"]["message"]
            with gw.http(key=PREMIUM) as c:
                r = c.post(CHAT, json=BODY)
                assert r.status_code == 429
                assert 'budget "acme-premium"' in r.json()["error"]["message"]
            with gw.http(key=OTHER) as c:
                assert c.post(CHAT, json=BODY).status_code == 429
            assert len(up.bodies) == 1


def test_serve_unreachable_keeps_the_last_state(tmp_path: Path, http_server: LoopbackServer,
                                                caplog: pytest.LogCaptureFixture) -> None:
    http_server.respond = lambda req: _json(_status("acme", "acme"))
    with scripted_upstream() as up, caplog.at_level(logging.INFO,
                                                    logger="vigil.gateway.budgets"):
        cfg = _config(tmp_path, [up.url], budgets=[_budget("acme", "refuse")],
                      budgets_url=f"{http_server.url}/budgets?token=not-for-logs")
        with running_gateway(cfg) as gw, gw.http(key=STANDARD) as c:
            assert c.post(CHAT, json=BODY).status_code == 429
            # serve fails, then answers garbage, then is gone: the budget stays enforced.
            for answer, problem in [((500, "text/plain", b"oops"), "status 500"),
                                    ((200, "application/json", b"{not json"), "malformed")]:
                seen = len(http_server.recorded())
                http_server.respond = _always(answer)
                wait_until(functools.partial(_polled, http_server, seen, 3),
                           what="three failed polls")
                assert gw.gateway.budgets._problem == problem
                assert c.post(CHAT, json=BODY).status_code == 429
            http_server.close()
            wait_until(lambda: gw.gateway.budgets._problem == "unreachable",
                       what="the poller to find serve gone")
            assert c.post(CHAT, json=BODY).status_code == 429
            assert up.bodies == []
    said = [r.getMessage() for r in caplog.records if r.name == "vigil.gateway.budgets"]
    # One line per change of state, not one per poll.
    assert len([m for m in said if "answered HTTP 500" in m]) == 1
    assert len([m for m in said if "malformed" in m]) == 1
    assert len([m for m in said if "cannot be read" in m]) == 1
    assert not any("not-for-logs" in m for m in said)


def test_serve_never_reached_refuses_nothing(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        cfg = _config(tmp_path, [up.url], budgets=[_budget("acme", "refuse")],
                      budgets_url=f"http://127.0.0.1:{free_port()}/budgets")
        with running_gateway(cfg) as gw:
            assert gw.gateway.budgets._problem == "unreachable"
            with gw.http(key=STANDARD) as c:
                r = c.post(CHAT, json=BODY)
            assert r.status_code == 200 and "x-vigil-budget" not in r.headers


def test_a_running_stream_is_not_cut_when_the_budget_is_spent(
        tmp_path: Path, http_server: LoopbackServer) -> None:
    http_server.respond = lambda req: _json(_status("acme", "acme", over=False, spent=900.0))
    tokens = 400  # a generation that lasts seconds on the simulator
    with running_fleet(1) as fleet:
        cfg = _config(tmp_path, fleet.base_urls, budgets=[_budget("acme", "refuse")],
                      budgets_url=f"{http_server.url}/budgets")
        with running_gateway(cfg) as gw, gw.http(key=STANDARD, timeout=60) as c:
            body = {**BODY, "stream": True, "max_tokens": tokens, "ignore_eos": True}
            with c.stream("POST", CHAT, json=body) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data: {"))
                assert json.loads(first[6:])["choices"]
                # The budget is spent now; the gateway sees it at its next poll.
                http_server.respond = lambda req: _json(_status("acme", "acme"))
                wait_until(lambda: _sees(gw, "acme", "standard", "refuse"),
                           what="the gateway to see the budget spent")
                refused = c.post(CHAT, json=BODY)
                assert refused.status_code == 429
                rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]"
            assert not any('"error"' in line for line in rest)
            stream_rec = gw.record(r.headers["x-vigil-request-id"])
            refused_rec = gw.record(refused.headers["x-vigil-request-id"])
    assert (stream_rec.status, stream_rec.error_class, stream_rec.completion_tokens) == (
        200, "", tokens)
    # The stream ended after the new request was refused: it ran across the change.
    assert stream_rec.ts_s > refused_rec.ts_s
