"""The backtest's alert states equal Prometheus's rule engine at every evaluation instant.

A history (counter resets, scrape gaps, a replica joining late, one down for half an hour)
is written into the embedded store and, as ``input_series``, into a ``promtool test rules``
file whose ``alert_rule_test`` lists, at every instant of the backtest's grid, exactly the
``ErrorBudgetBurn`` alerts the backtest says fire; the rule files are the ones ``vigil rules
prometheus`` generates for the same config. promtool (Debian's 2.42) evaluates every group at
every step and compares: it passes only if the backtest's state is Prometheus's at every
instant, for every SLO and severity. The SLOs have a 1-day period and the alert table short
windows, so that a 10-hour history covers every window many times over.

The test can fail: with one instant's state flipped, promtool must refuse the file.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.backtest_history import SHORT_ALERT_TABLE, History, Replica, between, write_store
from support.prometheus import PromSeries, require_prometheus

from alerts.rules.pipeline import generate
from alerts.rules.promtool_tests import render_template
from collector.store import Store
from slo.backtest.run import Backtest, backtest
from slo.sources.embedded import EmbeddedSource
from vigil.config import Config, load_config
from vigil.conventions import (
    ALERT_ERROR_BUDGET_BURN,
    FILE_ALERT_RULES,
    FILE_SLO_RULES,
    LABEL_MODEL_NAME,
    LABEL_POOL,
    LABEL_SLO,
)

pytestmark = [
    pytest.mark.slow,
    # "availability" is named on purpose: the requests' 5xx share, not the old scrape figure.
    pytest.mark.filterwarnings("ignore:.*indicator \"availability\" now measures"),
]

HOUR = 3600.0
STEP_S = 60.0
END = 10 * HOUR

CONFIG = """
[store]
path = "{store}"

[rules]
interval = "1m"
period_interval = "1m"

[[pools]]
name = "chat"
model = "meta-llama/Llama-3.1-8B-Instruct"

{table}
[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
objective = 0.95
period = "1d"

[[slos]]
name = "chat-errors"
pool = "chat"
indicator = "error_rate"
objective = 0.99
period = "1d"

[[slos]]
name = "chat-availability"
pool = "chat"
indicator = "availability"
objective = 0.99
period = "1d"

[[slos]]
name = "chat-up"
pool = "chat"
indicator = "replica_up"
objective = 0.99
period = "1d"
"""


def _history() -> list[PromSeries]:
    return History(
        start=0.0, end=END, scrape_s=STEP_S,
        replicas=[
            Replica("chat-0", restarts=[4 * HOUR + 30]),
            Replica("chat-1", joined=HOUR),
            Replica("chat-2", gaps=[(7 * HOUR, 7.5 * HOUR)], down=[(8 * HOUR, 8.5 * HOUR)]),
        ],
        rate=lambda t: 1.0 + t / HOUR * 0.2,
        ttft_bad=between(2 * HOUR, 3 * HOUR, 0.3, 0.01),
        errors=between(5 * HOUR, 6 * HOUR, 0.03, 0.001),
    ).build()


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Config, Backtest,
                                                            list[PromSeries]]:
    folder = tmp_path_factory.mktemp("backtest-promtool")
    (folder / "vigil.toml").write_text(CONFIG.format(store=folder / "vigil.db",
                                                     table=SHORT_ALERT_TABLE))
    config = load_config(folder / "vigil.toml")
    series = _history()
    with Store(folder / "vigil.db") as store:
        write_store(store, series)
        result = backtest(config, EmbeddedSource(store, semantics="2"), 0.0, END)
    files = generate(config).files()
    for name in (FILE_SLO_RULES, FILE_ALERT_RULES):
        (folder / name).write_text(files[name])
    return folder, config, result, series


def _values(samples: Sequence[tuple[int, float]]) -> str:
    """promtool's ``values``: one per step from time 0, ``_`` where there is no sample."""
    by_step = {round(ts / (STEP_S * 1000)): v for ts, v in samples}
    last = int(END // STEP_S)
    return " ".join(repr(float(by_step[k])) if k in by_step else "_" for k in range(last + 1))


def _document(config: Config, result: Backtest, series: Sequence[PromSeries],
              flip: tuple[str, str, int] | None = None) -> dict[str, Any]:
    """The promtool test file; with ``flip``, one state flipped and the tests ending at it
    (promtool evaluates only up to the last instant a test names)."""
    generated = generate(config)
    rules = {(r.origin.slo, r.origin.severity): r
             for g in generated.alert_groups for r in g.rules
             if r.alert == ALERT_ERROR_BUDGET_BURN}
    instants = result.grid.instants_ms()
    tests = []
    last = flip[2] if flip is not None else len(instants) - 1
    for i, at_ms in enumerate(instants.tolist()[:last + 1]):
        alerts = []
        for s in result.slos:
            for severity, state in s.firing.items():
                fires = bool(state[i])
                if flip == (s.spec.name, severity, i):
                    fires = not fires
                if not fires:
                    continue
                rule = rules[s.spec.name, severity]
                labels = {LABEL_SLO: s.spec.name, LABEL_POOL: s.spec.pool,
                          LABEL_MODEL_NAME: s.spec.model, **rule.labels}
                alerts.append({"exp_labels": dict(sorted(labels.items())),
                               "exp_annotations": {k: render_template(v, labels)
                                                   for k, v in rule.annotations.items()}})
        tests.append({"eval_time": f"{at_ms // 1000}s", "alertname": ALERT_ERROR_BUDGET_BURN,
                      "exp_alerts": alerts})
    inputs = []
    for s in series:
        inner = ", ".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        inputs.append({"series": f"{{__name__=\"{s.name}\", {inner}}}",
                       "values": _values(s.samples)})
    # Every group in file order: the SLIs recorded at an instant before the alerts read them
    # there. Without an order promtool evaluates the groups in Go's map order, different from
    # run to run.
    order = [g.name for g in (*generated.recording_groups, *generated.alert_groups)]
    return {
        "rule_files": [FILE_SLO_RULES, FILE_ALERT_RULES],
        "evaluation_interval": "1m",
        "group_eval_order": order,
        "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": tests}],
    }


def _promtool(folder: Path, doc: dict[str, Any], name: str) -> subprocess.CompletedProcess[str]:
    (folder / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run([require_prometheus()[1], "test", "rules", name], cwd=folder,
                          capture_output=True, text=True, timeout=600, check=False)


def test_the_history_fires_every_severity_and_rests_too(case: Any) -> None:
    _, _, result, _ = case
    for s in result.slos:
        for severity, state in s.firing.items():
            assert state.any() and not state.all(), (s.spec.name, severity)


def test_every_alert_state_is_prometheuss(case: Any) -> None:
    folder, config, result, series = case
    done = _promtool(folder, _document(config, result, series), "backtest_test.yml")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_one_wrong_state_fails(case: Any) -> None:
    folder, config, result, series = case
    s = result.slos[0]
    severity, state = next(iter(s.firing.items()))
    i = int(state.argmax())  # the first instant it fires: the wrong state says it does not
    done = _promtool(folder, _document(config, result, series, (s.spec.name, severity, i)),
                     "backtest_wrong_test.yml")
    assert done.returncode != 0
    assert ALERT_ERROR_BUDGET_BURN in done.stdout + done.stderr
