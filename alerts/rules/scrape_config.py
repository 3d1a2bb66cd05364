"""Pipeline step 6 of ``alerts.rules.pipeline``: Prometheus scrape jobs for the configured targets.

The rules select a pool's series by the labels Vigil's collector stores (``instance`` = the
target's name, ``pool``, ``kind``), so Prometheus must store them too; generating the scrape
configuration from the same ``[[targets]]`` keeps the two from drifting. One job per target,
because each target has its own interval, timeout and URL (none for the targets of a pool
whose ``selector`` / ``dcgm_selector`` chooses series Prometheus already scrapes):

* ``static_configs``: the target's ``host:port`` with its ``pool`` and ``kind`` labels and its
  own ``labels``; ``scheme``, ``metrics_path`` and ``params`` come from its URL;
* ``relabel_configs``: ``instance`` set to the target's name (Prometheus would use
  ``host:port``). ``job`` stays what Prometheus makes it, the job's name ``vigil-<target>``,
  so ``up{job="vigil-chat-0"}`` and the dashboards keyed on ``job`` work. Vigil's collector
  stores no ``job``, but nothing Vigil computes tells series apart by it: every rule and
  every engine query aggregates over ``pool`` / ``instance`` or sums a pool's series, so the
  extra label changes no number;
* ``metric_relabel_configs``: ``vllm_x`` renamed ``vllm:x``. Prometheus asks for OpenMetrics,
  and prometheus_client >= 0.22 (vLLM's) then escapes the ``:`` of sample names to ``_``
  (client_python#1177); Vigil's collector stores both spellings as ``vllm:`` (it asks for the
  text format, and renames the escaped spelling when it gets OpenMetrics anyway), and the rules
  read ``vllm:``.

Like the collector, Prometheus adds ``up``, keeps scraped labels that clash as
``exported_<name>`` (``honor_labels: false``) and the exposition's own timestamps
(``honor_timestamps: true``).

Then one job per ``[[discovery]]`` entry, ``vigil-<name>``, with Prometheus's own mechanism
(``file_sd_configs``, ``http_sd_configs``, ``dns_sd_configs``, each with the entry's
``refresh_interval``), its ``scheme``, ``metrics_path`` and scrape interval / timeout, the same
``vllm_`` rename, and ``relabel_configs`` that label the targets as the collector does
(``collector.discovery``):

* ``pool`` from the group's ``pool_label`` label (that label itself is dropped when it is not
  ``pool``), else the entry's ``pool``; ``kind`` from the group's ``kind`` label, else the
  entry's ``kind``. A target with no pool, a pool that is not configured or a kind other
  than vllm / dcgm is dropped, as the collector skips it;
* a target at the address (and of the kind) of a ``[[targets]]`` entry is dropped: the static
  job scrapes it already, under its configured name, as the collector keeps the static one;
* so is a target of a pool whose ``selector`` (``dcgm_selector`` for dcgm) chooses that kind
  of series: Prometheus scrapes those already with the team's labels;
* ``instance`` stays Prometheus's: the group's ``instance`` label, else the address, which is
  the collector's target name too. The group's ``__scheme__`` / ``__metrics_path__`` override
  the job's, in both.

file_sd patterns relative to the config file are written absolute (Prometheus would resolve
them against its own config file), and Prometheus takes only one ``*``, in the file name, so a
pattern with more is refused. Prometheus's dns_sd has no server setting: an entry's
``nameserver`` cannot go into the file, and ``scrape_notes`` says so (the file's header and
``vigil rules prometheus``'s stderr). Two things the collector does that relabeling cannot: a
target found by two entries is scraped by both jobs, and two targets whose ``instance`` clash
are not renamed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from alerts.rules.model import prom_duration
from vigil.config import Config, DiscoveryConfig, TargetConfig
from vigil.conventions import (
    KIND_DCGM,
    KIND_VLLM,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_POOL,
    SCRAPE_JOB_PREFIX,
    TARGET_KINDS,
    VLLM_ESCAPED_PREFIX,
    VLLM_PREFIX,
)
from vigil.errors import ConfigError

__all__ = [
    "discovery_job",
    "relabel_replacement",
    "scrape_configs",
    "scrape_job",
    "scrape_notes",
    "split_url",
]

#: What Prometheus's file_sd accepts as a pattern (discovery/file/file.go ``patFileSDName``):
#: a ``*`` only in the last path element, and a .json / .yml / .yaml ending.
_FILE_SD_PATTERN = re.compile(r"^[^*]*(\*[^/]*)?\.(json|yml|yaml|JSON|YML|YAML)$")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def split_url(target: TargetConfig, key: str = "",
              file: str = "") -> tuple[str, str, str, dict[str, list[str]]]:
    """``(scheme, host:port, metrics_path, params)`` of a target's URL.

    Raises ``ConfigError`` (naming ``file`` and ``key``) for a URL with credentials, which
    would end up in the generated file.
    """
    parts = urlsplit(target.url)
    if parts.username is not None or parts.password is not None:
        raise ConfigError("a URL with credentials cannot go into a scrape config; configure "
                          "basic_auth in Prometheus instead", file=file or None, key=key or None)
    params = parse_qs(parts.query, keep_blank_values=True)
    return parts.scheme, parts.netloc, parts.path or "/", params


def relabel_replacement(value: str) -> str:
    """``value`` as a relabeling ``replacement`` that yields it verbatim (``$`` would start a
    reference to a regex group: ``$$`` is a literal one)."""
    return value.replace("$", "$$")


def scrape_job(config: Config, target: TargetConfig, key: str = "") -> dict[str, Any]:
    """The scrape job of one target (``key``: its config key, for error messages)."""
    scheme, address, path, params = split_url(target, key, config.source)
    job: dict[str, Any] = {
        "job_name": f"{SCRAPE_JOB_PREFIX}-{target.name}",
        "scrape_interval": prom_duration(config.scrape_interval(target)),
        "scrape_timeout": prom_duration(config.scrape_timeout(target)),
        "scheme": scheme,
        "metrics_path": path,
    }
    if params:
        job["params"] = params
    job.update({
        "honor_labels": False,
        "honor_timestamps": True,
        "static_configs": [{
            "targets": [address],
            "labels": {LABEL_POOL: target.pool, LABEL_KIND: target.kind,
                       **{k: target.labels[k] for k in sorted(target.labels)}},
        }],
        "relabel_configs": [
            {"target_label": LABEL_INSTANCE, "replacement": relabel_replacement(target.name)},
        ],
        "metric_relabel_configs": _metric_relabel_configs(),
    })
    return job


def _metric_relabel_configs() -> list[dict[str, Any]]:
    return [{
        "source_labels": ["__name__"],
        "regex": f"{VLLM_ESCAPED_PREFIX}(.+)",
        "target_label": "__name__",
        "replacement": f"{VLLM_PREFIX}${{1}}",
    }]


def _selected(config: Config, target: TargetConfig) -> bool:
    """Whether the rules read ``target``'s kind of series of its pool by a ``selector`` (or
    ``dcgm_selector``): then Prometheus scrapes them already, with the team's labels."""
    pool = next((p for p in config.pools if p.name == target.pool), None)
    if pool is None:
        return False
    return bool(pool.selector if target.kind == KIND_VLLM else pool.dcgm_selector)


