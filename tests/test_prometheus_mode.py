"""Prometheus mode, proven: a real Prometheus scraping a simulated fleet with the files
``vigil rules prometheus`` writes, and Vigil's own collector scraping the same fleet, give the
same ``vigil slo status``, within a tolerance that comes only from their different scrape
instants.

The run (``prometheus_mode_systems``, ``prometheus_mode_load``): a 2-replica ``small`` fleet
plus a dead target; Debian's Prometheus 2.42 configured with the generated
``prometheus-scrape.yml`` and rule files, as written; the ``Collector`` writing the store; both
scraping every second. Load arrives in cycles of 6 s: 2 s of traffic (chat and completions,
streaming or not, streams cancelled by the client, prompts of 11,000 tokens that are cost
anomalies), then a 4 s pause in which no engine step runs; one cycle restarts a replica (every
counter back to zero) mid-pause. It builds KV-cache pressure, a queue, TTFT past its SLO
(burn-rate alerts, a scale-out), and an SLO that the dead target breaks (replica_up).

At five evaluation instants ``T``, each in the middle of a pause, ``vigil slo status --json
--at T`` from the store and ``--prometheus-url URL`` are compared number by number.

The tolerance, derived (``docs/deploying.md``, "How close the two answers are"):

* Premise, checked: every window edge and every instant the status reads a gauge at lies in a
  pause, where both systems scraped the same frozen values, so *nothing happened between the
  two systems' scrapes*. Every counter series changes by the same raw amount ``N`` in every
  window on both sides, and every gauge has the same value at every probe instant.
* What remains is where the instants are. Each side extrapolates a counter's raw change to
  the window's edges with its own factor ``k >= 1`` (PromQL's ``extrapolatedRate``: a function
  of that side's first and last sample instants in the window, and of ``N`` and the first
  value, which are equal). ``rho = k_store / k_prometheus`` per series; ``[lo, hi]`` is its
  range over the series a number is made of, in its window.
* Hence: a sum of increases (requests, tokens) agrees within a factor ``[lo, hi]``; a ratio of
  sums (error ratios, burn rates, means, bucket fractions) within ``[lo_num / hi_den,
  hi_num / lo_den]``; a quantile lies between the quantiles of Prometheus's buckets with every
  bucket fraction moved to either end of its own interval (``histogram_quantile`` falls as any
  fraction rises); gauges, replica_up and GPU-hours are equal; the idle share counts
  samples and may differ by a few samples per run of idle samples plus the sample-count
  difference; derived numbers carry their inputs' intervals through their formulas (the
  scaling advice's TTFT trend through the least-squares coefficients). A discrete outcome
  (an alert, a scaling reason) whose input interval straddles its threshold is reported as
  ambiguous rather than compared; there were none in the runs made while writing this.

Observed: ``hi/lo`` is about 1.0001 for most series in windows inside the run (more for a
sparse bucket whose extrapolation stops at zero), and up to about 1.03 across replicas for
windows that reach back before the first scrape (each side's extrapolation then ends at its
own first sample); quantiles agree to a few 1e-4, long-window ratios to a few per cent.

Also: the recorded series that Prometheus evaluated from the generated rules equal the
engine's numbers on the same Prometheus data at the rules' own evaluation instants (1e-9), and
``ErrorBudgetBurn`` fires in Prometheus exactly when the engine says it does. Those compare
one system with itself, so the only care is for a scrape that had started but was not yet
stored when a rule ran (``_scrape_windows``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.loopback import free_port, wait_for
from support.prometheus import PrometheusServer, require_prometheus
from support.prometheus_mode.checker import Checker, structure_differences
from support.prometheus_mode.load import CyclePlan, FleetFreezer, LoadStats, Schedule, drive_load
from support.prometheus_mode.samples import (
    GAUGES,
    Sides,
    edge_violations,
    first_scrapes,
    probe_times,
    read_samples,
    status_windows,
)
from support.prometheus_mode.systems import (
    collecting,
    scraping_prometheus,
    slo_status,
    vigil_config_text,
)
from support.prometheus_mode.tolerance import compare_status
from support.same_numbers import same_numbers

from alerts.rules.engine_value import engine_value
from alerts.rules.pipeline import RulesOptions, generate
from collector.store import Store
from serving.sim.testing import running_fleet
from slo.objectives.burn_rate import budget_remaining, burn_rate, evaluate_slo
from slo.objectives.spec import effective_slos, spec_version
from slo.sources.embedded import EmbeddedSource
from slo.sources.prometheus import PrometheusSource, selector
from vigil.config import Config, load_config
from vigil.conventions import (
    GROUP_SLO_SLI,
    LABEL_MODEL_NAME,
    SERIES_UP,
    SUFFIX_BUCKET,
    VLLM_REQUEST_SUCCESS,
    VLLM_TTFT,
)
from vigil.durations import parse_duration
from vigil_shell.cli import build_parser

# Serial: the recorded samples are compared at the instants Prometheus evaluated them, and
# an evaluation or scrape that other tests on the same cores delay moves the instants.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

SCHEDULE = Schedule()
#: Per cycle: arrivals per second of run time, giant prompts, or a restart (whole cycle paused).
PLAN = (
    CyclePlan(rate=5), CyclePlan(rate=10), CyclePlan(rate=12, giant=1), CyclePlan(rate=18),
    CyclePlan(restart=1), CyclePlan(rate=18, giant=1), CyclePlan(rate=22), CyclePlan(rate=22),
    CyclePlan(rate=12),
)
EVAL_CYCLES = (2, 3, 4, 6, 8)
POOL = "chat"
#: The rules' evaluation interval (``vigil rules prometheus --interval``), as the scrapes.
RULE_INTERVAL = "1s"


@dataclass
class Run:
    config_path: Path
    config: Config
    prom: PrometheusServer
    start_s: float
    stats: LoadStats
    sides: Sides
    times: list[float]
    ours: dict[float, dict[str, Any]]
    theirs: dict[float, dict[str, Any]]
    first: tuple[dict[str, int], dict[str, int]]
    #: ``--prometheus-url`` with the default ``recorded_rules = "auto"``: the SLO ratios the
    #: store's rules recorded (``theirs`` is ``--recorded-rules off``: raw series, compared
    #: with the store's own engine).
    read: dict[float, dict[str, Any]]


def _cli(*argv: str) -> int:
    args = build_parser(argv[0]).parse_args(list(argv))
    return int(args.func(args) or 0)


def _start_after_first_scrapes(first: list[float]) -> float:
    """Cycle 0's start: its grid of probe instants (``start + offset + k x cycle``, k < 0 too)
    must not fall between the two systems' first scrapes, or one side would have a timeline
    point the other lacks."""
    lo, hi = min(first), max(first)
    start = hi + SCHEDULE.margin_s + (SCHEDULE.cycle_s - SCHEDULE.eval_offset_s)
    if start - SCHEDULE.cycle_s - (SCHEDULE.cycle_s - SCHEDULE.eval_offset_s) > \
            lo - SCHEDULE.margin_s:
        raise RuntimeError(f"the first scrapes are {hi - lo:.1f} s apart: too far to schedule")
    return start


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_prometheus()
    work = tmp_path_factory.mktemp("prometheus-mode")
    with running_fleet(2, profile="small") as fleet:
        config_path = work / "vigil.toml"
        config_path.write_text(vigil_config_text(
            fleet.metrics_urls, f"http://127.0.0.1:{free_port()}/metrics",
            fleet.replicas[0].served_model, SCHEDULE))
        assert _cli("rules", "prometheus", "--config", str(config_path), "--out",
                    str(work / "rules"), "--interval", RULE_INTERVAL, "--period-interval",
                    RULE_INTERVAL) == 0
        config = load_config(config_path)
        freezer = FleetFreezer(fleet)
        with scraping_prometheus(work, work / "rules") as prom:
            wait_for("Prometheus scraping every target",
                     lambda: len(prom.query(SERIES_UP, time.time())) == len(config.targets))
            with collecting(config) as collector:
                wait_for("the collector scraping every target",
                         lambda: collector.scrapes >= len(config.targets))
                with Store(config.store_path(), readonly=True) as store:
                    stored = EmbeddedSource(store).samples(SERIES_UP, {}, time.time(), 60.0)
                ups = prom.query_range_samples(SERIES_UP, time.time(), 60.0)
                first = [pts[0][0] / 1000 for pts in ups.values()]
                first += [pts[0].ts_ms / 1000 for pts in stored.values()]
                start = _start_after_first_scrapes(first)
                stats = drive_load(fleet, freezer, SCHEDULE, start, PLAN)
            end = start + len(PLAN) * SCHEDULE.cycle_s
            times = [SCHEDULE.eval_time(start, k) for k in EVAL_CYCLES]
            ours = {t: slo_status(config_path, t) for t in times}
            theirs = {t: slo_status(config_path, t, prom.base_url, "off") for t in times}
            read = {t: slo_status(config_path, t, prom.base_url) for t in times}
            span = end - min(first) + 60.0
            with Store(config.store_path(), readonly=True) as store, \
                    PrometheusSource(prom.base_url, semantics="2") as remote:
                sides = Sides(read_samples(EmbeddedSource(store, semantics="2"), POOL, end, span),
                              read_samples(remote, POOL, end, span), "2",
                              config.engine.lookback)
            yield Run(config_path, config, prom, start, stats, sides, times, ours, theirs,
                      (first_scrapes(sides.ours), first_scrapes(sides.theirs)), read)


# --- the premise ------------------------------------------------------------------------------
def test_the_load_did_what_the_comparison_needs(run: Run) -> None:
    s = run.stats
    assert s.ok > 30 and s.cancelled > 0 and s.failed > 0 and s.giant == 2, s
    last = run.theirs[run.times[-1]]
    assert last["pools"][POOL]["kv_cache_usage"]["max"] > 0.5
    assert any(run.theirs[t]["pools"][POOL]["queue_length"] for t in run.times)
    assert any(run.theirs[t]["pools"][POOL]["scaling"]["action"] == "scale_out"
               for t in run.times)
    assert any(slo["alerts"] for t in run.times for slo in run.theirs[t]["slos"])
    assert any(run.theirs[t]["anomalies"] for t in run.times)
    assert last["pools"][POOL]["replicas_up"] == 2  # and the dead target is down


def test_both_systems_hold_the_same_series_scraped_on_a_steady_grid(run: Run) -> None:
    sides = run.sides
    assert set(sides.ours) == set(sides.theirs)
    assert {k[0] for k in sides.theirs} >= set(GAUGES)
    for side, name in ((sides.ours, "the store"), (sides.theirs, "Prometheus")):
        for (metric, labels), (ts, vals) in side.items():
            if metric != SERIES_UP:
                continue
            # up never changes (no downtime, even across the restart): replica_up and
            # GPU-hours are then exact on both sides.
            assert len(set(vals.tolist())) == 1, (name, labels)
            assert len(ts) > 0, (name, labels)
            # No premise on the scrape jitter: a scrape delayed by a busy machine widens the
            # idle-share bound (idle_share_bound measures the jitter) instead of voiding it.


def test_nothing_happened_between_the_two_systems_scrapes(run: Run) -> None:
    """The premise of the tolerance: at every instant the status reads, at every window edge,
    both systems saw the same values (the pause held)."""
    config = run.config
    for t in run.times:
        probes = probe_times(config, t)
        assert edge_violations(run.sides, t, status_windows(config), probes) == []
        for p in probes:  # the TTFT p95 points of the scaling timeline
            assert edge_violations(run.sides, p, [config.engine.window],
                                   metrics=[VLLM_TTFT + SUFFIX_BUCKET]) == []
    # Both sides' cooldowns start at their own first scrape; the instants are past them.
    assert all(t > max(run.first[1].values()) / 1000 + config.scaling.cooldown + 1
               for t in run.times)


# --- the status documents --------------------------------------------------------------------
def _compare(run: Run, t: float) -> Checker:
    return compare_status(run.config, run.sides, t, run.ours[t], run.theirs[t])


def test_status_has_the_same_keys_and_nulls_from_both_sources(run: Run) -> None:
    for t in run.times:
        excused = _compare(run, t).ambiguous
        assert structure_differences(run.ours[t], run.theirs[t], excused) == [], t


def test_status_numbers_agree_within_the_derived_tolerance(run: Run) -> None:
    compared = exact = 0
    for t in run.times:
        check = _compare(run, t)
        assert check.failures == [], f"at {t}:\n" + "\n".join(check.failures)
        compared += check.compared
        exact += check.exact
    # Not vacuous: hundreds of numbers, and most with a real tolerance, not just equality.
    assert compared > 500 and compared - exact > 200, (compared, exact)


def test_the_tolerance_is_tight_enough_to_catch_a_wrong_number(run: Run) -> None:
    """A test that cannot fail is a defect: nudge numbers just beyond their tolerance."""
    t = run.times[-1]
    spread = run.sides.spread(t, run.config.engine.cost_window,
                              run.sides.counters((VLLM_REQUEST_SUCCESS,)))

    def failures(edit: Any) -> list[str]:
        wrong = _copy(run.theirs[t])
        edit(wrong)
        return compare_status(run.config, run.sides, t, run.ours[t], wrong).failures

    def requests(doc: dict[str, Any]) -> None:
        # ours / theirs may be anywhere in [lo, hi]: move theirs by more than hi / lo.
        doc["pools"][POOL]["cost"]["requests"] *= spread.ratio_widening * 1.001

    def kv_max(doc: dict[str, Any]) -> None:
        kv = doc["pools"][POOL]["kv_cache_usage"]
        kv["max"] = math.nextafter(kv["max"], 2.0)  # gauges are exact: one ulp is too much

    def null(doc: dict[str, Any]) -> None:
        doc["slos"][0]["windows"]["12s"]["burn_rate"] = None

    for edit, path in ((requests, ".cost.requests:"), (kv_max, ".kv_cache_usage:"),
                       (null, ".windows.12s.burn_rate:")):
        found = failures(edit)
        assert len(found) == 1 and path in found[0], (path, found)


def _copy(doc: dict[str, Any]) -> dict[str, Any]:
    import json

    copied: dict[str, Any] = json.loads(json.dumps(doc))
    return copied


# --- the recorded series ---------------------------------------------------------------------
def _scrape_windows(run: Run) -> list[tuple[int, int]]:
    """Per Prometheus scrape, ``(start, end)`` in Unix ms: its samples carry the start as their
    timestamp but are stored only at the end (its ``scrape_duration_seconds``, plus 20 ms for
    the append). A rule evaluated in between does not see them, a later query does."""
    end = run.times[-1] + 1
    found = run.prom.query_range_samples("scrape_duration_seconds", end, end - run.start_s + 60)
    return sorted((ts, ts + math.ceil(v * 1000) + 20) for pts in found.values() for ts, v in pts)


def _racy(at_ms: int, scrapes: list[tuple[int, int]]) -> bool:
    return any(start <= at_ms < stored for start, stored in scrapes)


#: A rule group stores its samples when its evaluation ends; another group evaluated this soon
#: after (ms) may not see them yet and reads the SLI evaluation before.
RULE_COMMIT_MS = 100


def _sli_reads(at_ms: int, sli_instants: list[int]) -> list[int]:
    """The SLI evaluations (Unix ms) a rule evaluated at ``at_ms`` may have read, latest first:
    the last one at or before it, and the one before that when the last is too recent to be
    certainly stored (two groups evaluated milliseconds apart race)."""
    before = sorted((e for e in sli_instants if e <= at_ms), reverse=True)
    if len(before) > 1 and at_ms - before[0] < RULE_COMMIT_MS:
        return before[:2]
    return before[:1] or [at_ms]


#: Rules that read another rule's recorded SLI, and the window of that SLI.
_READS_SLI = {"current_burn_rate": "window", "period_burn_rate": "period",
              "period_budget_remaining": "period"}


def _recorded(run: Run) -> tuple[Any, dict[str, dict[Any, list[tuple[int, float]]]]]:
    """The rules ``vigil rules prometheus`` generates for the run's config (the CLI wrote
    their files) and every recorded series Prometheus produced, by rule selector."""
    result = generate(run.config, RulesOptions(interval_s=1.0, period_interval_s=1.0))
    end = run.times[-1] + 1
    span = end - run.start_s + 60
    recorded = {selector(r.record, r.labels): run.prom.query_range_samples(
        selector(r.record, r.labels), end, span) for r in result.rules() if r.record}
    return result, recorded


def _instants(rules: Any, recorded: dict[str, dict[Any, list[tuple[int, float]]]]) -> list[int]:
    """A group's evaluation instants (Unix ms) seen in its rules' recorded samples."""
    return sorted({ts for rule in rules for pts in recorded[selector(rule.record, rule.labels)]
                   .values() for ts, _ in pts})


def test_recorded_series_equal_the_engine_at_their_evaluation_instants(run: Run) -> None:
    """Every recorded series Prometheus produced from the generated rules, at the last rule
    evaluation before each evaluation instant, equals the engine's number on the same
    Prometheus data at the instant the rule read its data (1e-9); absent exactly where the
    engine says null. A burn rate reads the SLI recorded by another group, up to one interval
    earlier: its instant is that SLI's."""
    result, recorded = _recorded(run)
    specs = {s.name: s for s in effective_slos(run.config)}
    scrapes = _scrape_windows(run)
    sli_rules = {(r.origin.slo, r.origin.window_s): selector(r.record, r.labels)
                 for r in result.rules() if r.origin.kind == "sli_error"}
    compared = skipped = absent = 0
    lookback_ms = run.config.engine.lookback * 1000
    with PrometheusSource(run.prom.base_url, semantics="2") as source:
        for group in result.recording_groups:
            instants = _instants(group.rules, recorded)
            for t in run.times:
                at_ms = max((e for e in instants if e <= t * 1000), default=0)
                assert at_ms, (group.name, t, "no evaluation of the group before")
                for rule in group.rules:
                    per_series = recorded[selector(rule.record, rule.labels)]
                    got = {dict(labels).get(LABEL_MODEL_NAME, "")
                           if rule.origin.kind == "quantile" else "": v
                           for labels, pts in per_series.items() for ts, v in pts if ts == at_ms}
                    reads = [at_ms]
                    if rule.origin.kind in _READS_SLI:
                        spec = specs[rule.origin.slo]
                        w = (rule.origin.window_s if _READS_SLI[rule.origin.kind] == "window"
                             else spec.period_s)
                        sli = recorded[sli_rules[spec.name, w]]
                        reads = _sli_reads(at_ms, [ts for pts in sli.values() for ts, _ in pts
                                                   if at_ms - lookback_ms < ts <= at_ms])
                    if any(_racy(read_ms, scrapes) for read_ms in reads):
                        skipped += 1
                        continue
                    wants = []
                    for read_ms in reads:
                        values = engine_value(rule.origin, run.config,
                                              effective_slos(run.config), source, read_ms / 1000)
                        wants.append({k: v for k, v in values.items() if v is not None})
                    what = (f"{rule.record}{rule.labels} at {at_ms / 1000} "
                            f"(read {[r / 1000 for r in reads]}: {wants})")
                    assert any(same_numbers(got, want) for want in wants), (what, got)
                    compared += len(got)
                    absent += not got
    assert compared > 150, (compared, skipped, absent)


