"""KEDA ``ScaledObject``s that act on Vigil's scaling signals (``vigil rules keda``).

One ``ScaledObject`` per pool, scaling the pool's Deployment between ``min_replicas`` and
``max_replicas`` on Prometheus triggers. Each trigger is one of the scale-out signals of
``docs/scaling.md`` with its ``[scaling]`` threshold and ``metricType: Value``, for which the
HPA computes ``desired = ceil(current × value / threshold)`` and takes the largest over the
triggers: the very rule ``slo.scaling.policy`` applies on scale-out (``ceil(current × worst
ratio)``).

* ``queue-length``: ``sum(vllm:num_requests_waiting{pool, kind="vllm"})``, threshold
  ``scale_out_queue_length``;
* ``kv-cache-usage``: the mean over replicas of each replica's KV-cache usage, threshold
  ``scale_out_kv_usage``;
* ``ttft-p95``: the pool's TTFT p95 over ``[engine] window``, threshold
  ``scale_out_ttft_ratio`` × the pool's strictest TTFT SLO threshold; the quantile is
  ``[scaling] scale_out_ttft_quantile`` (0.95 by default), which names the trigger (``ttft-p90``
  for 0.9, ``ttft-p99-9`` for 0.999).

The queries are built by the same functions as the recording rules (``alerts.rules.promql``),
so the two cannot drift: a pool with a ``selector`` is read through it (the series of a
Prometheus that scrapes the replicas itself, e.g. ``vllm:num_requests_waiting{namespace="llm",
service="chat-vllm"}``), its replicas told apart by its ``replica_label``. Each query is a
single-element vector (KEDA refuses more than one element), and ``or vector(0)`` turns "no
data" (an idle pool, no replica) into 0 rather than an error.

Behaviour (``advanced.horizontalPodAutoscalerConfig.behavior``): scale-up is immediate
(stabilisation 0 s; +100 % or +4 pods per 15 s, whichever is more: the HPA's own default),
because a GPU replica takes minutes to start. Scale-down waits for a stabilisation window of
``max([rules.keda] min_scale_down_stabilization, scale_in_hold, cooldown)`` (10 min at
least by default), so a replica is removed only when every trigger has asked for fewer
replicas for that long, and removes one pod per ``scale_in_hold`` like ``slo.scaling.policy``.
KEDA's ``cooldownPeriod`` only governs scaling to and from zero replicas (``min_replicas = 0``), so
the ``[scaling] cooldown`` is carried by the scale-down window, not by it.

Not carried over: the projection ``spinup`` seconds ahead and the +1 minimum step of scale-out
(the HPA has neither), and the 10 % tolerance the HPA applies before acting.

``signal="vigil"`` instead gives each ScaledObject one trigger on ``vigil serve``'s
``vigil_scaling_desired_replicas{pool}`` (``metricType: AverageValue``, target 1), so the HPA
asks for exactly the replicas Vigil recommends, with the whole policy of ``docs/scaling.md``
(projection, hold, cooldown) behind them. It needs Prometheus to scrape ``vigil serve``'s
``/metrics``; without the series the trigger errors (``ignoreNullValues: "false"``) and the HPA
keeps the current replicas rather than scaling in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from alerts.rules import yaml_emitter
from alerts.rules.promql import (
    kv_usage_expr,
    number,
    promql_string,
    quantile_expr,
    queue_length_expr,
)
from slo.objectives.quantiles import quantile_key
from slo.scaling.signals import ttft_threshold_for
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    KEDA_AUTH_SECRET,
    KEDA_TRIGGER_AUTH,
    LABEL_POOL,
    METRIC_DESIRED_REPLICAS,
    SCALED_OBJECT_PREFIX,
    VLLM_TTFT,
)
from vigil.errors import ConfigError

__all__ = [
    "DEFAULT_PROMETHEUS_URL",
    "SIGNALS",
    "SIGNAL_VIGIL",
    "SIGNAL_VLLM",
    "KedaOptions",
    "KedaResult",
    "generate_keda",
    "scaled_object",
    "trigger_authentication",
]

#: Where KEDA finds Prometheus when neither ``--prometheus-url`` nor ``[engine]
#: prometheus_url`` says: the Service the Prometheus Operator creates.
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
#: Kubernetes' limits: behavior.*.stabilizationWindowSeconds <= 3600, periodSeconds <= 1800.
_MAX_STABILIZATION_S = 3600
_MAX_PERIOD_S = 1800
#: Fast scale-up: every 15 s, double the replicas or add 4, whichever adds more.
_SCALE_UP_PERIOD_S = 15
_SCALE_UP_PERCENT = 100
_SCALE_UP_PODS = 4
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MANAGED_BY = {"app.kubernetes.io/managed-by": "vigil"}


#: ``KedaOptions.signal``: the vLLM signals themselves, or Vigil's recommendation.
SIGNAL_VLLM = "vllm"
SIGNAL_VIGIL = "vigil"
SIGNALS = (SIGNAL_VLLM, SIGNAL_VIGIL)


@dataclass(frozen=True)
class KedaOptions:
    """Deployment facts the Vigil config does not hold.

    ``prometheus_url``: the Prometheus KEDA queries ("" = ``[engine] prometheus_url``, else
    ``DEFAULT_PROMETHEUS_URL``); ``namespace``: of the ScaledObjects ("" = none, kubectl's
    current one); ``scale_target``: the name of the workload to scale, ``{pool}`` replaced by
    the pool's name; ``scale_target_kind``: a Deployment unless said otherwise; ``signal``:
    ``"vllm"`` (the three scale-out signals, read from the vLLM series the generated scrape
    config collects) or ``"vigil"`` (one trigger on ``vigil serve``'s desired replicas, which
    needs Prometheus to scrape ``vigil serve``).
    """

    prometheus_url: str = ""
    namespace: str = ""
    scale_target: str = "{pool}"
    scale_target_kind: str = "Deployment"
    scale_target_api_version: str = "apps/v1"
    signal: str = SIGNAL_VLLM
    #: The Secret the TriggerAuthentication reads the ``[engine.http]`` credential from.
    auth_secret: str = KEDA_AUTH_SECRET

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {SIGNALS}, got {self.signal!r}")


@dataclass(frozen=True)
class KedaResult:
    """The ScaledObjects (one per pool, config order) and what could not be expressed."""

    objects: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]

    def text(self) -> str:
        """A multi-document YAML file for ``kubectl apply -f``."""
        return yaml_emitter.dump_all(self.objects, comment=(
            "Generated by `vigil rules keda` from the Vigil config; do not edit by hand.\n"
            "One KEDA ScaledObject per pool (docs/prometheus-rules.md)."
        ))


@dataclass(frozen=True)
class _Auth:
    """How the triggers authenticate, from ``[engine.http]``: KEDA's ``authModes``, the
    TriggerAuthentication's ``secretTargetRef`` parameters, extra trigger metadata, and
    what KEDA cannot be told."""

    modes: tuple[str, ...]
    parameters: tuple[str, ...]
    metadata: dict[str, str]
    notes: tuple[str, ...]


def _auth(config: Config) -> _Auth:
    """KEDA's Prometheus scaler takes a bearer token, basic auth, one custom header and a
    client certificate (its ``tls`` mode) from a TriggerAuthentication; headers, and
    skipping certificate checks, as trigger metadata. Each secret is a key of the Secret
    named by ``KedaOptions.auth_secret``, named as KEDA's parameter."""
    http = config.engine.http
    modes: list[str] = []
    params: list[str] = []
    notes: list[str] = []
    if http.bearer_token_file:
        modes.append("bearer")
        params.append("bearerToken")
    elif http.basic_auth is not None:
        modes.append("basic")
        params += ["username", "password"]
    elif http.oauth2 is not None:
        notes.append("[engine.http] oauth2: the ScaledObjects carry no OAuth2 settings; give "
                     "KEDA's prometheus trigger its oauth mode by hand")
    if http.header_files:
        _first, *rest = http.header_files
        if modes:
            notes += [f"[engine.http] header_files {name}: KEDA sends one credential per "
                      "trigger; the header is left out" for name in http.header_files]
        else:
            modes.append("custom")
            params += ["customAuthHeader", "customAuthValue"]
            notes += [f"[engine.http] header_files {name}: KEDA takes one custom header; "
                      "left out" for name in rest]
    if http.tls.cert_file:
        modes.append("tls")
        params += ["cert", "key"] + (["ca"] if http.tls.ca_file else [])
    elif http.tls.ca_file:
        notes.append("[engine.http.tls] ca_file: KEDA takes a CA only with a client certificate; "
                     "add the CA to the KEDA operator's trust store")
    if http.tls.server_name:
        notes.append("[engine.http.tls] server_name: KEDA cannot be told; its serverAddress "
                     "must carry the name the certificate does")
    metadata: dict[str, str] = {}
    if http.headers:
        metadata["customHeaders"] = ",".join(f"{k}={v}" for k, v in http.headers.items())
    if http.tls.insecure_skip_verify:
        metadata["unsafeSsl"] = "true"
    if modes:
        metadata["authModes"] = ",".join(modes)
    return _Auth(tuple(modes), tuple(params), metadata, tuple(notes))


