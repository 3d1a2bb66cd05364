"""``tests/support/dashboard_seed.py`` seeds what the dashboard's pages read: a config naming
every replica, a store with every series, and gateway records readable as a request log."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.dashboard_seed import AT, seed_dashboard

from collector.store import Store
from vigil.config import load_config


# --- seeded data holds what the pages need -----------------------------------------------------
@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_dashboard(tmp_path_factory.mktemp("seed"), gateway=True)


def test_config_is_valid_and_names_every_replica(seeded: Path) -> None:
    cfg = load_config(seeded)
    assert [p.name for p in cfg.pools] == ["chat", "batch"]
    assert {t.name for t in cfg.targets} == {"chat-0", "chat-0-gpu", "chat-1", "chat-1-gpu",
                                             "batch-0", "batch-0-gpu"}


def test_store_has_every_series_the_pages_read(seeded: Path) -> None:
    with Store(seeded.parent / "vigil.db", readonly=True) as store:
        names = set(store.metric_names())
        last = store.last_points("up", {"instance": "chat-0"})
    assert {"up", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
            "vllm:iteration_tokens_total_bucket", "vllm:num_preemptions_total",
            "vllm:prefix_cache_hits_total", "vllm:spec_decode_num_accepted_tokens_total",
            "DCGM_FI_PROF_SM_ACTIVE", "vllm:time_to_first_token_seconds_bucket"} <= names
    assert [p.ts_ms for p in last.values()] == [round(AT * 1000)]


def test_gateway_records_are_readable_as_a_request_log(seeded: Path) -> None:
    from slo.sources.request_log import GatewayRecords

    records = list(GatewayRecords(seeded.parent / "vigil-gateway.db").records("chat", AT, 3600))
    assert len(records) == 300
    assert {r.tier for r in records} == {"premium", "standard", "batch"}
    assert max(r.generated_tokens for r in records) == 60_000
