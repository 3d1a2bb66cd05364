"""The generated scrape config and rules, loaded into a live Prometheus 2.42 that scrapes.

A loopback HTTP server answers like a vLLM server does to Prometheus (the real OpenMetrics
rendering, ``vllm_`` sample names and all, client_python#1177) and like a dcgm-exporter; a third
target refuses connections. Prometheus runs with ``prometheus-scrape.yml`` as its scrape jobs and
the two generated rule files. Checked:

* Prometheus stores every series the rules read with exactly the label sets Vigil's collector
  stores for the same bodies (``instance`` = target name, ``pool``, ``kind``, ``vllm:`` names),
  plus the ``job`` Prometheus adds (the job's name, ``vigil-<target>``), which no rule tells
  series apart by; so the rules' selectors mean the same thing on both;
* every generated rule evaluates without error, the per-pool recordings have values, and
  ``TargetDown`` fires for the dead target.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.loopback import FIXTURES, exposition_server, free_port, text
from support.prometheus import PrometheusServer, require_prometheus

from alerts.rules.pipeline import RulesOptions, generate, write_files
from alerts.rules.scrape_config import scrape_configs
from collector.exposition import parse
from collector.scrape import points_from_families
from collector.service import target_info
from vigil.config import Config, parse_config
from vigil.model import Labels, labels_of

pytestmark = pytest.mark.slow

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
VLLM_BODY = (FIXTURES / "vllm_v1_metrics_sample.openmetrics.txt").read_bytes()
DCGM_BODY = (FIXTURES / "dcgm_exporter_sample.txt").read_bytes()
#: The series the generated rules read.
RULE_INPUTS = {
    "up", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
}
DEADLINE_S = 60.0


def _config(base: str, dead: str) -> Config:
    # Naming "availability" in [[slos]] warns that it now counts requests, not scrapes.
    with pytest.warns(DeprecationWarning, match="now measures requests"):
        return _parse(base, dead)


def _parse(base: str, dead: str) -> Config:
    return parse_config({
        "collector": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "pools": [{"name": "chat", "model": "meta-llama/Llama-3.1-8B-Instruct"}],
        "targets": [
            {"name": "chat-0", "url": f"{base}/metrics", "pool": "chat"},
            {"name": "chat-0-gpu", "url": f"{base}/dcgm/metrics", "pool": "chat",
             "kind": "dcgm"},
            {"name": "chat-1", "url": f"{dead}/metrics", "pool": "chat"},
        ],
        # The four default SLOs plus replica_up: the fixed bodies' counters never move, so
        # only the scrape-based SLI has a period error budget to record.
        "slos": [
            {"name": f"chat-{indicator.replace('_', '-')}", "pool": "chat",
             "indicator": indicator}
            for indicator in ("ttft", "e2e", "error_rate", "availability", "replica_up")
        ],
    })


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, Config]]:
    prometheus, _ = require_prometheus()
    routes = {"/metrics": text(VLLM_BODY, ctype=OPENMETRICS),
              "/dcgm/metrics": text(DCGM_BODY)}
    workdir = tmp_path_factory.mktemp("rules-live")
    with exposition_server(routes) as base:
        config = _config(base, f"http://127.0.0.1:{free_port()}")
        result = generate(config, RulesOptions(interval_s=1.0, period_interval_s=1.0))
        write_files(result.files(), workdir)
        scrape = (workdir / "prometheus-scrape.yml").read_text()
        (workdir / "prometheus.yml").write_text(
            "global:\n  evaluation_interval: 1s\nrule_files:\n- vigil-slo-rules.yml\n"
            f"- vigil-alert-rules.yml\n{scrape}"
        )
        port = free_port()
        log_path = workdir / "prometheus.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [prometheus, f"--config.file={workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
            )
        server = PrometheusServer(process, f"http://127.0.0.1:{port}", workdir, log_path)
        try:
            server.wait_ready()
            yield server, config
        finally:
            server.stop()


def _wait(what: str, server: PrometheusServer, check: object) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {DEADLINE_S:.0f}s:\n{server.log_tail()}")
        time.sleep(0.25)


def _stored(server: PrometheusServer) -> set[tuple[str, Labels]]:
    """Every stored series without its ``job`` label, which is checked to be the job's name
    ``vigil-<instance>`` (the label the collector does not store)."""
    data = server._get("/api/v1/series", {"match[]": '{__name__=~".+"}'})["data"]
    out = set()
    for item in data:
        labels = dict(item)
        name = labels.pop("__name__")
        if not name.startswith(("slo:", "vigil:", "ALERTS")):
            assert labels.pop("job") == f"vigil-{labels['instance']}", (name, labels)
        out.add((name, labels_of(labels)))
    return out


def _collector_series(config: Config) -> set[tuple[str, Labels]]:
    """What Vigil's collector stores for the same bodies (and ``up``)."""
    out = set()
    for target in config.targets:
        info = target_info(target)
        out.add(("up", labels_of(info.labels())))
        if target.name == "chat-1":
            continue
        body, ctype = ((VLLM_BODY, OPENMETRICS) if target.kind == "vllm"
                       else (DCGM_BODY, "text/plain; version=0.0.4"))
        for key, _family, _ts, _value in points_from_families(
                parse(body, content_type=ctype), info, 0):
            out.add((key.name, key.labels))
    return out