def _base(config: Config) -> Path:
    """The folder relative file_sd patterns are relative to, as the collector resolves them."""
    return Path(config.source).resolve().parent if config.source else Path.cwd()


def _alternatives(values: list[str]) -> str:
    """A relabeling regex matching exactly one of ``values`` (relabeling anchors it)."""
    return "|".join(re.escape(v) for v in values)


def _address(url: str) -> str:
    """The ``host:port`` a URL connects to, as ``collector.discovery.address_of`` gives it."""
    u = httpx.URL(url)
    port = u.port or _DEFAULT_PORTS.get(u.scheme, 80)
    return f"[{u.host}]:{port}" if ":" in u.host else f"{u.host}:{port}"


def _file_sd(config: Config, d: DiscoveryConfig, index: int) -> dict[str, Any]:
    base = _base(config)
    files = []
    for j, pattern in enumerate(d.files):
        full = pattern if Path(pattern).is_absolute() else str(base / pattern)
        if not _FILE_SD_PATTERN.match(full):
            raise ConfigError(f"{pattern!r}: Prometheus's file_sd takes a '*' only in the "
                              "file name (one at most) and a .json, .yml or .yaml ending",
                              file=config.source or None, key=f"discovery[{index}].files[{j}]")
        files.append(full)
    return {"files": files, "refresh_interval": prom_duration(d.refresh_interval)}


def _sd_configs(config: Config, d: DiscoveryConfig, index: int) -> dict[str, Any]:
    refresh = prom_duration(d.refresh_interval)
    if d.mechanism == "file_sd":
        return {"file_sd_configs": [_file_sd(config, d, index)]}
    if d.mechanism == "http_sd":
        parts = urlsplit(d.url)
        if parts.username is not None or parts.password is not None:
            raise ConfigError("a URL with credentials cannot go into a scrape config; "
                              "configure basic_auth in Prometheus instead",
                              file=config.source or None, key=f"discovery[{index}].url")
        return {"http_sd_configs": [{"url": d.url, "refresh_interval": refresh}]}
    dns: dict[str, Any] = {"names": list(d.names), "type": d.type}
    if d.type != "SRV":
        dns["port"] = d.port
    dns["refresh_interval"] = refresh
    return {"dns_sd_configs": [dns]}


