"""Pipeline step 6 of ``alerts.rules``: Prometheus scrape jobs for the configured targets.

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
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from alerts.rules_model import prom_duration
from vigil.config import Config, TargetConfig
from vigil.conventions import (
    KIND_VLLM,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_POOL,
    SCRAPE_JOB_PREFIX,
    VLLM_ESCAPED_PREFIX,
    VLLM_PREFIX,
)
from vigil.errors import ConfigError

__all__ = ["relabel_replacement", "scrape_configs", "scrape_job", "split_url"]


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
        "metric_relabel_configs": [{
            "source_labels": ["__name__"],
            "regex": f"{VLLM_ESCAPED_PREFIX}(.+)",
            "target_label": "__name__",
            "replacement": f"{VLLM_PREFIX}${{1}}",
        }],
    })
    return job


def _selected(config: Config, target: TargetConfig) -> bool:
    """Whether the rules read ``target``'s kind of series of its pool by a ``selector`` (or
    ``dcgm_selector``): then Prometheus scrapes them already, with the team's labels."""
    pool = next((p for p in config.pools if p.name == target.pool), None)
    if pool is None:
        return False
    return bool(pool.selector if target.kind == KIND_VLLM else pool.dcgm_selector)


def scrape_configs(config: Config) -> dict[str, Any]:
    """``{"scrape_configs": [...]}``: one job per ``[[targets]]`` entry, in config order,
    except the targets whose pool selects that kind of series by a selector: a second scrape
    would store the same samples twice, under Vigil's labels, where a selector on the team's
    own labels (``model_name``, say) could count them twice."""
    return {"scrape_configs": [scrape_job(config, t, f"targets[{i}].url")
                               for i, t in enumerate(config.targets)
                               if not _selected(config, t)]}
