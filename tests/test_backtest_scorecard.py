"""The scaling-advice scorecard on a history with known episodes, and the bulk replay it reads
equal to the replay of ``vigil serve``'s own call at every instant compared.

Ten hours of the pool ``chat`` (three replicas at 2 requests/s each, a fourth joining at 02:05,
one scrape every 30 s, the TTFT SLO at 0.8 s for 99 %), KV-cache usage 0.2 and an empty queue
except:

* **02:00-02:06, the queue**: 25 requests waiting per replica (75 > 50): the policy scales out
  at 02:00; half the requests are slow from 02:03 to 02:05, so the burn follows the
  scale-out (the queue warned 3.5 minutes ahead; TTFT p95 fired only once the burn ran; KV
  usage never did: the trap of a KV trigger that stays low while the queue grows). The
  fourth replica joined at 02:05: the advice was followed.
* **05:00-05:20, KV-cache usage 0.9** and no slow request: a scale-out on noise.
* **08:00-08:40, half the requests slow** with no queue: TTFT fires after the burn began;
  the scale-out is not followed and the pool burns through the deadline.
* **09:00 on**, the traffic falls to 0.5 requests/s per replica while KV usage stays at 0.35
  (above the scale-in threshold 0.3) until 09:30: with a capacity profile (2.5 requests/s per
  replica), the lower bound allowed three replicas from about 09:01, the scale-in comes at
  09:40: half an hour later than the policy's own 10-minute hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.backtest_history import History, Replica, write_store

from collector.store import Store
from slo.backtest.decisions import replay_fast
from slo.backtest.run import Backtest, backtest
from slo.backtest.scorecard import scorecard
from slo.planning.profile_store import ProfileStore
from slo.planning.replay import replay_decisions
from slo.scaling.policy import SIGNAL_KV, SIGNAL_QUEUE, SIGNAL_TTFT
from slo.sources.embedded import EmbeddedSource
from vigil.capacity import CapacityProfile, ProfileIdentity, SloTarget
from vigil.config import Config, load_config
from vigil.model import SeriesKey, labels_of

HOUR = 3600.0
MINUTE = 60.0
DAY = 86400.0
START = 1_790_000_000.0 - 1_790_000_000.0 % DAY  # midnight UTC
END = START + 10 * HOUR
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def at(h: int, m: int, s: int = 0) -> float:
    return START + h * HOUR + m * MINUTE + s


CONFIG = """
[store]
path = "{store}"

[collector]
scrape_interval = "30s"

[[pools]]
name = "chat"
model = "{model}"
gpu = "H100"

