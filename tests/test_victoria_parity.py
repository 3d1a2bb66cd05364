"""Every Vigil surface on VictoriaMetrics equals Prometheus 2.42 on the same samples.

One vLLM-shaped history (tests/support/backtest_history.py: a replica that restarts, its
counters falling to zero; a replica that joins mid-window and then goes unscraped for ten
minutes; errors, slow first tokens and slow requests in stretches) is backfilled into a real
Prometheus 2.42 and imported into a real VictoriaMetrics 1.79.5. Then:

1. **Raw reading.** ``slo.status.evaluate`` (``recorded_rules = "off"``) over Prometheus
   (``dialect = "promql"``) and over VictoriaMetrics (``dialect = "metricsql"``), both
   ``promql_semantics = "2"``, at instants before, across and after the join, the gap and the
   restart: every number of the status agrees within 1e-6 relative. With ``dialect =
   "promql"`` against VictoriaMetrics the SLO ratios do not (MetricsQL's own ``increase``).
2. **Rules.** The rules ``vigil rules prometheus`` writes for vmalert (``dialect =
   "metricsql"``) run by vmalert's replay record the ratio Prometheus computes from the
   PromQL rule's expression at the same instant (1e-6), and ``evaluate`` with
   ``recorded_rules = "auto"`` reads every SLO from those recorded series, equal to the
   stored samples to the bit.
3. **Access and tenants.** vmauth in front, one basic-auth user and one bearer-token user,
   each confined to its tenant's series (``extra_label``): each tenant's status is its own
   data's; a rotated token file is used from the next evaluation; no secret reaches the
   JSON, the output or the log. A wrong token is refused with a message that names the
   token file and does not show the token (vmauth 1.79 answers 400 and echoes it).
4. **HA deduplication.** Two copies of the series (``prometheus_replica`` a/b, timestamps a
   few ms apart) in a VictoriaMetrics that drops the replica label and deduplicates: the
   status equals Prometheus's single copy; without that, request counts double.

``MEASURED`` collects the largest relative difference per figure kind; ``pytest -s`` prints
it (docs/prometheus-rules.md, "Every Vigil surface on VictoriaMetrics", quotes it).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import itertools
import json
import logging
import math
import signal
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.backtest_history import History, Replica, between
from support.loopback import wait_for
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture
from support.victoria import (
    VictoriaServer,
    VmauthFront,
    VmauthUser,
    import_text,
    require_victoria,
    require_vmalert,
    require_vmauth,
    run_victoria,
    run_vmalert_replay,
    run_vmauth,
    start_victoria,
    tenant_prefix,
)

from alerts.rules import yaml_emitter
from alerts.rules.pipeline import Rule, generate
from slo.objectives.spec import effective_slos, spec_version
from slo.sources.open import open_source
from slo.status import evaluate
from vigil.config import Config, load_config, parse_config
from vigil.errors import SourceError
from vigil.model import Labels

#: An SLO on "availability" warns that it counts requests now (replica_up: the old figure);
#: both are here on purpose.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*indicator \"availability\" now measures requests:DeprecationWarning")

REL_TOL = 1e-6
#: Below this, two numbers are both zero for the comparison (a ratio of 0 on one side may be
#: 1e-17 on the other: extrapolation of a zero increase).
ABS_TOL = 1e-12

#: A whole multiple of 300 s (Unix s), so that vmalert's 30 s and 300 s groups land on it.
T0 = 1_760_000_100
SCRAPE_S = 30.0
#: Scrapes 7 s off the rules' 30 s grid: no window edge falls on a sample.
START = T0 + 7.0
END = START + 4 * 3600.0
RESTART = T0 + 2 * 3600.0 + 15.0
JOIN = T0 + 3600.0 + 1200.0
GAP = (JOIN + 1800.0, JOIN + 2400.0)

#: Before the join; the join inside the 5m/30m windows; inside the gap; right after the
#: restart; the end. None on the 30 s grid, one 0.5 s off it.
INSTANTS = (T0 + 3000.0 + 13.5, JOIN + 120.0 + 11.0, GAP[0] + 300.0 + 1.0,
            RESTART + 90.0 + 4.0, END - 20.0)

#: vmalert's replay: 20 minutes around the restart, on the 300 s grid (the period group's).
REPLAY_FROM = int(RESTART - 15.0 - 600.0)
REPLAY_TO = REPLAY_FROM + 1200
#: Inside the replay, 10 s after an evaluation of the 30 s groups (spec_info 10 s old).
RECORDED_AT = REPLAY_FROM + 900.0 + 10.0

PASSWORD_A = "pw-tenant-a-5c1e7b"
TOKEN_B1 = "tok-tenant-b-first-83d2a9"
TOKEN_B2 = "tok-tenant-b-rotated-47f0c6"
TOKEN_WRONG = "tok-not-known-anywhere-9a1b"
SECRETS = (PASSWORD_A, TOKEN_B1, TOKEN_B2, TOKEN_WRONG,
           base64.b64encode(f"team-a:{PASSWORD_A}".encode()).decode())

#: Largest relative difference per figure kind, filled by the tests, printed at the end.
MEASURED: dict[str, float] = {}


def _history(pool_share: float = 1.0) -> History:
    """The pool's history; ``pool_share`` scales the traffic (tenant b's is another)."""
    return History(
        start=START, end=END, scrape_s=SCRAPE_S,
        replicas=[Replica("chat-0", restarts=[RESTART]),
                  Replica("chat-1", joined=JOIN, gaps=[GAP])],
        rate=lambda t: pool_share * (2.0 + (t - START) / 3600.0),
        ttft_bad=between(T0 + 1800.0, T0 + 9000.0, 0.08, 0.01),
        e2e_bad=between(T0 + 7000.0, END, 0.2, 0.02),
        errors=between(T0 + 6000.0, T0 + 8000.0, 0.05 * pool_share, 0.004),
        # Four digits: VictoriaMetrics keeps about twelve (tests/support/victoria.py).
        kv_usage=lambda t: round(0.4 + 0.5 * ((t - START) % 1800.0) / 1800.0, 4),
        waiting=lambda t: float(int(t - START) // 600 % 7),
    )


SERIES = _history().build()


def _config_dict(dialect: str, recorded: str = "off",
                 url: str = "http://127.0.0.1:9") -> dict[str, Any]:
    return {
        "pools": [{"name": "chat", "model": "meta-llama/Llama-3.1-8B-Instruct"}],
        "engine": {"prometheus_url": url, "promql_semantics": "2", "dialect": dialect,
                   "recorded_rules": recorded},
        # The [rules] intervals are the replay's: freshness of slo:spec_info is judged by them.
        "rules": {"interval": "30s", "period_interval": "5m"},
        "slos": [
            {"name": "chat-ttft", "pool": "chat", "indicator": "ttft"},
            {"name": "chat-e2e", "pool": "chat", "indicator": "e2e"},
            {"name": "chat-errors", "pool": "chat", "indicator": "error_rate"},
            {"name": "chat-availability", "pool": "chat", "indicator": "availability"},
            {"name": "chat-up", "pool": "chat", "indicator": "replica_up"},
        ],
    }


def _config(dialect: str, url: str, recorded: str = "off") -> Config:
    return parse_config(_config_dict(dialect, recorded, url))


def _status(config: Config, at: float) -> dict[str, Any]:
    with open_source(config, "vigil.toml") as source:
        return evaluate(config, source, at)


prom = prometheus_fixture(lambda: SERIES)


@contextlib.contextmanager
def _victoria_with(workdir: Path, *flags: str) -> Iterator[VictoriaServer]:
    server = start_victoria(require_victoria(), workdir, *flags)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaServer]:
    # VictoriaMetrics' defaults, -search.maxQueryLen (16 KiB) included: the generated rules
    # spell each window's increase once, in a WITH template, and stay under it.
    with _victoria_with(tmp_path_factory.mktemp("vm")) as server:
        server.import_series(SERIES)
        yield server


# -- comparing two status documents ------------------------------------------------------------


def _kind(path: str) -> str:
    """The figure kind of a status path, for the measured table."""
    for key, kind in (("burn_rate_alerts", "alert table"), ("error_ratio", "SLO error ratio"),
                      ("burn_rate", "burn rate"), ("budget_remaining", "budget remaining"),
                      (".sli", "SLI"), ("quantiles", "quantiles"), ("kv_cache", "KV cache"),
                      ("queue", "queue"), ("cost", "cost"), ("scaling", "scaling"),
                      ("replicas", "replicas up"), ("anomal", "anomalies")):
        if key in path:
            return kind
    return "other"


def _walk(a: Any, b: Any, path: str, out: dict[str, tuple[Any, Any]]) -> None:
    """Every leaf of ``a`` and ``b`` by path; a path only one side has pairs with None."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in sorted({*a, *b}, key=str):
            _walk(a.get(k), b.get(k), f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(x, y, f"{path}[{i}]", out)
    else:
        out[path] = (a, b)


def _rel(a: float, b: float) -> float:
    if a == b or (abs(a) < ABS_TOL and abs(b) < ABS_TOL):
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any],
                ignore: tuple[str, ...] = ()) -> tuple[list[str], dict[str, float], int]:
    """What differs between two status documents beyond ``REL_TOL`` (paths with both
    values), the largest relative difference per figure kind, and how many numbers were
    compared. Paths containing any of ``ignore`` are skipped."""
    leaves: dict[str, tuple[Any, Any]] = {}
    _walk(ours, theirs, "", leaves)
    bad: list[str] = []
    worst: dict[str, float] = {}
    compared = 0
    for path, (a, b) in leaves.items():
        if any(part in path for part in ignore):
            continue
        if _number(a) and _number(b):
            rel = _rel(float(a), float(b))
            kind = _kind(path)
            worst[kind] = max(worst.get(kind, 0.0), rel)
            compared += 1
            if rel > REL_TOL:
                bad.append(f"{path}: {a!r} against {b!r} ({rel:.2g})")
        elif a != b:
            bad.append(f"{path}: {a!r} against {b!r}")
    return bad, worst, compared


