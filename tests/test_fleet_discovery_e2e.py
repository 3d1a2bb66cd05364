"""The whole fleet on loopback, found the way Kubernetes finds it, read the way a team reads it.

Simulated vLLM replicas are listed in one file_sd file, a group per pod with its Kubernetes
labels (``fleet_k8s``). A real Prometheus 2.42 discovers them from that file and relabels them
to those labels only: no ``pool``, no ``kind`` on any scraped series. Vigil's config chooses the
pool by ``selector = 'namespace="llm", service="chat-vllm"'`` with ``replica_label = "pod"`` and
has a ``[[discovery]]`` reading the same file (its groups' ``pool`` label names the pool for
Vigil). `vigil collect` scrapes them into the store, `vigil gateway` routes to them, and the
rules `vigil rules prometheus` writes for this config run in that Prometheus, every second.

Checked:

* every scraped series carries the Kubernetes labels and neither ``pool`` nor ``kind``; the
  rules' outputs carry ``pool``;
* each recorded sample equals the engine reading the same Prometheus (``PrometheusSource``) at
  the sample's own timestamp, to 1e-9 relative. Two kinds of sample cannot be compared that
  way, and are counted apart: one whose rule reads what a rule of another group recorded (that
  group ran at another instant), and one whose instant fell while a scrape of the pool was
  still being appended (a scrape is stamped when it starts and lands ``scrape_duration``
  later: the rule at that instant did not see it, a query made afterwards does);
* a pod added to the file mid-test is scraped by Prometheus and by Vigil's collector, gets
  requests through the gateway, and is billed (``slo.cost.pool.up_seconds``, on the store and on
  Prometheus) from its first sample on; a pod removed from the file stops being billed (its
  series go stale) and gets no more requests.
"""

from __future__ import annotations

import contextlib
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.fleet_k8s import (
    K8S_LABELS,
    NAMESPACE,
    POD_PREFIX,
    SERVICE,
    Load,
    live_prometheus,
    prometheus_yml,
    write_file_sd,
)
from support.loopback import free_port, wait_for
from support.prometheus import PrometheusServer

from alerts.rules.engine_value import engine_value
from alerts.rules.pipeline import Rule, RulesOptions, RulesResult, generate
from collector.store import Store
from serving.gateway.front.api_keys import key_sha256
from serving.sim.testing import FleetHandle, running_fleet, sample_values
from slo.cost.pool import up_seconds
from slo.sources.embedded import EmbeddedSource
from slo.sources.prometheus import PrometheusSource
from vigil.config import Config, load_config
from vigil.selectors import as_selector

# Serial: the recorded samples are compared at the instants Prometheus evaluated them, and
# an evaluation or scrape that other tests on the same cores delay moves the instants.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
POOL = "chat"
KEY = "sk-fleet-e2e"
REL_TOL = 1e-9
#: Seconds a scrape may still be landing after it ended (parse and append, on a busy machine).
APPEND_SLACK_S = 0.05
#: Names of the series the rules record (their outputs, not scraped).
OUTPUTS = re.compile(r"^(slo:|vigil:|ALERTS)")


def vigil_toml(sd_file: Path, gateway_port: int) -> str:
    """The pool by selector and replica label, discovery over the same file, 1 s scrapes."""
    return f"""
[store]
path = "vigil.db"
[collector]
scrape_interval = "1s"
scrape_timeout = "900ms"
[engine]
promql_semantics = "2"
window = "30s"
[[pools]]
name = "{POOL}"
model = "{MODEL}"
selector = 'namespace="{NAMESPACE}", service="{SERVICE}"'
replica_label = "pod"
[[discovery]]
name = "k8s"
files = ["{sd_file}"]
refresh_interval = "1s"
[[slos]]
name = "chat-ttft"
pool = "{POOL}"
indicator = "ttft"
threshold_seconds = 0.05
objective = 0.9
[[slos]]
name = "chat-errors"
pool = "{POOL}"
indicator = "error_rate"
[gateway]
listen = "127.0.0.1:{gateway_port}"
records_path = "gateway.db"
health_interval = "500ms"
[[gateway.api_keys]]
sha256 = "{key_sha256(KEY)}"
tenant = "e2e"
tier = "standard"
"""