def trigger_authentication(config: Config,
                           options: KedaOptions | None = None) -> dict[str, Any] | None:
    """The TriggerAuthentication every ScaledObject refers to, or None when ``[engine.http]``
    carries no credential KEDA can take."""
    opts = options or KedaOptions()
    auth = _auth(config)
    if not auth.parameters:
        return None
    metadata: dict[str, Any] = {"name": KEDA_TRIGGER_AUTH}
    if opts.namespace:
        metadata["namespace"] = _name(opts.namespace, "--namespace", config, "pools")
    metadata["labels"] = dict(_MANAGED_BY)
    secret = _name(opts.auth_secret, "--auth-secret", config, "engine.http")
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": metadata,
        "spec": {"secretTargetRef": [{"parameter": p, "name": secret, "key": p}
                                     for p in auth.parameters]},
    }


def _threshold(value: float) -> str:
    # 0.8 x 0.8 is 0.6400000000000001: nine decimals, as slo.scaling.policy rounds before ceil.
    return number(round(value, 9))


def _trigger(name: str, url: str, query: str, threshold: float) -> dict[str, Any]:
    return {
        "type": "prometheus",
        "name": name,
        "metricType": "Value",
        "metadata": {
            "serverAddress": url,
            "query": f"({query}) or vector(0)",
            "threshold": _threshold(threshold),
        },
    }


