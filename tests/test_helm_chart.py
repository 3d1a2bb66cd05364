"""The Helm chart ``deploy/helm/vigil``, rendered by Helm's own engine (helm-python-sdk: Helm
v4's Go SDK, no binary), as far as the API server: no cluster runs here.

For the chart's defaults and every values file of ``ci/`` (with the objects ``vigil rules
helm`` generates for it), with and without the optional CRDs: ``helm lint``; every object
valid for Kubernetes 1.29 and the newest version kubernetes-validate knows (strict: no unknown
field), the Prometheus Operator's and KEDA's objects against their CRDs' schemas; the
rendered vigil.toml loads with Vigil's own checks and is the config ``vigil rules helm`` read.
Then what the chart refuses at render time, naming the key: a wrong key, type or enum (the
values schema, generated from Vigil's models), a secret bound for the ConfigMap, several
copies of vigil serve on one SQLite volume, and a stale generated-objects overlay. The
generated objects equal what ``vigil rules prometheus|grafana|keda`` write for the same
config, but for the namespace and labels the chart adds.

helm-python-sdk cannot set ``.Capabilities.APIVersions`` (its render takes Helm's defaults,
the built-in APIs only), so "the cluster has the CRD" is rendered through the chart's
``apiVersions`` value, which the same helper (``vigil.hasAPI``) reads beside the capabilities.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import tomllib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from support.crd import python_patterns, unknown_fields

from alerts.rules.helm_values import (
    GENERATOR_INPUTS,
    config_from_values,
    config_json_schema,
    generate_overlay,
    load_values,
    load_values_file,
    merge_values,
)
from vigil.config import load_config
from vigil.errors import ConfigError
from vigil_shell.cli import main

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "vigil"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
CI_FILES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
CASES = ["defaults", *CI_FILES]
RELEASE, NAMESPACE = "vigil", "llm"
CRD_APIS = ["monitoring.coreos.com/v1/PrometheusRule", "monitoring.coreos.com/v1/PodMonitor",
            "keda.sh/v1alpha1/ScaledObject"]
CRD_KINDS = {"PrometheusRule", "PodMonitor", "ScaledObject"}
#: The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion) and the newest known.
KUBE_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
WORKLOADS = {"Deployment", "StatefulSet"}

#: The chart's own objects of each case, by kind, without and with the CRDs; the generated
#: ones (as many as `vigil rules helm` made) are added by ``_expected``.
EXPECTED = {
    "defaults": {
        False: {"ConfigMap": 1, "Service": 2, "ServiceAccount": 1, "StatefulSet": 1},
        True: {"ConfigMap": 1, "Service": 2, "ServiceAccount": 1, "StatefulSet": 1},
    },
    "embedded-values.yaml": {
        False: {"ConfigMap": 1, "Service": 2, "ServiceAccount": 1, "StatefulSet": 1},
        True: {"ConfigMap": 1, "Service": 2, "ServiceAccount": 1, "StatefulSet": 1},
    },
    "prometheus-ha-values.yaml": {
        False: {"ConfigMap": 1, "Deployment": 1, "Service": 1, "ServiceAccount": 1},
        True: {"ConfigMap": 1, "Deployment": 1, "Service": 1, "ServiceAccount": 1},
    },
    "gateway-keda-values.yaml": {
        False: {"ConfigMap": 1, "Deployment": 1, "PodDisruptionBudget": 1, "Service": 3,
                "ServiceAccount": 1, "StatefulSet": 1},
        True: {"ConfigMap": 1, "Deployment": 1, "PodDisruptionBudget": 1, "ScaledObject": 1,
               "Service": 3, "ServiceAccount": 1, "StatefulSet": 1},
    },
    "everything-values.yaml": {
        False: {"ConfigMap": 1, "Deployment": 3, "HorizontalPodAutoscaler": 1,
                "PodDisruptionBudget": 1, "Service": 3, "ServiceAccount": 1},
        True: {"ConfigMap": 1, "Deployment": 3, "HorizontalPodAutoscaler": 1,
               "PodDisruptionBudget": 1, "Service": 3, "ServiceAccount": 1},
    },
}


# --- rendering -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


@functools.cache
def _defaults() -> dict[str, Any]:
    return load_values_file(CHART / "values.yaml")


@functools.cache
def _user_values(case: str) -> dict[str, Any]:
    """A case's values file as Helm reads it ({} for the chart's defaults)."""
    return {} if case == "defaults" else load_values_file(CHART / "ci" / case)


def _wants_overlay(values: Mapping[str, Any]) -> bool:
    return any((values.get(s) or {}).get("enabled") for s in GENERATOR_INPUTS)


@functools.cache
def _overlay(case: str) -> dict[str, Any]:
    """What `vigil rules helm` writes for a case, read back as Helm reads it ({} if none)."""
    merged = merge_values(_defaults(), [_user_values(case)])
    if not _wants_overlay(merged):
        return {}
    text = generate_overlay(merged, file=case).text(command="vigil rules helm")
    return load_values(text)


def _layers(case: str) -> list[dict[str, Any]]:
    return [_user_values(case), _overlay(case)]


def _user(layers: Sequence[Mapping[str, Any]], apis: bool = False) -> dict[str, Any]:
    """The layers merged as `helm -f a -f b` merges them (before the chart's defaults)."""
    user: dict[str, Any] = {}
    for layer in [*layers, {"apiVersions": CRD_APIS} if apis else {}]:
        user = _deep_merge(user, layer)
    return user


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    return merge_values({}, [base, over])


def _render_raw(chart: helm_python.Chart, values: Mapping[str, Any]) -> dict[str, str]:
    return chart.render(copy.deepcopy(dict(values)), name=RELEASE, namespace=NAMESPACE)


def _docs(manifests: Mapping[str, str]) -> list[dict[str, Any]]:
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def render(chart: helm_python.Chart, layers: Sequence[Mapping[str, Any]],
           apis: bool = False) -> list[dict[str, Any]]:
    return _docs(_render_raw(chart, _user(layers, apis)))


def refusal(chart: helm_python.Chart, layers: Sequence[Mapping[str, Any]]) -> str:
    """The message Helm fails with (schema or template), or the test fails."""
    with pytest.raises((helm_python.HelmValuesError, helm_python.HelmRenderError)) as info:
        _render_raw(chart, _user(layers))
    return str(info.value)


def _vigil_toml(docs: Sequence[Mapping[str, Any]]) -> str:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "vigil.toml" in d.get("data", {})]
    text: str = cm["data"]["vigil.toml"]
    return text


