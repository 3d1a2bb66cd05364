"""``vigil rules prometheus --format operator``: PodMonitors and PrometheusRules that the
Prometheus Operator's own CRDs accept, holding exactly the plain rule files' groups.

The CRDs (``tests/fixtures/prometheus_operator_monitoring.coreos.com_*.yaml``, operator 0.93.0,
verbatim) are what the API server validates the objects with. Checked here: their
``openAPIV3Schema`` with jsonschema; besides, by walking the object against the schema, what
JSON schema leaves open: fields the structural schema does not declare (pruned, or refused
under strict field validation), ``x-kubernetes-int-or-string`` fields holding an int or a
string, and the keys of ``x-kubernetes-list-type: map`` lists being unique. Then: names that
Kubernetes accepts, ``promtool check rules`` on the groups, and a real Prometheus scraping a
loopback "pod" through a PodMonitor's relabelings, as the operator writes the scrape job.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import require_binary
from support.crd import python_patterns
from support.loopback import FIXTURES, exposition_server, text
from support.prometheus import APT_PACKAGE, PrometheusServer, require_prometheus, start_prometheus

from alerts.rules import yaml_emitter
from alerts.rules.operator import (
    MAX_APPLIED_BYTES,
    OperatorOptions,
    OperatorResult,
    applied_size,
    generate_operator,
    parse_match_labels,
    pod_monitor,
    prometheus_rules,
)
from alerts.rules.pipeline import RulesResult, generate
from vigil.config import Config, load_config, parse_config
from vigil.errors import ConfigError
from vigil_shell import rules_cli

GOLDEN = Path(__file__).resolve().parent / "golden" / "rules"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _schema(plural: str) -> tuple[dict[str, Any], dict[str, Any]]:
    crd = yaml.safe_load(
        (FIXTURES / f"prometheus_operator_monitoring.coreos.com_{plural}.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return crd, python_patterns(version["schema"]["openAPIV3Schema"])


CRDS = {kind: _schema(plural) for kind, plural in (
    ("PrometheusRule", "prometheusrules"), ("PodMonitor", "podmonitors"),
    ("ServiceMonitor", "servicemonitors"))}

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

SELECTOR_POOLS = [
    {"name": "chat", "model": MODEL, "selector": 'namespace="llm", service="chat-vllm"',
     "dcgm_selector": 'exported_namespace="llm", exported_pod=~"chat-.*"',
     "replica_label": "pod"},
    {"name": "code", "model": "Qwen/Qwen2.5-Coder-7B-Instruct",
     "selector": 'namespace="llm", model_name="Qwen/Qwen2.5-Coder-7B-Instruct"',
     "replica_label": "pod"},
]
PLAIN_POOL = {"name": "batch", "model": "Qwen/Qwen2.5-7B-Instruct"}


def _configs() -> dict[str, Config]:
    return {
        "defaults": load_config(GOLDEN / "defaults" / "vigil.toml"),
        "fleet": load_config(GOLDEN / "fleet" / "vigil.toml"),
        "selectors": parse_config({"pools": SELECTOR_POOLS}),
        "mixed": parse_config({
            "pools": [SELECTOR_POOLS[0], PLAIN_POOL],
            "targets": [{"name": "batch-0", "url": "http://10.0.0.20:8000/metrics",
                         "pool": "batch", "scrape_interval": "30s"},
                        {"name": "batch-gpu", "url": "http://10.0.0.20:9400/metrics",
                         "pool": "batch", "kind": "dcgm"}],
        }),
    }


CONFIGS = _configs()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request: pytest.FixtureRequest) -> tuple[str, RulesResult, OperatorResult]:
    result = generate(CONFIGS[request.param])
    options = OperatorOptions(namespace="monitoring",
                              labels=(("release", "kube-prometheus-stack"),),
                              dcgm_pod_selector="app=nvidia-dcgm-exporter",
                              dcgm_namespace="gpu-operator")
    return request.param, result, generate_operator(result, options)


# --- the CRDs' schemas ----------------------------------------------------------------------


def _walk(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """What jsonschema does not check of a structural schema (see the module docs)."""
    out: list[str] = []
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(obj, bool) or not isinstance(obj, int | str):
            out.append(f"{path}: int-or-string holds {type(obj).__name__}")
        return out
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                out += _walk(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += _walk(value, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and path != ".metadata":
                out.append(f"{path}.{key}: not in the schema")
    elif isinstance(obj, list) and "items" in schema:
        if schema.get("x-kubernetes-list-type") == "map":
            keys = [tuple(item.get(k) for k in schema["x-kubernetes-list-map-keys"])
                    for item in obj]
            if len(set(keys)) != len(keys):
                out.append(f"{path}: duplicate list-map keys")
        if schema.get("x-kubernetes-list-type") == "set" and len(
                {repr(item) for item in obj}) != len(obj):
            out.append(f"{path}: duplicate set items")
        for i, item in enumerate(obj):
            out += _walk(item, schema["items"], f"{path}[{i}]")
    return out


def _check_label(key: str, value: str) -> None:
    prefix, _, name = key.rpartition("/")
    assert not prefix or (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)), key
    assert len(name) <= 63 and _LABEL_PART.fullmatch(name), key
    assert value == "" or (len(value) <= 63 and _LABEL_PART.fullmatch(value)), value


def _check(obj: dict[str, Any]) -> None:
    crd, schema = CRDS[obj["kind"]]
    jsonschema.validate(obj, schema)
    assert _walk(obj, schema) == []
    assert obj["apiVersion"] == f"{crd['spec']['group']}/v1"
    meta = obj["metadata"]
    assert len(meta["name"]) <= 253 and _DNS_SUBDOMAIN.fullmatch(meta["name"]), meta["name"]
    if "namespace" in meta:
        assert len(meta["namespace"]) <= 63 and _DNS_LABEL.fullmatch(meta["namespace"])
    for key, value in meta.get("labels", {}).items():
        _check_label(key, value)
    if obj["kind"] == "PodMonitor":
        for key, value in obj["spec"]["selector"]["matchLabels"].items():
            _check_label(key, value)


def test_the_fixtures_are_the_operators_crds() -> None:
    for kind, (crd, _) in CRDS.items():
        assert crd["kind"] == "CustomResourceDefinition"
        assert crd["spec"]["names"]["kind"] == kind
        assert crd["metadata"]["annotations"]["operator.prometheus.io/version"] == "0.93.0"


def test_every_object_validates_against_its_crd(
    case: tuple[str, RulesResult, OperatorResult],
) -> None:
    _, _, objects = case
    assert objects.objects
    for obj in objects.objects:
        _check(obj)
    # As kubectl reads the file: every document, the same objects.
    assert list(yaml.safe_load_all(objects.text())) == list(objects.objects)


def test_the_schema_check_is_not_vacuous() -> None:
    result = generate(CONFIGS["defaults"])
    monitor, rule = generate_operator(result).objects[:2]
    typo = {**monitor, "spec": {**monitor["spec"], "podMetricEndpoints": []}}
    assert _walk(typo, CRDS["PodMonitor"][1]) == [".spec.podMetricEndpoints: not in the schema"]
    bad_interval = {**rule, "spec": {"groups": [{**rule["spec"]["groups"][0],
                                                 "interval": "30 seconds"}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad_interval, CRDS["PrometheusRule"][1])
    twice = {**rule, "spec": {"groups": rule["spec"]["groups"][:1] * 2}}
    assert _walk(twice, CRDS["PrometheusRule"][1]) == [".spec.groups: duplicate list-map keys"]
    floaty = {"expr": 0.5}
    expr_schema = (CRDS["PrometheusRule"][1]["properties"]["spec"]["properties"]["groups"]
                   ["items"]["properties"]["rules"]["items"])
    assert _walk(floaty, expr_schema) == [".expr: int-or-string holds float"]


# --- PrometheusRules: the plain groups, per pool --------------------------------------------


def test_prometheus_rules_hold_exactly_the_plain_groups(
    case: tuple[str, RulesResult, OperatorResult],
) -> None:
    _, result, objects = case
    plain = yaml.safe_load(result.all_rules_text())["groups"]
    order = [g["name"] for g in plain]
    rules = objects.of_kind("PrometheusRule")
    held = [g for obj in rules for g in obj["spec"]["groups"]]
    assert sorted(held, key=lambda g: order.index(g["name"])) == plain
    for obj in rules:
        names = [g["name"] for g in obj["spec"]["groups"]]
        assert names == sorted(names, key=order.index)  # plain-file order within an object
        assert applied_size(obj) <= MAX_APPLIED_BYTES
    pools = [p.name for p in result.config.pools]
    # Per pool, then `vigil` for the groups of no single pool (the dead-man's switch).
    assert [o["metadata"]["name"] for o in rules] == [
        *(f"vigil-{p}" for p in pools
          if any(g.rules and g.rules[0].origin.pool == p
                 for g in (*result.recording_groups, *result.alert_groups))), "vigil"]


def test_each_pool_gets_its_own_groups() -> None:
    result = generate(CONFIGS["fleet"])
    rules = {o["metadata"]["name"]: [g["name"] for g in o["spec"]["groups"]]
             for o in prometheus_rules(result)}
    assert list(rules) == ["vigil-chat", "vigil-batch", "vigil"]
    assert rules["vigil"] == ["vigil-meta-alerts"]
    assert "vigil-pool-chat" in rules["vigil-chat"]
    assert "vigil-slo-sli-batch-errors" in rules["vigil-batch"]
    assert not any("batch" in name for name in rules["vigil-chat"])


def test_a_pool_too_big_for_one_object_is_split_between_groups() -> None:
    result = generate(CONFIGS["fleet"])
    whole = prometheus_rules(result)
    limit = max(applied_size(o) for o in whole) // 3
    parts = prometheus_rules(result, limit=limit)
    names = [o["metadata"]["name"] for o in parts]
    assert names[:3] == ["vigil-chat", "vigil-chat-2", "vigil-chat-3"]
    assert len(names) == len(set(names)) > len(whole)
    assert all(applied_size(o) <= limit for o in parts)
    assert [g for o in parts for g in o["spec"]["groups"]] == [
        g for o in whole for g in o["spec"]["groups"]]
    with pytest.raises(ConfigError, match="alone is"):
        prometheus_rules(result, limit=1000)


def test_applied_size_counts_gos_html_escapes() -> None:
    assert applied_size({"a": "x"}) == len('{"a":"x"}')
    assert applied_size({"a": "<&>"}) == len('{"a":"\\u003c\\u0026\\u003e"}')


def test_promtool_accepts_the_groups_of_every_prometheus_rule(
    case: tuple[str, RulesResult, OperatorResult], tmp_path: Path,
) -> None:
    promtool = require_binary("promtool", apt=APT_PACKAGE)
    name, _, objects = case
    for obj in objects.of_kind("PrometheusRule"):
        path = tmp_path / f"{obj['metadata']['name']}.yml"
        path.write_text(yaml_emitter.dump({"groups": obj["spec"]["groups"]}))
        done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"


# --- PodMonitors ----------------------------------------------------------------------------


def test_pools_with_a_selector_get_no_pod_monitor(
    case: tuple[str, RulesResult, OperatorResult],
) -> None:
    _, result, objects = case
    monitors = [o["metadata"]["name"] for o in objects.of_kind("PodMonitor")]
    expected = []
    for pool in result.config.pools:
        if not pool.has_selector:
            expected.append(f"vigil-{pool.name}")
        if not pool.dcgm_selector:
            expected.append(f"vigil-{pool.name}-dcgm")
    assert monitors == expected
    header = objects.text().split("\n---\n")[0]
    for pool in result.config.pools:
        if pool.has_selector:
            assert f"# pool {pool.name}: no PodMonitor; its series are already scraped" in header


def test_pod_monitor_adds_the_labels_the_rules_select() -> None:
    config = CONFIGS["mixed"]
    batch = config.pools[1]
    monitor = pod_monitor(config, batch, options=OperatorOptions(pod_namespace="llm"))
    spec = monitor["spec"]
    assert spec["selector"] == {"matchLabels": {"model": "batch"}}
    assert spec["namespaceSelector"] == {"matchNames": ["llm"]}
    (endpoint,) = spec["podMetricsEndpoints"]
    # The pool's one vLLM target's interval; its timeout capped to it.
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"], endpoint["interval"],
            endpoint["scrapeTimeout"]) == ("container-port", "/metrics", "http", "30s", "10s")
    assert endpoint["relabelings"] == [
        {"targetLabel": "pool", "replacement": "batch"},
        {"targetLabel": "kind", "replacement": "vllm"},
        {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "instance"},
    ]
    assert not any(r.get("targetLabel") == "job" or r.get("action") == "labeldrop"
                   for r in endpoint["relabelings"])
    assert endpoint["metricRelabelings"][0]["replacement"] == "vllm:${1}"
    dcgm = pod_monitor(config, batch, "dcgm", OperatorOptions(
        dcgm_pod_selector="app=nvidia-dcgm-exporter,pool={pool}"))
    assert dcgm["metadata"]["name"] == "vigil-batch-dcgm"
    assert dcgm["spec"]["selector"]["matchLabels"] == {"app": "nvidia-dcgm-exporter",
                                                       "pool": "batch"}
    (ep,) = dcgm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "metrics" and "metricRelabelings" not in ep
    assert ep["relabelings"][1] == {"targetLabel": "kind", "replacement": "dcgm"}


def test_without_a_dcgm_pod_selector_a_note_says_why_there_is_no_dcgm_monitor() -> None:
    result = generate(CONFIGS["defaults"])
    objects = generate_operator(result)
    assert [o["kind"] for o in objects.objects] == ["PodMonitor", "PrometheusRule",
                                                    "PrometheusRule"]
    assert objects.notes == ("pool chat: no dcgm-exporter PodMonitor; dcgm-exporter runs per "
                             "node, not per pool: set the pool's dcgm_selector, or pass "
                             "--dcgm-pod-selector.",)


@pytest.mark.parametrize(("options", "match"), [
    (OperatorOptions(namespace="Monitoring"), "--namespace"),
    (OperatorOptions(labels=(("release", "kube prometheus"),)), "--label"),
    (OperatorOptions(pod_selector="model"), "--pod-selector"),
    (OperatorOptions(pod_selector="a=1,a=2"), "given twice"),
    (OperatorOptions(port="container-port-http"), "--port"),
    (OperatorOptions(dcgm_pod_selector="app=x,=y"), "--dcgm-pod-selector"),
])
def test_options_kubernetes_would_refuse_are_config_errors(options: OperatorOptions,
                                                           match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        generate_operator(generate(CONFIGS["defaults"]), options)


def test_names_kubernetes_would_refuse_are_config_errors() -> None:
    config = parse_config({"pools": [{"name": "Chat_Pool", "model": MODEL}]})
    with pytest.raises(ConfigError, match="not a valid Kubernetes name") as err:
        generate_operator(generate(config))
    assert err.value.key == "pools[0].name"
    config = parse_config({"pools": [{"name": "chat", "model": MODEL}]})
    with pytest.raises(ConfigError, match="--pod-selector"):  # the value, once replaced
        generate_operator(generate(config), OperatorOptions(pod_selector="m={pool}/x"))


def test_parse_match_labels() -> None:
    assert parse_match_labels("model={pool}, helm-release-name=vllm") == {
        "model": "{pool}", "helm-release-name": "vllm"}
    assert parse_match_labels("app.kubernetes.io/name={pool}") == {
        "app.kubernetes.io/name": "{pool}"}


def test_output_is_byte_stable() -> None:
    result = generate(CONFIGS["fleet"])
    assert generate_operator(result).text() == generate_operator(generate(
        CONFIGS["fleet"])).text()


# --- a real Prometheus scraping through a PodMonitor ----------------------------------------


def _snake(relabeling: dict[str, Any]) -> dict[str, Any]:
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in relabeling.items()}


def _operator_job(monitor: dict[str, Any], address: str, pod: str) -> dict[str, Any]:
    """The scrape job the operator writes for ``monitor``'s endpoint, with a static target in
    place of Kubernetes discovery: the operator's own relabelings (namespace, container, pod,
    ``job`` = ``<namespace>/<name>``, endpoint), then the PodMonitor's."""
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    namespace = monitor["metadata"].get("namespace", "default")
    name = monitor["metadata"]["name"]
    return {
        "job_name": f"podMonitor/{namespace}/{name}/0",
        "honor_labels": endpoint["honorLabels"],
        "honor_timestamps": endpoint["honorTimestamps"],
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "metrics_path": endpoint["path"],
        "scheme": endpoint["scheme"],
        "static_configs": [{"targets": [address], "labels": {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_pod_name": pod,
            "__meta_kubernetes_pod_container_name": "vllm",
        }}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"],
             "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{namespace}/{name}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *(_snake(r) for r in endpoint["relabelings"]),
        ],
        "metric_relabel_configs": [_snake(r) for r in endpoint.get("metricRelabelings", [])],
    }


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, str]]:
    prometheus, _ = require_prometheus()
    body = (FIXTURES / "vllm_v1_metrics_sample.openmetrics.txt").read_bytes()
    ctype = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    config = parse_config({"pools": [{"name": "chat", "model": MODEL}]})
    result = generate(config)
    objects = generate_operator(result, OperatorOptions(namespace="llm"))
    monitor = objects.of_kind("PodMonitor")[0]
    rules = objects.of_kind("PrometheusRule")
    workdir = tmp_path_factory.mktemp("operator-live")
    (workdir / "rules.yml").write_text(yaml_emitter.dump({"groups": [
        {**g, "interval": "1s"} for rule in rules for g in rule["spec"]["groups"]]}))
    pod = "vllm-chat-deployment-vllm-7c9f-x2x4q"
    with exposition_server({"/metrics": text(body, ctype=ctype)}) as base:
        job = _operator_job(monitor, base.removeprefix("http://"), pod)
        settings = yaml_emitter.dump({"global": {"evaluation_interval": "1s"},
                                    "rule_files": ["rules.yml"], "scrape_configs": [job]})
        server = start_prometheus(prometheus, workdir, settings, workdir / "data")
        try:
            server.wait_ready()
            yield server, pod
        finally:
            server.stop()


