"""Against a real Alertmanager 0.25 (Debian's ``prometheus-alertmanager``) on a loopback port.

* Vigil forwards alerts to ``POST /api/v2/alerts`` (format ``alertmanager_api``); Alertmanager
  lists them in ``GET /api/v2/alerts`` with the fingerprints Vigil computed, and forgets them
  when Vigil posts their resolution.
* Alertmanager then notifies a webhook receiver; the body it sends is compared, byte for byte,
  with what Vigil's own ``alertmanager`` format renders for the same alerts and route.

The binary is found by ``conftest.require_binary``: missing, the test is skipped, or fails under
CI.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support.alertmanager import POLL_S, Alertmanager, run_alertmanager
from support.alerts import config, receiver, route
from support.loopback import wait_for

from alerts.formats import API_ALERT_VALIDITY, render_alertmanager_webhook
from alerts.grouping import group_key
from alerts.model import Alert, Notification
from alerts.notifier import Notifier

GROUP_BY = ["alertname", "pool", "slo"]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    # A child route like Vigil's: matchers, group_by; tiny waits so the test is quick.
    with receiver() as hook, run_alertmanager(tmp_path, hook, match={"severity": "page"},
                                              group_by=GROUP_BY) as am:
        yield am


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _alerts(now: float) -> list[Alert]:
    started = round(now - 3600.0, 3)  # long ago: Alertmanager flushes the group at once
    common = {"alertname": "SLOBurnRate", "pool": "chat", "severity": "page",
              "model": "meta-llama/Llama-3.1-8B-Instruct"}
    return [
        Alert({**common, "slo": "chat-ttft"},
              {"summary": "TTFT p95 1.42s (SLO < 800ms) & rising",
               "description": "burn rate 14.4 over 1h and 5m",
               "dashboard_url": "http://127.0.0.1:8501/?pool=chat&slo=chat-ttft"},
              starts_at=started, generator_url="http://127.0.0.1:8501/slo?pool=chat&x=1"),
        Alert({**common, "slo": "chat-ttft", "model": "other"},
              {"summary": "second alert of the group"}, starts_at=started + 0.25,
              generator_url="http://127.0.0.1:8501/slo?pool=chat"),
    ]


@pytest.mark.slow
def test_forward_to_alertmanager_api_and_compare_its_webhook(
        tmp_path: Path, alertmanager: Alertmanager) -> None:
    am = alertmanager
    cfg = config(route(f"{am.url}/api/v2/alerts", name="am", format="alertmanager_api"))
    notifier = Notifier(cfg, tmp_path / "outbox.db")
    now = time.time()
    alerts = _alerts(now)
    [item] = notifier.process(now, alerts)
    rnd = asyncio.run(notifier.deliver_due())
    assert (rnd.delivered, rnd.failures) == (1, {}), notifier.outbox.get(item.id).last_error

    # Alertmanager lists them, with our fingerprints, labels and times.
    listed = wait_for("the alerts to be listed", lambda: len(am.alerts()) == 2 and am.alerts(),
                      20, POLL_S)
    by_fp = {a["fingerprint"]: a for a in listed}
    assert set(by_fp) == {a.fingerprint for a in alerts}
    for a in alerts:
        got = by_fp[a.fingerprint]
        assert got["labels"] == dict(a.labels)
        assert got["annotations"] == dict(a.annotations)
        assert got["generatorURL"] == a.generator_url
        assert got["status"]["state"] == "active" and got["receivers"] == [{"name": "hook"}]
        assert abs(_ts(got["startsAt"]) - a.starts_at) < 1e-3
        assert abs(_ts(got["endsAt"]) - (now + API_ALERT_VALIDITY)) < 1e-3

    # Alertmanager's webhook for them is byte for byte what our "alertmanager" format renders.
    # Alertmanager flushes a group at once when its alerts started long ago, and it inserts
    # the alerts of one POST one by one: its first webhook may carry only the first alert, the
    # next one (group_interval later) both. Compare the first that carries the whole group.
    def whole_group() -> list[Any]:
        return [r for r in am.hook.accepted() if len(r.json()["alerts"]) == 2]

    hook_reqs = wait_for("Alertmanager's webhook with both alerts", whole_group, 20, POLL_S)
    theirs = hook_reqs[0].body
    payload = json.loads(theirs)
    assert payload["status"] == "firing"
    hook_route = config(route("http://x/", name="hook", match={"severity": "page"},
                              group_by=GROUP_BY)).alerts.routes[0]
    ours = render_alertmanager_webhook(
        Notification(route="hook", group_key=group_key(hook_route, alerts[0].labels),
                     group_labels={k: alerts[0].labels[k] for k in GROUP_BY},
                     alerts=tuple(alerts), created_at=now, reason="first"),
        external_url=payload["externalURL"])
    assert ours == theirs

    # Resolving: the next snapshot carries endsAt = now; Alertmanager drops them from the list.
    later = time.time()
    [resolved_item] = notifier.process(later, [])
    assert asyncio.run(notifier.deliver_due()).delivered == 1
    assert json.loads(resolved_item.body)[0]["endsAt"] != ""
    wait_for("the resolved alerts to leave the list", lambda: am.alerts() == [], 20, POLL_S)
    resolved = wait_for(
        "Alertmanager's resolved notification",
        lambda: [r for r in am.hook.accepted() if r.json()["status"] == "resolved"], 20, POLL_S)
    assert {a["fingerprint"] for a in resolved[0].json()["alerts"]} == {
        a.fingerprint for a in alerts}
    notifier.close()