def _measure(what: str, worst: Mapping[str, float]) -> None:
    for kind, rel in worst.items():
        key = f"{what}: {kind}"
        MEASURED[key] = max(MEASURED.get(key, 0.0), rel)


# -- 1. raw reading -------------------------------------------------------------------------


def test_the_history_has_what_it_is_for() -> None:
    """A counter that falls to zero, a replica that joins, a gap: as the docstring says."""
    stop0 = next(s for s in SERIES if s.name == "vllm:request_success_total"
                 and s.labels["instance"] == "chat-0" and s.labels["finished_reason"] == "stop")
    values = [v for _, v in stop0.samples]
    drops = [i for i in range(1, len(values)) if values[i] < values[i - 1]]
    assert len(drops) == 1 and values[drops[0]] < values[drops[0] - 1] / 8
    up1 = next(s for s in SERIES if s.name == "up" and s.labels["instance"] == "chat-1")
    stamps = [t / 1000 for t, _ in up1.samples]
    assert stamps[0] == JOIN + 7.0
    assert max(b - a for a, b in itertools.pairwise(stamps)) == 630.0


def test_raw_reading_agrees_with_prometheus(prom: PrometheusServer, vm: VictoriaServer) -> None:
    total = 0
    for at in INSTANTS:
        theirs = _status(_config("promql", prom.base_url), at)
        ours = _status(_config("metricsql", vm.base_url), at)
        bad, worst, compared = differences(ours, theirs)
        assert not bad, (at, bad[:10])
        _measure("raw", worst)
        total += compared
    assert total > 500