def _last(series: dict[Any, list[tuple[int, float]]], at_s: float) -> float | None:
    """A recorded series' value at its last evaluation at or before ``at_s`` (NaN: None)."""
    pts = [p for points in series.values() for p in points if p[0] <= round(at_s * 1000)]
    if not pts:
        return None
    value = max(pts)[1]
    return value if math.isfinite(value) else None


def test_status_reads_what_prometheus_recorded_when_its_rules_are_current(run: Run) -> None:
    """With the generated rules running in Prometheus, ``vigil slo status --prometheus-url``
    reads every SLO's error ratios from the series they recorded: each window's ratio is
    exactly the rule's sample at its last evaluation before the instant (the same float), and
    burn rates and the budget follow with the rules' own operations; nothing falls back."""
    result, recorded = _recorded(run)
    specs = {s.name: s for s in effective_slos(run.config)}
    sli_rules = {(r.origin.slo, r.origin.window_s): selector(r.record, r.labels)
                 for r in result.rules() if r.origin.kind == "sli_error"}
    compared = 0
    for t in run.times:
        status = run.read[t]
        assert status["recorded_rules"]["fallback"] == {}, status["recorded_rules"]
        assert status["recorded_rules"]["read"] == sorted(specs)
        assert "warnings" not in status or not any("raw series" in w
                                                   for w in status["warnings"])
        for slo in status["slos"]:
            spec = specs[slo["name"]]
            assert slo["read"] == "recorded"
            assert slo["recorded"]["spec_version"] == spec_version(spec)

            for key, entry in slo["windows"].items():
                want = _last(recorded[sli_rules[spec.name, parse_duration(key)]], t)
                assert entry["error_ratio"] == want, (slo["name"], key, t)
                burn = burn_rate(want, spec.objective)
                assert entry["burn_rate"] == burn, (slo["name"], key, t)
                compared += want is not None
            period = _last(recorded[sli_rules[spec.name, spec.period_s]], t)
            assert slo["period_error_ratio"] == period
            assert slo["budget_remaining"] == budget_remaining(period, spec.objective)
    assert compared > 40, compared


