"""A known history for the chargeback tests, every figure computable by hand.

Four hours from ``T0`` (2026-11-10 00:00 UTC), replicas scraped every 15 s exactly:

* pool ``chat`` (H100, one GPU per replica, $3.60/GPU-hour, so $0.001 a second, until
  ``T0 + 2 h``, when ``[[cost.prices]]`` raises it to $7.20): ``chat-0`` up all along;
  ``chat-1`` joins at ``T0 + 1 h`` (a scale-out mid-window). Pool cost: chat-0 2 h × 3.6 +
  2 h × 7.2 = 21.6, chat-1 1 h × 3.6 + 2 h × 7.2 = 18.0; 39.6 in all.
* pool ``code`` (L40S at $1.80, two GPUs per replica: $0.001 a second a replica):
  ``code-0`` up for the first two hours only. Pool cost 7.2.

The requests (seconds after ``T0``; two gateway instances ``gw-a`` and ``gw-b`` write them,
and one comes from a router over OpenTelemetry without a replica):

=====  ========  ====  =======  ==================================================  ======
id     tenant    tier  replica  what                                                cost
=====  ========  ====  =======  ==================================================  ======
r1     acme      prem  chat-0   100-400, first token at 200; alone but 300-400      0.25
r2     globex    std   chat-0   300-500 not streamed; shares 300-400 half and half  0.15
r3     initech   bat   chat-0   1000-1600, 800 of 1000 prompt tokens cached         0.60
r4     acme      std   chat-0   2000-2100 cancelled, tokens unknown                 0.10
r5     acme      prem  --       a cache hit (saved 0.25)                            0
r6     globex    std   --       refused (429)                                       0
r7     initech   std   chat-1   4000-4600 (gw-b); shares 4300-4500 with r8          0.50
r8     acme      prem  chat-1   4300-4500 not streamed (gw-a)                       0.10
r9     globex    prem  chat-0   8000-8300 timed out, tokens unknown, at $0.002/s    0.60
r11    globex    bat   code-0   600-1800                                            1.20
r12    initech   std   (none)   3000-3300 over OTLP, no replica: code-0 ran alone   0.30
=====  ========  ====  =======  ==================================================  ======

vLLM's counters show each request's tokens as vLLM counts them (prompt tokens when the first
token is out, output tokens as they are generated), plus 3,000 output tokens on ``chat-0`` in
``(T0 + 7200, T0 + 7500]`` that no record knows: that step's 300 s at $0.002 are unattributed
(0.60). The hour ``T0 + 1 h`` to ``T0 + 2 h`` on ``chat-0`` has no request at all (idle).

So: chat = 2.30 (requests) + 0.60 (unattributed) + 36.70 (idle) = 39.60; code = 1.50 +
5.70 (idle) = 7.20; per tenant acme 0.45, globex 1.95, initech 1.40.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from support.prometheus import PromSeries
from vigil.config import Config, parse_config
from vigil.model import SeriesKey, labels_of
from vigil.storage.gateway_records import GatewayRecord

T0 = datetime(2026, 11, 10, tzinfo=UTC).timestamp()
SPAN_S = 4 * 3600
SCRAPE_S = 15
MODEL_CHAT = "meta-llama/Llama-3.1-8B-Instruct"
MODEL_CODE = "Qwen/Qwen2.5-Coder-7B-Instruct"
#: The replicas: (pool, model, up from, up until), seconds after T0.
REPLICAS = {
    "chat-0": ("chat", MODEL_CHAT, 0, SPAN_S),
    "chat-1": ("chat", MODEL_CHAT, 3600, SPAN_S),
    "code-0": ("code", MODEL_CODE, 0, 7200),
}
#: Expected figures (USD), by hand (see the module docstring).
EXPECTED_RUNS = {"r1": 0.25, "r2": 0.15, "r3": 0.60, "r4": 0.10, "r7": 0.50, "r8": 0.10,
                 "r9": 0.60, "r11": 1.20, "r12": 0.30}
EXPECTED_POOLS = {"chat": (39.6, 0.6, 36.7), "code": (7.2, 0.0, 5.7)}  # cost, unattr., idle
EXPECTED_TENANTS = {"acme": 0.45, "globex": 1.95, "initech": 1.40}
UNATTRIBUTED_TOKENS = 3000
UNATTRIBUTED_STEP = (7200, 7500)


def config(tmp: Path, budgets: list[dict[str, Any]] | None = None, **cost: Any) -> Config:
    """The history's config: records in ``tmp/records.sqlite``; ``cost``: ``[cost]`` keys."""
    return parse_config(config_data(tmp, budgets, **cost), file=str(tmp / "vigil.toml"))


