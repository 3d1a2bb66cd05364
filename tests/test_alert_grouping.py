"""Routes and aggregation groups: Alertmanager's timing on an injected clock."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.alerts import T0, alert, config, route

from alerts.formats import API_RESEND_INTERVAL, API_RESOLVED_RETENTION
from alerts.grouping import Grouper, LogEntry, group_key, route_key
from alerts.model import Notification

URL = "http://127.0.0.1:9/hook"


def grouper(*routes: dict, **alerts: object) -> Grouper:
    return Grouper(config(*routes, **alerts).alerts.routes)


def run(g: Grouper, times: list[float], alerts_at) -> list[Notification]:  # type: ignore[no-untyped-def]
    out = []
    for t in times:
        out += g.step(t, alerts_at(t))
    return out


def test_group_wait_then_first_notification() -> None:
    g = grouper(route(URL))
    a = alert()
    assert g.step(T0, [a]) == []
    assert g.step(T0 + 29.9, [a]) == []
    [n] = g.step(T0 + 30, [a])
    assert n.reason == "first" and n.status == "firing" and n.alerts == (a,)
    assert n.group_key == '{}/{}:{alertname="SLOBurnRate", pool="chat", slo="chat-ttft"}'
    assert dict(n.group_labels) == {"alertname": "SLOBurnRate", "pool": "chat",
                                    "slo": "chat-ttft"}
    assert n.created_at == T0 + 30


def test_alert_that_started_long_ago_flushes_at_once() -> None:
    # Alertmanager: no group_wait for an alert whose wait is already over (after a restart).
    g = grouper(route(URL))
    [n] = g.step(T0, [alert(starts_at=T0 - 31)])
    assert n.reason == "first"


def test_group_interval_batches_changes() -> None:
    g = grouper(route(URL))
    a, b = alert(model="m1"), alert(model="m2")  # same group (group_by has no model)
    g.step(T0, [a])
    [first] = g.step(T0 + 30, [a])
    assert first.alerts == (a,)
    # b joins right after the flush: nothing until the next group_interval tick.
    for t in (T0 + 31, T0 + 200, T0 + 329):
        assert g.step(t, [a, b]) == []
    [second] = g.step(T0 + 330, [a, b])
    assert second.reason == "new_alerts" and set(second.alerts) == {a, b}


def test_repeat_interval_at_the_first_tick_after_it() -> None:
    g = grouper(route(URL, group_interval=300, repeat_interval=3600))
    a = alert()
    sent = [n.created_at - T0 for n in run(g, [T0 + 30 * i for i in range(0, 300)],
                                           lambda t: [a])]
    # Flushes every 300 s from 30 s; the repeat needs sent_at < now - 3600 strictly, so the
    # tick at exactly 3630 does not repeat, the one at 3930 does (as in Alertmanager).
    assert sent == [30.0, 3930.0, 7830.0]


def test_resolved_notification_and_group_disappears() -> None:
    g = grouper(route(URL))
    a = alert()
    g.step(T0, [a])
    g.step(T0 + 30, [a])
    assert g.step(T0 + 100, []) == []  # resolved now, notified at the next tick
    [n] = g.step(T0 + 330, [])
    assert n.reason == "all_resolved" and n.status == "resolved"
    [r] = n.alerts
    assert r.ends_at == T0 + 100 and r.fingerprint == a.fingerprint
    assert g.groups() == []
    assert g.step(T0 + 10_000, []) == []


def test_partial_resolution_with_and_without_send_resolved() -> None:
    a, b = alert(model="m1"), alert(model="m2")
    for send_resolved, expected in ((True, ["first", "resolved"]), (False, ["first"])):
        g = grouper(route(URL, send_resolved=send_resolved))
        got = run(g, [T0, T0 + 30, T0 + 60, T0 + 330], lambda t: [a, b] if t < T0 + 60 else [a])
        assert [n.reason for n in got] == expected
        if send_resolved:
            assert [x.status for x in got[1].alerts] == ["firing", "resolved"]


def test_all_resolved_without_send_resolved_sends_nothing_and_forgets() -> None:
    g = grouper(route(URL, send_resolved=False))
    a = alert()
    got = run(g, [T0, T0 + 30, T0 + 60, T0 + 330], lambda t: [a] if t < T0 + 60 else [])
    assert [n.reason for n in got] == ["first"]
    assert g.groups() == []
    # Firing again later is news again.
    assert [n.reason for n in run(g, [T0 + 400, T0 + 430], lambda t: [a])] == ["first"]


def test_fired_and_resolved_within_group_wait_is_never_sent() -> None:
    g = grouper(route(URL))
    got = run(g, [T0, T0 + 10, T0 + 30, T0 + 400], lambda t: [alert()] if t < T0 + 10 else [])
    assert got == [] and g.groups() == []


def test_explicitly_resolved_alert_keeps_its_end_time() -> None:
    g = grouper(route(URL))
    a = alert()
    g.step(T0, [a])
    g.step(T0 + 30, [a])
    g.step(T0 + 100, [a.resolved_at(T0 + 42)])
    [n] = g.step(T0 + 330, [])
    assert n.alerts[0].ends_at == T0 + 42


def test_group_by_makes_groups_and_keys_like_alertmanager() -> None:
    r = route(URL, match={"severity": "page", "pool": "chat"}, group_by=["alertname", "slo"])
    g = grouper(r)
    alerts = [alert(slo="chat-ttft"), alert(slo="chat-e2e"), alert(slo="chat-e2e", model="x")]
    got = g.step(T0, [a for a in alerts]) + g.step(T0 + 30, alerts)
    assert sorted(n.group_key for n in got) == [
        '{}/{pool="chat",severity="page"}:{alertname="SLOBurnRate", slo="chat-e2e"}',
        '{}/{pool="chat",severity="page"}:{alertname="SLOBurnRate", slo="chat-ttft"}',
    ]
    assert sorted(len(n.alerts) for n in got) == [1, 2]
    cfg_route = config(r).alerts.routes[0]
    assert route_key(cfg_route) == '{}/{pool="chat",severity="page"}'
    assert group_key(cfg_route, {"alertname": "A"}) == route_key(cfg_route) + ':{alertname="A"}'


def test_group_by_everything() -> None:
    g = grouper(route(URL, group_by=["..."]))
    got = run(g, [T0, T0 + 30], lambda t: [alert(model="a"), alert(model="b")])
    assert len(got) == 2


def test_routes_first_match_and_continue() -> None:
    g = grouper(
        route(URL, name="pages", match={"severity": "page"}, continue_matching=True),
        route(URL, name="chat", match={"pool": "chat"}),
        route(URL, name="catch-all"),
    )
    page_chat = alert(severity="page", pool="chat")
    ticket_chat = alert(severity="ticket", pool="chat", slo="x")
    ticket_batch = alert(severity="ticket", pool="batch", slo="y")
    got = run(g, [T0, T0 + 30], lambda t: [page_chat, ticket_chat, ticket_batch])
    routed = sorted((n.route, a.fingerprint) for n in got for a in n.alerts)
    assert routed == sorted([
        ("pages", page_chat.fingerprint), ("chat", page_chat.fingerprint),
        ("chat", ticket_chat.fingerprint), ("catch-all", ticket_batch.fingerprint),
    ])


def test_unrouted_alerts_are_counted() -> None:
    g = grouper(route(URL, match={"severity": "page"}))
    g.step(T0, [alert(severity="ticket"), alert(severity="page")])
    assert g.unrouted == 1


def test_matching_an_empty_value_matches_a_missing_label() -> None:
    g = grouper(route(URL, match={"team": ""}))
    assert g.router.match(alert().labels) and not g.router.match(alert(team="x").labels)


def test_plan_changes_nothing_until_committed() -> None:
    g = grouper(route(URL))
    a = alert()
    g.step(T0, [a])
    plan = g.plan(T0 + 30, [a])
    assert len(plan.notifications) == 1
    assert len(g.plan(T0 + 30, [a]).notifications) == 1  # still due: nothing was committed
    g.commit(plan)
    assert g.plan(T0 + 31, [a]).notifications == ()
    with pytest.raises(RuntimeError, match="stale plan"):
        g.commit(plan)


def test_next_wakeup() -> None:
    g = grouper(route(URL))
    assert g.next_wakeup() is None
    g.step(T0, [alert()])
    assert g.next_wakeup() == T0 + 30
    g.step(T0 + 30, [alert()])
    assert g.next_wakeup() == T0 + 330


def test_alertmanager_api_streams_repost_snapshots() -> None:
    g = grouper(route(URL, name="am", format="alertmanager_api"))
    a, b = alert(slo="a"), alert(slo="b")
    [n] = g.step(T0, [a])  # no group_wait: Alertmanager does the grouping
    assert n.snapshot and n.reason == "snapshot" and n.alerts == (a,)
    assert g.step(T0 + 30, [a]) == []
    [n] = g.step(T0 + API_RESEND_INTERVAL, [a])  # re-posted before resolve_timeout
    [n] = g.step(T0 + API_RESEND_INTERVAL + 1, [a, b])  # a change is posted at once
    assert set(n.alerts) == {a, b}
    [n] = g.step(T0 + 100, [b])
    resolved = [x for x in n.alerts if not x.firing]
    assert [x.fingerprint for x in resolved] == [a.fingerprint] and resolved[0].ends_at == T0 + 100
    # The resolution is re-posted with the firing ones for API_RESOLVED_RETENTION, then dropped.
    t = T0 + 100
    while t < T0 + 100 + API_RESOLVED_RETENTION + 2 * API_RESEND_INTERVAL:
        t += API_RESEND_INTERVAL
        for n in g.step(t, [b]):
            last = n
    assert last.alerts == (b,)
    [n] = g.step(t + 1, [])
    assert [x.status for x in n.alerts] == ["resolved"]


def test_grouping_is_deterministic() -> None:
    def script(t: float) -> list:  # type: ignore[type-arg]
        k = int((t - T0) // 45)
        return [alert(slo=f"s{i}") for i in range(k % 4)] + [alert(pool="b")] * (k % 2)

    times = [T0 + 15 * i for i in range(200)]
    r = route(URL, group_by=["alertname"], group_interval=60, repeat_interval=600)
    first = run(grouper(r), times, script)
    second = run(grouper(r), times, script)
    assert first == second and len(first) > 5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.frozensets(st.sampled_from(["a", "b", "c", "d"])), min_size=1, max_size=40),
       st.sampled_from([10.0, 30.0]), st.booleans())
def test_grouping_invariants(script: list[frozenset[str]], group_wait: float,
                             send_resolved: bool) -> None:
    """Whatever the alerts do: nothing before group_wait, at least group_interval between
    notifications of one group, and once everything resolved, every group that announced a firing
    alert ends with a resolved notification (with send_resolved) and disappears."""
    step, interval = 20.0, 60.0
    g = grouper(route(URL, group_by=["alertname"], group_wait=group_wait,
                      group_interval=interval, repeat_interval=1e9,
                      send_resolved=send_resolved))
    sent: list[Notification] = []
    t = T0
    for names in script:
        sent += g.step(t, [alert(slo=s, starts_at=T0) for s in sorted(names)])
        t += step
    end = t + 2 * interval
    while t <= end:
        sent += g.step(t, [])
        t += step
    assert g.groups() == []
    if not sent:
        return
    assert sent[0].created_at >= T0 + group_wait
    # An "all resolved" notification ends the group; a new one may start sooner after it.
    gaps = [b.created_at - a.created_at for a, b in itertools.pairwise(sent)
            if a.reason != "all_resolved"]
    assert all(gap >= interval for gap in gaps)
    # What the receiver knows at the end: nothing is still firing.
    firing: set[str] = set()
    for n in sent:
        firing = {a.fingerprint for a in n.alerts if a.firing}
    if send_resolved:
        assert firing == set() and sent[-1].status == "resolved"


# --- the notification log across restarts ---------------------------------------------------
def _step_logged(g: Grouper, log: dict[tuple[str, str], LogEntry], t: float,
                 alerts: list) -> list[Notification]:  # type: ignore[type-arg]
    """``step``, applying the plan's log changes to ``log`` as the outbox would."""
    plan = g.plan(t, alerts)
    upserts, deletes = plan.log_changes()
    for e in upserts:
        log[(e.route, e.group_key)] = e
    for gid in deletes:
        del log[gid]
    g.commit(plan)
    return list(plan.notifications)


