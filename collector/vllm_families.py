"""The vLLM families Vigil reads, and what to say when a target's /metrics lacks one.

vLLM renames and drops metrics between releases (``vllm:gpu_cache_usage_perc`` became
``vllm:kv_cache_usage_perc`` in 0.9; the V0 engine had names V1 never had). A query for a name
the server no longer exposes answers nothing, which reads as "no data", or as 0 once summed:
the SLO, the scaling signal or the capacity figure goes silently wrong. So the collector checks
every full parse of a vLLM target against ``REQUIRED_FAMILIES`` and records on the target's
health, per missing family, what needs it, the older name the target exposes instead (if any)
and the vLLM version (``GET /version``, and the V0 names when present). The samples are stored
all the same.

The warnings are kept in ``TargetHealth.error`` while the target is up, one per line (the
store's health record has that one text column; a down target's ``error`` is its failure
reason and the warnings of its last successful scrape are not repeated there):
``health_warnings`` reads them back, ``missing_family_warning`` finds the one for a family.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable
from typing import Any, NamedTuple

from vigil.conventions import (
    KIND_VLLM,
    SUFFIX_BUCKET,
    VLLM_CACHE_CONFIG_INFO,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_HTTP_REQUESTS,
    VLLM_ITL,
    VLLM_KV_CACHE_USAGE,
    VLLM_OLD_GPU_CACHE_USAGE,
    VLLM_OLD_GPU_PREFIX_CACHE_HITS,
    VLLM_OLD_GPU_PREFIX_CACHE_QUERIES,
    VLLM_OLD_TIME_PER_OUTPUT_TOKEN,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_PROMPT_TOKENS_HIST,
    VLLM_QUEUE_TIME,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
    VLLM_TTFT,
    VLLM_V0_CPU_CACHE_USAGE,
    VLLM_V0_GPU_PREFIX_CACHE_HIT_RATE,
    VLLM_V0_NUM_REQUESTS_SWAPPED,
    VLLM_V0_TIME_IN_QUEUE,
    VLLM_VERSION_PATH,
)
from vigil.model import TargetHealth

__all__ = [
    "COMPLETE",
    "REQUIRED_FAMILIES",
    "FamilyCheck",
    "RequiredFamily",
    "VersionAnswer",
    "check_families",
    "declared_names",
    "families_for_indicator",
    "health_warnings",
    "join_warnings",
    "missing_family_warning",
    "parse_version",
]


class RequiredFamily(NamedTuple):
    """A family Vigil reads from every vLLM target.

    ``name`` is as /metrics spells it (a counter with its ``_total``, a histogram's base name);
    ``needed_for`` says in words what reads it; ``indicators`` are the SLO indicators whose SLI
    it is (``vigil slo status`` names the family when such an SLI has no data).
    """

    name: str
    needed_for: str
    histogram: bool = False
    indicators: tuple[str, ...] = ()

    def present(self, names: Collection[str]) -> bool:
        """Whether a scrape whose sample names are ``names`` exposes this family."""
        return (self.name + SUFFIX_BUCKET if self.histogram else self.name) in names


REQUIRED_FAMILIES: tuple[RequiredFamily, ...] = (
    RequiredFamily(VLLM_TTFT, "the TTFT SLO, TTFT quantiles and scaling on TTFT p95",
                   histogram=True, indicators=("ttft",)),
    RequiredFamily(VLLM_E2E, "the e2e SLO and e2e quantiles", histogram=True,
                   indicators=("e2e",)),
    RequiredFamily(VLLM_REQUEST_SUCCESS,
                   "the error-rate SLO, cost per request and scaling on request rate",
                   indicators=("error_rate",)),
    RequiredFamily(VLLM_HTTP_REQUESTS,
                   "the availability SLO without the gateway's records, and the 5xx answers "
                   "of the error-rate SLO", indicators=("availability",)),
    RequiredFamily(VLLM_GENERATION_TOKENS, "cost per output token and observed capacity"),
    RequiredFamily(VLLM_KV_CACHE_USAGE, "scaling on KV-cache usage and the KvCacheUsageHigh alert"),
    RequiredFamily(VLLM_REQUESTS_WAITING, "scaling on queue length"),
    RequiredFamily(VLLM_REQUESTS_RUNNING, "the idle share of cost and observed capacity"),
    RequiredFamily(VLLM_QUEUE_TIME, "queue-time quantiles", histogram=True),
    RequiredFamily(VLLM_ITL, "inter-token latency quantiles", histogram=True),
    RequiredFamily(VLLM_PROMPT_TOKENS_HIST, "prompt tokens per request and token anomalies",
                   histogram=True),
    RequiredFamily(VLLM_GENERATION_TOKENS_HIST,
                   "generated tokens per request and token anomalies", histogram=True),
    RequiredFamily(VLLM_CACHE_CONFIG_INFO, "KV-cache capacity in gateway routing"),
    RequiredFamily(VLLM_PREFIX_CACHE_QUERIES, "the prefix-cache hit rate"),
    RequiredFamily(VLLM_PREFIX_CACHE_HITS, "the prefix-cache hit rate"),
)


class _Former(NamedTuple):
    """What an older vLLM exposes where a required family would be."""

    new: str
    old: str
    histogram: bool
    note: str


#: First match wins per required family (tests/fixtures/vllm_metrics_reference.md, section 3).
_FORMER_NAMES = (
    _Former(VLLM_KV_CACHE_USAGE, VLLM_OLD_GPU_CACHE_USAGE, False, "its name before vLLM 0.9"),
    _Former(VLLM_PREFIX_CACHE_QUERIES, VLLM_OLD_GPU_PREFIX_CACHE_QUERIES, False,
            "its name before vLLM 0.9, counted in blocks in 0.8"),
    _Former(VLLM_PREFIX_CACHE_HITS, VLLM_OLD_GPU_PREFIX_CACHE_HITS, False,
            "its name before vLLM 0.9, counted in blocks in 0.8"),
    _Former(VLLM_PREFIX_CACHE_QUERIES, VLLM_V0_GPU_PREFIX_CACHE_HIT_RATE, False,
            "the V0 engine's hit-rate gauge in place of the counters"),
    _Former(VLLM_PREFIX_CACHE_HITS, VLLM_V0_GPU_PREFIX_CACHE_HIT_RATE, False,
            "the V0 engine's hit-rate gauge in place of the counters"),
    _Former(VLLM_ITL, VLLM_OLD_TIME_PER_OUTPUT_TOKEN, True, "its name before vLLM 0.10"),
)

#: Sample names only the V0 engine exposed.
_V0_NAMES = (VLLM_V0_NUM_REQUESTS_SWAPPED, VLLM_V0_CPU_CACHE_USAGE,
             VLLM_V0_GPU_PREFIX_CACHE_HIT_RATE, VLLM_V0_TIME_IN_QUEUE + SUFFIX_BUCKET)

_V0_TEXT = "V0 engine (the default engine before vLLM 0.8)"


class VersionAnswer(NamedTuple):
    """What ``GET /version`` told: the version, or why there is none."""

    version: str
    error: str = ""

    def describe(self) -> str:
        if self.version:
            return f"vLLM {self.version} (GET {VLLM_VERSION_PATH})"
        return f"vLLM version unknown (GET {VLLM_VERSION_PATH}: {self.error})"


#: A version as vLLM spells one ("0.6.6.post1", "0.11.0rc2", "0.10.1+cu126"); anything else
#: is not put into a message.
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+_-]{0,39}")


def parse_version(body: bytes) -> VersionAnswer:
    """The answer of ``GET /version`` (``{"version": "0.32.0"}``) as a ``VersionAnswer``."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return VersionAnswer("", "not JSON")
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        return VersionAnswer("", "no version in the answer")
    return VersionAnswer(version)


class FamilyCheck(NamedTuple):
    """One exposition checked against ``REQUIRED_FAMILIES``.

    ``missing``: the required families it lacks, in ``REQUIRED_FAMILIES`` order; ``former``:
    per missing family, the older name it exposes instead and what that name is; ``v0``:
    whether it has names only the V0 engine exposed.
    """

    missing: tuple[RequiredFamily, ...] = ()
    former: tuple[tuple[str, str, str], ...] = ()
    v0: bool = False

    def warnings(self, version: VersionAnswer | None = None) -> list[str]:
        """One line per missing family: the family, what needs it, the older name the target
        has instead and what is known of its vLLM version (``version``: ``GET /version``'s
        answer, None when it was not asked)."""
        server = [version.describe()] if version is not None else []
        if self.v0:
            server.append(_V0_TEXT)
        where = f"; {', '.join(server)}" if server else ""
        former = {new: (old, note) for new, old, note in self.former}
        out = []
        for family in self.missing:
            text = f"{family.name} missing (needed for {family.needed_for})"
            if family.name in former:
                old, note = former[family.name]
                text += f"; this target exposes {old}, {note}"
            out.append(text + where)
        return out


#: A complete exposition: nothing to say.
COMPLETE = FamilyCheck()


def declared_names(families: Iterable[Any]) -> frozenset[str]:
    """The sample names the families declared without a sample yet would have: a labelled
    family has no child before its first observation (vLLM's ``http_requests_total`` before
    the first request, prometheus-fastapi-instrumentator creating it lazily), yet the target
    exposes it. ``families``: prometheus_client ``Metric`` objects (a counter named without
    ``_total``)."""
    out: set[str] = set()
    for f in families:
        if f.samples:
            continue
        if f.type == "counter":
            out.add(f.name + "_total")
        elif f.type == "histogram":
            out.update((f.name + SUFFIX_BUCKET, f.name + "_count", f.name + "_sum"))
        else:
            out.add(f.name)
    return frozenset(out)


def check_families(names: Collection[str]) -> FamilyCheck:
    """Check one scrape of a vLLM target, given the names of its samples (``vllm:`` spelled
    with the colon, as the store keeps them)."""
    missing = tuple(f for f in REQUIRED_FAMILIES if not f.present(names))
    if not missing:
        return COMPLETE
    lacking = {f.name for f in missing}
    former: dict[str, tuple[str, str, str]] = {}
    for f in _FORMER_NAMES:
        if f.new in lacking and f.new not in former and (
                f.old + SUFFIX_BUCKET if f.histogram else f.old) in names:
            former[f.new] = (f.new, f.old, f.note)
    return FamilyCheck(missing, tuple(former.values()), any(n in names for n in _V0_NAMES))


def families_for_indicator(indicator: str) -> tuple[RequiredFamily, ...]:
    """The required families an SLO indicator's SLI is computed from."""
    return tuple(f for f in REQUIRED_FAMILIES if indicator in f.indicators)


def health_warnings(health: TargetHealth) -> list[str]:
    """The warnings recorded on a target's health: those of its last scrape when it is up
    (a down target's ``error`` is why it is down)."""
    if not health.up or health.kind != KIND_VLLM or not health.error:
        return []
    return health.error.splitlines()


def missing_family_warning(health: TargetHealth, family: str) -> str | None:
    """The warning a target's health holds for the missing ``family``, or None."""
    prefix = f"{family} missing"
    return next((w for w in health_warnings(health) if w.startswith(prefix + " ")
                 or w == prefix), None)


def join_warnings(warnings: Iterable[str]) -> str:
    """The text of ``TargetHealth.error`` for an up target with these warnings."""
    return "\n".join(warnings)
