"""Restarts of the notifier: the notification log in the outbox keeps a page from repeating.

Each test notifies through one ``Notifier``, closes it (a restart of ``vigil serve``), opens a
new one on the same outbox file and checks what a real receiver on 127.0.0.1 gets next.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path

import pytest
from support.alerts import T0, Receiver, alert, config, receiver, route

from alerts.notifier import Notifier
from alerts.outbox import OutboxError, OutboxItem
from vigil.clock import ManualClock
from vigil.config import Config

#: Alerts that started long ago: their group is flushed at once (no group_wait).
PAGE = alert(starts_at=T0 - 3600)
OTHER = alert(starts_at=T0 - 3600, model="other")  # same group (group_by has no model)


def start(tmp_path: Path, cfg: Config, clock: ManualClock) -> Notifier:
    return Notifier(cfg, tmp_path / "outbox.db", clock=clock, rng=random.Random(1))


def tick(n: Notifier, clock: ManualClock, t: float, alerts: list) -> list[OutboxItem]:  # type: ignore[type-arg]
    """``process`` at ``t`` then deliver what is due."""
    clock.now = t
    items = n.process(t, alerts)
    asyncio.run(n.deliver_due(t))
    return items


def first_page(tmp_path: Path, cfg: Config, clock: ManualClock, rec: Receiver) -> OutboxItem:
    n = start(tmp_path, cfg, clock)
    [item] = tick(n, clock, T0, [PAGE])
    assert item.reason == "first" and item.seq == 1
    assert len(rec.accepted()) == 1
    n.close()
    return item


def test_still_firing_is_not_paged_again_until_repeat_interval(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        cfg = config(route(rec.url))  # group_interval 300, repeat_interval 3600
        first = first_page(tmp_path, cfg, clock, rec)
        n = start(tmp_path, cfg, clock)
        [group] = n.status(T0 + 10)["groups"]
        assert group["last_notified_at"] == T0 and group["notifications"] == 1
        # Every step until repeat_interval after the logged notification: nothing.
        for t in [T0 + 10, *(T0 + 300 * k for k in range(1, 13))]:
            assert tick(n, clock, t, [PAGE]) == [], t
        assert len(rec.accepted()) == 1
        # The first flush after repeat_interval (T0 + 3600 is not "more than" it): one repeat.
        [repeat] = tick(n, clock, T0 + 3900, [PAGE])
        assert repeat.reason == "repeat" and repeat.seq == 2 and repeat.key != first.key
        assert [r.key for r in rec.accepted()] == [first.key, repeat.key]
        assert tick(n, clock, T0 + 4200, [PAGE]) == []
        n.close()


def test_restart_with_the_log_removed_would_page_again(tmp_path: Path) -> None:
    # The control: without the notification log the same restart repeats the page.
    clock = ManualClock(T0)
    with receiver() as rec:
        cfg = config(route(rec.url))
        first_page(tmp_path, cfg, clock, rec)
        with sqlite3.connect(tmp_path / "outbox.db") as c:
            c.execute("DELETE FROM alert_outbox_nflog")
        n = start(tmp_path, cfg, clock)
        [again] = tick(n, clock, T0 + 10, [PAGE])
        assert again.reason == "first" and again.seq == 2
        n.close()


def test_changed_set_after_restart_notifies_once(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        cfg = config(route(rec.url))
        first = first_page(tmp_path, cfg, clock, rec)
        n = start(tmp_path, cfg, clock)
        # The group counts as flushed at T0: the new alert waits for group_interval, not
        # group_wait, and goes out once with the one already notified.
        assert tick(n, clock, T0 + 10, [PAGE, OTHER]) == []
        [update] = tick(n, clock, T0 + 300, [PAGE, OTHER])
        assert update.reason == "new_alerts" and update.seq == 2 and update.firing == 2
        for t in (T0 + 600, T0 + 900):
            assert tick(n, clock, t, [PAGE, OTHER]) == []
        reqs = rec.accepted()
        assert [r.key for r in reqs] == [first.key, update.key]
        assert {a["labels"]["model"] for a in reqs[1].json()["alerts"]} == {"llama", "other"}
        n.close()


def test_resolved_while_down_is_announced_after_restart(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        cfg = config(route(rec.url))
        first = first_page(tmp_path, cfg, clock, rec)
        n = start(tmp_path, cfg, clock)
        assert tick(n, clock, T0 + 10, []) == []  # resolves now; flushed at group_interval
        [resolved] = tick(n, clock, T0 + 300, [])
        assert resolved.reason == "all_resolved" and resolved.alert_status == "resolved"
        assert resolved.seq == 2 and resolved.key != first.key
        body = rec.accepted()[1].json()
        assert body["status"] == "resolved"
        assert [a["labels"]["alertname"] for a in body["alerts"]] == ["SLOBurnRate"]
        # The group is gone, and so is its log entry: another restart sends nothing.
        assert n.grouper.groups() == [] and n.outbox.notification_log() == []
        n.close()
        n = start(tmp_path, cfg, clock)
        assert tick(n, clock, T0 + 600, []) == []
        # Firing again later is a new page, with the next sequence number (never reused).
        [again] = tick(n, clock, T0 + 900, [PAGE])
        assert again.reason == "first" and again.seq == 3
        assert len({r.key for r in rec.accepted()}) == 3
        n.close()


def test_resolved_while_down_without_send_resolved_sends_nothing(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        cfg = config(route(rec.url, send_resolved=False))
        first_page(tmp_path, cfg, clock, rec)
        n = start(tmp_path, cfg, clock)
        for t in (T0 + 10, T0 + 300, T0 + 600):
            assert tick(n, clock, t, []) == []
        assert len(rec.accepted()) == 1
        assert n.outbox.notification_log() == []
        n.close()


def test_keys_continue_across_several_restarts(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        cfg = config(route(rec.url, repeat_interval=600))
        items = [first_page(tmp_path, cfg, clock, rec)]
        for k in range(1, 5):  # a restart between every repeat
            n = start(tmp_path, cfg, clock)
            items += tick(n, clock, T0 + 900 * k - 890, [PAGE])  # right after the restart
            items += tick(n, clock, T0 + 900 * k, [PAGE])
            n.close()
        assert [i.reason for i in items] == ["first", "repeat", "repeat", "repeat", "repeat"]
        assert [i.seq for i in items] == [1, 2, 3, 4, 5]
        assert [r.key for r in rec.accepted()] == [i.key for i in items]
        assert len({i.key for i in items}) == 5


def test_notification_and_log_are_written_together(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock(T0)
    cfg = config(route("http://127.0.0.1:9/hook"))
    n = start(tmp_path, cfg, clock)

    def broken(*args: object) -> None:
        raise OutboxError("disk full")

    monkeypatch.setattr(type(n.outbox), "_write_log", staticmethod(broken))
    with pytest.raises(OutboxError):
        n.process(T0, [PAGE])
    # Neither the notification nor its log entry: the grouper did not count it either.
    assert n.outbox.items() == [] and n.outbox.notification_log() == []
    monkeypatch.undo()
    [item] = n.process(T0 + 1, [PAGE])
    assert item.seq == 1
    [entry] = n.outbox.notification_log()
    assert (entry.firing, entry.sent_at, entry.seq) == ({PAGE.fingerprint}, T0 + 1, 1)
    n.close()


def test_entries_of_removed_routes_are_dropped(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        first_page(tmp_path, config(route(rec.url)), clock, rec)
        n = start(tmp_path, config(route(rec.url, name="renamed")), clock)
        assert n.outbox.notification_log() == []
        [page] = tick(n, clock, T0 + 10, [PAGE])  # a new route: its own first page
        assert page.route == "renamed" and page.reason == "first"
        assert len(rec.accepted()) == 2  # and no spurious "resolved" from the old one
        n.close()
