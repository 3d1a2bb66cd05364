"""The store package's public surface: what ``collector.store`` exports and ``Store`` offers."""

from __future__ import annotations

import collector.store
from collector.store import Store


def test_public_names() -> None:
    assert sorted(collector.store.__all__) == [
        "APPLICATION_ID",
        "CompactionReport",
        "CounterWindow",
        "GaugeWindow",
        "SCHEMA_VERSION",
        "Store",
        "counter_like",
    ]
    for name in collector.store.__all__:
        assert getattr(collector.store, name) is not None


def test_store_methods() -> None:
    public = {n for n in dir(Store) if not n.startswith("_")}
    assert public == {
        "close", "compact", "counter_windows", "downsampled_before_ms", "forget_target",
        "frame", "gauge_windows", "last_points",
        "metric_names", "open_readonly", "points", "series", "series_arrays",
        "set_target_health",
        "target_health", "transaction", "write",
    }

