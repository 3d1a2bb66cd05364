"""The collector against real HTTP servers on 127.0.0.1: good, dead, slow and malformed targets."""

from __future__ import annotations

import asyncio
import math
import os

import pytest
from support.loopback import FIXTURES, exposition_server, free_port, slow, text

from collector.service import Collector
from collector.store import Store
from vigil.clock import ManualClock
from vigil.config import parse_config

V1 = (FIXTURES / "vllm_v1_metrics_sample.txt").read_text()
DCGM = (FIXTURES / "dcgm_exporter_sample.txt").read_text()

GOOD_SMALL = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0
"""

BAD = {
    "truncated": GOOD_SMALL + 'vllm:num_requests_waiting{engine="0",model_na',
    "badfloat": GOOD_SMALL.replace(" 3.0", " 3.0.1"),
    "duplicate": GOOD_SMALL + GOOD_SMALL.splitlines()[-1] + "\n",
    "noinf": (
        "# TYPE h histogram\n"
        'h_bucket{le="1.0"} 1\nh_bucket{le="2.0"} 2\nh_count 2\nh_sum 3\n'
    ),
    "html": "<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>",
    "empty": "",
}


# 5 s: a loopback answer can take over a second on a loaded 2-core machine; the test of the
# timeout itself passes its own 1 s.
def config(tmp_path, targets: dict[str, str], interval: str = "15s", timeout: str = "5s"):
    data = {
        "store": {"path": str(tmp_path / "vigil.db")},
        "collector": {"scrape_interval": interval, "scrape_timeout": timeout},
        "pools": [{"name": "chat", "model": "m"}],
        "targets": [
            {"name": n, "url": u, "pool": "chat", "kind": "dcgm" if "dcgm" in n else "vllm"}
            for n, u in targets.items()
        ],
    }
    return parse_config(data)


def run_once(cfg, clock):
    async def go():
        async with Collector(cfg, clock=clock) as c:
            return await c.scrape_all()

    return {h.target: h for h in asyncio.run(go())}


@pytest.fixture
def routes():
    garbage = os.urandom(10 * 1024 * 1024)
    r = {
        "/v1": text(V1),
        "/dcgm": text(DCGM),
        "/small": text(GOOD_SMALL),
        "/slow": slow(3.0, text(GOOD_SMALL)),
        "/err500": text("internal error", status=500),
        "/garbage": text(garbage, ctype="application/octet-stream"),
    }
    for name, body in BAD.items():
        r[f"/{name}"] = text(body)
    return r


def test_good_targets_store_samples_with_target_labels(tmp_path, routes):
    clock = ManualClock(1_795_000_000.0)
    with exposition_server(routes) as base:
        cfg = config(tmp_path, {"chat-0": f"{base}/v1", "chat-0-dcgm": f"{base}/dcgm"})
        health = run_once(cfg, clock)
    assert health["chat-0"].up and health["chat-0"].error == ""
    assert health["chat-0"].samples == sum(
        1 for line in V1.splitlines() if line and not line.startswith("#")
    )
    with Store(cfg.store_path()) as store:
        pts = store.points(
            "vllm:request_success_total", {"instance": "chat-0", "finished_reason": "stop"}
        )
        assert len(pts) == 1
        (key, points), = pts.items()
        assert key.as_dict()["pool"] == "chat" and key.as_dict()["kind"] == "vllm"
        assert points[0].ts_ms == 1_795_000_000_000
        up = store.points("up", {"instance": "chat-0"})
        assert [p.value for p in next(iter(up.values()))] == [1.0]
        gpu = store.points("DCGM_FI_DEV_GPU_UTIL", {"instance": "chat-0-dcgm"})
        assert len(gpu) == 2  # two GPUs on that node
        samples = store.points("scrape_samples_scraped", {"instance": "chat-0"})
        assert next(iter(samples.values()))[0].value == health["chat-0"].samples


@pytest.mark.parametrize(
    "route,reason",
    [
        ("truncated", "line 8"),
        ("badfloat", "line 3"),
        ("duplicate", "duplicate"),
        ("noinf", "+Inf"),
        ("html", "HTML"),
        ("empty", "empty"),
        ("garbage", "parse error"),
        ("err500", "HTTP status 500"),
    ],
)
def test_bad_target_recorded_down_with_reason(tmp_path, routes, route, reason):
    clock = ManualClock()
    with exposition_server(routes) as base:
        cfg = config(tmp_path, {"bad": f"{base}/{route}", "good": f"{base}/small"})
        health = run_once(cfg, clock)
    assert not health["bad"].up
    assert reason in health["bad"].error, health["bad"].error
    assert health["good"].up, "a bad target must not affect the others"
    with Store(cfg.store_path()) as store:
        up = store.points("up", {"instance": "bad"})
        assert [p.value for p in next(iter(up.values()))] == [0.0]
        assert store.points("vllm:num_requests_running", {"instance": "bad"}) == {}
        assert store.points("vllm:num_requests_running", {"instance": "good"})


def test_dead_and_slow_targets_do_not_delay_others(tmp_path, routes):
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    with exposition_server(routes) as base:
        cfg = config(
            tmp_path, {"dead": dead, "slow": f"{base}/slow", "good": f"{base}/small"},
            timeout="1s",
        )
        health = run_once(cfg, ManualClock())
    assert "connection refused" in health["dead"].error
    assert "timeout after 1s" in health["slow"].error
    assert health["good"].up
    # Scrapes run concurrently: the good one's own duration is unaffected by the slow one.
    assert health["good"].duration < health["slow"].duration


def test_body_size_limit(tmp_path, routes):
    with exposition_server(routes) as base:
        data = {
            "store": {"path": str(tmp_path / "v.db")},
            "collector": {"max_body_bytes": 1000},
            "pools": [{"name": "chat", "model": "m"}],
            "targets": [{"name": "big", "url": f"{base}/v1", "pool": "chat"}],
        }
        health = run_once(parse_config(data), ManualClock())
    assert "exceeds the limit of 1000 bytes" in health["big"].error


def test_staleness_marker_when_series_disappears(tmp_path):
    bodies = [GOOD_SMALL, GOOD_SMALL.replace(
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0\n', ""
    )]
    state = {"i": 0}

    def route():
        body = bodies[min(state["i"], 1)]
        state["i"] += 1
        return 200, "text/plain", body.encode()

    clock = ManualClock(1_795_000_000.0)
    with exposition_server({"/m": route}) as base:
        cfg = config(tmp_path, {"t": f"{base}/m"})

        async def go():
            async with Collector(cfg, clock=clock) as c:
                await c.scrape_all()
                clock.advance(15)
                await c.scrape_all()

        asyncio.run(go())
    with Store(cfg.store_path()) as store:
        pts = store.points("vllm:request_success_total", {"finished_reason": "length"})
        values = next(iter(pts.values()))
        assert values[0].value == 2.0 and values[1].value is None  # stale marker
        assert values[1].ts_ms == 1_795_000_015_000
        stop = next(iter(store.points(
            "vllm:request_success_total", {"finished_reason": "stop"}).values()))
        assert [p.value for p in stop] == [10.0, 10.0]


def test_failed_scrape_marks_previous_series_stale(tmp_path):
    state = {"up": True}

    def route():
        if state["up"]:
            return 200, "text/plain", GOOD_SMALL.encode()
        return 503, "text/plain", b"down"

    clock = ManualClock(1_795_000_000.0)
    with exposition_server({"/m": route}) as base:
        cfg = config(tmp_path, {"t": f"{base}/m"})

        async def go():
            async with Collector(cfg, clock=clock) as c:
                await c.scrape_all()
                state["up"] = False
                clock.advance(15)
                await c.scrape_all()
                clock.advance(15)
                await c.scrape_all()

        asyncio.run(go())
    with Store(cfg.store_path()) as store:
        running = next(iter(store.points("vllm:num_requests_running").values()))
        # one real value, one marker at the first failure, nothing after
        assert [p.value for p in running] == [3.0, None]
        up = next(iter(store.points("up").values()))
        assert [p.value for p in up] == [1.0, 0.0, 0.0]
        (h,) = store.target_health()
        assert not h.up and "503" in h.error


def test_vllm_underscore_spelling_stored_as_colon(tmp_path):
    om = (FIXTURES / "vllm_v1_metrics_sample.openmetrics.txt").read_bytes()
    route = text(om, ctype="application/openmetrics-text; version=1.0.0; charset=utf-8")
    with exposition_server({"/om": route, "/txt": text(V1)}) as base:
        cfg = config(tmp_path, {"om": f"{base}/om", "txt": f"{base}/txt"})
        health = run_once(cfg, ManualClock())
    assert health["om"].up, health["om"].error
    with Store(cfg.store_path()) as store:
        names = set(store.metric_names())
        assert "vllm:num_requests_running" in names
        assert not any(n.startswith("vllm_") for n in names)
        a = store.points("vllm:kv_cache_usage_perc", {"instance": "om"})
        b = store.points("vllm:kv_cache_usage_perc", {"instance": "txt"})
        assert [p.value for p in next(iter(a.values()))] == [
            p.value for p in next(iter(b.values()))
        ]


def test_scraped_label_clash_becomes_exported(tmp_path):
    body = '# TYPE g gauge\ng{instance="other",pool="x"} 1\n'
    with exposition_server({"/m": text(body)}) as base:
        cfg = config(tmp_path, {"t": f"{base}/m"})
        run_once(cfg, ManualClock())
    with Store(cfg.store_path()) as store:
        (key,) = store.points("g")
        labels = key.as_dict()
        assert labels["instance"] == "t" and labels["exported_instance"] == "other"
        assert labels["pool"] == "chat" and labels["exported_pool"] == "x"


def test_nan_gauge_survives(tmp_path):
    body = "# TYPE g gauge\ng NaN\n"
    with exposition_server({"/m": text(body)}) as base:
        cfg = config(tmp_path, {"t": f"{base}/m"})
        run_once(cfg, ManualClock())
    with Store(cfg.store_path()) as store:
        (pts,) = store.points("g").values()
        assert pts[0].value is not None and math.isnan(pts[0].value)


def test_counter_without_total_keeps_its_exposed_name(tmp_path):
    # dcgm-exporter's energy counter has no `_total`; Prometheus stores it as exposed.
    with exposition_server({"/dcgm": text(DCGM)}) as base:
        cfg = config(tmp_path, {"n-dcgm": f"{base}/dcgm"})
        run_once(cfg, ManualClock())
    with Store(cfg.store_path()) as store:
        names = set(store.metric_names())
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in names
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in names


def test_trickling_target_is_held_to_its_timeout(tmp_path):
    # A target that sends one byte every 0.25 s: httpx's per-read timeout never fires, so
    # only an overall deadline stops it.
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: 100000\r\n\r\n")
                for _ in range(40):
                    if stop.is_set():
                        break
                    try:
                        conn.sendall(b"#")
                    except OSError:
                        break
                    stop.wait(0.25)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        port = srv.getsockname()[1]
        cfg = config(tmp_path, {"trickle": f"http://127.0.0.1:{port}/metrics"}, timeout="1s")
        health = run_once(cfg, ManualClock())
    finally:
        stop.set()
        thread.join(timeout=5)
        srv.close()
    assert not health["trickle"].up
    assert health["trickle"].error == "timeout after 1s"
    assert health["trickle"].duration < 2.5


def test_second_collector_on_the_same_store_is_refused(tmp_path, routes):
    from vigil.errors import StoreError

    with exposition_server(routes) as base:
        cfg = config(tmp_path, {"t": f"{base}/small"})

        async def go():
            async with Collector(cfg):
                with pytest.raises(StoreError, match="already writing"):
                    async with Collector(cfg):
                        pass

        asyncio.run(go())