def _summary(ns: list[Notification]) -> list[tuple]:  # type: ignore[type-arg]
    return [(n.group_key, n.reason, n.status,
             sorted((a.fingerprint, a.status, a.ends_at) for a in n.alerts)) for n in ns]


@settings(max_examples=150, deadline=None)
@given(
    schedule=st.lists(st.sets(st.integers(0, 2)), min_size=2, max_size=10),
    data=st.data(),
    send_resolved=st.booleans(),
)
def test_restored_grouper_continues_like_one_that_never_stopped(
        schedule: list[set[int]], data: st.DataObject, send_resolved: bool) -> None:
    # Steps on the flush grid (group_wait 30, group_interval 300): a grouper rebuilt from the
    # log at any step notifies exactly what the one that kept running notifies.
    pool = [alert(model="m1"), alert(model="m2"), alert(pool="batch")]
    restart = data.draw(st.integers(1, len(schedule) - 1))
    cfg = route(URL, repeat_interval=900, send_resolved=send_resolved)
    times = [T0, *(T0 + 30 + 300 * k for k in range(len(schedule)))]
    steps = [schedule[0], *schedule]
    a, log = grouper(cfg), {}
    for t, s in zip(times[:restart + 1], steps[:restart + 1], strict=True):
        _step_logged(a, log, t, [pool[i] for i in s])
    b = grouper(cfg)
    assert b.restore(list(log.values())) == []
    for t, s in zip(times[restart + 1:], steps[restart + 1:], strict=True):
        active = [pool[i] for i in s]
        assert _summary(_step_logged(b, dict(log), t, active)) == \
            _summary(_step_logged(a, log, t, active))


def test_restore_drops_entries_of_vanished_routes_and_changed_groupings() -> None:
    g = grouper(route(URL))
    log: dict[tuple[str, str], LogEntry] = {}
    _step_logged(g, log, T0, [alert(starts_at=T0 - 60)])
    [entry] = log.values()
    assert entry.firing == {alert().fingerprint} and entry.sent_at == T0
    assert grouper(route(URL, name="other")).restore([entry]) == [entry]
    assert grouper(route(URL, group_by=["alertname"])).restore([entry]) == [entry]
    restored = grouper(route(URL))
    assert restored.restore([entry]) == []
    [group] = restored.groups()
    assert group.has_flushed and group.sent_at == T0 and group.next_flush == T0 + 300
