"""Config: Vigil's defaults, loud errors naming file and key, the example file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from vigil.config import (
    AlertRouteConfig,
    ApiKeyConfig,
    BudgetConfig,
    BurnRateAlert,
    Config,
    DiscoveryConfig,
    PoolConfig,
    PriceConfig,
    SloConfig,
    TargetConfig,
    VllmProfileConfig,
    load_config,
    parse_config,
)
from vigil.durations import format_duration, parse_duration
from vigil.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "vigil.example.toml"

MINIMAL = """
[[pools]]
name = "chat"
model = "m"
[[targets]]
name = "chat-0"
url = "http://127.0.0.1:8000/metrics"
pool = "chat"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "vigil.toml"
    p.write_text(text)
    return p


def test_example_loads():
    cfg = load_config(EXAMPLE)
    assert cfg.pools[0].name == "chat"
    assert {t.kind for t in cfg.targets} == {"vllm", "dcgm"}


def test_slo_and_scaling_numbers_are_defaults():
    cfg = Config()
    assert cfg.slo_defaults.ttft_threshold_seconds == 0.8
    assert cfg.slo_defaults.e2e_threshold_seconds == 8.0
    assert cfg.slo_defaults.error_rate_objective == 0.995
    assert cfg.slo_defaults.availability_objective == 0.995
    assert cfg.scaling.scale_out_kv_usage == 0.8
    assert cfg.scaling.scale_out_queue_length == 50
    assert cfg.scaling.scale_in_kv_usage == 0.3
    assert cfg.scaling.scale_in_hold == 600
    assert cfg.scaling.cooldown == 300
    assert cfg.scaling.scale_out_ttft_quantile == 0.95
    assert cfg.slo_defaults.e2e_reference_output_tokens == 512
    assert cfg.alerts.kv_usage_high == 0.9
    assert (cfg.rules.interval, cfg.rules.period_interval) == (30, 300)
    assert cfg.rules.keda.min_scale_down_stabilization == 600
    assert cfg.anomaly.token_multiplier == 10
    assert cfg.collector.scrape_interval == 15
    assert cfg.collector.scrape_timeout == 10
    assert cfg.store.raw_retention == 48 * 3600
    assert cfg.store.downsampled_retention == 35 * 86400
    assert cfg.prices["H100"] == 6.88


def _fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    out = set()
    for name, info in model.model_fields.items():
        if name == "source":
            continue
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _fields(ann, f"{prefix}{name}.")
        else:
            out.add(prefix + name)
    return out


def test_example_documents_every_key_with_a_comment():
    text = EXAMPLE.read_text()
    keys_in_file = set()
    section = ""
    for line in text.splitlines():
        s = line.strip().lstrip("# ").strip()
        m = re.match(r"^\[\[?([a-z_.]+)\]\]?", s)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"^([a-z0-9_]+)\s*=", s)
        if m and section != "prices":
            key = f"{section}.{m.group(1)}"
            # Each key is explained where it first appears (a repeated [[targets]] need not).
            assert key in keys_in_file or "#" in line, f"no comment on {key}: {line!r}"
            keys_in_file.add(key)
    for field in _fields(Config):
        # tables of their own, checked below
        if field in ("prices", "pools", "targets", "discovery", "slos", "engine.burn_rate_alerts",
                     "alerts.routes", "gateway.api_keys", "cost.prices", "budgets"):
            continue
        assert field in keys_in_file, f"{field} missing from example"
    # arrays of tables too
    for section, sub in (
        ("pools", PoolConfig), ("targets", TargetConfig), ("discovery", DiscoveryConfig),
        ("slos", SloConfig),
        ("engine.burn_rate_alerts", BurnRateAlert), ("alerts.routes", AlertRouteConfig),
        ("gateway.api_keys", ApiKeyConfig), ("pools.vllm", VllmProfileConfig),
        ("cost.prices", PriceConfig), ("budgets", BudgetConfig),
    ):
        for name, info in sub.model_fields.items():
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
                continue  # a table of its own, listed above
            assert f"{section}.{name}" in keys_in_file, f"{section}.{name} undocumented"


def test_unknown_key_names_file_and_key(tmp_path):
    p = write(tmp_path, MINIMAL + "\n[store]\npth = 'x.db'\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "store.pth"
    assert e.value.file == str(p)
    assert "unknown key" in str(e.value)


def test_wrong_type(tmp_path):
    text = MINIMAL.replace('name = "chat"\nmodel', 'name = "chat"\nmax_replicas = "lots"\nmodel')
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "pools[0].max_replicas"
    assert "'lots'" in str(e.value)


def test_target_naming_missing_pool(tmp_path):
    p = write(tmp_path, MINIMAL.replace('pool = "chat"', 'pool = "chot"'))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "targets[0].pool"
    assert "'chot' does not exist" in str(e.value)


def test_duplicate_target(tmp_path):
    text = MINIMAL + MINIMAL.split("[[targets]]")[1].join(["[[targets]]", ""])
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "duplicate" in str(e.value)


def test_bad_kind_and_url(tmp_path):
    p = write(tmp_path, MINIMAL.replace('pool = "chat"', 'pool = "chat"\nkind = "triton"'))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "targets[0].kind"
    p = write(tmp_path, MINIMAL.replace("http://127.0.0.1:8000/metrics", "127.0.0.1:8000"))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "targets[0].url"


def test_gpu_without_price(tmp_path):
    p = write(tmp_path, MINIMAL.replace('model = "m"', 'model = "m"\ngpu = "B300"'))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "pools[0].gpu" and "[prices]" in str(e.value)


def test_prices_merge_over_defaults(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL + "\n[prices]\nB300 = 12.5\nH100 = 3.0\n"))
    assert cfg.prices["B300"] == 12.5 and cfg.prices["H100"] == 3.0 and "L4" in cfg.prices