def _vigil_trigger(pool: PoolConfig, url: str) -> dict[str, Any]:
    # AverageValue with a target of 1: the HPA asks for ceil(value / 1) replicas, i.e. exactly
    # Vigil's recommendation. No `or vector(0)` here: with `vigil serve` unscraped, 0 would
    # scale the pool in; an empty answer is an error instead, and the HPA then holds.
    desired = f"{METRIC_DESIRED_REPLICAS}{{{LABEL_POOL}={promql_string(pool.name)}}}"
    return {
        "type": "prometheus",
        "name": "vigil-desired-replicas",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": url,
            "query": f"max({desired})",
            "threshold": "1",
            "ignoreNullValues": "false",
        },
    }


def _triggers(config: Config, pool: PoolConfig, url: str) -> tuple[list[dict[str, Any]],
                                                                   list[str]]:
    s = config.scaling
    ttft = s.scale_out_ttft_ratio * ttft_threshold_for(config, pool)
    q = s.scale_out_ttft_quantile
    # A trigger name is part of a Kubernetes metric name: no dot ("p99.9" -> "p99-9").
    ttft_name = "ttft-" + quantile_key(q).replace(".", "-")
    candidates = [
        ("queue-length", queue_length_expr(pool, by=()), s.scale_out_queue_length,
         "scaling.scale_out_queue_length"),
        ("kv-cache-usage", kv_usage_expr(pool, "avg", by=()), s.scale_out_kv_usage,
         "scaling.scale_out_kv_usage"),
        (ttft_name, quantile_expr(q, VLLM_TTFT, pool, config.engine.window, by=()),
         ttft, "scaling.scale_out_ttft_ratio"),
    ]
    triggers, warnings = [], []
    for name, query, threshold, key in candidates:
        if not threshold > 0:
            # The HPA divides by the target; slo.scaling.policy treats 0 as "any value triggers".
            warnings.append(f"pool {pool.name}: no {name} trigger: {key} is 0, which an HPA "
                            "target cannot express")
            continue
        triggers.append(_trigger(name, url, query, threshold))
    return triggers, warnings


def _name(text: str, what: str, config: Config, key: str) -> str:
    if len(text) > 253 or not _DNS_SUBDOMAIN.fullmatch(text):
        raise ConfigError(f"{what} {text!r} is not a valid Kubernetes name (lower-case "
                          "letters, digits, '-' and '.', at most 253 characters)",
                          file=config.source or None, key=key)
    return text


