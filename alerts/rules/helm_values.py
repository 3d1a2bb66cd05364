"""The Helm chart's values (``deploy/helm/vigil``): read as Helm reads them, turned into
Vigil's ``Config``, the generated objects as a values overlay (``vigil rules helm``), and the
chart's ``values.schema.json``.

Helm cannot run Python, so the objects the rule generators write for a config (the Prometheus
Operator's ``PrometheusRule`` and ``PodMonitor``, the Grafana sidecar's dashboard
``ConfigMap``, the vLLM pools' KEDA ``ScaledObject``) reach the chart as values:
``generate_overlay`` runs the very functions ``vigil rules prometheus --format operator``,
``vigil rules grafana --format operator`` and ``vigil rules keda`` run, on the ``config`` tree
of the values, and returns ``generated.<kind>`` lists of objects plus ``generated.from``, a
copy of every value they were made from. The chart renders the objects (adding its namespace
and labels) and refuses to render when ``generated.from`` differs from the values it is given
(``toJson`` on both sides, so the formatting is Helm's twice): a stale overlay fails at
``helm install`` instead of deploying rules for another config.

For that comparison to hold, the values are read here exactly as Helm reads them:

* YAML as Helm parses it (``load_values``: go-yaml v2 through sigs.k8s.io/yaml: YAML 1.1
  booleans including ``y`` and ``n``, ``1e3`` a number, no sexagesimal numbers, timestamps
  left as strings, keys as strings);
* the chart's ``values.yaml`` under the ``-f`` files as Helm merges them (``merge_values``:
  the files deep-merged in order, lists replaced; then the chart's defaults under them, a
  ``null`` removing a default);
* the ``config`` tree turned into TOML's types as the chart's ``vigil.toml`` writer does
  (``config_from_values``: a whole number is an integer, a ``null`` is left out), then checked
  by ``vigil.config.parse_config`` with the key named ``config.<key>``.

``values_schema`` builds the chart's ``values.schema.json``: the chart's own keys (a
hand-written file beside the chart) and, under ``config``, Vigil's pydantic models' JSON schema,
durations accepted as strings or seconds. ``python deploy/helm/values_schema.py`` writes it.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from alerts.rules import yaml_emitter
from vigil.config import Config, parse_config
from vigil.durations import parse_duration
from vigil.errors import ConfigError

__all__ = [
    "GENERATED_KINDS",
    "GENERATOR_INPUTS",
    "HelmOverlay",
    "config_from_values",
    "config_json_schema",
    "generate_overlay",
    "generator_inputs",
    "load_values",
    "load_values_file",
    "merge_values",
    "values_schema",
]

#: The values key of Vigil's configuration, one to one with vigil.toml.
CONFIG_KEY = "config"
#: The values key ``vigil rules helm`` writes: ``generated.from`` and one list per kind.
GENERATED_KEY = "generated"
FROM_KEY = "from"
#: Each kind of generated object: its values section (with ``enabled``), the key of its list
#: under ``generated``, and the object ``kind``.
GENERATED_KINDS: tuple[tuple[str, str], ...] = (
    ("podMonitors", "PodMonitor"),
    ("prometheusRules", "PrometheusRule"),
    ("grafanaDashboards", "ConfigMap"),
    ("poolScaledObjects", "ScaledObject"),
)
#: The values each generator reads besides ``config``, per section. The chart's
#: ``vigil.generatedFrom`` (templates/_generated.tpl) picks the same keys; the chart's tests
#: change each one and expect the chart to call the overlay stale. What the chart applies by
#: itself (namespace, labels) is not here: changing it needs no new overlay.
GENERATOR_INPUTS: dict[str, tuple[str, ...]] = {
    "podMonitors": ("enabled", "podSelector", "port", "podNamespace", "dcgmPodSelector",
                    "dcgmPort", "dcgmNamespace"),
    "prometheusRules": ("enabled",),
    "grafanaDashboards": ("enabled", "folder"),
    "poolScaledObjects": ("enabled", "prometheusUrl", "scaleTarget", "signal"),
}


# --- YAML as Helm reads it ----------------------------------------------------------------
class _HelmLoader(yaml.SafeLoader):
    """PyYAML's safe loader with go-yaml v2's implicit types (what Helm parses values with)."""


_HelmLoader.yaml_implicit_resolvers = {}
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE"
                   r"|on|On|ON|off|Off|OFF)$")
# Go's strconv.ParseInt with base 0 (0x, 0o, 0b, a leading 0 for octal, underscores).
_INT = re.compile(r"^[-+]?(?:0b[01_]+|0x[0-9a-fA-F_]+|0o[0-7_]+|[0-9][0-9_]*)$")
# go-yaml v2's yamlStyleFloat: an exponent needs no dot (PyYAML would read 1e3 as a string).
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_TRUE = frozenset({"y", "yes", "true", "on"})
for _tag, _regexp, _first in (
    ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", _BOOL, list("yYnNtTfFoO")),
    ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
    ("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789")),
    ("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"]),
):
    _HelmLoader.add_implicit_resolver(_tag, _regexp, _first)


def _construct_bool(loader: yaml.SafeLoader, node: yaml.Node) -> bool:
    return str(loader.construct_scalar(node)).lower() in _TRUE


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int | float:
    text = str(loader.construct_scalar(node)).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("+-")
    if text.startswith(("0b", "0x", "0o")):
        return sign * int(text[2:], {"b": 2, "x": 16, "o": 8}[text[1]])
    if len(text) > 1 and text.startswith("0"):
        # Go reads 017 as octal; 09 is no octal number, and go-yaml then reads it as a float.
        return sign * int(text, 8) if re.fullmatch("[0-7]+", text) else float(sign * int(text))
    return sign * int(text)


def _construct_string(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))


_HelmLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_HelmLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
# An explicit !!timestamp stays text, as Helm's JSON conversion leaves it.
_HelmLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_string)


def _json_key(key: Any) -> str:
    """A mapping key as sigs.k8s.io/yaml writes it into JSON."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, float):
        return format(key, "g") if math.isfinite(key) else str(key)
    return str(key)


