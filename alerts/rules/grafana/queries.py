"""The PromQL of the dashboards' panels: pure functions of the config and the SLO specs.

Wherever a recording rule of ``vigil rules prometheus`` holds the number, the panel reads that
rule's series (``slo:*``, ``vigil:*``), so a panel shows what ``vigil slo status
--prometheus-url`` computes at the same instant. Panels of what no rule records (running
requests, preemptions, prefix-cache hits, speculative decoding, tokens, inter-token latency, SM
activity) read vLLM's and DCGM's series through each pool's own matchers, as the rules do
(``alerts.rules.promql.pool_series``): a pool chosen by a selector has no ``pool`` label, so
each pool's term gets it with ``label_replace``, and the union is narrowed to the pools of the
``$pool`` variable by a series that carries ``pool`` for every pool (``vigil:queue_length:sum``,
which the rules record per pool).

Grafana's variables (``$pool``, ``$model``, ``$slo``, ``$endpoint``) are left in the text, and
``$__rate_interval`` in the windows of ``rate()``; the tests replace them
(``tests/support/grafana_queries.py``) for a check by promtool or a query to a real Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from alerts.rules.model import prom_duration
from alerts.rules.promql import (
    number,
    pool_by,
    pool_series,
    promql_string,
)
from alerts.rules.recording import sli_record_name
from slo.objectives.burn_rate import slo_burn_alerts
from slo.objectives.spec import SloSpec
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    KIND_DCGM,
    LABEL_BUDGET,
    LABEL_CURRENCY,
    LABEL_MODEL_NAME,
    LABEL_POOL,
    LABEL_SLO,
    LABEL_TENANT,
    METRIC_BUDGET_SPENT_RATIO,
    METRIC_TENANT_COST,
    RULE_CURRENT_BURN_RATE,
    RULE_ERROR_BUDGET,
    RULE_OBJECTIVE,
    RULE_PERIOD_BUDGET_REMAINING,
    RULE_QUEUE_LENGTH,
)

__all__ = [
    "POOL_VAR",
    "RATE_INTERVAL",
    "attainment",
    "budget_spent_share",
    "burn_rate",
    "burn_threshold",
    "per_pool",
    "pool_filter",
    "slo_filter",
    "tenant_cost_this_month",
]

#: The variables the queries use, as Grafana writes them.
POOL_VAR = "$pool"
MODEL_VAR = "$model"
SLO_VAR = "$slo"
ENDPOINT_VAR = "$endpoint"
RATE_INTERVAL = "$__rate_interval"


def pool_filter(extra: Mapping[str, str] | None = None) -> str:
    """``{pool=~"$pool"}`` (and ``extra`` regex matchers): the matchers of a series that carries
    Vigil's ``pool`` label (every ``slo:*`` and ``vigil:*`` series)."""
    matchers = {LABEL_POOL: POOL_VAR, **(extra or {})}
    return "{" + ", ".join(f"{k}=~{promql_string(v)}" for k, v in matchers.items()) + "}"


def slo_filter(slo: str = SLO_VAR) -> str:
    """``{pool=~"$pool", slo=~"<slo>"}``."""
    return pool_filter({LABEL_SLO: slo})


def attainment(specs: Sequence[SloSpec], window_s: float | None = None) -> list[tuple[str, str]]:
    """``(legend, expr)`` of ``1 - slo:sli_error:ratio_rate<w>``: the share of good events over
    ``window_s``, or over each SLO's own period when None (one query per distinct period, the
    SLI series the rules record for it, so the value is ``1 - `` the engine's period error
    ratio, exactly)."""
    windows = [window_s] if window_s is not None else sorted({s.period_s for s in specs})
    out = []
    for w in windows:
        names = [s.name for s in specs if window_s is not None or s.period_s == w]
        slos = "|".join(re.escape(n) for n in names) if window_s is None else SLO_VAR
        out.append((prom_duration(w), f"1 - {sli_record_name(w)}{slo_filter(slos)}"))
    return out


def burn_rate(window_s: float) -> str:
    """The burn rate over ``window_s`` of the SLOs chosen: the SLI over that window divided by the
    SLO's error budget (both recorded), as ``slo.objectives.burn_rate.burn_rate``."""
    return (f"{sli_record_name(window_s)}{slo_filter()} / on ({LABEL_SLO}) "
            f"{RULE_ERROR_BUDGET}{slo_filter()}")


def current_burn_rate() -> str:
    """``slo:current_burn_rate:ratio`` of the SLOs chosen (over ``[engine] window``)."""
    return f"{RULE_CURRENT_BURN_RATE}{slo_filter()}"


def budget_remaining() -> str:
    """The share of the period's error budget left (``slo:period_error_budget_remaining``)."""
    return f"{RULE_PERIOD_BUDGET_REMAINING}{slo_filter()}"


def objective() -> str:
    return f"{RULE_OBJECTIVE}{slo_filter()}"