def scaled_object(config: Config, pool: PoolConfig,
                  options: KedaOptions | None = None) -> tuple[dict[str, Any], list[str]]:
    """The ScaledObject of one pool, and warnings about triggers left out."""
    opts = options or KedaOptions()
    url = opts.prometheus_url or config.engine.prometheus_url or DEFAULT_PROMETHEUS_URL
    if opts.signal == SIGNAL_VIGIL:
        triggers, warnings = [_vigil_trigger(pool, url)], []
    else:
        triggers, warnings = _triggers(config, pool, url)
    if not triggers:
        raise ConfigError(f"pool {pool.name}: every scale-out threshold is 0; a ScaledObject "
                          "needs at least one trigger", file=config.source or None, key="scaling")
    # The Prometheus KEDA queries is the one [engine.http] describes: the same headers, and
    # the credential through the shared TriggerAuthentication.
    auth = _auth(config)
    for trigger in triggers:
        trigger["metadata"].update(auth.metadata)
        if auth.parameters:
            trigger["authenticationRef"] = {"name": KEDA_TRIGGER_AUTH}
    s = config.scaling
    hold = math.ceil(s.scale_in_hold)
    stabilization = max(math.ceil(config.rules.keda.min_scale_down_stabilization), hold,
                        math.ceil(s.cooldown))
    if stabilization > _MAX_STABILIZATION_S:
        warnings.append(f"pool {pool.name}: scale-down stabilisation capped at "
                        f"{_MAX_STABILIZATION_S} s (Kubernetes' maximum), not {stabilization} s")
        stabilization = _MAX_STABILIZATION_S
    pool_key = f"pools[{config.pools.index(pool)}].name" if pool in config.pools else "pools"
    metadata: dict[str, Any] = {"name": _name(f"{SCALED_OBJECT_PREFIX}-{pool.name}",
                                              "ScaledObject name", config, pool_key)}
    if opts.namespace:
        metadata["namespace"] = _name(opts.namespace, "--namespace", config, pool_key)
    metadata["labels"] = dict(_MANAGED_BY)
    target = _name(opts.scale_target.replace("{pool}", pool.name), "--scale-target", config,
                   pool_key)
    spec: dict[str, Any] = {
        "scaleTargetRef": {
            "apiVersion": opts.scale_target_api_version,
            "kind": opts.scale_target_kind,
            "name": target,
        },
        "pollingInterval": max(1, round(config.collector.scrape_interval)),
        # Only used to scale to zero (min_replicas = 0): as long as a scale-down is held.
        "cooldownPeriod": stabilization,
        "minReplicaCount": pool.min_replicas,
        "maxReplicaCount": pool.max_replicas,
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {
                    "scaleUp": {
                        "stabilizationWindowSeconds": 0,
                        "selectPolicy": "Max",
                        "policies": [
                            {"type": "Percent", "value": _SCALE_UP_PERCENT,
                             "periodSeconds": _SCALE_UP_PERIOD_S},
                            {"type": "Pods", "value": _SCALE_UP_PODS,
                             "periodSeconds": _SCALE_UP_PERIOD_S},
                        ],
                    },
                    "scaleDown": {
                        "stabilizationWindowSeconds": stabilization,
                        "selectPolicy": "Min",
                        "policies": [
                            {"type": "Pods", "value": 1,
                             "periodSeconds": min(_MAX_PERIOD_S, max(1, hold))},
                        ],
                    },
                },
            },
        },
        "triggers": triggers,
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata,
        "spec": spec,
    }, warnings


def generate_keda(config: Config, options: KedaOptions | None = None,
                  pools: Sequence[PoolConfig] | None = None) -> KedaResult:
    """One ScaledObject per pool (all of the config's by default), after the
    TriggerAuthentication they share when ``[engine.http]`` carries a credential."""
    objects: list[dict[str, Any]] = []
    warnings: list[str] = list(_auth(config).notes)
    shared = trigger_authentication(config, options)
    if shared is not None:
        objects.append(shared)
    for pool in config.pools if pools is None else pools:
        obj, notes = scaled_object(config, pool, options)
        objects.append(obj)
        warnings += notes
    return KedaResult(tuple(objects), tuple(warnings))
