"""promtool (Debian's 2.42) accepts every generated rule file and passes the generated tests.

* ``promtool check rules`` on the recording and the alerting rules of several configs: the
  golden cases (pools chosen by selectors among them), the default SLOs with custom intervals,
  a config with nothing in it. 2.42 rejects 3.x-only syntax and duplicate rules (same name
  and labels), so this also proves the files load into the Prometheus CI runs;
* ``promtool test rules`` on the generated tests: Prometheus, evaluating the rules over the
  synthetic fleet, records exactly (promtool compares floats exactly) the engine's numbers and
  fires exactly the alerts the engine would;
* and the tests can fail: one wrong expected value, or a wrong alert, and promtool says so.

Skipped when promtool is not installed, except under CI (``CI`` set), where that fails.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.prometheus import require_prometheus

from alerts.rules.pipeline import RulesOptions, generate, rules_options, write_files
from vigil.config import Config, load_config, parse_config
from vigil.conventions import FILE_ALERT_RULES, FILE_RULES_TEST, FILE_SLO_RULES

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).resolve().parent / "golden" / "rules"
DEFAULTS = {
    "pools": [{"name": "chat", "model": "meta-llama/Llama-3.1-8B-Instruct"}],
    "targets": [{"name": "chat-0", "url": "http://127.0.0.1:8000/metrics", "pool": "chat"}],
}
FLEET = load_config(GOLDEN / "fleet" / "vigil.toml")
CONFIGS: dict[str, tuple[Config, RulesOptions]] = {
    "golden-defaults": (load_config(GOLDEN / "defaults" / "vigil.toml"), RulesOptions()),
    # Pools chosen by selectors (namespace/service, a regex, replica_label "pod"): the test's
    # series carry only those labels.
    "golden-kubernetes": (load_config(GOLDEN / "kubernetes" / "vigil.toml"), RulesOptions()),
    # The golden files: the fleet's own [rules] intervals (45s, 10m).
    "golden-fleet": (FLEET, rules_options(FLEET)),
    "fleet-30s": (FLEET, RulesOptions()),
    # An interval that does not divide a minute: the test's evaluation time moves with it.
    "defaults-45s": (parse_config(DEFAULTS), RulesOptions(interval_s=45.0, period_interval_s=90.0)),
    # A minute-multiple interval: the evaluation time falls on the sample grid.
    "defaults-1m": (parse_config(DEFAULTS), RulesOptions(interval_s=60.0)),
    "empty": (parse_config({}), RulesOptions()),
    # Pools no [[targets]] entry lists: one found by [[discovery]] at its own interval, one
    # whose series only a PodMonitor brings. Their replicas are billed at the interval the
    # cost rule uses, not at the test's one-minute sample spacing.
    "unlisted-replicas": (parse_config({
        **DEFAULTS,
        "pools": [*DEFAULTS["pools"], {"name": "found", "model": "m"},
                  {"name": "lone", "model": "m", "scrape_interval": "20s"}],
        "discovery": [{"name": "k8s", "files": ["targets/found.json"], "pool": "found",
                       "scrape_interval": "30s"}],
    }), RulesOptions()),
}


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_prometheus()[1]


def _promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, check=False)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    config, options = CONFIGS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    write_files(generate(config, options).files(), folder)
    return folder


def test_promtool_check_rules_accepts_every_rule_file(promtool: str, written: Path) -> None:
    for name in (FILE_SLO_RULES, FILE_ALERT_RULES):
        done = _promtool(promtool, "check", "rules", name, cwd=written)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout


def test_promtool_test_rules_passes(promtool: str, written: Path) -> None:
    done = _promtool(promtool, "test", "rules", FILE_RULES_TEST, cwd=written)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_generated_tests_catch_a_wrong_value_and_a_wrong_alert(
    promtool: str, tmp_path: Path
) -> None:
    config, options = CONFIGS["golden-defaults"]
    write_files(generate(config, options).files(), tmp_path)
    original = (tmp_path / FILE_RULES_TEST).read_text()
    wrong_value = original.replace("value: 0.17600000000000005", "value: 0.17600000000000007", 1)
    wrong_alert = original.replace("instance: chat-1\n", "instance: chat-9\n", 1)
    for broken in (wrong_value, wrong_alert):
        assert broken != original
        (tmp_path / FILE_RULES_TEST).write_text(broken)
        done = _promtool(promtool, "test", "rules", FILE_RULES_TEST, cwd=tmp_path)
        assert done.returncode != 0
        assert "FAILED" in done.stdout + done.stderr
