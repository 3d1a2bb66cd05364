"""``[[discovery]]`` entries as Prometheus scrape jobs: file_sd, http_sd and dns_sd configs
whose relabeling labels the targets as Vigil's collector does (``pool`` from the group's
``pool_label`` or the entry's default, ``kind``, the skipped targets dropped). promtool accepts
the file, and a live Prometheus discovering a simulated replica through the generated file_sd
job stores ``up`` with exactly the labels the collector gives the same target (plus ``job``).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.loopback import free_port
from support.prometheus import PrometheusServer, require_prometheus, start_prometheus

from alerts.rules import yaml_emitter
from alerts.rules.pipeline import generate, write_files
from alerts.rules.scrape_config import discovery_job, scrape_configs, scrape_notes
from collector.discovery import ORIGIN_STATIC, TargetSet
from collector.service import target_info
from serving.sim.testing import running_fleet
from vigil.config import Config, parse_config
from vigil.conventions import FILE_SCRAPE_CONFIG
from vigil.errors import ConfigError
from vigil.model import Labels, labels_of
from vigil_shell.rules_cli import add_arguments, run

MODEL = "m"
DEADLINE_S = 60.0


def _config(discovery: list[dict[str, Any]], *, file: str = "<config>",
            **extra: Any) -> Config:
    return parse_config({
        "collector": {"scrape_interval": "15s", "scrape_timeout": "5s"},
        "pools": [{"name": "chat", "model": MODEL}, {"name": "batch", "model": MODEL},
                  {"name": "team", "model": MODEL, "selector": 'namespace="llm"'}],
        "discovery": discovery,
        **extra,
    }, file=file)


def _job(config: Config, name: str) -> dict[str, Any]:
    return next(j for j in scrape_configs(config)["scrape_configs"]
                if j["job_name"] == f"vigil-{name}")


# --- the jobs -------------------------------------------------------------------------------
def test_a_file_sd_entry_is_a_job_with_absolute_paths(tmp_path: Path) -> None:
    config = _config([{"name": "k8s", "files": ["sd/*.json", "/etc/sd/x.yaml"],
                       "pool": "chat", "refresh_interval": "1m", "scrape_interval": "5s",
                       "scheme": "https", "metrics_path": "/vllm/metrics"}],
                     file=str(tmp_path / "vigil.toml"))
    job = _job(config, "k8s")
    assert job["file_sd_configs"] == [{"files": [str(tmp_path / "sd" / "*.json"),
                                                 "/etc/sd/x.yaml"],
                                       "refresh_interval": "1m"}]
    assert (job["scrape_interval"], job["scrape_timeout"]) == ("5s", "5s")
    assert (job["scheme"], job["metrics_path"]) == ("https", "/vllm/metrics")
    assert job["metric_relabel_configs"][0]["replacement"] == "vllm:${1}"
    # The relative path is said to have been made absolute, in the file's header too.
    (note,) = scrape_notes(config)
    assert note.startswith("discovery k8s: file_sd paths relative") and str(tmp_path) in note
    assert f"# {note}" in generate(config).files()[FILE_SCRAPE_CONFIG]


def test_http_sd_and_dns_sd_entries() -> None:
    config = _config([
        {"name": "api", "url": "http://127.0.0.1:9/targets", "refresh_interval": "10s"},
        {"name": "a", "names": ["chat.llm.svc"], "type": "A", "port": 8000, "pool": "chat"},
        {"name": "srv", "names": ["_http._tcp.chat.llm.svc"], "type": "SRV", "pool": "chat",
         "nameserver": "127.0.0.1:5353"},
    ])
    assert _job(config, "api")["http_sd_configs"] == [
        {"url": "http://127.0.0.1:9/targets", "refresh_interval": "10s"}]
    assert _job(config, "a")["dns_sd_configs"] == [
        {"names": ["chat.llm.svc"], "type": "A", "port": 8000, "refresh_interval": "30s"}]
    assert _job(config, "srv")["dns_sd_configs"] == [
        {"names": ["_http._tcp.chat.llm.svc"], "type": "SRV", "refresh_interval": "30s"}]
    # Prometheus's dns_sd asks its host's resolver: the nameserver cannot go into the file.
    assert scrape_notes(config) == [
        "discovery srv: Prometheus's dns_sd has no nameserver setting; it asks its host's "
        "resolver, not 127.0.0.1:5353."]


def test_the_relabeling_sets_pool_and_kind_and_drops_what_the_collector_skips() -> None:
    config = _config(
        [{"name": "k8s", "files": ["/sd/*.json"], "pool": "batch", "pool_label": "team_pool",
          "kind": "dcgm"}],
        targets=[{"name": "chat-0", "url": "http://10.0.0.1:8000/metrics", "pool": "chat"},
                 {"name": "chat-gpu", "url": "https://[fd00::1]/metrics", "pool": "chat",
                  "kind": "dcgm"}])
    assert _job(config, "k8s")["relabel_configs"] == [
        {"source_labels": ["team_pool"], "target_label": "pool"},
        {"action": "labeldrop", "regex": "team_pool"},
        {"source_labels": ["pool"], "regex": "", "target_label": "pool", "replacement": "batch"},
        {"source_labels": ["kind"], "regex": "", "target_label": "kind", "replacement": "dcgm"},
        {"source_labels": ["pool"], "regex": "chat|batch|team", "action": "keep"},
        {"source_labels": ["kind"], "regex": "vllm|dcgm", "action": "keep"},
        {"source_labels": ["pool", "kind"], "regex": "team;vllm", "action": "drop"},
        {"source_labels": ["__address__", "kind"],
         "regex": r"10\.0\.0\.1:8000;vllm|\[fd00::1\]:443;dcgm", "action": "drop"},
    ]


def test_what_prometheus_cannot_take_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"only in the file name") as err:
        scrape_configs(_config([{"name": "k8s", "files": ["/sd/*/targets.json"]}]))
    assert err.value.key == "discovery[0].files[0]"
    with pytest.raises(ConfigError, match="credentials") as err:
        discovery_job(_config([]), _config(
            [{"name": "api", "url": "http://u:p@127.0.0.1:9/sd"}]).discovery[0], 0)
    clash = _config([{"name": "chat-0", "files": ["/sd/a.json"]}],
                    targets=[{"name": "chat-0", "url": "http://10.0.0.1:8000/metrics",
                              "pool": "chat"}])
    with pytest.raises(ConfigError, match="rename one") as err:
        scrape_configs(clash)
    assert err.value.key == "discovery[0].name"


def test_vigil_rules_prometheus_says_the_notes_on_stderr(tmp_path: Path) -> None:
    path = tmp_path / "vigil.toml"
    path.write_text('[[pools]]\nname = "chat"\nmodel = "m"\n\n[[discovery]]\nname = "dns"\n'
                    'names = ["chat.svc"]\nport = 8000\npool = "chat"\n'
                    'nameserver = "127.0.0.1:5353"\n')
    parser = argparse.ArgumentParser(prog="vigil rules")
    add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    args = parser.parse_args(["prometheus", "-c", str(path), "--out", str(tmp_path / "out")])
    assert run(args, out=out, err=err) == 0
    assert "vigil rules prometheus: discovery dns: Prometheus's dns_sd has no nameserver" \
        in err.getvalue()


# --- promtool and a live Prometheus ---------------------------------------------------------
@pytest.mark.slow
def test_promtool_check_config_accepts_every_mechanism(tmp_path: Path) -> None:
    _, promtool = require_prometheus()
    config = _config([
        {"name": "files", "files": ["sd/*.json"], "pool_label": "team_pool"},
        {"name": "api", "url": "http://127.0.0.1:9/targets", "pool": "chat"},
        {"name": "a", "names": ["chat.llm.svc"], "port": 8000, "pool": "chat"},
        {"name": "srv", "names": ["_http._tcp.chat.llm.svc"], "type": "SRV", "pool": "batch",
         "kind": "dcgm", "scrape_interval": "1m", "scrape_timeout": "20s"},
    ], file=str(tmp_path / "vigil.toml"),
        targets=[{"name": "chat-0", "url": "http://127.0.0.1:8000/metrics", "pool": "chat"}])
    write_files(generate(config).files(), tmp_path)
    scrape = (tmp_path / FILE_SCRAPE_CONFIG).read_text()
    (tmp_path / "prometheus.yml").write_text(
        f"rule_files:\n- vigil-slo-rules.yml\n- vigil-alert-rules.yml\n{scrape}")
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _address(metrics_url: str) -> str:
    return metrics_url.removeprefix("http://").removesuffix("/metrics")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer,
                                                                     Config, dict[str, str]]]:
    prometheus, _ = require_prometheus()
    workdir = tmp_path_factory.mktemp("sd-live")
    with running_fleet(2) as fleet:
        a, b = (_address(u) for u in fleet.metrics_urls)
        dead = f"127.0.0.1:{free_port()}"
        (workdir / "sd").mkdir()
        (workdir / "sd" / "fleet.json").write_text(json.dumps([
            # a is also a [[targets]] entry: its static job scrapes it, under its name.
            {"targets": [a, b], "labels": {"team_pool": "chat", "zone": "z1"}},
            # No pool label: the entry's default pool.
            {"targets": [dead], "labels": {"instance": "batch-dead"}},
            # An unknown pool (the collector skips it), a pool its selector covers.
            {"targets": ["127.0.0.1:1"], "labels": {"team_pool": "nope"}},
            {"targets": ["127.0.0.1:2"], "labels": {"team_pool": "team"}},
        ]))
        config = parse_config({
            "collector": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "pools": [{"name": "chat", "model": MODEL}, {"name": "batch", "model": MODEL},
                      {"name": "team", "model": MODEL, "selector": 'namespace="llm"'}],
            "targets": [{"name": "chat-static", "url": f"http://{a}/metrics",
                         "pool": "chat"}],
            "discovery": [{"name": "k8s", "files": ["sd/*.json"], "pool": "batch",
                           "pool_label": "team_pool", "refresh_interval": "1s"}],
        }, file=str(workdir / "vigil.toml"))
        scrape = yaml_emitter.dump(scrape_configs(config))
        server = start_prometheus(prometheus, workdir, scrape, workdir / "data")
        try:
            server.wait_ready()
            yield server, config, {"a": a, "b": b, "dead": dead}
        finally:
            server.stop()


def _stored_up(server: PrometheusServer) -> set[Labels]:
    return {labels_of({k: v for k, v in labels if k != "__name__"})
            for labels in server.query("up", time.time())}


@pytest.mark.slow
def test_prometheus_labels_discovered_targets_as_the_collector_does(
        live: tuple[PrometheusServer, Config, dict[str, str]]) -> None:
    server, config, at = live
    target_set = TargetSet(config)
    asyncio.run(target_set.refresh(force=True))
    # The collector scrapes team's target into its own store too; in a Prometheus, the
    # pool's selector reads it under the team's labels, as for a static target of that pool.
    collector = {labels_of({**dict(target_info(t.target).labels()),
                            "job": "vigil-" + ("k8s" if t.origin != ORIGIN_STATIC else t.name)})
                 for t in target_set.current().values() if t.target.pool != "team"}
    assert collector == {
        labels_of({"instance": "chat-static", "pool": "chat", "kind": "vllm",
                   "job": "vigil-chat-static"}),
        labels_of({"instance": at["b"], "pool": "chat", "kind": "vllm", "zone": "z1",
                   "job": "vigil-k8s"}),
        labels_of({"instance": "batch-dead", "pool": "batch", "kind": "vllm",
                   "job": "vigil-k8s"}),
    }
    deadline = time.monotonic() + DEADLINE_S
    while _stored_up(server) != collector:
        if time.monotonic() > deadline:
            pytest.fail(f"up is {_stored_up(server)}, not {collector}:\n{server.log_tail()}")
        time.sleep(0.25)
    up = {dict(k)["instance"]: v for k, v in server.query("up", time.time()).items()}
    assert up == {"chat-static": 1.0, at["b"]: 1.0, "batch-dead": 0.0}
    # The replica's own series carry the same labels, vllm: spelled.
    running = server.query(f'vllm:num_requests_running{{instance="{at["b"]}"}}', time.time())
    assert running and all(dict(k)["pool"] == "chat" and dict(k)["zone"] == "z1"
                           for k in running)
    assert not server.query('{__name__=~"vllm_.+"}', time.time())
