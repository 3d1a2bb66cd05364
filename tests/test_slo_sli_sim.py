"""The error-rate and availability SLIs on the simulator behaving as vLLM does when a request
finishes with reason ``error``: unstreamed, a 500 and a finished error; streamed, a 200 with
the error inside the stream and a finished error. Each failed request is counted once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.store import Store
from serving.sim.testing import FleetHandle, running_fleet, sample_values, total
from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec
from slo.sources.embedded import EmbeddedSource
from vigil.model import SeriesKey, labels_of

AT = 1_795_000_000.0
COUNTERS = ("vllm:request_success_total", "http_requests_total")


def _fail_in_flight(fleet: FleetHandle) -> list[str]:
    """Finish every in-flight request of replica 0 with reason ``error``, once one exists."""
    runner = fleet.replicas[0].runner
    deadline = time.monotonic() + 10
    while not runner.engine.requests:
        if time.monotonic() > deadline:
            raise AssertionError("no request reached the engine")
        time.sleep(0.01)

    async def fail() -> list[str]:
        ids = list(runner.engine.requests)
        return [rid for rid in ids if runner.fail(rid)]

    return fleet.call(fail())


def _scrape(fleet: FleetHandle) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return sample_values(httpx.get(fleet.metrics_urls[0], timeout=10).text)


def _long_body(model: str, stream: bool) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "tell me everything"}],
            "max_tokens": 4000, "ignore_eos": True, "stream": stream}


def _store_of(before: dict[Any, float], after: dict[Any, float], path: Path) -> Store:
    """Two scrapes of the replica as a store: every counter at ``AT - 290`` and ``AT``."""
    target = {"instance": "sim-0", "pool": "chat", "kind": "vllm"}
    rows = []
    for (name, labels), value in after.items():
        if name not in COUNTERS:
            continue
        key = SeriesKey(name, labels_of({**dict(labels), **target}))
        start = before.get((name, labels), 0.0)
        rows += [(key, "counter", round((AT - 290) * 1000), start),
                 (key, "counter", round(AT * 1000), value)]
    store = Store(path)
    store.write(rows)
    return store


def test_a_failed_request_is_counted_once_streamed_or_not(tmp_path: Path) -> None:
    with running_fleet(1) as fleet:
        model = fleet.replicas[0].served_model
        url = f"{fleet.api_urls[0]}/chat/completions"
        before = _scrape(fleet)
        ok = httpx.post(url, json={**_long_body(model, False), "max_tokens": 3}, timeout=30)
        assert ok.status_code == 200

        answer: dict[str, httpx.Response] = {}
        unstreamed = threading.Thread(target=lambda: answer.setdefault(
            "r", httpx.post(url, json=_long_body(model, False), timeout=30)))
        unstreamed.start()
        assert len(_fail_in_flight(fleet)) == 1
        unstreamed.join(30)
        assert answer["r"].status_code == 500  # vLLM's GenerationError

        with httpx.stream("POST", url, json=_long_body(model, True), timeout=30) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            first = next(line for line in lines if line)
            assert first.startswith("data: ")
            assert len(_fail_in_flight(fleet)) == 1
            rest = [line for line in lines if line]
        assert '"code": 500' in rest[-2] or '"code":500' in rest[-2]
        assert rest[-1] == "data: [DONE]"
        after = _scrape(fleet)

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    # 3 finished requests, 2 of them errors; vLLM's API server saw 2 ok answers (the streamed
    # error's 200 among them) and one 500: the unstreamed error, in both counters.
    assert grew("vllm:request_success_total") == 3
    assert grew("vllm:request_success_total", finished_reason="error") == 2
    assert grew("http_requests_total", method="POST", status="2xx") == 2
    assert grew("http_requests_total", method="POST", status="5xx") == 1

    with _store_of(before, after, tmp_path / "v.db") as store:
        source = EmbeddedSource(store)
        spec = SloSpec("e", "chat", model, "all", "error_rate", 0.99, None, 86400.0)
        errors = error_ratio(spec, source, AT, 300)
        # 2 failed of 3, not (2 + 1) of 3: the 500 is the unstreamed error itself.
        assert errors.error_ratio == pytest.approx(2 / 3, rel=1e-12)
        avail = error_ratio(SloSpec("a", "chat", model, "all", "availability", 0.99, None,
                                    86400.0), source, AT, 300)
        # From vLLM's counters the streamed failure is a 2xx answer: 1 server error of 3.
        assert avail.error_ratio == pytest.approx(1 / 3, rel=1e-12)
