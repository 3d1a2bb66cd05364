"""``TargetDown`` for a pool whose replicas ``[[discovery]]`` finds: one rule on the pool's
``up{pool, kind}`` (vllm and dcgm), as a selector pool gets one on its selectors, held for
``N - 1`` scrapes at the longest interval of the entries that can name the pool. Pools with
``[[targets]]`` and no such entry keep exactly their rules. promtool accepts the file, and a
hand-written promtool test shows the rule pending, then firing, for a discovered replica."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.prometheus import require_prometheus

from alerts.rules import yaml_emitter
from alerts.rules.model import Rule
from alerts.rules.pipeline import generate, write_files
from vigil.config import Config, parse_config
from vigil.conventions import FILE_ALERT_RULES, FILE_RULES_TEST, FILE_SLO_RULES

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BOTH_KINDS = 'up{pool="chat", kind="vllm"} == 0\nor\nup{pool="chat", kind="dcgm"} == 0'


def _config(discovery: list[dict[str, Any]], *, targets: list[dict[str, Any]] | None = None,
            **pool: Any) -> Config:
    return parse_config({
        "collector": {"scrape_interval": "15s", "scrape_timeout": "5s"},
        "pools": [{"name": "chat", "model": MODEL, **pool},
                  {"name": "batch", "model": MODEL}],
        "targets": targets or [],
        "discovery": discovery,
    })


def _down(config: Config, pool: str = "chat") -> list[Rule]:
    return [r for r in generate(config).rules()
            if r.alert == "TargetDown" and r.origin.pool == pool]


def _files(entry: str = "sd/*.json") -> dict[str, Any]:
    return {"name": "k8s", "files": [entry]}


def test_a_discovered_pool_is_watched_on_both_kinds() -> None:
    (rule,) = _down(_config([{**_files(), "pool": "chat", "scrape_interval": "5s"}]))
    assert rule.expr == BOTH_KINDS
    assert rule.for_s == 10  # 3 scrapes every 5s: the first failure starts the clock
    assert rule.labels == {"severity": "ticket", "pool": "chat", "model": MODEL}
    # $labels are the expression's: the discovered target's name is its instance.
    assert rule.annotations["summary"] == "Target {{ $labels.instance }} of pool chat is down"


def test_an_entry_without_a_pool_can_name_every_pool() -> None:
    config = _config([{**_files(), "pool_label": "team_pool"}])
    assert [r.expr for r in _down(config)] == [BOTH_KINDS]
    assert len(_down(config, "batch")) == 1
    assert _down(config)[0].for_s == 30  # [collector] scrape_interval


def test_a_pool_no_entry_feeds_still_gets_the_pool_wide_rule() -> None:
    # No [[targets]] and no [[discovery]] of its own: a PodMonitor (or the team's relabelled
    # jobs) scrapes it, so its up{pool, kind} series are watched at [collector]'s interval.
    config = _config([{**_files(), "pool": "batch"}])
    assert [r.expr for r in _down(config)] == [BOTH_KINDS]
    assert _down(config)[0].for_s == 30
    assert len(_down(config, "batch")) == 1


def test_the_longest_interval_of_the_entries_holds_the_alert() -> None:
    config = _config([{**_files(), "pool": "chat", "scrape_interval": "5s"},
                      {"name": "dns", "names": ["chat.llm.svc"], "port": 8000, "pool": "chat",
                       "scrape_interval": "20s"}])
    assert [r.for_s for r in _down(config)] == [40]
    # The pool's own scrape_interval says what the entries' intervals cannot.
    config = _config([{**_files(), "pool": "chat", "scrape_interval": "5s"}],
                     scrape_interval="1m")
    assert [r.for_s for r in _down(config)] == [120]


def test_a_pool_with_targets_and_discovery_keeps_one_rule_on_the_pool() -> None:
    targets = [{"name": "chat-0", "url": "http://127.0.0.1:8000/metrics", "pool": "chat",
                "scrape_interval": "10s"},
               {"name": "chat-1", "url": "http://127.0.0.1:8001/metrics", "pool": "chat"}]
    without = _down(_config([], targets=targets))
    assert [r.labels.get("instance") for r in without] == ["chat-0", "chat-1"]
    (rule,) = _down(_config([{**_files(), "pool": "chat", "scrape_interval": "20s"}],
                            targets=targets))
    assert rule.expr == 'up{pool="chat"} == 0'
    assert rule.for_s == 40  # the entry's 20s is the longest


def test_targets_without_a_discovery_of_their_pool_keep_their_rules_byte_for_byte() -> None:
    targets = [{"name": "chat-0", "url": "http://127.0.0.1:8000/metrics", "pool": "chat"}]
    plain = generate(_config([], targets=targets))
    other = generate(_config([{**_files(), "pool": "batch"}], targets=targets))

    def chat_groups(result: Any) -> str:
        return yaml_emitter.dump({"groups": [g.to_dict() for g in result.alert_groups
                                           if g.name.endswith("-chat")]})

    assert "TargetDown" in chat_groups(plain)
    assert chat_groups(other) == chat_groups(plain)


def test_a_selector_pool_keeps_its_selector_rule() -> None:
    config = _config([{**_files(), "pool": "chat"}], selector='namespace="llm"')
    assert [r.expr for r in _down(config)] == ['up{namespace="llm"} == 0']


# --- promtool -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def promtool() -> str:
    return require_prometheus()[1]


def _run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, check=False)


DISCOVERED = [{"name": "k8s", "files": ["sd/*.json"], "pool": "chat"}]


def _written(tmp_path: Path) -> Config:
    config = parse_config({
        "collector": {"scrape_interval": "15s", "scrape_timeout": "5s"},
        "pools": [{"name": "chat", "model": MODEL}],
        "discovery": DISCOVERED,
    })
    write_files(generate(config).files(), tmp_path)
    return config


@pytest.mark.slow
def test_promtool_checks_the_rules_and_passes_the_generated_tests(
        promtool: str, tmp_path: Path) -> None:
    _written(tmp_path)
    for name in (FILE_SLO_RULES, FILE_ALERT_RULES):
        done = _run(promtool, "check", "rules", name, cwd=tmp_path)
        assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    done = _run(promtool, "test", "rules", FILE_RULES_TEST, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_promtool_fires_for_a_discovered_replica_after_three_failed_scrapes(
        promtool: str, tmp_path: Path) -> None:
    config = _written(tmp_path)
    url = config.alerts.dashboard_url
    replica = {"pool": "chat", "kind": "vllm", "instance": "10.0.0.5:8000", "job": "vigil-k8s"}
    gpu = {"pool": "chat", "kind": "dcgm", "instance": "10.0.0.5:9400", "job": "vigil-k8s"}

    def series(labels: dict[str, str]) -> str:
        return "up{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    def firing(labels: dict[str, str]) -> dict[str, Any]:
        name = labels["instance"]
        return {
            "exp_labels": {**labels, "severity": "ticket", "model": MODEL},
            "exp_annotations": {
                "summary": f"Target {name} of pool chat is down",
                "description": f"3 scrapes in a row of the target {name} failed (every 15s).",
                "dashboard_url": url,
            },
        }

    test = {
        "rule_files": [FILE_ALERT_RULES],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            # Scrapes at 0s, 15s, ...: the vLLM replica fails from 30s on, the exporter
            # from 60s on.
            "input_series": [
                {"series": series(replica), "values": "1 1 0 0 0 0 0"},
                {"series": series(gpu), "values": "1 1 1 1 0 0 0"},
                # A replica of a pool that is not configured: no rule watches it.
                {"series": series({**replica, "pool": "batch"}), "values": "0x6"},
            ],
            "alert_rule_test": [
                # Pending from the first failure (30s) until held for 2 x 15s.
                {"eval_time": "45s", "alertname": "TargetDown", "exp_alerts": []},
                {"eval_time": "60s", "alertname": "TargetDown", "exp_alerts": [firing(replica)]},
                {"eval_time": "90s", "alertname": "TargetDown",
                 "exp_alerts": [firing(replica), firing(gpu)]},
            ],
        }],
    }
    (tmp_path / "discovered-test.yml").write_text(yaml_emitter.dump(test))
    done = _run(promtool, "test", "rules", "discovered-test.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
