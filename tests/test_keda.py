"""``vigil rules keda``: one KEDA ScaledObject per pool, valid against KEDA's own CRD.

The CRD (``tests/fixtures/keda_scaledobjects_crd.yaml``, KEDA 2.20.x, verbatim) is what the
Kubernetes API server validates a ScaledObject with. Checked here: its ``openAPIV3Schema`` with
jsonschema; the fields it does not close (Kubernetes prunes or, with strict field validation,
refuses unknown fields; JSON schema lets them through) by walking the object against the
schema's properties; its CEL rule ``minReplicaCount <= maxReplicaCount`` (which JSON schema
cannot express) by hand; and the behaviour of Vigil's scaling policy (fast scale-out, scale-in
one replica at a time, only after ``scale_in_hold``).
"""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from support.crd import unknown_fields

from alerts.rules.keda import (
    DEFAULT_PROMETHEUS_URL,
    KedaOptions,
    generate_keda,
    scaled_object,
)
from alerts.rules.promql import kv_usage_expr, queue_length_expr
from vigil.config import Config, parse_config
from vigil.errors import ConfigError
from vigil_shell import rules_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GOLDEN = Path(__file__).resolve().parent / "golden" / "rules"
CRD = yaml.safe_load((FIXTURES / "keda_scaledobjects_crd.yaml").read_text())
VERSION = next(v for v in CRD["spec"]["versions"] if v["name"] == "v1alpha1")
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
#: The CEL rules of spec, as the CRD states them (the test below implements each).
CEL_RULES = [r["rule"] for r in SCHEMA["properties"]["spec"].get("x-kubernetes-validations", [])]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _config(**extra: Any) -> Config:
    return parse_config({
        "pools": [
            {"name": "chat", "model": MODEL, "min_replicas": 2, "max_replicas": 10},
            {"name": "batch", "model": "Qwen/Qwen2.5-7B-Instruct", "min_replicas": 0,
             "max_replicas": 3},
            {"name": "solo", "model": MODEL, "min_replicas": 1, "max_replicas": 1},
        ],
        **extra,
    })


def _cel_min_le_max(spec: dict[str, Any]) -> bool:
    """``!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount) ?
    self.maxReplicaCount : 100)``."""
    if "minReplicaCount" not in spec:
        return True
    return spec["minReplicaCount"] <= spec.get("maxReplicaCount", 100)


def _check(obj: dict[str, Any]) -> None:
    jsonschema.validate(obj, SCHEMA)
    assert unknown_fields(obj, SCHEMA) == []
    assert _cel_min_le_max(obj["spec"])
    assert obj["apiVersion"] == f"{CRD['spec']['group']}/{VERSION['name']}"
    assert obj["kind"] == CRD["spec"]["names"]["kind"]


def test_the_crd_has_the_one_cel_rule_we_implement() -> None:
    assert CEL_RULES == [
        "!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount) ? "
        "self.maxReplicaCount : 100)"
    ]
    assert _cel_min_le_max({"minReplicaCount": 3, "maxReplicaCount": 2}) is False
    assert _cel_min_le_max({"minReplicaCount": 101}) is False
    assert _cel_min_le_max({"maxReplicaCount": 2}) is True


def test_every_scaled_object_validates_against_the_crd() -> None:
    result = generate_keda(_config())
    assert [o["metadata"]["name"] for o in result.objects] == [
        "vigil-chat", "vigil-batch", "vigil-solo"]
    for obj in result.objects:
        _check(obj)
    for case in ("defaults", "fleet", "kubernetes"):  # the golden files, as kubectl reads them
        for obj in yaml.safe_load_all((GOLDEN / case / "vigil-keda.yml").read_text()):
            _check(obj)


def test_the_schema_check_is_not_vacuous() -> None:
    obj, _ = scaled_object(_config(), _config().pools[0])
    broken = {**obj, "spec": {**obj["spec"], "minReplicaCount": -1}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)
    typo = {**obj, "spec": {**obj["spec"], "cooldownPeriode": 3}}
    assert unknown_fields(typo, SCHEMA) == [".spec.cooldownPeriode"]
    swapped = {**obj["spec"], "minReplicaCount": 9, "maxReplicaCount": 2}
    assert not _cel_min_le_max(swapped)


def test_replica_bounds_come_from_the_pool() -> None:
    config = _config()
    for obj, pool in zip(generate_keda(config).objects, config.pools, strict=True):
        spec = obj["spec"]
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
            pool.min_replicas, pool.max_replicas)
        assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": pool.name}


