"""``vigil rules grafana``: the dashboards validate against Grafana's dashboard JSON schema, equal
their golden files, and every query they hold is PromQL that promtool accepts.

Golden cases are the rule generator's (``tests/golden/rules/<case>/vigil.toml``: Vigil's labels,
and pools chosen by Kubernetes selectors); the dashboards they give are in
``tests/golden/grafana/<case>/``. After reviewing a change, regenerate them with::

    VIGIL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_grafana_dashboards.py
"""

from __future__ import annotations

import argparse
import difflib
import io
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from support.grafana_queries import panel_queries, substitute, variable_queries
from support.prometheus import require_prometheus

from alerts.rules.grafana import GrafanaOptions, generate_grafana
from alerts.rules.pipeline import generate
from vigil.config import load_config, parse_config
from vigil.errors import ConfigError

TESTS = Path(__file__).resolve().parent
RULES_GOLDEN = TESTS / "golden" / "rules"
GOLDEN = TESTS / "golden" / "grafana"
CASES = ("defaults", "kubernetes")
UPDATE = os.environ.get("VIGIL_UPDATE_GOLDEN") == "1"
SCHEMA = json.loads((TESTS / "fixtures" / "grafana_dashboard.jsonschema.json").read_text())
UIDS = ["vigil-slo-overview", "vigil-slo-detail", "vigil-fleet", "vigil-cost"]
#: Variables each dashboard defines, besides ``datasource``.
VARIABLES = {"vigil-slo-overview": {"pool", "slo"}, "vigil-slo-detail": {"pool", "slo"},
             "vigil-fleet": {"pool", "model", "endpoint"}, "vigil-cost": {"pool"}}


def _dashboards(case: str, **options: Any) -> dict[str, dict[str, Any]]:
    config = load_config(RULES_GOLDEN / case / "vigil.toml")
    return dict(generate_grafana(generate(config), GrafanaOptions(**options)).dashboards)


def _valid(model: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(model)]


@pytest.mark.parametrize("case", CASES)
def test_every_dashboard_validates_against_grafanas_schema(case: str) -> None:
    boards = _dashboards(case)
    assert list(boards) == UIDS
    for uid, model in boards.items():
        assert _valid(model) == [], uid
        assert model["uid"] == uid and "vigil" in model["tags"]


def test_the_schema_can_fail() -> None:
    model = _dashboards("defaults")["vigil-fleet"]
    broken = json.loads(json.dumps(model))
    broken["panels"][1]["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": "a string"}, "properties": []}]
    assert _valid(broken)


@pytest.mark.parametrize("case", CASES)
def test_the_dashboards_equal_the_golden_files(case: str) -> None:
    folder = GOLDEN / case
    config = load_config(RULES_GOLDEN / case / "vigil.toml")
    files = generate_grafana(generate(config)).files()
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
    assert sorted(files) == sorted(p.name for p in folder.iterdir())
    for name, text in files.items():
        want = (folder / name).read_text(encoding="utf-8")
        if text != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                                f"golden/grafana/{case}/{name}", "generated"))
            pytest.fail(f"{name} differs from the golden file (VIGIL_UPDATE_GOLDEN=1 "
                        f"regenerates it after review):\n{diff[:6000]}")
    assert generate_grafana(generate(config)).files() == files  # byte-stable