def test_promql_spelled_for_victoria_does_not_agree(prom: PrometheusServer,
                                                    vm: VictoriaServer) -> None:
    """The comparison can fail: MetricsQL's own ``increase`` (no extrapolation, the sample
    before the window as its start) gives other ratios on the same samples."""
    at = INSTANTS[3]
    theirs = _status(_config("promql", prom.base_url), at)
    ours = _status(_config("promql", vm.base_url), at)
    bad, worst, _ = differences(ours, theirs)
    assert any("error_ratio" in b for b in bad), bad
    MEASURED["dialect promql on VictoriaMetrics: SLO error ratio"] = worst["SLO error ratio"]


# -- 2. the rules, run by vmalert ----------------------------------------------------------


def _key(rule: Rule) -> tuple[str, tuple[tuple[str, str], ...]]:
    return rule.record, tuple(sorted(rule.labels.items()))


def _series_key(labels: Labels) -> tuple[str, tuple[tuple[str, str], ...]]:
    d = dict(labels)
    name = d.pop("__name__")
    return name, tuple(sorted(d.items()))


@pytest.fixture(scope="module")
def replayed(vm: VictoriaServer) -> dict[tuple[str, tuple[tuple[str, str], ...]],
                                        list[tuple[int, float]]]:
    """The SLO groups of the MetricsQL rules, replayed by vmalert over ``REPLAY_FROM`` ..
    ``REPLAY_TO`` into ``vm``; what the store holds of every ``slo:`` series afterwards."""
    require_vmalert()
    result = generate(_config("metricsql", vm.base_url, "auto"))
    rules = yaml_emitter.dump({"groups": [g.to_dict() for g in result.slo_groups]})
    run_vmalert_replay(vm, rules, REPLAY_FROM, REPLAY_TO)
    # What the replay can record: the ratios and spec_info read raw series. The burn rates
    # and budget read recorded ones, which replay with -replay.rulesDelay=0s does not wait
    # for (they are computed by Vigil from the ratios anyway).
    want = {_key(r) for r in result.rules()
            if r.record and r.origin.kind in ("sli_error", "spec_info")}

    def stored() -> dict[tuple[str, tuple[tuple[str, str], ...]],
                         list[tuple[int, float]]] | None:
        vm.flush()
        got = vm.query_range_samples('{__name__=~"slo:.+"}', REPLAY_TO,
                                     REPLAY_TO - REPLAY_FROM + 1)
        found = {_series_key(k): v for k, v in got.items()}
        # Every group's last evaluation has landed (remote write is asynchronous).
        done = want <= set(found) and all(found[k][-1][0] == REPLAY_TO * 1000 for k in want)
        return found if done else None

    return wait_for("vmalert's recorded series in victoria-metrics", stored, timeout_s=60)