[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
objective = 0.99
"""


def _kv(t: float) -> float:
    if at(5, 0) <= t < at(5, 20):
        return 0.9
    if at(8, 40) <= t < at(9, 30):
        return 0.35
    return 0.2


def _rate(t: float) -> float:
    return 0.5 if t >= at(9, 0) else 2.0


def _slow(t: float) -> float:
    return 0.5 if at(2, 3) <= t < at(2, 5) or at(8, 0) <= t < at(8, 40) else 0.0


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scorecard")
    (folder / "vigil.toml").write_text(CONFIG.format(store=folder / "vigil.db", model=MODEL))
    series = History(start=START, end=END, scrape_s=30.0,
                     replicas=[Replica("chat-0"), Replica("chat-1"), Replica("chat-2"),
                               Replica("chat-3", joined=at(2, 5))],
                     rate=_rate, ttft_bad=_slow, kv_usage=_kv,
                     waiting=lambda t: 25.0 if at(2, 0) <= t < at(2, 6) else 0.0).build()
    with Store(folder / "vigil.db") as store:
        write_store(store, series)
    return folder


def _config(folder: Path, *, profile: bool) -> Config:
    path = folder / "vigil-capacity.json"
    if profile and not path.exists():
        ProfileStore(path).save(CapacityProfile(
            identity=ProfileIdentity(model=MODEL, gpu="H100", gpus_per_replica=1),
            basis="measured", max_concurrency=32, max_goodput_rps=2.5,
            max_output_tokens_per_s=500.0, slos=(SloTarget("chat-ttft", "ttft", 0.8, 0.99),)))
    elif not profile and path.exists():
        path.unlink()
    return load_config(folder / "vigil.toml")


@pytest.fixture(scope="module")
def card(written: Path) -> tuple[Backtest, dict[str, Any]]:
    config = _config(written, profile=False)
    with Store(written / "vigil.db", readonly=True) as store:
        source = EmbeddedSource(store)
        result = backtest(config, source, START + 15 * MINUTE, END)
        return result, scorecard(result, source, config, config.pools[0]).to_dict()


def test_the_bulk_replay_is_the_replay_of_serves_own_call(written: Path) -> None:
    instants = [at(2, 0, 0) + k * 30 for k in range(-2, 24)] + [
        at(5, 0), at(5, 0, 30), at(5, 20, 30), at(8, 0, 30), at(8, 1), at(8, 1, 30),
        at(9, 39, 30), at(9, 40), at(9, 40, 30), at(2, 15)]
    for profile in (False, True):
        config = _config(written, profile=profile)
        pool = config.pools[0]
        with Store(written / "vigil.db", readonly=True) as store:
            source = EmbeddedSource(store)
            fast, _ = replay_fast(source, config, pool, at(1, 50), at(9, 45))
            by_time = dict(fast)
            slow = replay_decisions(source, config, pool, 0, 0, 1, at=instants)
        for t, rec in slow:
            assert by_time[t] == rec, (profile, t)
    # The episodes were seen: scale-outs on the queue and on KV usage, a scale-in.
    actions = {by_time[t].action for t in instants}
    assert actions == {"scale_out", "scale_in", "hold"}


def test_a_scale_out_ahead_of_the_burn_and_the_queue_warning_first(
        card: tuple[Backtest, dict[str, Any]]) -> None:
    _, doc = card
    assert doc["decisions"] == "replay" and doc["interval_seconds"] == 30.0
    outs = {o["at"]: o for o in doc["scale_outs"]}
    queue = outs[at(2, 0)]
    assert queue["first_trigger"] == SIGNAL_QUEUE and queue["triggers"] == [SIGNAL_QUEUE]
    assert not queue["burning"] and queue["outcome"] == "burn followed"
    # The first slow requests are in the 02:03:30 scrape; the 30-second rules see them there.
    assert queue["burn_began_after_seconds"] == 210.0
    assert queue["replicas_added"] == 1 and queue["current"] == 3
    kv = outs[at(5, 0)]
    assert kv["triggers"] == [SIGNAL_KV] and kv["outcome"] == "no burn"
    assert kv["replicas_added"] == 0
    ttft = [o for o in doc["scale_outs"] if at(8, 0) <= o["at"] < at(8, 40)]
    assert len(ttft) == 1
    assert ttft[0]["first_trigger"] == SIGNAL_TTFT and ttft[0]["burning"]
    assert ttft[0]["outcome"] == "still burning" and ttft[0]["replicas_added"] == 0


def test_each_trigger_is_scored_as_warning_late_or_noise(
        card: tuple[Backtest, dict[str, Any]]) -> None:
    _, doc = card
    burns = doc["burns"]
    assert [(b["start"] >= at(2, 3), b["first_trigger"]) for b in burns] == [
        (True, SIGNAL_QUEUE), (True, SIGNAL_TTFT)]
    first = burns[0]
    assert first["trigger_lead_seconds"][SIGNAL_QUEUE] == 210.0
    assert first["trigger_lead_seconds"][SIGNAL_KV] is None
    # TTFT p95 crosses 0.64 s with the same scrape that starts the burn: no warning.
    assert first["trigger_lead_seconds"][SIGNAL_TTFT] == 0.0
    t = doc["triggers"]
    assert t[SIGNAL_QUEUE] | {"median_lead_seconds": 210.0} == t[SIGNAL_QUEUE]
    assert (t[SIGNAL_QUEUE]["early_warnings"], t[SIGNAL_QUEUE]["noise"]) == (1, 0)
    assert (t[SIGNAL_KV]["firings"], t[SIGNAL_KV]["noise"], t[SIGNAL_KV]["burns_missed"]) == (
        1, 1, 2)
    assert t[SIGNAL_TTFT]["early_warnings"] == 0 and t[SIGNAL_TTFT]["late"] == 2
    assert t[SIGNAL_TTFT]["first"] == 1 and t[SIGNAL_QUEUE]["first"] == 1


def test_scale_ins_need_a_capacity_profile_to_be_judged(
        card: tuple[Backtest, dict[str, Any]]) -> None:
    _, doc = card
    assert doc["scale_ins"]
    assert all(s["too_late"] is None for s in doc["scale_ins"])
    assert any("capacity profile" in n for n in doc["notes"])


def test_a_late_scale_in_and_the_gpu_hours_it_cost(written: Path) -> None:
    config = _config(written, profile=True)
    with Store(written / "vigil.db", readonly=True) as store:
        source = EmbeddedSource(store)
        result = backtest(config, source, at(8, 50), END)
        doc = scorecard(result, source, config, config.pools[0]).to_dict()
    (late,) = [s for s in doc["scale_ins"] if s["at"] >= at(9, 30)]
    assert (late["at"], late["current"], late["desired"]) == (at(9, 40), 4, 3)
    # λ over the 10-minute hold falls under 3 × 2.5 = 7.5 requests/s about a minute after the
    # drop (8 → 2 requests/s); the scale-in waited the 10-minute hold after KV usage fell at
    # 09:30: 39 minutes after the bound allowed it, 29 beyond the hold.
    assert at(9, 0) < late["lower_bound_since"] <= at(9, 2)
    assert 28 * MINUTE <= late["late_by_seconds"] <= 29.5 * MINUTE and late["too_late"]
    # 4 replicas against a bound that falls from 3 to 1 within the first 10 minutes: more
    # than one replica-hour wasted over the 39 minutes, fewer than 3 × 39 minutes.
    assert 39 / 60 < late["gpu_hours_above_lower_bound"] < 3 * 39 / 60


def test_serves_kept_decisions_are_used_where_the_history_has_them(written: Path,
                                                                   tmp_path: Path) -> None:
    # serve's exported decision, as a Prometheus scraping it keeps it: scale out 3 -> 5 at
    # 05:00-05:10 (kept), nothing else kept.
    config = _config(written, profile=False)
    copy = tmp_path / "vigil.db"
    copy.write_bytes((written / "vigil.db").read_bytes())
    labels = labels_of({"pool": "chat", "job": "vigil"})
    rows = []
    for k in range(21):
        ts = round((at(5, 0) + 30 * k) * 1000)
        rows.append((SeriesKey("vigil_scaling_current_replicas", labels), "gauge", ts, 3.0))
        rows.append((SeriesKey("vigil_scaling_desired_replicas", labels), "gauge", ts, 5.0))
    with Store(copy) as store:
        store.write(rows)
    with Store(copy, readonly=True) as store:
        source = EmbeddedSource(store, lookback_s=30.0)
        result = backtest(config, source, at(4, 30), at(6, 0))
        doc = scorecard(result, source, config, config.pools[0]).to_dict()
    assert doc["decisions"] == "kept+replay" and doc["kept_evaluations"] == 21
    out = next(o for o in doc["scale_outs"] if o["at"] == at(5, 0))
    assert out["kept"] and (out["current"], out["desired"]) == (3, 5)
    assert out["triggers"] == [SIGNAL_KV]  # the replay's reasons beside serve's numbers