def _jsonable(value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        return {_json_key(k): _jsonable(v, f"{where}.{_json_key(k)}") for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{value} is not a number Helm can read", key=where or None)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        # Helm holds every number as a float64: a larger integer is rounded, here too.
        return float(value)
    return value


def load_values(text: str, *, file: str = "<values>") -> dict[str, Any]:
    """A values document as Helm reads it (an empty document is ``{}``); ``ConfigError``
    naming ``file`` when it is not YAML or not a mapping."""
    try:
        data = yaml.load(text, Loader=_HelmLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", file=file) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"a values file is a mapping, got {type(data).__name__}", file=file)
    try:
        out: dict[str, Any] = _jsonable(data, "")
    except ConfigError as exc:
        raise ConfigError(exc.reason, file=file, key=exc.key) from None
    return out


def load_values_file(path: str | Path) -> dict[str, Any]:
    """``load_values`` of a file; ``ConfigError`` naming it when it cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(p)) from None
    return load_values(text, file=str(p))


# --- Helm's merge -------------------------------------------------------------------------
def _merge_maps(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Two ``-f`` files as Helm's ``mergeMaps`` joins them: maps deep, anything else replaced
    (a ``null`` included: it is resolved against the chart's defaults later)."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            out[key] = _merge_maps(below, value)
        else:
            out[key] = value
    return out


def _coalesce(user: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The user's values over the chart's defaults as Helm's ``CoalesceValues`` does: maps
    deep, the user's value winning otherwise; a user's ``null`` over a default removes it
    (a ``null`` where the chart has no default stays)."""
    out = dict(user)
    for key, default in defaults.items():
        if default is None:
            # Helm drops the chart's own nulls too (a null default documents an unset key).
            if out.get(key) is None:
                out.pop(key, None)
        elif key not in out:
            out[key] = _without_nulls(default)
        elif out[key] is None:
            del out[key]
        elif isinstance(out[key], Mapping) and isinstance(default, Mapping):
            out[key] = _coalesce(out[key], default)
    return out


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return copy.deepcopy(value)


def merge_values(defaults: Mapping[str, Any], layers: Iterable[Mapping[str, Any]]
                 ) -> dict[str, Any]:
    """What the chart's templates see as ``.Values``: ``layers`` (the ``-f`` files, in order)
    over the chart's ``defaults``."""
    user: dict[str, Any] = {}
    for layer in layers:
        user = _merge_maps(user, layer)
    return _coalesce(user, defaults)


# --- the config tree -----------------------------------------------------------------------
def _as_toml(value: Any) -> Any:
    """``value`` with the types the chart's vigil.toml writer gives it: a whole number is an
    integer (Helm holds every number as a float64, and Vigil's integer keys refuse 30.0), a
    ``null`` is left out (TOML has none)."""
    if isinstance(value, Mapping):
        return {k: _as_toml(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_as_toml(v) for v in value if v is not None]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2.0**63:
        return int(value)
    return value


def _rekey(exc: ConfigError, file: str) -> ConfigError:
    """A config error with its key as the values spell it (``config.pools[0].name``)."""
    key = f"{CONFIG_KEY}.{exc.key}" if exc.key else CONFIG_KEY
    return ConfigError(exc.reason, file=file, key=key)


def config_from_values(values: Mapping[str, Any], *, file: str = "<values>") -> Config:
    """Vigil's ``Config`` from the ``config`` tree of merged values, checked as ``vigil``
    checks a file; ``ConfigError`` naming ``file`` and ``config.<key>``."""
    tree = values.get(CONFIG_KEY, {})
    if tree is None:
        tree = {}
    if not isinstance(tree, Mapping):
        raise ConfigError(f"a mapping of vigil.toml's sections, got {type(tree).__name__}",
                          file=file, key=CONFIG_KEY)
    try:
        return parse_config(_as_toml(tree), file=file)
    except ConfigError as exc:
        raise _rekey(exc, file) from None


def generator_inputs(values: Mapping[str, Any]) -> dict[str, Any]:
    """``generated.from``: every value the generated objects depend on (``config`` and the
    ``GENERATOR_INPUTS`` of each section), as the chart's ``vigil.generatedFrom`` picks them."""
    out: dict[str, Any] = {CONFIG_KEY: values.get(CONFIG_KEY, {})}
    for section, keys in GENERATOR_INPUTS.items():
        given = values.get(section) or {}
        out[section] = {k: given[k] for k in keys if isinstance(given, Mapping) and k in given}
    return out


# --- the overlay ----------------------------------------------------------------------------
# YAML's printable set, less what a JSON string may hold raw but YAML reads otherwise: the
# characters YAML 1.1 takes for line breaks (NEL, U+2028, U+2029) and anything unprintable.
_YAML_UNSAFE = re.compile("[^\t\n\r\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd"
                          "\U00010000-\U0010ffff]")


def _flow_json(value: Any) -> str:
    """``value`` as one line of JSON, which YAML reads as the same tree (JSON is a subset of
    YAML 1.2, and the escapes keep it within what go-yaml v2 reads as YAML 1.1)."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, allow_nan=False)
    # Every unsafe character is in the Basic Multilingual Plane: one four-digit \u escape each.
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


@dataclass(frozen=True)
class HelmOverlay:
    """``generated``: the objects per values key (``GENERATED_KINDS``), what they were made
    from, and notes on what was left out (as the ``vigil rules`` commands print them)."""

    source: Mapping[str, Any]
    objects: Mapping[str, tuple[dict[str, Any], ...]]
    notes: tuple[str, ...]

    def values(self) -> dict[str, Any]:
        """The overlay as a values tree."""
        return {GENERATED_KEY: {FROM_KEY: copy.deepcopy(dict(self.source)),
                                **{k: list(v) for k, v in self.objects.items()}}}

    def text(self, *, command: str) -> str:
        """The values file: a header naming ``command`` (how to regenerate it), the objects
        in the byte-stable style of the other generated files, and ``from`` as one line of
        JSON (read by Helm as the very tree it copies)."""
        counts = ", ".join(f"{len(v)} {k}" for k, v in self.objects.items())
        comment = "\n".join([
            f"Generated by `{command}`; do not edit by hand.",
            f"The objects the chart deploy/helm/vigil renders for these values ({counts}),",
            "made by the generators of `vigil rules prometheus|grafana|keda`, and generated.from,",
            "a copy of the values they were made from. The chart refuses this file once those",
            "values change: run the command again. Install with",
            "  helm install vigil deploy/helm/vigil -f <your values files> -f <this file>",
            *(f"Note: {n}" for n in self.notes),
        ])
        body = yaml_emitter.dump({GENERATED_KEY: {k: list(v) for k, v in self.objects.items()}}
                                 if self.objects else {GENERATED_KEY: {}}, comment=comment)
        lines = body.rstrip("\n").split("\n")
        head = lines.index(f"{GENERATED_KEY}:" if self.objects else f"{GENERATED_KEY}: {{}}")
        lines[head] = f"{GENERATED_KEY}:"
        lines.insert(head + 1, f"  {FROM_KEY}: {_flow_json(dict(self.source))}")
        return "\n".join(lines) + "\n"


def _enabled(values: Mapping[str, Any], section: str) -> bool:
    given = values.get(section)
    return isinstance(given, Mapping) and given.get("enabled") is True


def _text(values: Mapping[str, Any], section: str, key: str, default: str) -> str:
    given = values.get(section)
    value = given.get(key, default) if isinstance(given, Mapping) else default
    if value is None:
        return default
    if not isinstance(value, str):
        raise ConfigError(f"expected a string, got {value!r}", key=f"{section}.{key}")
    return value


def generate_overlay(values: Mapping[str, Any], *, file: str = "<values>") -> HelmOverlay:
    """The generated objects of the merged ``values`` (``merge_values``), for each kind whose
    section is ``enabled``; ``ConfigError`` naming ``file`` and the key when the config or an
    option is wrong, or when no kind is enabled."""
    from alerts.rules.grafana import GrafanaOptions, generate_grafana
    from alerts.rules.keda import KedaOptions, generate_keda
    from alerts.rules.operator import OperatorOptions, generate_operator
    from alerts.rules.pipeline import generate, rules_options

    wanted = [section for section, _ in GENERATED_KINDS if _enabled(values, section)]
    if not wanted:
        names = ", ".join(f"{s}.enabled" for s, _ in GENERATED_KINDS)
        raise ConfigError(f"nothing to generate: none of {names} is true", file=file)
    config = config_from_values(values, file=file)
    objects: dict[str, tuple[dict[str, Any], ...]] = {}
    notes: list[str] = []
    try:
        result = generate(config, rules_options(config))
        notes += [f"skipped SLO {name}: {reason}" for name, reason in result.validated.skipped]
        if "podMonitors" in wanted or "prometheusRules" in wanted:
            d = OperatorOptions()
            operator = generate_operator(result, OperatorOptions(
                pod_selector=_text(values, "podMonitors", "podSelector", d.pod_selector),
                port=_text(values, "podMonitors", "port", d.port),
                pod_namespace=_text(values, "podMonitors", "podNamespace", d.pod_namespace),
                dcgm_pod_selector=_text(values, "podMonitors", "dcgmPodSelector",
                                        d.dcgm_pod_selector),
                dcgm_port=_text(values, "podMonitors", "dcgmPort", d.dcgm_port),
                dcgm_namespace=_text(values, "podMonitors", "dcgmNamespace", d.dcgm_namespace),
            ))
            for section, kind in GENERATED_KINDS[:2]:
                if section in wanted:
                    objects[section] = tuple(operator.of_kind(kind))
            if "podMonitors" in wanted:
                notes += operator.notes
        if "grafanaDashboards" in wanted:
            grafana = generate_grafana(result, GrafanaOptions(
                format="operator",
                folder=_text(values, "grafanaDashboards", "folder", GrafanaOptions.folder)))
            objects["grafanaDashboards"] = tuple(grafana.objects())
        if "poolScaledObjects" in wanted:
            d_keda = KedaOptions()
            keda = generate_keda(config, KedaOptions(
                prometheus_url=_text(values, "poolScaledObjects", "prometheusUrl",
                                     d_keda.prometheus_url).rstrip("/"),
                scale_target=_text(values, "poolScaledObjects", "scaleTarget",
                                   d_keda.scale_target),
                signal=_signal(values)))
            objects["poolScaledObjects"] = keda.objects
            notes += keda.warnings
    except ConfigError as exc:
        raise _values_error(exc, file) from None
    return HelmOverlay(generator_inputs(values), objects, tuple(notes))


#: The generators' option flags (named in their messages) -> the values key that sets them.
_FLAG_KEYS = {
    "--pod-selector": "podMonitors.podSelector", "--port": "podMonitors.port",
    "--pod-namespace": "podMonitors.podNamespace",
    "--dcgm-pod-selector": "podMonitors.dcgmPodSelector", "--dcgm-port": "podMonitors.dcgmPort",
    "--dcgm-namespace": "podMonitors.dcgmNamespace",
    "--scale-target": "poolScaledObjects.scaleTarget",
}


def _values_error(exc: ConfigError, file: str) -> ConfigError:
    """A generator's error with the values key that caused it: an option's (named by its
    flag in the message) or ``config.<key>``."""
    for flag, key in _FLAG_KEYS.items():
        if exc.reason.startswith(flag + " "):
            return ConfigError(exc.reason[len(flag) + 1:], file=file, key=key)
    if exc.key and exc.key.partition(".")[0] in GENERATOR_INPUTS:
        return ConfigError(exc.reason, file=file, key=exc.key)
    return _rekey(exc, file) if exc.key else ConfigError(exc.reason, file=file)


def _signal(values: Mapping[str, Any]) -> str:
    from alerts.rules.keda import SIGNAL_VLLM, SIGNALS

    signal = _text(values, "poolScaledObjects", "signal", SIGNAL_VLLM)
    if signal not in SIGNALS:
        raise ConfigError(f"must be one of {', '.join(SIGNALS)}, got {signal!r}",
                          key="poolScaledObjects.signal")
    return signal


# --- values.schema.json ----------------------------------------------------------------------
#: A duration as ``parse_duration`` reads it: "90s", "1h30m", "500ms" (or a number).
DURATION_PATTERN = r"^\s*([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w|y))+\s*$"


class _ValuesSchema(GenerateJsonSchema):
    """pydantic's JSON schema with Vigil's durations as what they accept: a number of
    seconds (with the field's bounds) or a duration string. pydantic alone describes the
    validator's output, a number, and would refuse "30s" at render time."""

    def function_before_schema(self, schema: core_schema.BeforeValidatorFunctionSchema
                               ) -> JsonSchemaValue:
        function = schema["function"]
        if function.get("function") is parse_duration:
            seconds = self.generate_inner(schema["schema"])
            return {"anyOf": [seconds, {"type": "string", "pattern": DURATION_PATTERN}]}
        return super().function_before_schema(schema)


def _strip_titles(node: Any, *, schema: bool = True) -> None:
    """Remove pydantic's ``title`` annotations (a field's name again, capitalised) from
    every schema object, not from ``properties`` maps, where a key may be a field's name."""
    if isinstance(node, dict):
        if schema:
            node.pop("title", None)
        for key, child in node.items():
            if key in ("properties", "$defs", "patternProperties"):
                for sub in child.values():
                    _strip_titles(sub)
            elif key not in ("default", "enum", "const", "examples"):
                _strip_titles(child, schema=True)
    elif isinstance(node, list):
        for child in node:
            _strip_titles(child)


def config_json_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of vigil.toml, from ``vigil.config.Config``: unknown
    keys refused where the config refuses them, types, enums, bounds and patterns."""
    schema: dict[str, Any] = Config.model_json_schema(schema_generator=_ValuesSchema)
    # Set by load_config from the file's path; a file that names it is refused.
    schema["properties"].pop("source", None)
    _strip_titles(schema)
    return schema


def values_schema(chart_part: Mapping[str, Any]) -> dict[str, Any]:
    """The chart's ``values.schema.json``: ``chart_part`` (the chart's own keys) with
    ``config`` as vigil.toml's schema (``$defs.Config`` and the models it refers to)."""
    config = config_json_schema()
    defs = config.pop("$defs", {})
    out = copy.deepcopy(dict(chart_part))
    clash = set(defs) & set(out.get("$defs", {}))
    if clash:
        raise ValueError(f"$defs {sorted(clash)} are both the chart's and the config's")
    out["$defs"] = {**out.get("$defs", {}), "Config": config, **defs}
    properties = out.setdefault("properties", {})
    properties[CONFIG_KEY] = {
        "description": "Vigil's configuration, one to one with vigil.toml (every key: "
                       "vigil.example.toml); the chart writes it into the ConfigMap's "
                       "vigil.toml.",
        "$ref": "#/$defs/Config",
    }
    return out