def test_recorded_ratios_equal_prometheus(prom: PrometheusServer, vm: VictoriaServer,
                                          replayed: dict[Any, list[tuple[int, float]]]) -> None:
    promql = {_key(r): r for r in generate(_config("promql", prom.base_url)).rules()
              if r.record and r.origin.kind == "sli_error"}
    assert len(promql) == 5 * 8  # five SLOs, seven windows and the period
    compared = absent = 0
    worst = 0.0
    for key, rule in promql.items():
        recorded = dict(replayed.get(key, []))
        # Every evaluation from the first to the last, both included: 30 s, the period 5 min.
        step = 300 if key[0].endswith("30d") else 30
        for at in range(REPLAY_FROM, REPLAY_TO + 1, step):
            theirs = list(prom.query(rule.standalone, at).values())
            ours = recorded.get(at * 1000)
            if not theirs or math.isnan(theirs[0]):
                # No number in Prometheus: none, or NaN, recorded.
                assert ours is None or math.isnan(ours), (key, at)
                absent += 1
                continue
            assert ours is not None, (key, at, theirs)
            rel = _rel(ours, theirs[0])
            assert rel <= REL_TOL, (key, at, ours, theirs[0])
            worst = max(worst, rel)
            compared += 1
    assert compared > 1000
    MEASURED["vmalert recorded vs Prometheus: SLO error ratio"] = worst
    MEASURED["vmalert recorded vs Prometheus: absent on both"] = absent


def test_status_reads_the_recorded_series_exactly(
        vm: VictoriaServer, replayed: dict[Any, list[tuple[int, float]]]) -> None:
    config = _config("metricsql", vm.base_url, "auto")
    status = _status(config, RECORDED_AT)
    specs = {s.name: s for s in effective_slos(config)}
    assert status["recorded_rules"]["read"] == sorted(specs)
    assert status["recorded_rules"]["fallback"] == {}
    assert "warnings" not in status
    at_ms = round(RECORDED_AT * 1000)
    read = 0
    for slo in status["slos"]:
        assert slo["read"] == "recorded", slo["name"]
        assert slo["recorded"] == {"spec_version": spec_version(specs[slo["name"]]),
                                   "age_seconds": 10.0}
        labels = (("model_name", slo["model"]), ("pool", "chat"), ("slo", slo["name"]))
        for window, figures in slo["windows"].items():
            points = replayed[(f"slo:sli_error:ratio_rate{window}", labels)]
            # The newest sample at or before the instant: what the store's alerts saw.
            value = [v for t, v in points if t <= at_ms][-1]
            assert figures["error_ratio"] == (None if math.isnan(value) else value)
            objective = slo["objective"]
            if figures["error_ratio"] is not None:
                # The rules' own float operations: ratio / (1 - objective).
                assert figures["burn_rate"] == figures["error_ratio"] / (1 - objective)
            read += 1
        period = replayed[("slo:sli_error:ratio_rate30d", labels)]
        value = [v for t, v in period if t <= at_ms][-1]
        assert slo["period_error_ratio"] == (None if math.isnan(value) else value)
    assert read == 5 * 7
    MEASURED["status (recorded) vs the store's recorded samples"] = 0.0


# -- 3. vmauth: credentials and tenants ----------------------------------------------------


def _tenant(series: list[PromSeries], tenant: str) -> list[PromSeries]:
    return [PromSeries(s.name, {**s.labels, "tenant": tenant}, s.samples) for s in series]