@dataclass
class World:
    tmp: Path
    config: Config
    result: RulesResult
    prom: PrometheusServer
    fleet: FleetHandle
    sd_file: Path
    gateway_url: str
    load: Load
    procs: dict[str, subprocess.Popen[bytes]]

    def pods(self) -> dict[str, str]:
        """Every replica of the fleet as pod name -> ``host:port``."""
        return {f"{POD_PREFIX}{i}": f"{self.fleet.host}:{p}"
                for i, p in enumerate(self.fleet.ports)}

    def list_pods(self, *names: str) -> None:
        write_file_sd(self.sd_file, {n: a for n, a in self.pods().items() if n in names},
                      pool=POOL)

    def alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode}:\n"
                                     f"{p.communicate()[1].decode()[-3000:]}")


def _vigil(tmp: Path, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "vigil_shell.cli", *argv], cwd=tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("fleet-e2e")
    sd_file = tmp / "pods.json"
    gateway_port = free_port()
    with running_fleet(3, subprocess=True, model=MODEL) as fleet, contextlib.ExitStack() as stack:
        cfg_path = tmp / "vigil.toml"
        cfg_path.write_text(vigil_toml(sd_file, gateway_port))
        config = load_config(cfg_path)
        pods = {f"{POD_PREFIX}{i}": f"{fleet.host}:{p}" for i, p in enumerate(fleet.ports)}
        write_file_sd(sd_file, {n: pods[n] for n in (f"{POD_PREFIX}0", f"{POD_PREFIX}1")},
                      pool=POOL)
        # The rules as the command writes them, loaded as they are.
        subprocess.run([sys.executable, "-m", "vigil_shell.cli", "rules", "prometheus",
                        "--config", str(cfg_path), "--out", str(tmp), "--interval", "1s",
                        "--period-interval", "1s"], check=True, capture_output=True, timeout=120)
        result = generate(config, RulesOptions(interval_s=1.0, period_interval_s=1.0))
        assert (tmp / "vigil-slo-rules.yml").read_text() == result.slo_rules_text()
        prom = stack.enter_context(live_prometheus(
            tmp, prometheus_yml(sd_file, ["vigil-slo-rules.yml", "vigil-alert-rules.yml"])))
        procs = {"vigil collect": _vigil(tmp, "collect", "--config", str(cfg_path)),
                 "vigil gateway": _vigil(tmp, "gateway", "--config", str(cfg_path))}
        for p in procs.values():
            stack.callback(_stop, p)
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        w = World(tmp, config, result, prom, fleet, sd_file, gateway_url,
                  Load(gateway_url, KEY, MODEL), procs)

        def gateway_up() -> bool:
            w.alive()
            return httpx.get(gateway_url + "/health", timeout=2).status_code == 200

        wait_for("the gateway serving", gateway_up, 30, ignore=(httpx.HTTPError,))
        stack.enter_context(w.load)
        yield w


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()


def _pods_up(prom: PrometheusServer) -> dict[str, float]:
    return {dict(k)["pod"]: v for k, v in prom.query("up", time.time()).items()}


def _scraped_series(prom: PrometheusServer) -> list[dict[str, str]]:
    data = prom._get("/api/v1/series", {"match[]": '{__name__=~".+"}',
                                        "start": repr(time.time() - 60)})["data"]
    return [s for s in data if not OUTPUTS.match(s["__name__"])]


def test_prometheus_keeps_only_the_kubernetes_labels(world: World) -> None:
    prom = world.prom
    wait_for("both pods scraped", lambda: _pods_up(prom) == {
        f"{POD_PREFIX}0": 1.0, f"{POD_PREFIX}1": 1.0}, 30)
    series = _scraped_series(prom)
    assert {s["__name__"] for s in series} >= {"up", "vllm:kv_cache_usage_perc",
                                               "vllm:time_to_first_token_seconds_bucket"}
    for s in series:
        assert "pool" not in s and "kind" not in s, s
        assert all(s.get(k) for k in K8S_LABELS), s
    # What Vigil generates still says which pool it is about.
    recorded = wait_for("a queue length recorded", lambda: prom.query(
        'vigil:queue_length:sum', time.time()), 30)
    assert [dict(k)["pool"] for k in recorded] == [POOL]


# --- recorded == engine -----------------------------------------------------------------------
def _reads_other_groups(result: RulesResult) -> set[str]:
    """Recording rules (``record`` + labels) whose expression reads a series recorded by a
    rule of another group, or of a later place in its own."""
    out = set()
    for group in result.recording_groups:
        seen: set[str] = set()
        for rule in group.rules:
            for other in result.recording_groups:
                for dep in other.rules:
                    if dep.record and re.search(re.escape(dep.record) + r"(?![\w:])",
                                                rule.expr) and dep.record not in seen:
                        out.add(_key(rule))
            seen.add(rule.record or "")
    return out