def write_config(tmp: Path, budgets: list[dict[str, Any]] | None = None, **cost: Any) -> Path:
    """The history's config as ``tmp/vigil.toml``."""
    path = tmp / "vigil.toml"
    path.write_text(_toml(config_data(tmp, budgets, **cost)))
    return path


def _toml(doc: dict[str, Any], prefix: str = "") -> str:
    """``doc`` as TOML (strings, numbers, booleans, lists, tables, arrays of tables)."""
    scalars, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append(f"\n[{prefix}{k}]\n" + _toml(v, f"{prefix}{k}."))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            tables += [f"\n[[{prefix}{k}]]\n" + _toml(x, f"{prefix}{k}.") for x in v]
        else:
            scalars.append(f"{k} = {json.dumps(v)}")
    return "\n".join(scalars) + "\n" + "".join(tables)


def config_data(tmp: Path, budgets: list[dict[str, Any]] | None = None,
                **cost: Any) -> dict[str, Any]:
    """The history's config as a parsed TOML document."""
    price_change = datetime.fromtimestamp(T0 + 7200, UTC).isoformat()
    return {
        "store": {"path": str(tmp / "store.sqlite")},
        "pools": [{"name": "chat", "model": MODEL_CHAT, "gpu": "H100"},
                  {"name": "code", "model": MODEL_CODE, "gpu": "L40S", "gpus_per_replica": 2}],
        "targets": [{"name": n, "url": f"http://127.0.0.1:{9 + i}/metrics", "pool": p}
                    for i, (n, (p, _, _, _)) in enumerate(REPLICAS.items())],
        "prices": {"H100": 3.6, "L40S": 1.8},
        "gateway": {"records_path": str(tmp / "records.sqlite"), "api_keys": [
            {"sha256": f"{i:064x}", "tenant": t, "tier": "standard"}
            for i, t in enumerate(("acme", "globex"), start=1)]},
        "cost": {"prices": [{"pool": "chat", "since": price_change, "per_gpu_hour": 7.2}],
                 "tenants": ["initech"], **cost},
        "slos": [{"name": "chat-ttft", "pool": "chat", "indicator": "ttft",
                  "threshold_seconds": 150.0},
                 {"name": "code-e2e", "pool": "code", "indicator": "e2e",
                  "threshold_seconds": 1000.0}],
        "budgets": budgets or [],
    }


@dataclass(frozen=True)
class Req:
    """One request of the history (seconds after T0)."""

    id: str
    tenant: str
    tier: str
    pool: str
    replica: str
    start: float
    end: float
    first: float | None
    prompt: int
    cached: int
    output: int
    writer: str = "gw-a"
    error_class: str = ""
    status: int = 200
    cache_hit: str = ""
    tokens_source: str = "usage"


REQUESTS = (
    Req("r1", "acme", "premium", "chat", "chat-0", 100, 400, 200, 400, 0, 300),
    Req("r2", "globex", "standard", "chat", "chat-0", 300, 500, None, 40, 0, 290),
    Req("r3", "initech", "batch", "chat", "chat-0", 1000, 1600, 1100, 1000, 800, 500),
    Req("r4", "acme", "standard", "chat", "chat-0", 2000, 2100, None, 0, 0, 0,
        error_class="client_cancel", status=499, tokens_source="unknown"),
    Req("r5", "acme", "premium", "chat", "", 2200, 2200.01, None, 400, 0, 300,
        cache_hit="l1"),
    Req("r6", "globex", "standard", "chat", "", 2300, 2300.001, None, 0, 0, 0,
        error_class="rejected", status=429, tokens_source="unknown"),
    Req("r7", "initech", "standard", "chat", "chat-1", 4000, 4600, 4100, 100, 0, 500,
        writer="gw-b"),
    Req("r8", "acme", "premium", "chat", "chat-1", 4300, 4500, None, 100, 0, 175),
    Req("r9", "globex", "premium", "chat", "chat-0", 8000, 8300, None, 0, 0, 0,
        error_class="timeout", status=504, tokens_source="unknown"),
    Req("r11", "globex", "batch", "code", "code-0", 600, 1800, 700, 200, 0, 1100),
    Req("r12", "initech", "standard", "code", "", 3000, 3300, 3050, 50, 0, 250, writer="otlp"),
)