#: Tenant b: a third of the traffic and five times the error share in its bad stretch.
SERIES_B = _history(pool_share=1 / 3).build()


@pytest.fixture(scope="module")
def tenants() -> Iterator[VictoriaServer]:
    with run_victoria(_tenant(SERIES, "a") + _tenant(SERIES_B, "b")) as server:
        yield server


def _auth_users(vm: VictoriaServer, token_b: str) -> list[VmauthUser]:
    return [VmauthUser(tenant_prefix(vm, "tenant", "a"), username="team-a",
                       password=PASSWORD_A),
            VmauthUser(tenant_prefix(vm, "tenant", "b"), bearer_token=token_b)]


def _reload_vmauth(front: VmauthFront, users: list[VmauthUser]) -> None:
    """Rewrite vmauth's ``-auth.config`` (run_vmauth keeps it beside its log) and send SIGHUP,
    which vmauth answers by reloading it; wait (bounded) until it does."""
    (front.log_path.parent / "auth.yml").write_text(
        "users:\n" + "".join(u.yaml() for u in users))
    front.process.send_signal(signal.SIGHUP)
    token = users[1].bearer_token

    def accepted() -> bool:
        resp = httpx.get(f"{front.url}/api/v1/query", params={"query": "1"}, trust_env=False,
                         headers={"Authorization": f"Bearer {token}"})
        return resp.status_code == 200

    wait_for("vmauth to load the new token", accepted, timeout_s=30)


def _write_config(folder: Path, name: str, url: str, http: str) -> Path:
    """A config file whose ``[engine.http]`` is ``http`` (TOML), relative paths beside it."""
    data = _config_dict("metricsql", "off", url)
    path = folder / f"{name}.toml"
    lines = [f'[engine]\nprometheus_url = "{url}"\npromql_semantics = "2"\n'
             'dialect = "metricsql"\nrecorded_rules = "off"\n', http,
             '[[pools]]\nname = "chat"\nmodel = "meta-llama/Llama-3.1-8B-Instruct"\n']
    lines += [f'[[slos]]\nname = "{s["name"]}"\npool = "chat"\nindicator = "{s["indicator"]}"\n'
              for s in data["slos"]]
    path.write_text("\n".join(lines))
    tomllib.loads(path.read_text())  # a test that writes bad TOML says so here
    return path


def _cli_status(config_file: Path, at: float) -> tuple[dict[str, Any], str]:
    """``vigil slo status --json --at <at>``, in process: the JSON and everything printed."""
    from vigil_shell.slo_status_cli import run

    out = io.StringIO()
    args = argparse.Namespace(config=str(config_file), at=at, prometheus_url=None,
                              promql_semantics=None, window=None, json=True,
                              recorded_rules=None, quantile_source="auto")
    assert run(args, out=out) == 0
    text = out.getvalue()
    return json.loads(text), text