def _discovery_relabel_configs(config: Config, d: DiscoveryConfig) -> list[dict[str, Any]]:
    """Label a discovered target's ``pool`` and ``kind`` as the collector does, and drop the
    targets it would skip (see the module docs)."""
    rules: list[dict[str, Any]] = []
    if d.pool_label != LABEL_POOL:
        # Copied even when empty: the collector reads the pool from pool_label only.
        rules.append({"source_labels": [d.pool_label], "target_label": LABEL_POOL})
        rules.append({"action": "labeldrop", "regex": d.pool_label})
    if d.pool:
        rules.append({"source_labels": [LABEL_POOL], "regex": "", "target_label": LABEL_POOL,
                      "replacement": relabel_replacement(d.pool)})
    rules.append({"source_labels": [LABEL_KIND], "regex": "", "target_label": LABEL_KIND,
                  "replacement": d.kind})
    pools = [p.name for p in config.pools]
    if pools:
        rules.append({"source_labels": [LABEL_POOL], "regex": _alternatives(pools),
                      "action": "keep"})
    else:  # no pool to scrape for: the collector skips every target
        rules.append({"source_labels": ["__address__"], "regex": ".*", "action": "drop"})
    rules.append({"source_labels": [LABEL_KIND], "regex": _alternatives(list(TARGET_KINDS)),
                  "action": "keep"})
    selected = [f"{p.name};{kind}" for p in config.pools
                for kind, text in ((KIND_VLLM, p.selector), (KIND_DCGM, p.dcgm_selector))
                if text]
    if selected:
        rules.append({"source_labels": [LABEL_POOL, LABEL_KIND],
                      "regex": _alternatives(selected), "action": "drop"})
    static = list(dict.fromkeys(f"{_address(t.url)};{t.kind}" for t in config.targets))
    if static:
        rules.append({"source_labels": ["__address__", LABEL_KIND],
                      "regex": _alternatives(static), "action": "drop"})
    return rules


def discovery_job(config: Config, d: DiscoveryConfig, index: int = 0) -> dict[str, Any]:
    """The scrape job of one ``[[discovery]]`` entry (``index``: its place, for error
    messages). Raises ``ConfigError`` for what Prometheus cannot take (a file_sd pattern with
    a ``*`` outside the file name, a URL with credentials)."""
    interval = d.scrape_interval or config.collector.scrape_interval
    timeout = min(d.scrape_timeout or config.collector.scrape_timeout, interval)
    job: dict[str, Any] = {
        "job_name": f"{SCRAPE_JOB_PREFIX}-{d.name}",
        "scrape_interval": prom_duration(interval),
        "scrape_timeout": prom_duration(timeout),
        "scheme": d.scheme,
        "metrics_path": d.metrics_path,
        "honor_labels": False,
        "honor_timestamps": True,
        **_sd_configs(config, d, index),
        "relabel_configs": _discovery_relabel_configs(config, d),
        "metric_relabel_configs": _metric_relabel_configs(),
    }
    return job


def scrape_notes(config: Config) -> list[str]:
    """What the reader of the generated scrape jobs should know: relative file_sd paths made
    absolute, DNS servers Prometheus cannot be told about. One line each."""
    notes = []
    base = _base(config)
    for d in config.discovery:
        relative = [f for f in d.files if not Path(f).is_absolute()]
        if relative:
            notes.append(f"discovery {d.name}: file_sd paths relative to the Vigil config "
                         f"are written absolute, under {base}.")
        if d.nameserver:
            notes.append(f"discovery {d.name}: Prometheus's dns_sd has no nameserver setting; "
                         f"it asks its host's resolver, not {d.nameserver}.")
    return notes


def scrape_configs(config: Config) -> dict[str, Any]:
    """``{"scrape_configs": [...]}``: one job per ``[[targets]]`` entry, in config order,
    except the targets whose pool selects that kind of series by a selector: a second scrape
    would store the same samples twice, under Vigil's labels, where a selector on the team's
    own labels (``model_name``, say) could count them twice. Then one job per
    ``[[discovery]]`` entry (``discovery_job``).

    Raises ``ConfigError`` when two jobs would have the same name (a target and a discovery
    entry called alike)."""
    jobs = [scrape_job(config, t, f"targets[{i}].url")
            for i, t in enumerate(config.targets) if not _selected(config, t)]
    taken = {j["job_name"] for j in jobs}
    for i, d in enumerate(config.discovery):
        job = discovery_job(config, d, i)
        if job["job_name"] in taken:
            raise ConfigError(f"the scrape job {job['job_name']!r} of [[discovery]] {d.name!r} "
                              "has the name of a [[targets]] entry's job; rename one",
                              file=config.source or None, key=f"discovery[{i}].name")
        taken.add(job["job_name"])
        jobs.append(job)
    return {"scrape_configs": jobs}