def test_scale_up_is_fast_and_scale_down_waits_at_least_600s() -> None:
    for hold, expected in (("5m", 600), ("10m", 600), ("15m", 900), ("2h", 3600)):
        config = _config(scaling={"scale_in_hold": hold})
        result = generate_keda(config)
        for obj in result.objects:
            behavior = obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
            up, down = behavior["scaleUp"], behavior["scaleDown"]
            assert up["stabilizationWindowSeconds"] == 0
            assert up["selectPolicy"] == "Max"
            assert {"type": "Percent", "value": 100, "periodSeconds": 15} in up["policies"]
            assert {"type": "Pods", "value": 4, "periodSeconds": 15} in up["policies"]
            assert down["stabilizationWindowSeconds"] >= (
                config.rules.keda.min_scale_down_stabilization)
            assert down["stabilizationWindowSeconds"] == expected
            # One replica at a time, every scale_in_hold (capped at Kubernetes' 30 min).
            assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds":
                                         min(1800, int(config.scaling.scale_in_hold))}]
            # cooldownPeriod only matters for scaling to zero: not relied on for the cooldown.
            assert obj["spec"]["cooldownPeriod"] == down["stabilizationWindowSeconds"]
        capped = [w for w in result.warnings if "capped" in w]
        assert bool(capped) == (hold == "2h")


@pytest.mark.parametrize("minimum, hold, expected", [
    ("0s", "5m", 300), ("20m", "5m", 1200), ("20m", "30m", 1800), ("1h", "5m", 3600)])
def test_the_minimum_scale_down_window_is_configuration(minimum: str, hold: str,
                                                        expected: int) -> None:
    config = _config(scaling={"scale_in_hold": hold, "cooldown": "1m"},
                     rules={"keda": {"min_scale_down_stabilization": minimum}})
    obj, warnings = scaled_object(config, config.pools[0])
    down = obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] == expected
    assert warnings == []
    _check(obj)


@pytest.mark.parametrize("quantile, name", [
    (0.95, "ttft-p95"), (0.9, "ttft-p90"), (0.999, "ttft-p99-9")])
def test_the_ttft_trigger_uses_the_configured_quantile(quantile: float, name: str) -> None:
    config = _config(scaling={"scale_out_ttft_quantile": quantile})
    obj, _ = scaled_object(config, config.pools[0])
    (ttft,) = [t for t in obj["spec"]["triggers"] if t["name"].startswith("ttft-")]
    assert ttft["name"] == name
    assert ttft["metadata"]["query"].startswith(f"(histogram_quantile({quantile:g}, ")
    _check(obj)


def test_triggers_are_single_element_queries_with_the_scaling_thresholds() -> None:
    config = _config(scaling={"scale_out_queue_length": 20, "scale_out_kv_usage": 0.7},
                     slos=[{"name": "chat-ttft", "pool": "chat", "indicator": "ttft",
                            "threshold_seconds": 0.5}])
    obj, warnings = scaled_object(config, config.pools[0])
    assert warnings == []
    triggers = {t["name"]: t for t in obj["spec"]["triggers"]}
    assert list(triggers) == ["queue-length", "kv-cache-usage", "ttft-p95"]
    for t in triggers.values():
        assert t["type"] == "prometheus" and t["metricType"] == "Value"
        assert t["metadata"]["serverAddress"] == DEFAULT_PROMETHEUS_URL
        query = t["metadata"]["query"]
        assert query.endswith(" or vector(0)")  # one element even when there is no data
        assert not re.match(r"\(\w+ by ", query)  # no outer grouping: one element
    assert triggers["queue-length"]["metadata"]["threshold"] == "20"
    assert triggers["kv-cache-usage"]["metadata"]["threshold"] == "0.7"
    # The strictest TTFT SLO of the pool (0.5 s) × scale_out_ttft_ratio (0.8).
    assert triggers["ttft-p95"]["metadata"]["threshold"] == "0.4"
    # The same expressions as the recording rules, without the per-pool grouping.
    assert queue_length_expr("chat", by=()) in triggers["queue-length"]["metadata"]["query"]
    assert kv_usage_expr("chat", by=()) in triggers["kv-cache-usage"]["metadata"]["query"]
    assert 'sum by (le) (increase(vllm:time_to_first_token_seconds_bucket{pool="chat", ' \
        'kind="vllm"}[5m]))' in triggers["ttft-p95"]["metadata"]["query"]