def test_error_budget_burn_fires_in_prometheus_when_the_engine_says(run: Run) -> None:
    """``ErrorBudgetBurn`` (no ``for``) is active at an evaluation of its group exactly when
    the engine, on the same Prometheus data, lists the severity at the instant the SLO's
    recorded SLIs were evaluated (the alert reads them, up to one interval later)."""
    end = run.times[-1] + 1
    span = end - run.start_s + 60
    alerts = run.prom.query_range_samples('ALERTS{alertname="ErrorBudgetBurn"}', end, span)
    assert alerts, "no ErrorBudgetBurn alert ever fired"
    firing: dict[tuple[str, str], set[int]] = {}
    for labels, pts in alerts.items():
        d = dict(labels)
        assert d["alertstate"] == "firing"  # no `for`: never pending
        firing.setdefault((d["slo"], d["severity"]), set()).update(ts for ts, _ in pts)
    # One alert group per SLO: its evaluations share one phase within the second, known from
    # its samples. An SLO whose alert never fired must not fire in the engine either.
    phases = {slo: min(ts) % 1000 for (slo, _), ts in firing.items()}
    result, recorded = _recorded(run)
    sli_groups = {g.rules[0].origin.slo: _instants(g.rules, recorded)
                  for g in result.recording_groups if g.name.startswith(GROUP_SLO_SLI + "-")}
    scrapes = _scrape_windows(run)
    checked = fired = 0
    with PrometheusSource(run.prom.base_url, semantics="2") as source:
        for t in run.times:
            for spec in effective_slos(run.config):
                at_ms = int(t * 1000)
                if spec.name in phases:
                    at_ms -= (at_ms - phases[spec.name]) % 1000
                reads = _sli_reads(at_ms, sli_groups[spec.name])
                if any(_racy(read_ms, scrapes) for read_ms in reads):
                    continue
                active = {severity for severity in ("page", "ticket")
                          if at_ms in firing.get((spec.name, severity), set())}
                engine = [set(evaluate_slo(spec, source, read_ms / 1000,
                                           run.config.engine.burn_rate_alerts).alerts)
                          & {"page", "ticket"} for read_ms in reads]
                assert active in engine, (spec.name, at_ms, reads, active, engine)
                checked += 2
                fired += len(active)
    assert fired > 0 and checked > fired, (fired, checked)


def test_target_down_fires_for_the_dead_target(run: Run) -> None:
    got = run.prom.query('ALERTS{alertname="TargetDown", alertstate="firing"}', run.times[-1])
    assert {dict(k)["instance"] for k in got} == {"chat-2"}