def _wait(what: str, check: Any, server: PrometheusServer, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:.0f}s:\n{server.log_tail()}")
        time.sleep(0.25)
    return got


@pytest.mark.slow
def test_a_pod_monitor_gives_the_series_the_labels_the_rules_select(
    scraped: tuple[PrometheusServer, str],
) -> None:
    server, pod = scraped
    up = _wait("the pod scraped", lambda: server._get(
        "/api/v1/series", {"match[]": "up"})["data"], server)
    assert up == [{"__name__": "up", "pool": "chat", "kind": "vllm", "instance": pod,
                   "pod": pod, "namespace": "llm", "container": "vllm",
                   "endpoint": "container-port", "job": "llm/vigil-chat"}]
    kv = server._get("/api/v1/series", {"match[]": "vllm:kv_cache_usage_perc"})["data"]
    assert kv and all(s["pool"] == "chat" and s["instance"] == pod for s in kv)
    # The PrometheusRule's own groups select them: the pool's KV-cache usage is recorded.
    got = _wait("vigil:kv_cache_usage:avg recorded", lambda: server.query(
        'vigil:kv_cache_usage:avg{pool="chat"}', time.time()), server)
    assert list(got.values()) == [0.1874]


# --- the command line -----------------------------------------------------------------------


def _run(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="vigil rules")
    rules_cli.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    code = rules_cli.run(parser.parse_args(list(argv)), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_writes_vigil_operator_yml(tmp_path: Path) -> None:
    config = GOLDEN / "defaults" / "vigil.toml"
    code, out, err = _run("prometheus", "-c", str(config), "--format", "operator",
                          "--out", str(tmp_path), "--namespace", "llm",
                          "--label", "release=kube-prometheus-stack", "--label", "team=ml",
                          "--pod-selector", "app.kubernetes.io/name={pool}", "--port", "http")
    assert code == 0
    assert out == f"wrote {tmp_path / 'vigil-operator.yml'}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vigil-operator.yml"]
    assert "no dcgm-exporter PodMonitor" in err
    docs = list(yaml.safe_load_all((tmp_path / "vigil-operator.yml").read_text()))
    for obj in docs:
        _check(obj)
        assert obj["metadata"]["namespace"] == "llm"
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "vigil",
                                             "release": "kube-prometheus-stack", "team": "ml"}
    spec = docs[0]["spec"]
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/name": "chat"}
    assert spec["podMetricsEndpoints"][0]["port"] == "http"


def test_cli_prints_without_out_and_refuses_operator_options_for_files() -> None:
    config = str(GOLDEN / "defaults" / "vigil.toml")
    code, out, _ = _run("prometheus", "-c", config, "--format", "operator")
    assert code == 0 and out.startswith("# Generated by `vigil rules prometheus --format operator`")
    assert [d["kind"] for d in yaml.safe_load_all(out)] == ["PodMonitor", "PrometheusRule",
                                                             "PrometheusRule"]
    with pytest.raises(ConfigError, match="--namespace, --port: only with --format operator"):
        _run("prometheus", "-c", config, "--namespace", "llm", "--port", "http")
    with pytest.raises(ConfigError, match="--label"):
        _run("prometheus", "-c", config, "--format", "operator", "--label", "release")
