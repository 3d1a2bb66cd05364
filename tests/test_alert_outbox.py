"""The SQLite outbox: durability, order per group, backoff, expiry, idempotency keys."""

from __future__ import annotations

import random
import sqlite3
import uuid
from pathlib import Path

import pytest
from support.alerts import T0, alert, config, route

from alerts.grouping import LogEntry
from alerts.model import Notification
from alerts.outbox import Outbox, OutboxError, backoff_delay

URL = "http://127.0.0.1:9/hook"
ROUTE = config(route(URL)).alerts.routes[0]


class FixedRandom(random.Random):
    """``uniform`` returns the low end, the middle or the high end of the range."""

    def __init__(self, where: float):
        super().__init__(0)
        self.where = where

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.where


def note(group: str = "g1", t: float = T0, *, snapshot: bool = False) -> Notification:
    return Notification(route="hook", group_key=group, group_labels={}, alerts=(alert(),),
                        created_at=t, reason="snapshot" if snapshot else "first",
                        snapshot=snapshot)


def put(ob: Outbox, *notes: Notification) -> list[int]:
    items = ob.enqueue([(n, f"body {n.group_key} {n.created_at}".encode(), ROUTE)
                        for n in notes], now=max(n.created_at for n in notes))
    return [i.id for i in items]


@pytest.fixture
def ob(tmp_path: Path) -> Outbox:
    o = Outbox(tmp_path / "outbox.db", retry_initial=1.0, retry_max=300.0, max_age=3600.0,
               rng=FixedRandom(0.5))
    yield o  # type: ignore[misc]
    o.close()


def test_enqueue_is_durable_and_keys_are_stable(tmp_path: Path, ob: Outbox) -> None:
    ids = put(ob, note("g1"), note("g1", T0 + 1), note("g2"))
    items = [ob.get(i) for i in ids]
    assert [(i.group_key, i.seq) for i in items] == [("g1", 1), ("g1", 2), ("g2", 1)]
    assert len({i.key for i in items}) == 3
    for i in items:
        uuid.UUID(i.key)
        assert i.status == "pending" and i.attempts == 0 and i.next_attempt_at == i.created_at
        assert i.url == URL and i.format == "generic" and i.timeout == 5.0
    # Another connection (another process) sees every row, with the same keys.
    other = Outbox(tmp_path / "outbox.db")
    assert [(i.id, i.key, i.body) for i in other.items()] == [(i.id, i.key, i.body) for i in items]
    assert other.instance == ob.instance
    other.close()
    with sqlite3.connect(tmp_path / "outbox.db") as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_next_due_offers_only_the_head_of_each_group(ob: Outbox) -> None:
    a1, a2, b1 = put(ob, note("a"), note("a", T0 + 1), note("b", T0 + 2))
    assert [i.id for i in ob.next_due(T0 + 5)] == [a1, b1]
    assert ob.begin_attempt(a1, T0 + 5) == 1
    assert [i.id for i in ob.next_due(T0 + 5)] == [b1]  # a1 in flight; a2 waits behind it
    ob.fail(a1, T0 + 6, "HTTP 500")
    assert [i.id for i in ob.next_due(T0 + 6)] == [b1]  # a1 backing off; a2 still waits
    assert [i.id for i in ob.next_due(T0 + 7)] == [b1, a1]  # the longest due first
    ob.begin_attempt(a1, T0 + 7)
    ob.ack(a1, T0 + 7)
    assert [i.id for i in ob.next_due(T0 + 7)] == [a2, b1]  # a2 is due since T0 + 1
    assert ob.head("a", "nope") is None and ob.head("hook", "a").id == a2  # type: ignore[union-attr]


