"""What one run measured: per-request results and the summary ``vigil loadgen`` prints.

Definitions follow ``vllm bench serve`` so numbers can be compared with it:

* TTFT: from sending the request to the first generated token (first non-empty content
  chunk); streaming requests only.
* TPOT (time per output token, excluding the first): ``(e2e - ttft) / (output_tokens - 1)``
  per request with at least two output tokens.
* ITL (inter-token latency): every gap between consecutive content chunks, pooled over all
  requests.
* E2E: from sending to the last byte.
* Percentiles: linear interpolation between order statistics (``numpy.percentile``'s
  default, as vLLM's benchmark).
* Goodput: completed requests per second that met every SLO given (TTFT and e2e thresholds,
  seconds); a request without a TTFT (not streamed) is judged on e2e alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vigil.config import SloDefaults

__all__ = ["RequestResult", "Slo", "percentiles", "summarize"]

_PCTS = (50.0, 95.0, 99.0)


@dataclass
class RequestResult:
    """One request as the client saw it. Times in seconds."""

    tier: str
    kind: str
    stream: bool
    status: int = 0  # 0: no HTTP answer (connection error, or cancelled)
    ok: bool = False
    error: str = ""
    cancelled: bool = False
    ttft: float | None = None
    e2e: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    cache: str = ""  # the gateway's X-Vigil-Cache answer, when present

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first; None with fewer than two tokens."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


_SLO_DEFAULTS = SloDefaults()


@dataclass(frozen=True)
class Slo:
    """Goodput thresholds (seconds); None = not judged. The defaults are those of
    ``[slo_defaults]`` (``ttft_threshold_seconds``, ``e2e_threshold_seconds``)."""

    ttft: float | None = _SLO_DEFAULTS.ttft_threshold_seconds
    e2e: float | None = _SLO_DEFAULTS.e2e_threshold_seconds

    def met(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        if self.ttft is not None and r.ttft is not None and r.ttft > self.ttft:
            return False
        return not (self.e2e is not None and r.e2e is not None and r.e2e > self.e2e)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p95, p99 of ``values`` (None for no values)."""
    if not values:
        return {"mean": None, "p50": None, "p95": None, "p99": None}
    arr = np.asarray(values, dtype=float)
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    for p, v in zip(_PCTS, np.percentile(arr, _PCTS), strict=True):
        out[f"p{p:g}"] = float(v)
    return out


def summarize(results: Iterable[RequestResult], elapsed_s: float, slo: Slo) -> dict[str, Any]:
    """The run's report (JSON-ready): counts, latency percentiles, throughput, goodput."""
    results = list(results)
    done = [r for r in results if r.ok]
    elapsed = max(elapsed_s, 1e-9)
    status: dict[str, int] = {}
    for r in results:
        key = "cancelled" if r.cancelled else (str(r.status) if r.status else "no answer")
        status[key] = status.get(key, 0) + 1
    tiers: dict[str, dict[str, Any]] = {}
    for name in sorted({r.tier for r in results}):
        mine = [r for r in results if r.tier == name]
        ok = [r for r in mine if r.ok]
        tiers[name] = {
            "sent": len(mine),
            "completed": len(ok),
            "ttft_seconds": percentiles([r.ttft for r in ok if r.ttft is not None]),
            "e2e_seconds": percentiles([r.e2e for r in ok if r.e2e is not None]),
        }
    good = sum(1 for r in done if slo.met(r))
    output = sum(r.output_tokens for r in done)
    return {
        "duration_seconds": elapsed_s,
        "sent": len(results),
        "completed": len(done),
        "failed": sum(1 for r in results if not r.ok and not r.cancelled),
        "cancelled": sum(1 for r in results if r.cancelled),
        "status": dict(sorted(status.items())),
        "long_outputs": sum(1 for r in done if r.kind == "long"),
        "cache_hits": sum(1 for r in done if r.cache.startswith("hit")),
        "request_throughput": len(done) / elapsed,
        "output_token_throughput": output / elapsed,
        "total_output_tokens": output,
        "ttft_seconds": percentiles([r.ttft for r in done if r.ttft is not None]),
        "tpot_seconds": percentiles([t for r in done if (t := r.tpot) is not None]),
        "itl_seconds": percentiles([g for r in done for g in r.itl]),
        "e2e_seconds": percentiles([r.e2e for r in done if r.e2e is not None]),
        # Generated tokens per completed request, as the SLO engine's tokens per request.
        "output_tokens": percentiles([float(r.output_tokens) for r in done]),
        "slo": {"ttft_seconds": slo.ttft, "e2e_seconds": slo.e2e},
        "good_requests": good,
        "goodput": good / elapsed,
        "by_tier": tiers,
    }


def _ms(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v * 1000:.1f}"


def format_report(report: dict[str, Any]) -> str:
    """The report as a table that fits 100 columns."""
    lines = [
        f"duration {report['duration_seconds']:.1f} s: sent {report['sent']}, completed "
        f"{report['completed']}, failed {report['failed']}, cancelled {report['cancelled']}",
        "status: " + ", ".join(f"{k} x{v}" for k, v in report["status"].items()),
        f"throughput {report['request_throughput']:.2f} req/s, "
        f"{report['output_token_throughput']:.1f} output tok/s; goodput "
        f"{report['goodput']:.2f} req/s ({report['good_requests']} met TTFT <= "
        f"{report['slo']['ttft_seconds']} s and e2e <= {report['slo']['e2e_seconds']} s)",
        f"long outputs {report['long_outputs']}, cache hits {report['cache_hits']}",
        "",
        f"{'(ms)':<6}{'mean':>10}{'p50':>10}{'p95':>10}{'p99':>10}",
    ]
    for key, name in (("ttft_seconds", "TTFT"), ("tpot_seconds", "TPOT"),
                      ("itl_seconds", "ITL"), ("e2e_seconds", "E2E")):
        p = report[key]
        lines.append(f"{name:<6}{_ms(p['mean']):>10}{_ms(p['p50']):>10}{_ms(p['p95']):>10}"
                     f"{_ms(p['p99']):>10}")
    if report["by_tier"]:
        lines += ["", f"{'tier':<10}{'sent':>7}{'done':>7}{'TTFT p95 ms':>14}{'E2E p95 ms':>13}"]
        for name, t in report["by_tier"].items():
            lines.append(f"{name:<10}{t['sent']:>7}{t['completed']:>7}"
                         f"{_ms(t['ttft_seconds']['p95']):>14}{_ms(t['e2e_seconds']['p95']):>13}")
    return "\n".join(lines)