# --- lint, Kubernetes' schemas, the CRDs' schemas ------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_helm_lint(case: str) -> None:
    values = _user(_layers(case))
    for kube in ("v1.29.0", None):
        report = helm_python.lint(CHART, copy.deepcopy(values), strict=True, kube_version=kube)
        # Severity 1 is "info" (Helm recommends an icon); warnings and errors fail.
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report
        assert report["errors"] == []


def _crd_schema(name: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((FIXTURES / name).read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema: dict[str, Any] = python_patterns(served["schema"]["openAPIV3Schema"])
    return schema


CRD_SCHEMAS = {
    "PrometheusRule": _crd_schema(
        "prometheus_operator_monitoring.coreos.com_prometheusrules.yaml", "v1"),
    "PodMonitor": _crd_schema("prometheus_operator_monitoring.coreos.com_podmonitors.yaml", "v1"),
    "ScaledObject": _crd_schema("keda_scaledobjects_crd.yaml", "v1alpha1"),
}


def _check_object(obj: dict[str, Any]) -> None:
    where = f"{obj['kind']} {obj['metadata']['name']}"
    if obj["kind"] in CRD_KINDS:
        schema = CRD_SCHEMAS[obj["kind"]]
        jsonschema.validate(obj, schema)
        assert unknown_fields(obj, schema) == [], where
        return
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def _expected(case: str, apis: bool) -> dict[str, int]:
    """EXPECTED, plus every generated object of the case's overlay that renders: the Grafana
    ConfigMaps always, the CRDs' objects only with them."""
    counts = Counter(EXPECTED[case][apis])
    generated = _overlay(case).get("generated", {})
    for section, kind in (("grafanaDashboards", "ConfigMap"), ("podMonitors", "PodMonitor"),
                          ("prometheusRules", "PrometheusRule"),
                          ("poolScaledObjects", "ScaledObject")):
        if kind == "ConfigMap" or apis:
            counts[kind] += len(generated.get(section, []))
    return dict(+counts)


@pytest.mark.parametrize("apis", [False, True], ids=["no-crds", "crds"])
@pytest.mark.parametrize("case", CASES)
def test_objects_are_valid(chart: helm_python.Chart, case: str, apis: bool) -> None:
    docs = render(chart, _layers(case), apis)
    assert dict(Counter(d["kind"] for d in docs)) == _expected(case, apis)
    if case == "everything-values.yaml" and apis:
        assert {d["kind"] for d in docs} >= CRD_KINDS
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(set(names)) == len(names), names
    for doc in docs:
        _check_object(doc)


def test_the_validators_refuse_what_the_api_server_refuses() -> None:
    """The checks above can fail: an unknown field, in a built-in kind and in a CRD's."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
               "spec": {"ports": [{"port": 80, "targetPrt": 80}]}}
    for version in KUBE_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(service, version, strict=True)
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "x"}, "spec": {"groups": [{"name": "g", "rules": [],
                                                            "intervall": "30s"}]}}
    assert unknown_fields(rule, CRD_SCHEMAS["PrometheusRule"]) == [".spec.groups[0].intervall"]


def test_crd_objects_render_only_where_the_cluster_has_them(chart: helm_python.Chart) -> None:
    case = "everything-values.yaml"
    manifests = _render_raw(chart, _user(_layers(case)))
    assert not CRD_KINDS & {d["kind"] for d in _docs(manifests)}
    notes = manifests["vigil/templates/NOTES.txt"]
    for api in ("monitoring.coreos.com/v1/PrometheusRule", "keda.sh/v1alpha1/ScaledObject"):
        assert f"the cluster has no {api}: none created" in notes
    with_apis = _render_raw(chart, _user(_layers(case), apis=True))
    assert "none created" not in with_apis["vigil/templates/NOTES.txt"]


# --- vigil.toml ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_rendered_vigil_toml_loads_as_the_values_config(chart: helm_python.Chart, case: str,
                                                       tmp_path: Path) -> None:
    path = tmp_path / "vigil.toml"
    path.write_text(_vigil_toml(render(chart, _layers(case))))
    loaded = load_config(path)
    merged = merge_values(_defaults(), [_user_values(case)])
    from_values = config_from_values(merged, file=case)
    assert loaded.model_dump(exclude={"source"}) == from_values.model_dump(exclude={"source"})


def test_toml_writer_keeps_types_and_odd_strings(chart: helm_python.Chart,
                                                 tmp_path: Path) -> None:
    """Whole numbers become integers (Helm holds 33554432 as a float64), other numbers keep
    their value, strings keep every character, keys that are not bare are quoted."""
    odd = 'quote " backslash \\ tab \t newline \n <&> é 😀 \x7f'
    values = {"config": {
        "collector": {"max_body_bytes": 33554432, "scrape_interval": 20},
        "capacity": {"hours_per_month": 730.5, "precision": 0.05},
        "pools": [{"name": "chat", "model": odd, "vllm": {"extra_args": ["--a", "b c"]}}],
        "targets": [{"name": "t", "url": "http://chat.llm.svc:8000/metrics", "pool": "chat",
                     "labels": {"zone": "eu-1 / rack 7"}}],
        "prices": {"H100": 4, "B200 SXM": 9.75},
    }}
    path = tmp_path / "vigil.toml"
    path.write_text(_vigil_toml(render(chart, [values])))
    raw = tomllib.loads(path.read_text())
    assert raw["collector"]["max_body_bytes"] == 33554432
    assert raw["prices"]["B200 SXM"] == 9.75
    assert raw["targets"][0]["labels"] == {"zone": "eu-1 / rack 7"}
    config = load_config(path)
    assert config.pools[0].model == odd
    assert config.pools[0].vllm.extra_args == ["--a", "b c"]
    assert config.capacity.hours_per_month == 730.5
    assert config.collector.scrape_interval == 20.0


def test_pods_roll_when_the_config_changes(chart: helm_python.Chart) -> None:
    def checksums(values: Mapping[str, Any]) -> set[str]:
        return {d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
                for d in render(chart, [values]) if d["kind"] in WORKLOADS}

    before = checksums({})
    after = checksums({"config": {"collector": {"scrape_interval": "30s"}}})
    assert len(before) == len(after) == 1
    assert before != after


# --- the values schema ---------------------------------------------------------------------------


def _schema_script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "values_schema", REPO / "deploy" / "helm" / "values_schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_schema_is_the_generated_one() -> None:
    """values.schema.json is generated (python deploy/helm/values_schema.py): it cannot drift
    from Vigil's models."""
    committed = (CHART / "values.schema.json").read_text()
    assert committed == _schema_script().schema_text(), (
        "deploy/helm/vigil/values.schema.json is stale: run python deploy/helm/values_schema.py")


def _example_config() -> dict[str, Any]:
    """vigil.example.toml's tables: the keys it sets, each at its default."""
    data: dict[str, Any] = tomllib.loads((REPO / "vigil.example.toml").read_text())
    return data


def test_schema_accepts_what_vigil_accepts() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for case in CASES:
        merged = merge_values(_defaults(), _layers(case))
        assert list(validator.iter_errors(merged)) == [], case
    example = _example_config()
    assert list(validator.iter_errors({"config": example})) == []
    durations = {"config": {"collector": {"scrape_interval": 15, "scrape_timeout": "1m30s"},
                            "serve": {"lease_duration": "20s"}}}
    assert list(validator.iter_errors(durations)) == []


def test_config_schema_refuses_unknown_keys_at_every_level() -> None:
    schema = config_json_schema()
    assert schema["additionalProperties"] is False
    assert "source" not in schema["properties"]
    for name, model in schema["$defs"].items():
        assert model.get("additionalProperties") is False, name


@pytest.mark.parametrize(("values", "where", "what"), [
    ({"config": {"pools": [{"name": "chat", "model": "m", "gpus": 2}]}},
     "/config/pools/0", "'gpus'"),
    ({"config": {"collector": {"max_body_bytes": "big"}}},
     "/config/collector/max_body_bytes", "integer"),
    ({"config": {"pools": [{"name": "chat", "model": "m", "max_replicas": 2.5}]}},
     "/config/pools/0/max_replicas", "integer"),
    ({"config": {"gateway": {"routing": "random"}}}, "/config/gateway/routing", "prefix_aware"),
    ({"config": {"collector": {"scrape_interval": "fast"}}},
     "/config/collector/scrape_interval", "fast"),
    ({"config": {"scaling": {"scale_out_kv_usage": 1.5}}},
     "/config/scaling/scale_out_kv_usage", "1.5"),
    ({"config": {"colector": {}}}, "/config", "'colector'"),
    ({"serve": {"replicass": 2}}, "/serve", "'replicass'"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy", "IfNotPresent"),
    ({"poolScaledObjects": {"signal": "gpu"}}, "/poolScaledObjects/signal", "vllm"),
], ids=["unknown-pool-key", "type", "float-for-int", "enum", "duration", "bound",
        "unknown-section", "chart-key", "chart-enum", "option-enum"])
def test_a_wrong_value_fails_at_render_naming_the_key(chart: helm_python.Chart,
                                                     values: dict[str, Any], where: str,
                                                     what: str) -> None:
    message = refusal(chart, [values])
    assert f"at '{where}'" in message, message
    assert what in message, message


# --- what the chart refuses ----------------------------------------------------------------------

PROMETHEUS = {"engine": {"prometheus_url": "http://prometheus.monitoring.svc:9090"}}


@pytest.mark.parametrize(("values", "expected"), [
    ({"config": {"serve": {"database": "postgresql://vigil:hunter2@db.llm.svc/vigil"}}},
     ["config.serve.database", "postgresql.passwordSecret"]),
    ({"config": {"gateway": {"database": "postgresql://vigil@db/vigil?password=hunter2"}}},
     ["config.gateway.database", "PGPASSWORD"]),
    ({"config": {"engine": {"prometheus_url": "http://admin:pw@prometheus:9090"}}},
     ["config.engine.prometheus_url", "credentials"]),
    ({"config": {"engine": {"prometheus_url": "http://admin@prometheus:9090"}}},
     ["config.engine.prometheus_url", "proxy"]),
    ({"config": {"alerts": {"routes": [{
        "name": "slack", "format": "slack",
        "url": "https://hooks.slack.com/services/T000/B000/0a1b2c3d4e5f"}]}}},
     ["config.alerts.routes[0].url", "Slack", "alertmanager_api", "api_url_file"]),
    ({"config": {"alerts": {"routes": [{
        "name": "bot", "url": "https://bot.example.com/hook?token=abc123"}]}}},
     ["config.alerts.routes[0].url", "credential"]),
    ({"config": {"gateway": {"otel": {"enabled": True, "endpoint": "http://otel:4318",
                                      "headers": {"Authorization": "Bearer abc"}}}}},
     ["config.gateway.otel.headers.Authorization", "OTEL_EXPORTER_OTLP_HEADERS",
      "gateway.secretEnv"]),
    ({"config": {"pools": [{"name": "chat", "model": "m"}],
                 "targets": [{"name": "t", "url": "http://x:8000/metrics", "pool": "chat",
                              "labels": {"api_key": "abc"}}]}},
     ["config.targets[0].labels.api_key", "Secret"]),
], ids=["serve-db-password", "gateway-db-password-param", "prometheus-password",
        "prometheus-user", "slack", "token-param", "otel-header", "label"])
def test_a_secret_bound_for_the_configmap_is_refused(chart: helm_python.Chart,
                                                     values: dict[str, Any],
                                                     expected: list[str]) -> None:
    message = refusal(chart, [values])
    for text in expected:
        assert text in message, message


@pytest.mark.parametrize(("values", "expected"), [
    ({"serve": {"replicas": 2, "persistence": {"existingClaim": "vigil-store"}},
      "config": {"serve": {"database": "postgresql://vigil@db/vigil"}}},
     ["serve.replicas = 2", "existingClaim", "SQLite", "ReadWriteOnce"]),
    ({"serve": {"replicas": 2},
      "config": {"alerts": {"routes": [{"name": "hook", "url": "http://hook.ops.svc/x"}]}}},
     ["serve.replicas = 2", "config.serve.database", "alertmanager_api"]),
    ({"config": {"alerts": {"routes": [{"name": "hook", "url": "http://hook.ops.svc/x",
                                        "secret_env": "HOOK_KEY"}]}}},
     ["config.alerts.routes[0].secret_env", "serve.secretEnv.HOOK_KEY"]),
    ({"config": {"store": {"path": "vigil.db"}}},
     ["config.store.path", "/var/lib/vigil/", "read-only"]),
    ({"gateway": {"enabled": True, "replicas": 1},
      "config": {"gateway": {"listen": "127.0.0.1:8080"}}},
     ["config.gateway.listen", "loopback", "0.0.0.0:8080"]),
    ({"gateway": {"enabled": True, "replicas": 3}},
     ["config.gateway.database", "several copies"]),
    ({"gateway": {"enabled": True, "autoscaling": {"enabled": True}, "keda": {"enabled": True}},
      "config": {"gateway": {"database": "postgresql://vigil@db/vigil"}}},
     ["gateway.autoscaling.enabled and gateway.keda.enabled"]),
    ({"dashboard": {"enabled": True, "passwordSecret": {"name": "pw"}}},
     ["config.engine.prometheus_url", "serve's own volume"]),
    ({"dashboard": {"enabled": True}, "config": PROMETHEUS},
     ["dashboard.passwordSecret.name", "config.dashboard.password_env"]),
], ids=["serve-copies-one-claim", "serve-copies-no-database", "route-secret-env",
        "relative-store", "gateway-loopback", "gateway-copies-sqlite", "two-autoscalers",
        "dashboard-embedded", "dashboard-no-password"])
def test_a_broken_deployment_is_refused(chart: helm_python.Chart, values: dict[str, Any],
                                        expected: list[str]) -> None:
    message = refusal(chart, [values])
    for text in expected:
        assert text in message, message


def test_serve_copies_each_with_its_own_store(chart: helm_python.Chart) -> None:
    """Embedded mode, two copies: one volume each (volumeClaimTemplates), allowed; only
    Alertmanager routes need no shared outbox (Alertmanager deduplicates)."""
    values = {"serve": {"replicas": 2}, "config": {"alerts": {"routes": [{
        "name": "am", "url": "http://am.monitoring.svc:9093/api/v2/alerts",
        "format": "alertmanager_api"}]}}}
    (sts,) = [d for d in render(chart, [values]) if d["kind"] == "StatefulSet"]
    assert sts["spec"]["replicas"] == 2
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "data" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}


def test_prometheus_mode_serve_is_a_deployment_without_volume(chart: helm_python.Chart) -> None:
    docs = render(chart, _layers("prometheus-ha-values.yaml"))
    (serve,) = [d for d in docs if d["kind"] == "Deployment"]
    assert serve["spec"]["replicas"] == 2
    pod = serve["spec"]["template"]["spec"]
    (data,) = [v for v in pod["volumes"] if v["name"] == "data"]
    assert "emptyDir" in data
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "vigil-postgresql",
                                                              "key": "password"}
    toml = tomllib.loads(_vigil_toml(docs))
    assert toml["serve"] == {"database": "postgresql://vigil@vigil-postgresql.llm.svc:5432/"
                                         "vigil?sslmode=require", "lease_duration": 15}


# --- every pod alike -----------------------------------------------------------------------------

LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
          "app.kubernetes.io/component", "app.kubernetes.io/part-of",
          "app.kubernetes.io/managed-by")