def test_each_tenant_sees_its_own_data_and_secrets_stay_secret(
        tenants: VictoriaServer, vm: VictoriaServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    require_vmauth()
    caplog.set_level(logging.INFO)
    (tmp_path / "pw-a").write_text(PASSWORD_A + "\n")
    (tmp_path / "token-b").write_text(TOKEN_B1 + "\n")
    at = INSTANTS[3]
    captured: list[str] = []
    with run_vmauth(_auth_users(tenants, TOKEN_B1)) as front, \
            run_victoria(SERIES_B) as only_b:
        file_a = _write_config(tmp_path, "a", front.url, '[engine.http.basic_auth]\n'
                               'username = "team-a"\npassword_file = "pw-a"\n')
        file_b = _write_config(tmp_path, "b", front.url,
                               '[engine.http]\nbearer_token_file = "token-b"\n')
        status_a, text_a = _cli_status(file_a, at)
        status_b, text_b = _cli_status(file_b, at)
        captured += [text_a, text_b]
        # Each tenant's status is what its own data alone gives, read directly.
        want_a = _status(_config("metricsql", vm.base_url), at)
        want_b = _status(_config("metricsql", only_b.base_url), at)
        for got, want in ((status_a, want_a), (status_b, want_b)):
            bad, worst, compared = differences(got, want)
            assert not bad, bad[:10]
            assert compared > 100
            _measure("through vmauth vs the tenant's data alone", worst)
        # ...and the tenants' numbers differ: a third of the traffic, other error shares.
        err_a = status_a["slos"][2]["windows"]["1h"]["error_ratio"]
        err_b = status_b["slos"][2]["windows"]["1h"]["error_ratio"]
        assert err_a is not None and err_b is not None and err_a != err_b

        # One Vigil process, the token rotated under it: the next evaluation uses the new one.
        config_b = load_config(file_b)
        with open_source(config_b, str(file_b)) as source:
            first = evaluate(config_b, source, at)
            (tmp_path / "token-b").write_text(TOKEN_B2 + "\n")
            _reload_vmauth(front, _auth_users(tenants, TOKEN_B2))  # TOKEN_B1 revoked
            rotated = evaluate(config_b, source, at)
            assert differences(rotated, first)[0] == []
        captured += [json.dumps(first), json.dumps(rotated)]
    captured += [caplog.text, *capsys.readouterr()]
    leaked = [s for s in SECRETS for text in captured if s in text]
    assert not leaked, leaked


def test_a_wrong_token_is_named_by_its_file_never_shown(tenants: VictoriaServer,
                                                        tmp_path: Path) -> None:
    require_vmauth()
    (tmp_path / "token-b").write_text(TOKEN_WRONG + "\n")
    with run_vmauth(_auth_users(tenants, TOKEN_B1)) as front:
        file_b = _write_config(tmp_path, "b", front.url,
                               '[engine.http]\nbearer_token_file = "token-b"\n')
        config_b = load_config(file_b)
        with open_source(config_b, str(file_b)) as source, \
                pytest.raises(SourceError) as refused:
            evaluate(config_b, source, INSTANTS[3])
    message = f"{refused.value}\n{refused.value!r}"
    assert not [s for s in SECRETS if s in message], message
    assert str(tmp_path / "token-b") in message, message


# -- 4. VictoriaMetrics deduplicating an HA pair ------------------------------------------


def _pair(series: list[PromSeries]) -> list[PromSeries]:
    """The series as two Prometheus replicas scrape them: ``b`` 3 ms before ``a``, so the
    last sample of each 30 s interval, the one deduplication keeps, is ``a``'s."""
    out = []
    for replica, shift in (("a", 0), ("b", -3)):
        out += [PromSeries(s.name, {**s.labels, "prometheus_replica": replica},
                           [(t + shift, v) for t, v in s.samples]) for s in series]
    return out


def test_ha_pair_deduplicated_equals_one_copy(prom: PrometheusServer,
                                              tmp_path: Path) -> None:
    relabel = tmp_path / "relabel.yml"
    relabel.write_text("- action: labeldrop\n  regex: prometheus_replica\n")
    body, _ = import_text(_pair(SERIES))
    at = INSTANTS[3]
    with _victoria_with(tmp_path, f"-dedup.minScrapeInterval={SCRAPE_S:g}s",
                        f"-relabelConfig={relabel}") as dedup:
        resp = dedup.http.post("/api/v1/import/prometheus", content=body.encode())
        assert resp.status_code in (200, 204), resp.text
        dedup.flush()
        # Exactly one copy is searchable: replica a's samples, without the replica label.
        dedup.wait_samples(SERIES)
        ours = _status(_config("metricsql", dedup.base_url), at)
    theirs = _status(_config("promql", prom.base_url), at)
    bad, worst, compared = differences(ours, theirs)
    assert not bad, bad[:10]
    assert compared > 100
    _measure("HA pair deduplicated", worst)


def test_ha_pair_without_deduplication_counts_twice(prom: PrometheusServer) -> None:
    at = INSTANTS[3]
    with run_victoria(_pair(SERIES)) as plain:
        config = _config("metricsql", plain.base_url)
        with open_source(config, "vigil.toml") as source:
            doubled = sum(source.increase("vllm:request_success_total", {"pool": "chat"},
                                          at, 3600.0).values())
            ours = evaluate(config, source, at)
    with open_source(_config("promql", prom.base_url), "vigil.toml") as source:
        single = sum(source.increase("vllm:request_success_total", {"pool": "chat"},
                                     at, 3600.0).values())
    assert single > 0 and doubled == pytest.approx(2 * single, rel=REL_TOL)
    theirs = _status(_config("promql", prom.base_url), at)
    queue = ours["pools"]["chat"]["queue_length"], theirs["pools"]["chat"]["queue_length"]
    assert queue[1] > 0 and queue[0] == 2 * queue[1]


def test_print_measured() -> None:
    """Last in the file: the table of what the tests above measured (``pytest -s``)."""
    for key, value in sorted(MEASURED.items()):
        print(f"{key}: {value:.3g}")
    assert not MEASURED or all(v >= 0 for v in MEASURED.values())