def test_backoff_doubles_up_to_the_cap_with_jitter(ob: Outbox) -> None:
    [i] = put(ob, note())
    t = T0
    delays = []
    for _ in range(12):
        ob.begin_attempt(i, t)
        after = ob.fail(i, t, "HTTP 503")
        delays.append(after.next_attempt_at - t)
        t = after.next_attempt_at
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    assert ob.get(i).attempts == 12 and ob.get(i).last_error == "HTTP 503"
    low, high = FixedRandom(0.0), FixedRandom(1.0)
    assert backoff_delay(3, initial=1, cap=300, rng=low) == 2.0
    assert backoff_delay(3, initial=1, cap=300, rng=high) == 6.0
    assert backoff_delay(10_000, initial=1, cap=300, rng=high) == 450.0
    rng = random.Random(7)
    for n in range(1, 20):
        d = backoff_delay(n, initial=1, cap=300, rng=rng)
        base = min(300, 2 ** (n - 1))
        assert 0.5 * base <= d <= 1.5 * base


def test_max_age_gives_up_and_unblocks_the_group(ob: Outbox) -> None:
    old, newer = put(ob, note("a", T0), note("a", T0 + 3000))
    ob.begin_attempt(old, T0)
    ob.fail(old, T0, "cannot connect")
    assert ob.expire(T0 + 3599) == []
    [gone] = ob.expire(T0 + 3600)
    assert gone.id == old and gone.status == "given_up"
    assert "given up after 3600 s and 1 attempts (last: cannot connect)" in gone.last_error
    assert [i.id for i in ob.next_due(T0 + 3600)] == [newer]
    # A failure past max_age gives up at once too.
    ob.begin_attempt(newer, T0 + 6600)
    assert ob.fail(newer, T0 + 6600, "HTTP 500").status == "given_up"
    s = ob.stats(T0 + 6600)
    assert (s.pending, s.given_up, s.done) == (0, 2, 0)


def test_recover_after_a_crash_mid_attempt(tmp_path: Path, ob: Outbox) -> None:
    [i] = put(ob, note())
    assert ob.begin_attempt(i, T0 + 1) == 1
    assert ob.begin_attempt(i, T0 + 1) is None  # already in flight
    assert ob.next_due(T0 + 100) == []
    assert ob.stats(T0 + 1).in_flight == 1
    # The process dies here: a new one recovers the row, due at once, same key.
    again = Outbox(tmp_path / "outbox.db")
    [stuck] = again.recover(T0 + 50)
    assert stuck.id == i
    [due] = again.next_due(T0 + 50)
    assert due.key == ob.get(i).key and due.inflight_since is None
    assert "interrupted" in (due.last_error or "")
    assert again.begin_attempt(i, T0 + 50) == 2
    again.ack(i, T0 + 51)
    assert again.next_due(T0 + 1000) == [] and again.get(i).status == "done"
    again.close()


def test_acknowledged_rows_are_never_offered_again(ob: Outbox) -> None:
    [i] = put(ob, note())
    ob.begin_attempt(i, T0)
    ob.ack(i, T0)
    assert ob.begin_attempt(i, T0 + 1) is None
    assert ob.next_due(T0 + 10**6) == [] and ob.expire(T0 + 10**6) == []