def test_every_object_is_labelled_and_every_pod_locked_down(chart: helm_python.Chart) -> None:
    docs = render(chart, _layers("everything-values.yaml"), apis=True)
    docs += render(chart, _layers("embedded-values.yaml"))
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert all(labels.get(k) for k in LABELS), (doc["kind"], labels)
        assert doc["metadata"]["namespace"] in (NAMESPACE, "monitoring")
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    assert {c["name"] for d in workloads for c in d["spec"]["template"]["spec"]["containers"]} \
        == {"serve", "gateway", "dashboard"}
    for doc in workloads:
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        assert "checksum/config" in doc["spec"]["template"]["metadata"]["annotations"]
        (container,) = pod["containers"]
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert container["image"] == "vigil:0.1.0"
        assert container["args"][:3] == [container["name"], "--config", "/etc/vigil/vigil.toml"]
        assert container["resources"]["requests"]
        assert container["livenessProbe"] and container["readinessProbe"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/etc/vigil"]["readOnly"] is True
        assert {"/tmp", "/var/lib/vigil"} <= set(mounts)
    probes = {c["name"]: c["readinessProbe"]["httpGet"]["path"]
              for d in workloads for c in d["spec"]["template"]["spec"]["containers"]}
    assert probes == {"serve": "/healthz", "gateway": "/health", "dashboard": "/_stcore/health"}
    serve_args = next(c["args"] for d in workloads
                      for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "serve")
    assert serve_args[3:] == ["--listen", "0.0.0.0:9464", "--allow-remote"]


def test_dashboard_password_comes_from_its_secret(chart: helm_python.Chart) -> None:
    docs = render(chart, _layers("everything-values.yaml"))
    (dashboard,) = [d for d in docs if d["metadata"]["name"] == "vigil-dashboard"
                    and d["kind"] == "Deployment"]
    env = {e["name"]: e for e in dashboard["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["VIGIL_DASHBOARD_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "vigil-dashboard", "key": "password"}
    (gateway,) = [d for d in docs if d["metadata"]["name"] == "vigil-gateway"
                  and d["kind"] == "Deployment"]
    assert "replicas" not in gateway["spec"]  # the HorizontalPodAutoscaler's
    genv = {e["name"] for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert genv == {"PGPASSWORD", "OTEL_EXPORTER_OTLP_HEADERS"}


def test_gateway_replicas_belong_to_the_autoscaler_in_place(chart: helm_python.Chart) -> None:
    """With KEDA enabled but not in the cluster, the Deployment keeps its replicas (no
    ScaledObject would own them); with KEDA there, the ScaledObject does."""
    layers = _layers("gateway-keda-values.yaml")
    for apis, replicas in ((False, 2), (True, None)):
        (gateway,) = [d for d in render(chart, layers, apis)
                      if d["kind"] == "Deployment" and d["metadata"]["name"] == "vigil-gateway"]
        assert gateway["spec"].get("replicas") == replicas


# --- the generated objects -----------------------------------------------------------------------


def _without_chart_metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    out["metadata"] = {k: v for k, v in out["metadata"].items()
                       if k not in ("namespace", "labels")}
    return out


def _cli_objects(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(argv) == 0
    return [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]


def test_generated_objects_are_the_clis(chart: helm_python.Chart, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    case = "everything-values.yaml"
    docs = render(chart, _layers(case), apis=True)
    config = tmp_path / "vigil.toml"
    config.write_text(_vigil_toml(docs))
    values = _user_values(case)
    pm = values["podMonitors"]
    operator = _cli_objects(capsys, [
        "rules", "prometheus", "--config", str(config), "--format", "operator",
        "--pod-selector", pm["podSelector"], "--pod-namespace", pm["podNamespace"],
        "--dcgm-pod-selector", pm["dcgmPodSelector"], "--dcgm-namespace", pm["dcgmNamespace"]])
    grafana = _cli_objects(capsys, [
        "rules", "grafana", "--config", str(config), "--format", "operator",
        "--folder", values["grafanaDashboards"]["folder"]])
    keda = _cli_objects(capsys, [
        "rules", "keda", "--config", str(config),
        "--scale-target", values["poolScaledObjects"]["scaleTarget"]])
    rendered = [d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component")
                == "monitoring"]
    by_kind = {kind: [_without_chart_metadata(d) for d in rendered if d["kind"] == kind]
               for kind in ("PodMonitor", "PrometheusRule", "ConfigMap", "ScaledObject")}
    cli = [*operator, *grafana, *keda]
    assert [_without_chart_metadata(d) for d in cli if d["kind"] == "PodMonitor"] \
        == by_kind["PodMonitor"]
    assert [_without_chart_metadata(d) for d in cli if d["kind"] == "PrometheusRule"] \
        == by_kind["PrometheusRule"]
    assert [_without_chart_metadata(d) for d in grafana] == by_kind["ConfigMap"]
    assert [_without_chart_metadata(d) for d in keda] == by_kind["ScaledObject"]
    for doc in rendered:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
    rule = next(d for d in rendered if d["kind"] == "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["namespace"] == NAMESPACE
    board = next(d for d in rendered if d["kind"] == "ConfigMap")
    assert board["metadata"]["namespace"] == "monitoring"
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_a_stale_overlay_is_refused(chart: helm_python.Chart) -> None:
    case = "everything-values.yaml"
    user, overlay = _layers(case)
    slo = {"name": "code-ttft", "pool": "code", "indicator": "ttft"}
    changed = _deep_merge(user, {"config": {"slos": [*user["config"]["slos"], slo]}})
    message = refusal(chart, [changed, overlay])
    assert "(config.slos differ)" in message, message
    assert "vigil rules helm --values" in message


@pytest.mark.parametrize(("section", "key"), [
    (section, key) for section, keys in GENERATOR_INPUTS.items() for key in keys])
def test_every_generator_input_is_guarded(chart: helm_python.Chart, section: str,
                                          key: str) -> None:
    """The chart's pick list (templates/_generated.tpl) is GENERATOR_INPUTS: changing any of
    them calls the overlay stale."""
    user, overlay = _layers("everything-values.yaml")
    merged = merge_values(_defaults(), [user])
    old = merged[section][key]
    other = {"vllm": "vigil", "vigil": "vllm"}  # an enum: the other value
    new: Any = (not old) if isinstance(old, bool) else other.get(old) or (
        f"{old}-x" if old else "x")
    message = refusal(chart, [_deep_merge(user, {section: {key: new}}), overlay])
    assert f"({section}.{key} differ)" in message, message


def test_what_the_chart_applies_needs_no_new_overlay(chart: helm_python.Chart) -> None:
    user, overlay = _layers("everything-values.yaml")
    changed = _deep_merge(user, {"prometheusRules": {"labels": {"team": "llm"},
                                                     "namespace": "monitoring"},
                                 "serve": {"replicas": 3}})
    docs = render(chart, [changed, overlay], apis=True)
    rules = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rules and all(d["metadata"]["namespace"] == "monitoring"
                         and d["metadata"]["labels"]["team"] == "llm" for d in rules)


def test_enabled_objects_need_the_overlay(chart: helm_python.Chart) -> None:
    message = refusal(chart, [{"prometheusRules": {"enabled": True}}])
    assert "generated.from is missing" in message
    assert "vigil rules helm" in message


# --- reading values as Helm does -----------------------------------------------------------------

TRICKY = """
a: y
b: no
c: 1e3
d: 0x1F
e: 01:00
f: 2020-01-01
g: ~
i: 1_000
j: 0o17
k: 017
m: +12
o: 1.
p: Yes
q: 12:30:00
r: -0
t: 3.0
v: NO
w: '1e3'
x: 1e+3
on: 1
n: {y: 2}
z: 123456789012345678
"""


def test_values_are_read_as_helm_reads_them() -> None:
    assert json.loads(json.dumps(load_values(TRICKY))) == helm_python.values_from_yaml(TRICKY)


@pytest.mark.parametrize("case", CASES)
def test_values_are_merged_as_helm_merges_them(chart: helm_python.Chart, case: str) -> None:
    layers = [_user_values(case), {"config": {"store": {"path": None}, "new": None}}]
    ours = merge_values(_defaults(), layers)
    helms = chart.merge_values(_user(layers))
    assert ours == helms


def test_the_overlay_reads_back_as_written() -> None:
    """generated.from is one line of JSON in YAML: Helm reads it as the tree it copies, odd
    strings and numbers included, so that toJson on both sides agrees."""
    odd = "yes\u2028no\x85 \"quoted\" 'single' # not a comment: {} [] \U0001F600 \x7f 1e3"
    user = {"config": {"pools": [{"name": "chat", "model": odd, "max_replicas": 3,
                                  "gpus_per_replica": 2}],
                       "capacity": {"precision": 1e-05, "hours_per_month": 1e3}},
            "prometheusRules": {"enabled": True}}
    merged = merge_values(_defaults(), [user])
    overlay = generate_overlay(merged, file="odd.yaml")
    text = overlay.text(command="vigil rules helm --values odd.yaml")
    read = helm_python.values_from_yaml(text)
    assert read == overlay.values()
    assert read["generated"]["from"]["config"]["pools"][0]["model"] == odd


def test_overlay_passes_the_guard_for_odd_values(chart: helm_python.Chart) -> None:
    odd = "yes\u2028no \"quoted\" é \U0001F600"
    user = {"config": {"pools": [{"name": "chat", "model": odd}],
                       "capacity": {"precision": 1e-05, "hours_per_month": 730.0}},
            "prometheusRules": {"enabled": True}}
    text = generate_overlay(merge_values(_defaults(), [user])).text(command="x")
    docs = render(chart, [user, load_values(text)], apis=True)
    rules = [d["metadata"]["name"] for d in docs if d["kind"] == "PrometheusRule"]
    assert rules == ["vigil-chat", "vigil"]  # the pool's groups, then those of no one pool


# --- vigil rules helm ----------------------------------------------------------------------------


def test_cli_writes_the_overlay(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                chart: helm_python.Chart) -> None:
    out = tmp_path / "generated-values.yaml"
    values = CHART / "ci" / "gateway-keda-values.yaml"
    assert main(["rules", "helm", "--chart", str(CHART), "--values", str(values),
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    text = out.read_text()
    assert text.startswith("# Generated by `vigil rules helm --chart ")
    docs = render(chart, [_user_values("gateway-keda-values.yaml"), load_values(text)],
                  apis=True)
    assert sum(d["kind"] == "ScaledObject" for d in docs) == 3


def test_cli_names_the_file_and_key_of_a_bad_config(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "my-values.yaml"
    values.write_text("config:\n  pools:\n    - name: chat\n      model: m\n"
                      "      min_replicas: 9\n      max_replicas: 2\n"
                      "prometheusRules:\n  enabled: true\n")
    assert main(["rules", "helm", "--chart", str(CHART), "--values", str(values)]) == 2
    err = capsys.readouterr().err
    assert f"{values}: config.pools[0]: min_replicas (9) is more than max_replicas" in err


def test_cli_refuses_when_nothing_is_enabled(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "my-values.yaml"
    values.write_text("config: {}\n")
    assert main(["rules", "helm", "--chart", str(CHART), "--values", str(values)]) == 2
    assert "nothing to generate" in capsys.readouterr().err


def test_cli_names_the_option_of_a_bad_selector() -> None:
    merged = merge_values(_defaults(), [{"podMonitors": {"enabled": True,
                                                         "podSelector": "model"}}])
    with pytest.raises(ConfigError) as info:
        generate_overlay(merged, file="v.yaml")
    assert info.value.key == "podMonitors.podSelector"
    assert info.value.file == "v.yaml"


def test_the_otlp_receiver_gets_a_container_port_and_a_service_port(
        chart: helm_python.Chart) -> None:
    """``config.otlp.listen`` starts serve's OTLP receiver: the pod and the Service expose
    its port, named ``otlp``, for the routers and vLLM to send their spans to; a loopback
    address, which nothing outside the pod reaches, is refused at render time."""
    docs = render(chart, [{"config": {"otlp": {"listen": "0.0.0.0:4318"}}}])
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    ports = {p["name"]: p for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports["otlp"]["containerPort"] == 4318
    (service,) = [d for d in docs if d["kind"] == "Service" and "clusterIP" not in d["spec"]]
    served = {p["name"]: p for p in service["spec"]["ports"]}
    assert served["otlp"] == {"name": "otlp", "port": 4318, "targetPort": "otlp",
                              "protocol": "TCP"}
    assert 'listen = "0.0.0.0:4318"' in _vigil_toml(docs)
    plain = render(chart, [{}])
    (sts,) = [d for d in plain if d["kind"] == "StatefulSet"]
    assert "otlp" not in {p["name"] for p in sts["spec"]["template"]["spec"]["containers"][0]
                          ["ports"]}
    assert "loopback" in refusal(chart, [{"config": {"otlp": {"listen": "127.0.0.1:4318"}}}])
