"""vigil.storage.sqlite: the one way every Vigil store opens and writes its SQLite file."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from vigil.errors import StoreError, VigilError
from vigil.storage.sqlite import Database

SCHEMA = ("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER)",)


class OtherError(VigilError):
    """A store's own error leaf, to see that ``error=`` is what gets raised."""


def test_opens_in_wal_with_the_schema_and_creates_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "x.db"
    with Database(path, schema=SCHEMA, synchronous="FULL") as db:
        assert db.query("PRAGMA journal_mode")[0][0] == "wal"
        assert db.query("PRAGMA synchronous")[0][0] == 2  # FULL
        assert db.query("PRAGMA busy_timeout")[0][0] == 10_000
        assert db.query("SELECT name FROM sqlite_master WHERE type = 'table'") == [("t",)]
    assert db.closed


def test_transaction_commits_all_or_nothing(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", schema=SCHEMA)
    with db.transaction() as c:
        c.execute("INSERT INTO t VALUES ('a', 1)")
    with pytest.raises(RuntimeError), db.transaction() as c:
        c.execute("INSERT INTO t VALUES ('b', 2)")
        raise RuntimeError("boom")
    assert db.query("SELECT k FROM t") == [("a",)]
    assert not db.conn.in_transaction


def test_nested_transaction_is_a_savepoint(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", schema=SCHEMA)
    with db.transaction() as c:
        c.execute("INSERT INTO t VALUES ('outer', 1)")
        with pytest.raises(ValueError), db.transaction() as inner:
            inner.execute("INSERT INTO t VALUES ('inner', 2)")
            raise ValueError
        assert db.in_transaction
    assert db.query("SELECT k FROM t") == [("outer",)]


def test_sqlite_errors_name_the_file_and_what_was_done(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", what="the alert outbox", error=OtherError, schema=SCHEMA)
    with (pytest.raises(OtherError, match=r"x\.db: cannot write the alert outbox: .*UNIQUE"),
          db.transaction() as c):
        c.execute("INSERT INTO t VALUES ('a', 1)")
        c.execute("INSERT INTO t VALUES ('a', 2)")
    assert db.query("SELECT COUNT(*) FROM t") == [(0,)]


def test_after_begin_failure_rolls_back(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", schema=SCHEMA)

    def check(conn: sqlite3.Connection) -> None:
        raise StoreError("stale")

    with pytest.raises(StoreError, match="stale"), db.transaction(after_begin=check):
        raise AssertionError("the block runs only after after_begin succeeded")
    assert not db.conn.in_transaction


def test_a_file_that_is_not_sqlite_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "notes.db"
    bad.write_bytes(b"this is not a database, just text " * 100)
    with pytest.raises(StoreError, match=r"notes\.db: not a usable SQLite file for the store"):
        Database(bad, schema=SCHEMA)


def test_readonly_never_creates_and_never_writes(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such file"):
        Database(tmp_path / "missing.db", readonly=True)
    assert not (tmp_path / "missing.db").exists()
    Database(tmp_path / "x.db", schema=SCHEMA).close()
    ro = Database(tmp_path / "x.db", readonly=True)
    with pytest.raises(StoreError, match="open read-only"), ro.transaction():
        raise AssertionError("a read-only database opens no transaction")
    with pytest.raises(StoreError, match="readonly"):
        ro.execute("INSERT INTO t VALUES ('a', 1)")


def test_closed_database_says_so(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", what="the batch queue")
    db.close()
    db.close()
    with pytest.raises(StoreError, match="the batch queue is closed"):
        db.query("SELECT 1")


def test_a_second_connection_waits_for_the_write_lock(tmp_path: Path) -> None:
    """BEGIN IMMEDIATE plus the busy timeout: a second writer waits instead of failing."""
    a = Database(tmp_path / "x.db", schema=SCHEMA)
    b = Database(tmp_path / "x.db", schema=SCHEMA)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with a.transaction() as c:
            c.execute("INSERT INTO t VALUES ('a', 1)")
            holding.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    holding.wait(5)
    threading.Timer(0.2, release.set).start()
    with b.transaction() as c:
        c.execute("INSERT INTO t VALUES ('b', 2)")
    t.join()
    assert sorted(r[0] for r in b.query("SELECT k FROM t")) == ["a", "b"]


def test_on_rollback_undoes_only_the_level_that_rolled_back(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", schema=SCHEMA)
    cache: dict[str, int] = {}

    def put(c: sqlite3.Connection, k: str, v: int) -> None:
        c.execute("INSERT INTO t VALUES (?, ?)", (k, v))
        cache[k] = v
        db.on_rollback(lambda: cache.pop(k))

    with db.transaction() as c:
        put(c, "outer", 1)
        with pytest.raises(ValueError), db.transaction() as inner:
            put(inner, "inner", 2)
            raise ValueError
        assert cache == {"outer": 1}
    with pytest.raises(RuntimeError), db.transaction() as c:
        put(c, "gone", 3)
        raise RuntimeError
    assert cache == {"outer": 1}
    assert db.query("SELECT k FROM t") == [("outer",)]
    db.on_rollback(lambda: cache.clear())  # outside a transaction: nothing to undo, dropped
    with db.transaction():
        pass
    assert cache == {"outer": 1}


def test_after_commit_runs_after_the_outermost_commit_only(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", schema=SCHEMA)
    seen: list[str] = []
    with db.transaction():
        with db.transaction():
            db.after_commit(lambda: seen.append(f"kept, in a transaction: {db.in_transaction}"))
        with pytest.raises(ValueError), db.transaction():
            db.after_commit(lambda: seen.append("rolled back"))
            raise ValueError
        assert seen == []
    assert seen == ["kept, in a transaction: False"]
    with pytest.raises(RuntimeError), db.transaction():
        db.after_commit(lambda: seen.append("rolled back too"))
        raise RuntimeError
    db.after_commit(lambda: seen.append("at once"))
    assert seen == ["kept, in a transaction: False", "at once"]


def test_snapshot_reads_one_state_while_another_connection_commits(tmp_path: Path) -> None:
    writer = Database(tmp_path / "x.db", schema=SCHEMA)
    reader = Database(tmp_path / "x.db", readonly=True)
    with reader.snapshot():
        assert reader.query("SELECT COUNT(*) FROM t") == [(0,)]
        writer.execute("INSERT INTO t VALUES ('a', 1)")
        assert reader.query("SELECT COUNT(*) FROM t") == [(0,)]
    assert reader.query("SELECT COUNT(*) FROM t") == [(1,)]
    with writer.transaction(), writer.snapshot() as c:  # the open transaction is the snapshot
        assert c.in_transaction


def test_errors_as_names_the_step_and_rolls_back(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", schema=SCHEMA)
    with (pytest.raises(StoreError, match=r"x\.db: cannot record 2 rows: .*UNIQUE"),
          db.transaction() as c, db.errors_as("record 2 rows")):
        c.execute("INSERT INTO t VALUES ('a', 1)")
        c.execute("INSERT INTO t VALUES ('a', 2)")
    assert db.query("SELECT COUNT(*) FROM t") == [(0,)]


def test_check_refuses_a_file_before_anything_changes_it(tmp_path: Path) -> None:
    path = tmp_path / "theirs.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE theirs (x)")
    conn.close()

    def ours(conn: sqlite3.Connection) -> None:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if names - {"t"}:
            raise OtherError(f"{path}: not ours")

    with pytest.raises(OtherError, match="not ours"):
        Database(path, schema=SCHEMA, check=ours)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # left as it was
    conn.close()


def test_require_writable(tmp_path: Path) -> None:
    Database(tmp_path / "x.db", schema=SCHEMA).close()
    Database(tmp_path / "x.db").require_writable("compact")
    with pytest.raises(StoreError, match="cannot compact: the store is open read-only"):
        Database(tmp_path / "x.db", readonly=True).require_writable("compact")