def test_a_selector_pool_is_queried_by_its_selector_and_replica_label() -> None:
    config = parse_config({"pools": [{
        "name": "chat", "model": MODEL, "selector": 'namespace="llm", service=~"chat-.*"',
        "replica_label": "pod"}]})
    obj, _ = scaled_object(config, config.pools[0])
    triggers = {t["name"]: t["metadata"]["query"] for t in obj["spec"]["triggers"]}
    chosen = '{namespace="llm", service=~"chat-.*"}'
    assert triggers["queue-length"] == \
        f"(sum(vllm:num_requests_waiting{chosen})) or vector(0)"
    assert triggers["kv-cache-usage"] == \
        f"(avg(avg by (pod) (vllm:kv_cache_usage_perc{chosen}))) or vector(0)"
    assert f"sum by (le) (increase(vllm:time_to_first_token_seconds_bucket{chosen}[5m]))" \
        in triggers["ttft-p95"]
    for query in triggers.values():
        assert "pool=" not in query and "kind=" not in query
    _check(obj)
    # Vigil's own series keep their pool label: the "vigil" signal is unchanged.
    vigil, _ = scaled_object(config, config.pools[0], KedaOptions(signal="vigil"))
    assert vigil["spec"]["triggers"][0]["metadata"]["query"] == \
        'max(vigil_scaling_desired_replicas{pool="chat"})'


def test_a_zero_threshold_drops_its_trigger_with_a_warning() -> None:
    config = _config(scaling={"scale_out_queue_length": 0})
    obj, warnings = scaled_object(config, config.pools[0])
    assert [t["name"] for t in obj["spec"]["triggers"]] == ["kv-cache-usage", "ttft-p95"]
    assert len(warnings) == 1 and "scale_out_queue_length" in warnings[0]
    _check(obj)
    none_left = _config(scaling={"scale_out_queue_length": 0, "scale_out_kv_usage": 0,
                                 "scale_out_ttft_ratio": 0})
    with pytest.raises(ConfigError, match="at least one trigger"):
        generate_keda(none_left)


def test_options_and_the_engine_url_reach_the_objects() -> None:
    config = _config(engine={"prometheus_url": "http://prom.example:9090"})
    obj, _ = scaled_object(config, config.pools[0])
    assert {t["metadata"]["serverAddress"] for t in obj["spec"]["triggers"]} == {
        "http://prom.example:9090"}
    obj, _ = scaled_object(config, config.pools[0], KedaOptions(
        prometheus_url="http://other:9090", namespace="inference", scale_target="vllm-{pool}"))
    assert obj["metadata"]["namespace"] == "inference"
    assert obj["spec"]["scaleTargetRef"]["name"] == "vllm-chat"
    assert {t["metadata"]["serverAddress"] for t in obj["spec"]["triggers"]} == {
        "http://other:9090"}
    _check(obj)


@pytest.mark.parametrize("options, pool_name, message", [
    (KedaOptions(), "Chat_Pool", "ScaledObject name"),
    (KedaOptions(namespace="Bad Namespace"), "chat", "--namespace"),
    (KedaOptions(scale_target="{pool}_deploy"), "chat", "--scale-target"),
])
def test_names_kubernetes_refuses_are_config_errors(options: KedaOptions, pool_name: str,
                                                    message: str) -> None:
    config = parse_config({"pools": [{"name": pool_name, "model": MODEL}]})
    with pytest.raises(ConfigError, match=message):
        generate_keda(config, options)