def test_invalid_toml_reports_line(tmp_path):
    p = write(tmp_path, "[store\npath = 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "invalid TOML" in str(e.value) and "line 1" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml")


def test_timeout_above_interval(tmp_path):
    p = write(tmp_path, MINIMAL + '\n[collector]\nscrape_interval = "5s"\nscrape_timeout = "10s"\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "collector"


def test_per_target_overrides(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL.replace(
        'pool = "chat"', 'pool = "chat"\nscrape_interval = "30s"\nscrape_timeout = "20s"')))
    t = cfg.targets[0]
    assert cfg.scrape_interval(t) == 30 and cfg.scrape_timeout(t) == 20
    # only the interval set: the default 10s timeout is capped to it, as in Prometheus
    cfg = load_config(write(tmp_path, MINIMAL.replace(
        'pool = "chat"', 'pool = "chat"\nscrape_interval = "5s"')))
    assert cfg.scrape_timeout(cfg.targets[0]) == 5


def test_explicit_target_timeout_above_interval(tmp_path):
    p = write(tmp_path, MINIMAL.replace(
        'pool = "chat"', 'pool = "chat"\nscrape_interval = "30s"\nscrape_timeout = "1m"'))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "targets[0].scrape_timeout"


@pytest.mark.parametrize(
    "section,line",
    [
        ("collector", "max_body_bytes = '1000'"),
        ("collector", "max_body_bytes = true"),
        ("collector", "max_body_bytes = 1000.0"),
        ("scaling", "scale_out_kv_usage = '0.8'"),
        ("slo_defaults", "ttft_objective = true"),
        ("store", "raw_retention = inf"),
        ("store", "raw_retention = 0"),
        ("collector", "compact_interval = 0"),
        ("scaling", "scale_out_ttft_quantile = 0"),
        ("scaling", "scale_out_ttft_quantile = 1.5"),
        ("rules", "interval = 0"),
        ("rules", "period_interval = '-1m'"),
        ("rules.keda", "min_scale_down_stabilization = '2h'"),
    ],
)
def test_wrong_types_and_ranges_are_errors(tmp_path, section, line):
    p = write(tmp_path, MINIMAL + f"\n[{section}]\n{line}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key.startswith(section)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999/metrics", "http://[::1/metrics", "http:///metrics"]
)
def test_bad_target_urls(tmp_path, url):
    p = write(tmp_path, MINIMAL.replace("http://127.0.0.1:8000/metrics", url))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "targets[0].url"


OLD_KV = MINIMAL + "\n[scaling]\nadmission_kv_usage = 0.85\n"


def test_old_kv_key_loads_with_a_warning_naming_file_and_both_keys(tmp_path, caplog):
    p = write(tmp_path, OLD_KV)
    with pytest.warns(DeprecationWarning) as w:
        cfg = load_config(p)
    assert cfg.alerts.kv_usage_high == 0.85
    (message,) = [str(x.message) for x in w]
    assert message.startswith(f"{p}: ")
    assert "[scaling] admission_kv_usage" in message and "[alerts] kv_usage_high" in message
    assert message in caplog.text  # also logged: DeprecationWarnings are hidden by default


def test_old_kv_key_in_a_config_built_in_code_is_migrated_too():
    with pytest.warns(DeprecationWarning, match="admission_kv_usage"):
        cfg = Config(scaling={"admission_kv_usage": 0.7}, alerts={"budget_low_ratio": 0.2})
    assert (cfg.alerts.kv_usage_high, cfg.alerts.budget_low_ratio) == (0.7, 0.2)


def test_old_and_new_kv_key_together_are_an_error(tmp_path):
    p = write(tmp_path, OLD_KV + "[alerts]\nkv_usage_high = 0.9\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert (e.value.file, e.value.key) == (str(p), "scaling.admission_kv_usage")
    assert "kv_usage_high" in str(e.value)


def test_a_bad_value_under_the_old_kv_key_names_the_old_key(tmp_path):
    p = write(tmp_path, OLD_KV.replace("0.85", "1.5"))
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "scaling.admission_kv_usage"


def test_store_path_relative_to_config(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.store_path() == tmp_path / "vigil.db"


def test_source_is_not_a_user_key():
    with pytest.raises(ConfigError):
        parse_config({"source": "x"})


@pytest.mark.parametrize(
    "text,seconds",
    [("15s", 15), ("1m30s", 90), ("48h", 172800), ("35d", 3024000), ("250ms", 0.25), (7, 7)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["15 sec", "", "m5", "-5s", True, -1])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_format_duration():
    assert format_duration(3600) == "1h" and format_duration(90) == "1m30s"


def test_cli_exit_code_2_on_bad_config(tmp_path):
    p = write(tmp_path, MINIMAL.replace('pool = "chat"', 'pool = "chot"'))
    proc = subprocess.run(
        [sys.executable, "-m", "vigil_shell.cli", "targets", "--config", str(p)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert str(p) in proc.stderr and "targets[0].pool" in proc.stderr
