"""A load generator for vLLM-compatible endpoints (a replica or the gateway).

The role ``vllm bench serve`` plays for vLLM: Poisson or gamma arrivals at a rate that can be
steady, ramp, follow a compressed day or burst (or a fixed number of concurrent clients), a mix
of chat/completions, streaming, long-output outliers, FAQ repeats in other words, and priority
tiers; a progress bar; and a final report with TTFT, TPOT, ITL and e2e (mean, p50, p95, p99),
throughput and goodput against the SLOs (``--json`` for scripts). See ``workload`` for the
mix and ``report`` for the definitions; ``vigil_shell.loadgen_cli`` is the command.
"""

from serving.loadgen.client import Progress, generate
from serving.loadgen.report import RequestResult, Slo, format_report, summarize
from serving.loadgen.workload import SCENARIOS, TIERS, Workload, keyed_workload

__all__ = ["SCENARIOS", "TIERS", "Progress", "RequestResult", "Slo", "Workload", "format_report",
           "generate", "keyed_workload", "summarize"]