def test_keys_never_repeat_even_in_a_recreated_outbox(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    first = Outbox(path)
    k1 = first.enqueue([(note(), b"x", ROUTE)], T0)[0].key
    first.close()
    path.unlink()
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    second = Outbox(path)
    k2 = second.enqueue([(note(), b"x", ROUTE)], T0)[0].key
    second.close()
    assert k1 != k2  # same route, group and sequence number, different outbox instance


def test_sequence_survives_pruning(ob: Outbox) -> None:
    ids = put(ob, note(), note(t=T0 + 1))
    for i in ids:
        ob.begin_attempt(i, T0 + 2)
        ob.ack(i, T0 + 2)
    assert ob.prune(T0 + 10_000, keep_seconds=60) == 0  # the newest rows are kept...
    import alerts.outbox as module

    old = module.KEEP_FINISHED
    module.KEEP_FINISHED = 0
    try:
        assert ob.prune(T0 + 10_000, keep_seconds=60) == 2  # ...unless there are too many
    finally:
        module.KEEP_FINISHED = old
    [i] = put(ob, note(t=T0 + 3))
    assert ob.get(i).seq == 3


def test_snapshots_supersede_older_pending_ones(ob: Outbox) -> None:
    s1, s2 = put(ob, note("am", T0, snapshot=True), note("am", T0 + 60, snapshot=True))
    assert ob.get(s1).status == "superseded" and ob.get(s2).status == "pending"
    # One in flight is not superseded, but if it then fails, the newer one replaces it.
    ob.begin_attempt(s2, T0 + 61)
    [s3] = put(ob, note("am", T0 + 120, snapshot=True))
    assert ob.get(s2).status == "pending"
    assert ob.fail(s2, T0 + 121, "HTTP 500").status == "superseded"
    assert [i.id for i in ob.next_due(T0 + 121)] == [s3]


def test_active_alerts_round_trip(ob: Outbox) -> None:
    a = alert()
    ob.save_active([(a, ["hook"])])
    assert ob.active() == [(a, ["hook"])]
    ob.save_active([])
    assert ob.active() == []


def test_not_an_sqlite_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(OutboxError, match=r"bad\.db"):
        Outbox(bad)


def test_every_commit_is_synced_to_disk(ob: Outbox) -> None:
    """synchronous = FULL: a committed notification survives a power loss, not only a crash."""
    assert ob._db.query("PRAGMA synchronous") == [(2,)]


def test_a_closed_outbox_says_so_by_name(ob: Outbox) -> None:
    ob.close()
    with pytest.raises(OutboxError, match=r"outbox\.db: the alert outbox is closed"):
        put(ob, note())


def _entry(group: str, t: float, firing: set[str]) -> LogEntry:
    a = alert()
    return LogEntry(route="hook", group_key=group, labels={"pool": "chat"}, created_at=T0,
                    firing=frozenset(firing), resolved=frozenset(), sent_at=t, alerts=(a,),
                    notifications=1)


def test_notification_log_is_written_with_the_notifications(ob: Outbox) -> None:
    fp = alert().fingerprint
    ob.enqueue([(note("g1"), b"b", ROUTE)], T0, log=[_entry("g1", T0, {fp})])
    [e] = ob.notification_log()
    assert (e.group_key, e.firing, e.sent_at, e.seq, e.alerts) == ("g1", {fp}, T0, 1, (alert(),))
    assert dict(e.labels) == {"pool": "chat"}
    # A log update without a notification keeps the last sequence number.
    ob.enqueue([], T0 + 5, log=[_entry("g1", T0 + 5, set())])
    [e] = ob.notification_log()
    assert (e.firing, e.sent_at, e.seq) == (frozenset(), T0 + 5, 1)
    ob.enqueue([(note("g1", T0 + 9), b"b", ROUTE)], T0 + 9, forget=[("hook", "g1")])
    assert ob.notification_log() == []
    ob.enqueue([], T0 + 9, log=[_entry("g2", T0 + 9, {fp})])
    ob.forget_log([("hook", "g2")])
    assert ob.notification_log() == []


def test_an_outbox_file_from_before_the_notification_log_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = Outbox(path)
    [item] = old.enqueue([(note("g1"), b"body", ROUTE)], T0)
    old.close()
    with sqlite3.connect(path) as c:
        c.execute("DROP TABLE alert_outbox_nflog")  # as written by an older Vigil
    ob = Outbox(path)
    assert ob.notification_log() == []
    assert [(i.key, i.status, i.body) for i in ob.items()] == [(item.key, "pending", b"body")]
    [nxt] = ob.enqueue([(note("g1", T0 + 1), b"b", ROUTE)], T0 + 1,
                       log=[_entry("g1", T0 + 1, {alert().fingerprint})])
    assert nxt.seq == 2 and ob.notification_log()[0].seq == 2
    ob.close()
