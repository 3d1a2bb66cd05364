"""``vigil targets`` and ``vigil collect --once`` with discovery: the list, origins, labels,
health from the store, and the exit codes (0 ok, 1 a source failed, 2 a bad config)."""

from __future__ import annotations

import json
from pathlib import Path

from support.loopback import exposition_server, text

from vigil_shell.cli import main

BODY = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 1\n"


def write_config(tmp_path: Path, *, files: str = "sd/*.json") -> Path:
    p = tmp_path / "vigil.toml"
    p.write_text(f"""
[store]
path = "vigil.db"

[[pools]]
name = "chat"
model = "m"

[[targets]]
name = "chat-static"
url = "http://127.0.0.1:9/metrics"
pool = "chat"
labels = {{ team = "core" }}

[[discovery]]
name = "fleet"
files = ["{files}"]
pool = "chat"
""")
    return p


def write_groups(tmp_path: Path, groups: object, name: str = "a.json") -> None:
    (tmp_path / "sd").mkdir(exist_ok=True)
    (tmp_path / "sd" / name).write_text(json.dumps(groups))


def test_targets_lists_static_and_discovered(tmp_path, capsys):
    cfg = write_config(tmp_path)
    write_groups(tmp_path, [{"targets": ["10.0.0.1:8000"], "labels": {"zone": "z1"}}])
    assert main(["targets", "--config", str(cfg), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["target"]: r for r in data["targets"]}
    assert rows["chat-static"]["origin"] == "static"
    assert rows["chat-static"]["labels"] == {"team": "core"}
    d = rows["10.0.0.1:8000"]
    assert d["origin"] == "file_sd fleet (sd/a.json)" and d["labels"] == {"zone": "z1"}
    assert (d["pool"], d["kind"], d["url"]) == ("chat", "vllm", "http://10.0.0.1:8000/metrics")
    assert d["up"] is None  # no store yet
    assert data["discovery"] == [{"name": "fleet", "mechanism": "file_sd", "error": ""}]
    assert main(["targets", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "10.0.0.1:8000" in out and "file_sd fleet (sd/a.json) {zone=z1}" in out


def test_a_failing_source_exits_1_naming_it(tmp_path, capsys):
    cfg = write_config(tmp_path)
    (tmp_path / "sd").mkdir()
    (tmp_path / "sd" / "a.json").write_text('[{"targets": ["10.0.0.1:8')
    assert main(["targets", "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "discovery fleet (file_sd): sd/a.json: invalid JSON" in err


def test_a_bad_discovery_config_exits_2(tmp_path, capsys):
    cfg = write_config(tmp_path, files="sd/*.txt")
    assert main(["targets", "--config", str(cfg)]) == 2
    assert "discovery[0].files[0]" in capsys.readouterr().err


def test_collect_once_scrapes_discovered_targets_and_targets_shows_health(tmp_path, capsys):
    with exposition_server({"/metrics": text(BODY)}) as base:
        cfg = write_config(tmp_path)
        write_groups(tmp_path, [{"targets": [base.removeprefix("http://")]}])
        assert main(["collect", "--config", str(cfg), "--once"]) == 0
        capsys.readouterr()
        assert main(["targets", "--config", str(cfg), "--json"]) == 0
    rows = {r["target"]: r for r in json.loads(capsys.readouterr().out)["targets"]}
    assert rows[base.removeprefix("http://")]["up"] is True
    assert rows["chat-static"]["up"] is False  # nothing listens on port 9