def test_prometheus_stores_the_collectors_label_sets(
    live: tuple[PrometheusServer, Config],
) -> None:
    server, config = live
    ours = _collector_series(config)
    names = {name for name, _ in ours}
    assert names >= RULE_INPUTS

    def stored_up() -> set[Labels]:
        return {labels for name, labels in _stored(server) if name == "up"}

    def stored_inputs() -> set[tuple[str, Labels]]:
        return {s for s in _stored(server) if s[0] in RULE_INPUTS}

    _wait("every target scraped", server,
          lambda: stored_up() == {labels for name, labels in ours if name == "up"})
    _wait("the vLLM series stored", server,
          lambda: stored_inputs() == {s for s in ours if s[0] in RULE_INPUTS})
    # Everything scraped (the rules' own recordings and ALERTS aside).
    everything = {s for s in _stored(server)
                  if not s[0].startswith(("slo:", "vigil:", "ALERTS"))}
    # Prometheus may keep fewer series (its own scrape_* series aside), never different ones.
    assert {s for s in everything if s[0] in names} <= ours
    for name, labels in everything:
        assert not name.startswith("vllm_"), name  # all renamed to vllm:
        assert {"instance", "pool", "kind"} <= set(dict(labels)), name


def test_every_rule_evaluates_and_target_down_fires(
    live: tuple[PrometheusServer, Config],
) -> None:
    server, _ = live

    def rules() -> list[dict]:
        groups = server._get("/api/v1/rules")["data"]["groups"]
        return [r for g in groups for r in g["rules"]]

    _wait("every rule evaluated", server,
          lambda: rules() and all(r["health"] == "ok" for r in rules()))
    assert all(not r.get("lastError") for r in rules())
    for record in ("vigil:kv_cache_usage:avg", "vigil:queue_length:sum",
                   "slo:objective:ratio", "slo:period_error_budget_remaining:ratio"):
        _wait(f"{record} recorded", server, lambda r=record: server.query(r, time.time()))
    # The fixture's one engine: KV-cache usage 0.1874, 3 requests waiting.
    kv = server.query('vigil:kv_cache_usage:avg{pool="chat"}', time.time())
    assert list(kv.values()) == [0.1874]
    queue = server.query('vigil:queue_length:sum{pool="chat"}', time.time())
    assert list(queue.values()) == [3.0]
    _wait("TargetDown firing for chat-1", server, lambda: server.query(
        'ALERTS{alertname="TargetDown", alertstate="firing", instance="chat-1"}', time.time()))


def test_scrape_config_passes_promtool_check_config(tmp_path: Path) -> None:
    _, promtool = require_prometheus()
    config = _config("http://127.0.0.1:9", "http://127.0.0.1:10")
    result = generate(config)
    write_files(result.files(), tmp_path)
    scrape = (tmp_path / "prometheus-scrape.yml").read_text()
    (tmp_path / "prometheus.yml").write_text(
        f"rule_files:\n- vigil-slo-rules.yml\n- vigil-alert-rules.yml\n{scrape}")
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_job_keeps_job_and_carries_the_targets_own_labels() -> None:
    config = parse_config({
        "pools": [{"name": "chat", "model": "m"}],
        "targets": [{"name": "chat-$1", "url": "http://127.0.0.1:9/metrics", "pool": "chat",
                     "labels": {"zone": "eu-1", "team": "ml"}}],
    })
    (job,) = scrape_configs(config)["scrape_configs"]
    assert job["job_name"] == "vigil-chat-$1"
    assert job["static_configs"][0]["labels"] == {"pool": "chat", "kind": "vllm",
                                                  "team": "ml", "zone": "eu-1"}
    # `$` would refer to a regex group; `$$` is a literal one. Nothing touches `job`.
    assert job["relabel_configs"] == [{"target_label": "instance", "replacement": "chat-$$1"}]


def test_no_job_for_the_targets_a_selector_already_covers() -> None:
    config = parse_config({
        "pools": [{"name": "chat", "model": "m", "selector": 'namespace="llm"'},
                  {"name": "batch", "model": "m", "dcgm_selector": 'exported_namespace="b"'}],
        "targets": [
            {"name": "chat-0", "url": "http://127.0.0.1:9/metrics", "pool": "chat"},
            {"name": "chat-gpu", "url": "http://127.0.0.1:9/dcgm", "pool": "chat",
             "kind": "dcgm"},
            {"name": "batch-0", "url": "http://127.0.0.1:9/metrics", "pool": "batch"},
            {"name": "batch-gpu", "url": "http://127.0.0.1:9/dcgm", "pool": "batch",
             "kind": "dcgm"},
        ],
    })
    jobs = [j["job_name"] for j in scrape_configs(config)["scrape_configs"]]
    assert jobs == ["vigil-chat-gpu", "vigil-batch-0"]
