"""file_sd discovery over real files: JSON and YAML, globs, rewrites, half-written files."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from collector.discovery import TargetSet
from vigil.clock import ManualClock
from vigil.config import parse_config
from vigil.errors import ConfigError


def make_config(tmp_path: Path, *, files: list[str], targets: list[dict] | None = None,
                **discovery: object):
    return parse_config({
        "pools": [{"name": "chat", "model": "m"}, {"name": "code", "model": "c"}],
        "targets": targets or [],
        "discovery": [{"name": "chat-files", "files": files, "refresh_interval": "30s",
                       **discovery}],
    }, file=str(tmp_path / "vigil.toml"))


def write_json(path: Path, groups: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(groups))


def refresh(ts: TargetSet, *, force: bool = True):
    return asyncio.run(ts.refresh(force=force))


def test_json_and_yaml_groups_become_targets(tmp_path):
    write_json(tmp_path / "sd/a.json", [{
        "targets": ["10.0.0.1:8000", "10.0.0.2:8000"],
        "labels": {"pool": "chat", "zone": "eu-1", "__meta_pod": "x", "kind": "vllm"},
    }])
    (tmp_path / "sd/b.yaml").write_text(
        "- targets: ['10.0.1.1:9400']\n  labels: {pool: code, kind: dcgm, node: n1}\n")
    ts = TargetSet(make_config(tmp_path, files=["sd/*.json", "sd/*.yaml"]))
    changes = refresh(ts)
    assert [t.name for t in changes.added] == ["10.0.0.1:8000", "10.0.0.2:8000",
                                               "10.0.1.1:9400"]
    cur = ts.current()
    a = cur["10.0.0.1:8000"]
    assert a.origin == "file_sd chat-files (sd/a.json)"
    assert a.target.url == "http://10.0.0.1:8000/metrics"
    assert (a.target.pool, a.target.kind) == ("chat", "vllm")
    assert a.target.labels == {"zone": "eu-1"}  # no __meta_*, no pool, no kind
    b = cur["10.0.1.1:9400"]
    assert (b.target.pool, b.target.kind, b.target.labels) == ("code", "dcgm", {"node": "n1"})
    assert b.origin == "file_sd chat-files (sd/b.yaml)"
    assert ts.errors() == {"chat-files": ""}


def test_relative_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    write_json(tmp_path / "conf/sd/a.json", [{"targets": ["10.0.0.1:8000"]}])
    cfg = parse_config({
        "pools": [{"name": "chat", "model": "m"}],
        "discovery": [{"name": "d", "files": ["sd/a.json"], "pool": "chat"}],
    }, file=str(tmp_path / "conf/vigil.toml"))
    monkeypatch.chdir(tmp_path)  # not the config's folder
    ts = TargetSet(cfg)
    refresh(ts)
    assert list(ts.current()) == ["10.0.0.1:8000"]


def test_rewrite_adds_removes_and_changes(tmp_path):
    f = tmp_path / "sd/a.json"
    write_json(f, [{"targets": ["10.0.0.1:8000", "10.0.0.2:8000"], "labels": {"pool": "chat"}}])
    ts = TargetSet(make_config(tmp_path, files=["sd/a.json"]))
    refresh(ts)
    write_json(f, [
        {"targets": ["10.0.0.2:8000"], "labels": {"pool": "chat", "zone": "b"}},
        {"targets": ["10.0.0.3:8000"], "labels": {"pool": "chat"}},
    ])
    changes = refresh(ts)
    assert [t.name for t in changes.added] == ["10.0.0.3:8000"]
    assert [t.name for t in changes.removed] == ["10.0.0.1:8000"]
    assert [t.target.labels for t in changes.changed] == [{"zone": "b"}]
    assert not refresh(ts), "an unchanged file changes nothing"


def test_refresh_follows_the_injected_clock(tmp_path):
    f = tmp_path / "sd/a.json"
    write_json(f, [{"targets": ["10.0.0.1:8000"], "labels": {"pool": "chat"}}])
    clock = ManualClock()
    ts = TargetSet(make_config(tmp_path, files=["sd/a.json"]), clock=clock)
    assert refresh(ts, force=False).added  # every source is due at first
    write_json(f, [{"targets": ["10.0.0.2:8000"], "labels": {"pool": "chat"}}])
    clock.advance(29)
    assert not refresh(ts, force=False), "not due before refresh_interval"
    assert ts.next_due() == pytest.approx(clock.now + 1)
    clock.advance(1)
    assert [t.name for t in refresh(ts, force=False).added] == ["10.0.0.2:8000"]


def test_half_written_file_keeps_previous_targets(tmp_path, caplog):
    f = tmp_path / "sd/a.json"
    full = [{"targets": ["10.0.0.1:8000", "10.0.0.2:8000"], "labels": {"pool": "chat"}}]
    write_json(f, full)
    ts = TargetSet(make_config(tmp_path, files=["sd/*.json"]))
    refresh(ts)
    before = ts.current()
    caplog.set_level(logging.WARNING, logger="vigil.discovery")
    for partial in (json.dumps(full)[:25], ""):
        f.write_text(partial)
        assert not refresh(ts), f"{partial!r} must not remove targets"
        assert ts.current() == before
        err = ts.errors()["chat-files"]
        assert "sd/a.json" in err and "previous 2 target(s) are kept" in err
    assert "invalid JSON at line 1" in caplog.text and "sd/a.json" in caplog.text
    write_json(f, [{"targets": ["10.0.0.1:8000"], "labels": {"pool": "chat"}}])
    assert [t.name for t in refresh(ts).removed] == ["10.0.0.2:8000"]
    assert ts.errors() == {"chat-files": ""}


def test_broken_yaml_keeps_previous_targets(tmp_path):
    f = tmp_path / "sd/a.yml"
    f.parent.mkdir()
    f.write_text("- targets: ['10.0.0.1:8000']\n  labels: {pool: chat}\n")
    ts = TargetSet(make_config(tmp_path, files=["sd/a.yml"]))
    refresh(ts)
    f.write_text("- targets: ['10.0.0.1:8000'\n  labels: {pool: ch")
    refresh(ts)
    assert list(ts.current()) == ["10.0.0.1:8000"]
    assert "invalid YAML at line" in ts.errors()["chat-files"]


def test_bad_group_shape_is_reported_with_its_position(tmp_path):
    write_json(tmp_path / "sd/a.json", [{"targets": ["10.0.0.1:8000"]}, {"targets": "x"}])
    ts = TargetSet(make_config(tmp_path, files=["sd/a.json"], pool="chat"))
    refresh(ts)
    assert ts.current() == {}
    assert "group 2: 'targets' must be a list" in ts.errors()["chat-files"]


def test_file_that_disappears_takes_its_targets(tmp_path):
    write_json(tmp_path / "sd/a.json", [{"targets": ["10.0.0.1:8000"]}])
    write_json(tmp_path / "sd/b.json", [{"targets": ["10.0.0.2:8000"]}])
    ts = TargetSet(make_config(tmp_path, files=["sd/*.json"], pool="chat"))
    refresh(ts)
    (tmp_path / "sd/a.json").unlink()
    changes = refresh(ts)
    assert [t.name for t in changes.removed] == ["10.0.0.1:8000"]
    assert list(ts.current()) == ["10.0.0.2:8000"]


def test_unknown_or_missing_pool_skips_the_target(tmp_path, caplog):
    write_json(tmp_path / "sd/a.json", [
        {"targets": ["10.0.0.1:8000"], "labels": {"pool": "nope"}},
        {"targets": ["10.0.0.2:8000"]},
        {"targets": ["10.0.0.3:8000"], "labels": {"pool": "chat", "kind": "gpu"}},
        {"targets": ["10.0.0.4:8000"], "labels": {"pool": "chat"}},
    ])
    caplog.set_level(logging.WARNING, logger="vigil.discovery")
    ts = TargetSet(make_config(tmp_path, files=["sd/a.json"]))
    refresh(ts)
    assert list(ts.current()) == ["10.0.0.4:8000"]
    err = ts.errors()["chat-files"]
    assert "pool 'nope' does not exist" in err
    assert "'10.0.0.2:8000': no pool" in err
    assert "kind 'gpu'" in err
    assert caplog.text.count("pool 'nope' does not exist") == 1
    refresh(ts)
    assert caplog.text.count("pool 'nope' does not exist") == 1, "logged once, not per refresh"


def test_pool_label_and_defaults(tmp_path):
    write_json(tmp_path / "sd/a.json", [
        {"targets": ["10.0.0.1:8000"], "labels": {"vigil_pool": "code", "pool": "x"}},
        {"targets": ["10.0.0.2:8000"], "labels": {"instance": "chat-2", "team": ""}},
    ])
    ts = TargetSet(make_config(tmp_path, files=["sd/a.json"], pool="chat",
                               pool_label="vigil_pool", scheme="https",
                               metrics_path="/vllm/metrics", scrape_interval="5s"))
    refresh(ts)
    cur = ts.current()
    a = cur["10.0.0.1:8000"].target
    assert (a.pool, a.labels) == ("code", {})  # "pool" is Vigil's own label
    assert a.url == "https://10.0.0.1:8000/vllm/metrics" and a.scrape_interval == 5
    b = cur["chat-2"].target  # the group's instance label names the target
    assert (b.pool, b.labels, b.url) == ("chat", {}, "https://10.0.0.2:8000/vllm/metrics")


def test_static_target_wins_and_clashes_are_disambiguated(tmp_path):
    write_json(tmp_path / "sd/a.json", [
        {"targets": ["127.0.0.1:8001", "127.0.0.1:8002"], "labels": {"pool": "chat"}},
        {"targets": ["127.0.0.1:8002"],
         "labels": {"pool": "chat", "kind": "dcgm", "__metrics_path__": "/dcgm/metrics"}},
        {"targets": ["127.0.0.1:8002"], "labels": {"pool": "code"}},
    ])
    static = [{"name": "chat-1", "url": "http://127.0.0.1:8001/metrics", "pool": "chat"}]
    ts = TargetSet(make_config(tmp_path, files=["sd/a.json"], targets=static))
    refresh(ts)
    cur = ts.current()
    assert list(cur) == ["chat-1", "127.0.0.1:8002", "127.0.0.1:8002/dcgm/metrics"]
    assert cur["chat-1"].origin == "static"
    assert cur["127.0.0.1:8002/dcgm/metrics"].target.kind == "dcgm"
    assert "also file_sd chat-files (sd/a.json) (pool 'chat'" in ts.errors()["chat-files"]


def test_a_file_of_another_format_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"discovery\[0\]\.files\[0\].*\.json, \.yml or "):
        TargetSet(make_config(tmp_path, files=["sd/*.txt"]))


def test_subscribers_get_the_changes(tmp_path):
    write_json(tmp_path / "sd/a.json", [{"targets": ["10.0.0.1:8000"]}])
    ts = TargetSet(make_config(tmp_path, files=["sd/a.json"], pool="chat"))
    seen: list[str] = []

    async def slow(changes):
        await asyncio.sleep(0)
        seen.append("async:" + ",".join(t.name for t in changes.added))

    ts.subscribe(lambda c: seen.append("sync:" + ",".join(t.name for t in c.added)))
    ts.subscribe(slow)
    refresh(ts)
    refresh(ts)  # nothing changed: nothing published
    assert seen == ["sync:10.0.0.1:8000", "async:10.0.0.1:8000"]