@pytest.mark.parametrize("case", CASES)
def test_panels_have_units_the_data_source_variable_and_only_known_variables(case: str) -> None:
    for uid, model in _dashboards(case).items():
        names = {v["name"] for v in model["templating"]["list"]}
        assert names == {"datasource", *VARIABLES[uid]}, uid
        for panel in model["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            if panel["type"] != "table":
                assert panel["fieldConfig"]["defaults"].get("unit"), (uid, panel["title"])
            for target in panel["targets"]:
                used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
                assert used <= names, (uid, panel["title"], used - names)


def test_slo_panels_read_the_recording_rules() -> None:
    """Where a rule records the number, the panel reads the rule's series, not the raw
    counters: the SLO dashboards read nothing of vLLM's."""
    for uid in ("vigil-slo-overview", "vigil-slo-detail"):
        for title, expr in panel_queries(_dashboards("kubernetes")[uid]):
            assert "vllm:" not in expr, (uid, title, expr)
            assert "slo:" in expr or "ALERTS" in expr, (uid, title, expr)


def test_a_selector_pool_is_read_through_its_selector() -> None:
    fleet = dict(panel_queries(_dashboards("kubernetes")["vigil-fleet"]))
    running = fleet["Requests running"]
    # The pools of the golden config: one chosen by namespace/service, one by a regex.
    assert 'namespace="llm", service="chat-vllm", pod=~"chat-vllm-.+"' in running
    assert 'label_replace(' in running and '"pool", "chat"' in running
    assert running.rstrip().endswith('vigil:queue_length:sum{pool=~"$pool"}')


def _rule_file(exprs: list[str]) -> str:
    rules = [{"record": f"vigil_panel:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    return yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}, sort_keys=False)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_query_passes_promtool(case: str, tmp_path: Path) -> None:
    """Each panel's query, and the selector of each variable's ``label_values``, with the
    variables substituted, checked by ``promtool check rules`` (Prometheus 2.42's parser)."""
    promtool = require_prometheus()[1]
    exprs: list[str] = []
    for model in _dashboards(case).values():
        exprs += [substitute(e) for _, e in panel_queries(model)]
        for _, query in variable_queries(model):
            inner = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
            assert inner, query
            exprs.append(substitute(inner.group(1)))
    assert not [e for e in exprs if "$" in e]
    path = tmp_path / "panels.yml"
    path.write_text(_rule_file(exprs))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # And promtool does refuse a broken query.
    path.write_text(_rule_file(["sum by (pool (vigil:queue_length:sum)"]))
    assert subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          timeout=120, check=False).returncode != 0


@pytest.mark.parametrize("operator", ["sidecar", "grafana-operator"])
def test_kubernetes_objects_carry_the_same_dashboards(operator: str) -> None:
    config = load_config(RULES_GOLDEN / "kubernetes" / "vigil.toml")
    out = generate_grafana(generate(config), GrafanaOptions(
        format="operator", operator=operator, namespace="monitoring",
        labels=(("release", "kube-prometheus-stack"),), folder="LLM SLOs"))
    docs = [d for d in yaml.safe_load_all(out.objects_text()) if d]
    assert [d["metadata"]["name"] for d in docs] == UIDS
    for doc in docs:
        meta = doc["metadata"]
        assert meta["namespace"] == "monitoring"
        assert meta["labels"]["release"] == "kube-prometheus-stack"
        if operator == "sidecar":
            assert (doc["apiVersion"], doc["kind"]) == ("v1", "ConfigMap")
            assert meta["labels"]["grafana_dashboard"] == "1"
            assert meta["annotations"]["grafana_folder"] == "LLM SLOs"
            (text,) = doc["data"].values()
        else:
            assert (doc["apiVersion"], doc["kind"]) == ("grafana.integreatly.org/v1beta1",
                                                        "GrafanaDashboard")
            assert doc["spec"]["folder"] == "LLM SLOs"
            assert doc["spec"]["instanceSelector"] == {"matchLabels": {"dashboards": "grafana"}}
            text = doc["spec"]["json"]
        model = json.loads(text)
        assert model == out.dashboards[meta["name"]]
        assert _valid(model) == []


def _cli(*argv: str) -> tuple[int, str, str]:
    from vigil_shell.rules_cli import add_arguments, run

    parser = argparse.ArgumentParser(prog="vigil rules")
    add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    code = run(parser.parse_args(list(argv)), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_the_command_writes_the_files(tmp_path: Path) -> None:
    config = RULES_GOLDEN / "defaults" / "vigil.toml"
    code, out, _ = _cli("grafana", "--config", str(config), "--out", str(tmp_path / "g"))
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == sorted(
        f"{uid}.json" for uid in UIDS)
    assert out.count("wrote ") == 4
    code, out, _ = _cli("grafana", "--config", str(config))
    assert [m["uid"] for m in json.loads(out)] == UIDS
    code, out, _ = _cli("grafana", "--config", str(config), "--format", "operator",
                        "--operator", "grafana-operator", "--instance-selector", "team=llm")
    assert "kind: GrafanaDashboard" in out and "team: llm" in out


def test_operator_flags_need_the_operator_format_and_labels_are_checked() -> None:
    config = str(RULES_GOLDEN / "defaults" / "vigil.toml")
    with pytest.raises(ConfigError, match="--folder: only with --format operator"):
        _cli("grafana", "--config", config, "--folder", "x")
    with pytest.raises(ConfigError, match="--label"):
        _cli("grafana", "--config", config, "--format", "operator", "--label", "bad label")


def test_a_config_without_any_slo_rule_is_refused_with_the_reason() -> None:
    config = parse_config({
        "pools": [{"name": "chat", "model": "m"}],
        "slos": [{"name": "chat-ep", "pool": "chat", "indicator": "ttft",
                  "endpoint": "chat"}]})
    with pytest.raises(ConfigError, match="chat-ep: endpoint 'chat'"):
        generate_grafana(generate(config))


def test_substitute_replaces_every_variable() -> None:
    text = 'rate(x{pool=~"$pool", model_name=~"$model"}[$__rate_interval]) and $slo $endpoint'
    assert substitute(text, {"pool": "chat"}) == (
        'rate(x{pool=~"chat", model_name=~".*"}[1m]) and .* .*')