def _key(rule: Rule) -> str:
    return f"{rule.record}{sorted(rule.labels.items())}"


def _in_flight(scrapes: list[tuple[float, float]], at: float) -> bool:
    """Whether a scrape stamped before ``at`` may have landed after it: ``(start, duration)``
    pairs, seconds."""
    return any(start <= at < start + duration + APPEND_SLACK_S for start, duration in scrapes)


def test_recorded_samples_equal_the_engine_at_their_instants(world: World) -> None:
    prom, result = world.prom, world.result
    # Enough evaluations of every group: each rule has recorded a few seconds of samples.
    _first_rule_eval(prom)
    wait_for("every rule group evaluated 12 times",
             lambda: _fewest_group_evaluations(prom) >= 12, 30, interval_s=0.5)
    now = time.time()
    source = PrometheusSource(prom.base_url, semantics="2", lookback_s=world.config.engine.lookback)
    durations = prom.query_range_samples(
        as_selector({"namespace": NAMESPACE, "service": SERVICE}).promql(
            "scrape_duration_seconds"), now, 30)
    scrapes = [(ts / 1000, d) for pts in durations.values() for ts, d in pts]
    chained = _reads_other_groups(result)
    compared = skipped_chained = skipped_in_flight = 0
    for rule in (r for r in result.rules() if r.record):
        # The last 12 s: the twelve evaluations waited for above, of which about a quarter
        # fall while a scrape is in flight (skipped below), however loaded the machine.
        recorded = prom.query_range_samples(as_selector(rule.labels).promql(rule.record), now,
                                            12)
        assert recorded, f"{rule.record} {rule.labels} recorded nothing"
        if _key(rule) in chained:
            skipped_chained += sum(len(pts) for pts in recorded.values())
            continue
        by_instant: dict[int, dict[str, float]] = {}
        for labels, pts in recorded.items():
            model = dict(labels).get("model_name", "") if rule.origin.kind == "quantile" else ""
            for ts, value in pts:
                by_instant.setdefault(ts, {})[model] = value
        for ts, theirs in sorted(by_instant.items()):
            at = ts / 1000
            if _in_flight(scrapes, at):
                skipped_in_flight += 1
                continue
            values = engine_value(rule.origin, result.config, result.validated.specs, source,
                                  at)
            ours = {m: v for m, v in values.items() if v is not None}
            what = f"{rule.record}{rule.labels} at {at}"
            assert set(theirs) == set(ours), (what, theirs, ours)
            # Cost too: the engine bills a selector's replicas at the interval the rule uses
            # (Config.unlisted_scrape_interval), so scrape-time jitter moves both alike.
            for m, v in ours.items():
                assert theirs[m] == pytest.approx(v, rel=REL_TOL, abs=1e-12), (what, m)
                compared += 1
    source.close()
    assert compared >= 100, (compared, skipped_chained, skipped_in_flight)


def _first_rule_eval(prom: PrometheusServer) -> float:
    def evaluated() -> float | None:
        groups = prom._get("/api/v1/rules")["data"]["groups"]
        stamps = [g.get("lastEvaluation", "") for g in groups]
        return time.time() if groups and all(s and not s.startswith("0001") for s in stamps) \
            else None

    return wait_for("every rule group evaluated", evaluated, 30)


def _fewest_group_evaluations(prom: PrometheusServer) -> float:
    """The fewest evaluations of any rule group so far (Prometheus's own
    ``prometheus_rule_group_iterations_total``)."""
    samples = sample_values(httpx.get(prom.base_url + "/metrics", timeout=5).text)
    counts = [v for (name, _), v in samples.items()
              if name == "prometheus_rule_group_iterations_total"]
    return min(counts) if counts else 0.0


# --- a pod added, a pod removed ---------------------------------------------------------------
def _billed_prometheus(world: World, at: float) -> dict[str, float]:
    with PrometheusSource(world.prom.base_url, semantics="2",
                          lookback_s=world.config.engine.lookback) as source:
        seconds = up_seconds(source, world.config, world.config.pool(POOL), at, 3600.0)
    return {dict(k).get("pod", ""): v for k, v in seconds.items()}