def test_cli_prints_or_writes_the_objects(tmp_path: Path) -> None:
    config_file = tmp_path / "vigil.toml"
    config_file.write_text(f'[[pools]]\nname = "chat"\nmodel = "{MODEL}"\n')
    parser = argparse.ArgumentParser(prog="vigil rules")
    rules_cli.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    args = parser.parse_args(["keda", "--config", str(config_file), "--namespace", "ml",
                              "--prometheus-url", "http://prom:9090/"])
    assert rules_cli.run(args, out=out, err=err) == 0
    (obj,) = list(yaml.safe_load_all(out.getvalue()))
    _check(obj)
    assert obj["metadata"]["namespace"] == "ml"
    assert obj["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://prom:9090"
    args = parser.parse_args(["keda", "-c", str(config_file), "--out", str(tmp_path / "k")])
    out = io.StringIO()
    assert rules_cli.run(args, out=out, err=err) == 0
    assert (tmp_path / "k" / "vigil-keda.yml").is_file()
    assert out.getvalue() == f"wrote {tmp_path / 'k' / 'vigil-keda.yml'}\n"
    assert err.getvalue() == ""


def test_signal_vigil_follows_vigils_recommendation() -> None:
    config = _config(scaling={"scale_out_queue_length": 0})  # irrelevant to this signal
    result = generate_keda(config, KedaOptions(signal="vigil"))
    assert result.warnings == ()
    for obj, pool in zip(result.objects, config.pools, strict=True):
        _check(obj)
        (trigger,) = obj["spec"]["triggers"]
        assert trigger == {
            "type": "prometheus",
            "name": "vigil-desired-replicas",
            # AverageValue, target 1: the HPA asks for ceil(desired / 1) = desired replicas.
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": DEFAULT_PROMETHEUS_URL,
                "query": f'max(vigil_scaling_desired_replicas{{pool="{pool.name}"}})',
                "threshold": "1",
                # No data (vigil serve not scraped) must not read as 0 and scale the pool in.
                "ignoreNullValues": "false",
            },
        }
        behavior = obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 600
    with pytest.raises(ValueError, match="signal"):
        KedaOptions(signal="both")


def test_cli_signal_flag(tmp_path: Path) -> None:
    config_file = tmp_path / "vigil.toml"
    config_file.write_text(f'[[pools]]\nname = "chat"\nmodel = "{MODEL}"\n')
    parser = argparse.ArgumentParser(prog="vigil rules")
    rules_cli.add_arguments(parser)
    out = io.StringIO()
    args = parser.parse_args(["keda", "-c", str(config_file), "--signal", "vigil"])
    assert rules_cli.run(args, out=out, err=io.StringIO()) == 0
    (obj,) = list(yaml.safe_load_all(out.getvalue()))
    assert [t["name"] for t in obj["spec"]["triggers"]] == ["vigil-desired-replicas"]
    with pytest.raises(SystemExit):
        parser.parse_args(["keda", "-c", str(config_file), "--signal", "gpu"])


def test_the_triggers_read_prometheus_as_engine_http_says() -> None:
    """A credential becomes one TriggerAuthentication the ScaledObjects share, reading the
    Secret's keys named as KEDA's parameters; headers and skipped certificate checks become
    trigger metadata; what KEDA cannot take is said."""
    config = _config(engine={"http": {
        "bearer_token_file": "/var/run/secrets/tokens/prometheus",
        "headers": {"X-Scope-OrgID": "team-a"},
        "tls": {"cert_file": "c.pem", "key_file": "k.pem", "ca_file": "ca.pem",
                "server_name": "prom.internal"}}})
    result = generate_keda(config, KedaOptions(namespace="llm", auth_secret="prom-creds"))
    auth, *scaled = result.objects
    assert auth == {
        "apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication",
        "metadata": {"name": "vigil-prometheus", "namespace": "llm",
                     "labels": {"app.kubernetes.io/managed-by": "vigil"}},
        "spec": {"secretTargetRef": [
            {"parameter": p, "name": "prom-creds", "key": p}
            for p in ("bearerToken", "cert", "key", "ca")]},
    }
    for obj in scaled:
        _check(obj)
        for trigger in obj["spec"]["triggers"]:
            assert trigger["authenticationRef"] == {"name": "vigil-prometheus"}
            meta = trigger["metadata"]
            assert meta["authModes"] == "bearer,tls"
            assert meta["customHeaders"] == "X-Scope-OrgID=team-a"
            assert "unsafeSsl" not in meta
    assert result.warnings == ("[engine.http.tls] server_name: KEDA cannot be told; its "
                               "serverAddress must carry the name the certificate does",)
    # Nothing to authenticate with: no TriggerAuthentication, no reference.
    plain = generate_keda(_config(engine={"http": {"tls": {"insecure_skip_verify": True}}}))
    assert [o["kind"] for o in plain.objects] == ["ScaledObject"] * 3
    for obj in plain.objects:
        for trigger in obj["spec"]["triggers"]:
            assert "authenticationRef" not in trigger
            assert trigger["metadata"]["unsafeSsl"] == "true"
    oauth = generate_keda(_config(engine={"http": {"oauth2": {
        "client_id": "vigil", "client_secret_env": "S", "token_url": "https://sso/token"}}}))
    assert "oauth2: the ScaledObjects carry no OAuth2 settings" in oauth.warnings[0]
