"""The leader's lease (vigil/storage/lease.py, alerts/leadership.py) and the outbox shared on
PostgreSQL (alerts/outbox.py): one holder at a time by the database's clock, numbered terms,
fenced writes, and no two leaders across a database restart. SQLite and a real PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.alerts import alert, config, route

from alerts.leadership import Leadership
from alerts.model import Notification
from alerts.notifier import Notifier
from alerts.outbox import Outbox
from vigil.conventions import OUTBOX_DONE, OUTBOX_PENDING, SERVE_LEASE_NAME
from vigil.errors import ConfigError, LeaseLost, StoreError
from vigil.storage.database import SqlDatabase, open_database
from vigil.storage.lease import LEASE_SCHEMA, Lease


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "shared.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def db(target: str) -> Iterator[SqlDatabase]:
    d = open_database(target, what="the lease", schema=LEASE_SCHEMA)
    yield d
    d.close()


def test_one_holder_at_a_time_and_terms_count_changes(db: SqlDatabase) -> None:
    a = Lease(db, "x", "a", 0.6)
    b = Lease(db, "x", "b", 0.6)
    first = a.acquire()
    assert first.held and first.token == 1 and first.holder == "a"
    assert first.remaining == pytest.approx(0.6)
    seen = b.acquire()
    assert not seen.held and seen.holder == "a" and seen.token == 1 and seen.deadline is None
    # Renewing keeps the term.
    assert a.acquire().token == 1
    time.sleep(0.8)  # a's lease runs out: b takes it in the next term
    taken = b.acquire()
    assert taken.held and taken.token == 2
    assert not a.acquire().held
    # A clean release lets the other in at once, in a new term.
    assert b.release(2)
    again = a.acquire()
    assert again.held and again.token == 3


def test_a_holder_back_after_its_lease_ran_out_starts_a_new_term(db: SqlDatabase) -> None:
    a = Lease(db, "x", "a", 0.3)
    assert a.acquire().token == 1
    time.sleep(0.5)
    # Nobody took it meanwhile, but writes fenced with term 1 must not pass any more.
    assert a.acquire().token == 2


def test_deadline_is_measured_from_the_request_on_the_local_clock(db: SqlDatabase) -> None:
    ticks = iter([100.0])
    lease = Lease(db, "x", "a", 5.0, monotonic=lambda: next(ticks))
    state = lease.acquire()
    assert state.deadline == 105.0


def test_fence_refuses_another_term_and_a_short_lease(db: SqlDatabase) -> None:
    a = Lease(db, "x", "a", 3.0)
    term = a.acquire().token
    check = a.fence(term)
    with db.transaction() as c:
        check(c, 1.0)  # held, with more than a second left
    with pytest.raises(LeaseLost, match="less than the 10 s"), db.transaction() as c:
        check(c, 10.0)
    with pytest.raises(LeaseLost, match=r"held by a \(term 1\), not by a \(term 7\)"), \
            db.transaction() as c:
        a.fence(7)(c, 0.0)
    b = Lease(db, "x", "b", 3.0)
    a.release(term)
    assert b.acquire().held
    with pytest.raises(LeaseLost, match=r"held by b \(term 2\)"), db.transaction() as c:
        check(c, 0.0)


def test_concurrent_takers_elect_exactly_one(target: str) -> None:
    dbs = [open_database(target, what="the lease", schema=LEASE_SCHEMA) for _ in range(6)]
    results: list[bool] = []
    lock = threading.Lock()
    start = threading.Barrier(len(dbs))

    def take(i: int) -> None:
        lease = Lease(dbs[i], "race", f"copy-{i}", 30.0)
        start.wait()
        for _ in range(20):
            try:
                held = lease.acquire().held
            except StoreError:  # SQLite: another writer held the file past the busy timeout
                continue
            with lock:
                results.append(held)
            if held:
                return

    try:
        threads = [threading.Thread(target=take, args=(i,)) for i in range(len(dbs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        holders = dbs[0].query("SELECT holder, token FROM vigil_lease WHERE name = 'race'")
    finally:
        for d in dbs:
            d.close()
    assert results.count(True) == 1, results
    assert len(holders) == 1 and holders[0][1] == 1


# --- the outbox shared by copies --------------------------------------------------------------
def _entry(cfg: Any, now: float, group: str = "g") -> tuple[Notification, bytes, Any]:
    r = cfg.alerts.routes[0]
    n = Notification(route=r.name, group_key=group, group_labels={"alertname": "A"},
                     alerts=(alert(),), created_at=now, reason="first")
    return n, b'{"x": 1}', r


def test_the_outbox_on_postgresql_keeps_its_guarantees(postgres_url: str) -> None:
    cfg = config(route("http://127.0.0.1:9/hook"))
    a = Outbox(postgres_url.replace("postgres@", "postgres:s3cret@"))  # trust: ignored
    b = Outbox(postgres_url)
    try:
        assert a.instance == b.instance  # one key space for every copy
        assert "s3cret" not in str(a.path) and "postgres:***@" in str(a.path)
        (item,) = a.enqueue([_entry(cfg, 100.0)], 100.0)
        (again,) = a.enqueue([_entry(cfg, 101.0)], 101.0)
        assert (item.seq, again.seq) == (1, 2) and item.key != again.key
        # The next copy sees the same head and may start it once only.
        assert [h.id for h in b.next_due(200.0)] == [item.id]
        assert a.begin_attempt(item.id, 200.0) == 1
        assert b.begin_attempt(item.id, 200.0) is None
        a.ack(item.id, 201.0)
        assert b.get(item.id).status == OUTBOX_DONE
        assert [h.id for h in b.next_due(300.0)] == [again.id]
        assert b.stats(300.0).pending == 1
        b.save_active([(alert(), ["hook"])])
        assert [x.fingerprint for x, _ in a.active()] == [alert().fingerprint]
    finally:
        a.close()
        b.close()


def test_a_deposed_leader_can_neither_queue_nor_start_a_send(target: str) -> None:
    cfg = config(route("http://127.0.0.1:9/hook", timeout=2.0))
    db = open_database(target, what="the lease", schema=LEASE_SCHEMA)
    old, new = Lease(db, SERVE_LEASE_NAME, "old", 0.5), Lease(db, SERVE_LEASE_NAME, "new", 5.0)
    term = old.acquire().token
    ob = Outbox(target, fence=old.fence(term))
    try:
        (item,) = ob.enqueue([_entry(cfg, 100.0)], 100.0)
        # Half a second left: not enough for a 2 s attempt.
        with pytest.raises(LeaseLost, match="less than the 2 s"):
            ob.begin_attempt(item.id, 101.0, hold=2.0)
        time.sleep(0.7)
        assert new.acquire().held
        with pytest.raises(LeaseLost, match="held by new"):
            ob.enqueue([_entry(cfg, 102.0, "other")], 102.0)
        with pytest.raises(LeaseLost):
            ob.begin_attempt(item.id, 103.0)
        assert [i.status for i in ob.items()] == [OUTBOX_PENDING]  # nothing was written
        assert ob.get(item.id).attempts == 0
    finally:
        ob.close()
        db.close()


def test_a_new_leaders_notifier_resumes_the_groups_of_the_old_one(postgres_url: str) -> None:
    cfg = config(route("http://127.0.0.1:9/hook", group_wait=0.0))
    first = Leadership(postgres_url, "one", 5.0)
    second = Leadership(postgres_url, "two", 5.0)
    try:
        assert first.tick().kind == "became"
        assert second.tick().kind == "standby"
        n1 = Notifier(cfg, postgres_url, fence=first.fence())
        queued = n1.process(1000.0, [alert(starts_at=990.0)])
        assert len(queued) == 1
        n1.close()
        first.release()
        assert second.tick().kind == "became" and second.term == 2
        n2 = Notifier(cfg, postgres_url, fence=second.fence())
        # The same alert still firing: already notified by the old leader, nothing new.
        assert n2.process(1001.0, [alert(starts_at=990.0)]) == []
        assert [i.key for i in n2.outbox.items()] == [queued[0].key]
        n2.close()
    finally:
        first.close()
        second.close()


def test_no_two_leaders_across_a_database_restart(postgres_server: Any,
                                                  postgres_url: str) -> None:
    """Two copies tick every 0.1 s while the database goes away for longer than the lease and
    comes back; sampled every 20 ms, at most one of them leads at any moment, the leader stops
    acting by its deadline, and someone leads again once the lease ran out."""
    duration = 1.5
    copies = [Leadership(postgres_url, f"copy-{i}", duration) for i in range(2)]
    stop = threading.Event()
    both: list[float] = []
    leaders: list[tuple[float, tuple[bool, bool]]] = []

    def ticking(lead: Leadership) -> None:
        while not stop.is_set():
            lead.tick()
            time.sleep(0.1)

    def sampling() -> None:
        while not stop.is_set():
            now = time.monotonic()
            state = (copies[0].leads(), copies[1].leads())
            leaders.append((now, state))
            if all(state):
                both.append(now)
            time.sleep(0.02)

    threads = [threading.Thread(target=ticking, args=(c,)) for c in copies]
    threads.append(threading.Thread(target=sampling))
    try:
        copies[0].tick()  # copy-0 leads first
        for t in threads:
            t.start()
        time.sleep(0.5)
        assert copies[0].leads() and not copies[1].leads()
        down_at = time.monotonic()
        postgres_server.stop()
        time.sleep(duration + 1.0)
        stepped_down = [t for t, s in leaders if t > down_at and not s[0]]
        assert stepped_down, "the leader kept acting without its database"
        lag = stepped_down[0] - down_at
        postgres_server.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(c.leads() for c in copies):
            time.sleep(0.05)
        back = [c.name for c in copies if c.leads()]
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for c in copies:
            c.close()
    assert both == []
    assert len(back) == 1
    print(f"\nleader stopped acting {lag:.2f} s after the database went away "
          f"(lease {duration:g} s); {back[0]} leads after the restart")
    assert lag <= duration + 0.2


def test_routes_must_fit_in_half_the_lease(tmp_path: Path) -> None:
    from vigil.config import load_config

    path = tmp_path / "vigil.toml"
    path.write_text('[serve]\ndatabase = "postgresql://vigil@db/vigil"\nlease_duration = "10s"\n'
                    '[[alerts.routes]]\nname = "oncall"\nurl = "http://127.0.0.1:9/h"\n'
                    'timeout = "6s"\n')
    with pytest.raises(ConfigError, match=r"alerts\.routes\[0\]\.timeout.*half of \[serve\]"):
        load_config(str(path))
    path.write_text('[serve]\ndatabase = "postgresql://vigil:hunter2@db/vigil"\n')
    with pytest.raises(ConfigError, match="PGPASSWORD") as err:
        load_config(str(path))
    assert "hunter2" not in str(err.value)


def test_two_copies_given_the_same_name_are_still_two_holders(postgres_url: str) -> None:
    """One config for every replica (the chart's) may set one [serve] name: the lease still
    tells the processes apart."""
    first = Leadership(postgres_url, "vigil-serve", 5.0)
    second = Leadership(postgres_url, "vigil-serve", 5.0)
    try:
        assert first.tick().kind == "became"
        assert second.tick().kind == "standby"
        assert first.leads() and not second.leads()
        assert second.describe().startswith("standby vigil-serve: leader is vigil-serve/")
    finally:
        first.close()
        second.close()


def test_a_term_given_up_after_stepping_down_passes_to_another(postgres_url: str) -> None:
    """A copy that cannot act in its term (its notifier could not be built) gives the term up
    at once, rather than taking it back every second while nothing is delivered."""
    first = Leadership(postgres_url, "one", 30.0)
    second = Leadership(postgres_url, "two", 30.0)
    try:
        turn = first.tick()
        assert turn.kind == "became"
        first.step_down("could not open the shared outbox")
        first.release(turn.term)
        assert second.tick().kind == "became" and second.term == turn.term + 1
        assert first.tick().kind == "standby"
    finally:
        first.close()
        second.close()