def record(r: Req) -> GatewayRecord:
    """The request as its gateway (or the OTLP receiver) recorded it."""
    model = MODEL_CHAT if r.pool == "chat" else MODEL_CODE
    return GatewayRecord(
        id=f"{r.writer}-{r.id}", start_s=T0 + r.start, ts_s=T0 + r.end, pool=r.pool,
        model=model, endpoint="chat", tenant=r.tenant, tier=r.tier, key_id="k",
        replica=r.replica, status=r.status, stream=r.first is not None,
        prompt_tokens=r.prompt, completion_tokens=r.output, tokens_source=r.tokens_source,
        ttft_s=None if r.first is None else r.first - r.start,
        e2e_s=None if r.error_class == "rejected" else r.end - r.start, queue_s=0.0,
        error=r.error_class == "timeout", error_class=r.error_class, cache_hit=r.cache_hit,
        requested_max_tokens=None, max_tokens=None, max_tokens_decision="",
        cost_usd=None, saved_usd=0.25 if r.cache_hit else None, upstream_id="", batch_id="",
        message="", cached_tokens=r.cached or None)


def write_records(path: Path, requests: tuple[Req, ...] = REQUESTS) -> None:
    """The records, each written by its own instance's ``RecordWriter`` into one file."""
    from serving.gateway.telemetry.record_writer import RecordWriter

    for writer_name in sorted({r.writer for r in requests}):
        w = RecordWriter(path)
        w.start()
        for r in requests:
            if r.writer == writer_name:
                w.put(record(r))
        assert w.flush(10)
        w.close()


def _sample_times(lo: float, hi: float) -> list[float]:
    """The scrape times of a replica up over ``(lo, hi]``: each stands for the 15 s before."""
    return [T0 + t for t in range(int(lo) + SCRAPE_S, int(hi) + 1, SCRAPE_S)]


def _counter_values(replica: str) -> dict[str, list[tuple[float, float]]]:
    """vLLM's three token counters of ``replica`` at each scrape (see the module docstring)."""
    _, _, up_from, up_to = REPLICAS[replica]
    times = _sample_times(up_from, up_to)
    prompt = dict.fromkeys(times, 0.0)
    hits = dict.fromkeys(times, 0.0)
    gen = dict.fromkeys(times, 0.0)
    # r12 names no replica; code-0 is the only one of its pool that ran.
    mine = [r for r in REQUESTS if (r.replica or ("code-0" if r.writer == "otlp" else ""))
            == replica]
    for r in mine:
        if r.tokens_source == "unknown" or r.cache_hit:
            continue
        counted = T0 + (r.first if r.first is not None else r.start)
        t_prompt = min(t for t in times if t >= counted)
        prompt[t_prompt] += r.prompt
        hits[t_prompt] += r.cached
        d0 = T0 + (r.first if r.first is not None else r.start)
        d1 = T0 + r.end
        for t in times:
            overlap = min(t, d1) - max(t - SCRAPE_S, d0)
            if overlap > 0:
                gen[t] += r.output * overlap / (d1 - d0)
    if replica == "chat-0":
        lo, hi = UNATTRIBUTED_STEP
        extra = [t for t in times if T0 + lo < t <= T0 + hi]
        for t in extra:
            gen[t] += UNATTRIBUTED_TOKENS / len(extra)
    out = {}
    for name, per in (("vllm:prompt_tokens_total", prompt), ("vllm:prefix_cache_hits_total", hits),
                      ("vllm:generation_tokens_total", gen)):
        value, points = 0.0, []
        for t in times:
            value += per[t]
            points.append((t, value))
        out[name] = points
    return out


def series() -> list[PromSeries]:
    """Every series of the history, as loaded into a Prometheus."""
    out = []
    for replica, (pool, model, up_from, up_to) in REPLICAS.items():
        base = {"pool": pool, "kind": "vllm", "instance": replica}
        out.append(PromSeries("up", base, [(round(t * 1000), 1.0)
                                           for t in _sample_times(up_from, up_to)]))
        for name, points in _counter_values(replica).items():
            out.append(PromSeries(name, {**base, "model_name": model, "engine": "0"},
                                  [(round(t * 1000), v) for t, v in points]))
    return out


def write_store(path: Path) -> None:
    """The series into a new embedded store at ``path``."""
    from collector.store import Store

    rows = []
    for s in series():
        kind = "gauge" if s.name == "up" else "counter"
        key = SeriesKey(s.name, labels_of(s.labels))
        rows += [(key, kind, ts, v) for ts, v in s.samples]
    with Store(path) as store:
        store.write(rows)