def tenant_cost_this_month() -> str:
    """Each tenant's GPU cost this month (in ``[cost] currency``) over the pools of ``$pool``,
    from `vigil serve`'s ``vigil_tenant_cost_usd_total`` (a counter that starts again with each
    month: its value now is the month so far), largest first. Copies of `vigil serve` on a
    shared database each export the same figures: ``max`` over them per tenant, pool and
    currency, then the pools summed, so a tenant is counted once."""
    series = f"{METRIC_TENANT_COST}_total{pool_filter()}"
    return (f"sort_desc(sum by ({LABEL_TENANT}) "
            f"(max by ({LABEL_TENANT}, {LABEL_POOL}, {LABEL_CURRENCY}) ({series})))")


def budget_spent_share() -> str:
    """Each ``[[budgets]]`` entry's spend this month over its amount (1 = spent), from `vigil
    serve`'s ``vigil_budget_spent_ratio``, largest first; ``max`` over the copies of `vigil
    serve` that export it. A budget has no ``pool`` label (it may cover every pool), so
    ``$pool`` does not narrow it."""
    return (f"sort_desc(max by ({LABEL_BUDGET}, {LABEL_TENANT}) "
            f"({METRIC_BUDGET_SPENT_RATIO}))")


def burn_threshold(config: Config, specs: Sequence[SloSpec], severity: str) -> str | None:
    """The burn rate at which the ``severity`` alert fires, per SLO: the highest factor of that
    severity's rows (a row fires above its own factor), a constant per SLO written as
    ``0 * slo:objective:ratio{slo="<name>"} + <factor>`` so that it follows ``$slo`` and carries
    the SLO's labels. None when no SLO has a row of that severity."""
    terms = []
    for spec in specs:
        rows = [r for r in slo_burn_alerts(config.engine.burn_rate_alerts, spec.period_s)
                if r.severity == severity]
        if not rows:
            continue
        factor = min(r.factor for r in rows)
        terms.append(f"0 * {RULE_OBJECTIVE}{{{LABEL_SLO}={promql_string(spec.name)}, "
                     f"{LABEL_SLO}=~{promql_string(SLO_VAR)}, "
                     f"{LABEL_POOL}=~{promql_string(POOL_VAR)}}} + {number(factor)}")
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else "(\n  " + "\n  or\n  ".join(terms) + "\n)"


def per_pool(config: Config, build: Callable[[PoolConfig], str]) -> str:
    """The union over the pools of ``build(pool)``, narrowed to the pools of ``$pool``.

    ``build`` receives each pool and returns its expression over ``pool_series(pool)``,
    aggregated ``by_clause(pool, ...)``; a pool chosen by a selector has no ``pool`` label,
    which ``label_replace`` adds (for the others it sets the value they already have)."""
    terms = [f"label_replace({build(p)}, {promql_string(LABEL_POOL)}, "
             f"{promql_string(p.name)}, \"\", \"\")" for p in config.pools]
    union = terms[0] if len(terms) == 1 else "(\n  " + "\n  or\n  ".join(terms) + "\n)"
    return f"{union}\nand on ({LABEL_POOL})\n{RULE_QUEUE_LENGTH}{pool_filter()}"


def by_clause(pool: PoolConfig, *labels: str) -> str:
    """``pool, model_name`` and ``labels`` for a pool with Vigil's labels; without ``pool`` for a
    pool chosen by a selector (``label_replace`` adds it)."""
    return ", ".join(pool_by(pool, (LABEL_POOL, LABEL_MODEL_NAME, *labels)))


def by_pool(pool: PoolConfig) -> str:
    """``pool`` for a pool with Vigil's labels, "" for a pool chosen by a selector (``sum by ()``
    then sums the whole pool; ``label_replace`` adds ``pool``)."""
    return ", ".join(pool_by(pool, (LABEL_POOL,)))


def series(pool: PoolConfig, metric: str) -> str:
    """``metric`` over the pool's vLLM series."""
    return pool_series(pool).promql(metric)


def model_matcher(pool: PoolConfig, metric: str) -> str:
    """``metric`` over the pool's series, narrowed to the models of ``$model``."""
    text = pool_series(pool).promql(metric)
    return _add_matcher(text, f"{LABEL_MODEL_NAME}=~{promql_string(MODEL_VAR)}")


def dcgm_series(pool: PoolConfig, metric: str) -> str:
    """``metric`` over the pool's DCGM exporter series."""
    return pool_series(pool, KIND_DCGM).promql(metric)


def _add_matcher(selector_text: str, matcher: str) -> str:
    """``metric{a="b"}`` with ``matcher`` added (``metric{matcher}`` when it had none)."""
    if selector_text.endswith("}"):
        inner = selector_text[selector_text.index("{") + 1:-1]
        return selector_text[:selector_text.index("{")] + "{" + (
            f"{inner}, {matcher}" if inner else matcher) + "}"
    return f"{selector_text}{{{matcher}}}"