def _billed_store(world: World, at: float) -> dict[str, float]:
    with Store(world.config.store_path(), readonly=True) as store:
        source = EmbeddedSource(store, semantics="2", lookback_s=world.config.engine.lookback)
        seconds = up_seconds(source, world.config, world.config.pool(POOL), at, 3600.0)
    return {dict(k).get("pod", ""): v for k, v in seconds.items()}


def _up_samples(world: World, pod: str, at: float) -> list[tuple[int, float]]:
    found = world.prom.query_range_samples(f'up{{pod="{pod}"}}', at, 3600)
    return sorted(p for pts in found.values() for p in pts)


def _store_up_samples(world: World, pod: str) -> list[int]:
    with Store(world.config.store_path(), readonly=True) as store:
        series = store.points("up", {"pod": pod})
    return sorted(p.ts_ms for pts in series.values() for p in pts
                  if p.value is not None and not math.isnan(p.value))


def _gateway_replicas(world: World) -> set[str]:
    replicas = httpx.get(world.gateway_url + "/health", timeout=5).json()["replicas"]
    return {r["url"].removeprefix("http://").split("/")[0] for r in replicas}


def test_a_pod_added_and_a_pod_removed(world: World) -> None:
    pods = world.pods()
    new, old, kept = f"{POD_PREFIX}2", f"{POD_PREFIX}0", f"{POD_PREFIX}1"
    wait_for("both first pods scraped", lambda: set(_pods_up(world.prom)) == {old, kept}, 30)
    assert not _up_samples(world, new, time.time())
    added_at = time.time()
    world.list_pods(old, kept, new)

    # Scraped by both, routed to by the gateway.
    wait_for("the new pod scraped by Prometheus", lambda: _pods_up(world.prom).get(new) == 1.0,
             30)
    wait_for("the new pod scraped by Vigil", lambda: _store_up_samples(world, new), 30)
    wait_for("the new pod in the gateway", lambda: pods[new] in _gateway_replicas(world), 30)
    wait_for("requests served by the new pod", lambda: world.load.snapshot().get(
        _gateway_name(world, pods[new]), 0) > 0, 30)
    wait_for("a few samples of the new pod to bill", lambda: len(_store_up_samples(world, new))
             >= 4 and len(_up_samples(world, new, time.time())) >= 4, 30, interval_s=0.5)

    # Billed from its first sample: one scrape interval per up sample, none before.
    at = time.time()
    for billed, stamps in ((_billed_prometheus(world, at),
                            [ts for ts, v in _up_samples(world, new, at) if v == 1.0]),
                           (_billed_store(world, at), _store_up_samples(world, new))):
        assert stamps[0] >= (added_at - 1) * 1000
        assert billed[new] == pytest.approx(len(stamps) * 1.0)
        assert billed[new] == pytest.approx((at * 1000 - stamps[0]) / 1000, abs=2.0)

    # Removed: no new samples, so no more billing, and no more requests.
    world.list_pods(kept, new)
    wait_for("the removed pod stale in Prometheus", lambda: old not in _pods_up(world.prom), 30)
    wait_for("the removed pod out of the gateway", lambda: pods[old] not in
             _gateway_replicas(world), 30)
    rounds = world.load.rounds()
    wait_for("the requests already sent to it finished", lambda: all(
        now >= then + 2 for now, then in zip(world.load.rounds(), rounds, strict=True)), 30)
    served = world.load.snapshot().get(_gateway_name(world, pods[old]), 0)
    first = time.time()
    billed_prom, billed_store = _billed_prometheus(world, first), _billed_store(world, first)
    scraped_prom = len(_up_samples(world, kept, first))
    scraped_store = len(_store_up_samples(world, kept))
    wait_for("three more scrapes of the pods still listed", lambda: len(_up_samples(
        world, kept, time.time())) >= scraped_prom + 3 and len(_store_up_samples(world, kept))
        >= scraped_store + 3, 30, interval_s=0.5)
    later = time.time()
    assert _billed_prometheus(world, later)[old] == billed_prom[old]
    assert _billed_store(world, later).get(old, 0.0) == billed_store.get(old, 0.0)
    assert world.load.snapshot().get(_gateway_name(world, pods[old]), 0) == served
    # The pods still listed are billed on.
    assert _billed_prometheus(world, later)[kept] > billed_prom[kept]
    world.alive()


def _gateway_name(world: World, address: str) -> str:
    """The gateway's name of the replica at ``address`` (``x-vigil-replica``)."""
    replicas = httpx.get(world.gateway_url + "/health", timeout=5).json()["replicas"]
    for r in replicas:
        if address in r["url"]:
            return str(r["name"])
    return address
