"""``vigil.storage.postgres.PostgresDatabase`` against a real PostgreSQL server, and the
interface it shares with ``vigil.storage.sqlite.Database``: the tests taking ``opener`` run on
either database, so the two stay interchangeable for the stores written on top of them."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.loopback import free_port
from support.postgres import PostgresServer

from vigil.errors import StoreError, StoreUnavailable
from vigil.storage.database import SqlDatabase, migrate, open_database, redact_url
from vigil.storage.postgres import PostgresDatabase, translate_placeholders

REPO = Path(__file__).resolve().parent.parent

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "name TEXT NOT NULL UNIQUE, weight REAL, body BLOB, n INTEGER NOT NULL DEFAULT 0)",
)

#: Waits between threads of one test (seconds): generous, only reached when a test fails.
WAIT_S = 10.0

Opener = Callable[..., SqlDatabase]


@pytest.fixture(params=["sqlite", "postgresql"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens databases on one target (an SQLite file, or a fresh PostgreSQL database), the
    schema above applied unless told otherwise; all are closed at teardown."""
    opened: list[SqlDatabase] = []
    target: str | Path = (tmp_path / "test.db" if request.param == "sqlite"
                          else request.getfixturevalue("postgres_url"))

    def open_(*, schema: tuple[str, ...] = SCHEMA, readonly: bool = False) -> SqlDatabase:
        db = open_database(target, what="the test store", schema=schema, readonly=readonly)
        opened.append(db)
        return db

    yield open_
    for db in opened:
        db.close()


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresDatabase]:
    with PostgresDatabase(postgres_url, what="the test store", schema=SCHEMA) as db:
        yield db


def _names(db: SqlDatabase) -> list[str]:
    return [row[0] for row in db.query("SELECT name FROM items ORDER BY name")]


# --- placeholders ---------------------------------------------------------------------------
def test_placeholders_outside_literals_become_psycopg_ones() -> None:
    assert translate_placeholders("SELECT * FROM t WHERE a = ? AND b = ?") == (
        "SELECT * FROM t WHERE a = %s AND b = %s")


def test_question_marks_inside_literals_and_identifiers_stay() -> None:
    assert translate_placeholders("SELECT 'a?b', \"c?\", ?") == "SELECT 'a?b', \"c?\", %s"
    assert translate_placeholders("SELECT 'it''s ?', ?") == "SELECT 'it''s ?', %s"


def test_percent_signs_are_doubled_everywhere() -> None:
    assert translate_placeholders("SELECT '100%', 7 % ?") == "SELECT '100%%', 7 %% %s"


def test_translation_is_cached() -> None:
    sql = "SELECT ? -- cached"
    assert translate_placeholders(sql) is translate_placeholders(sql)


def test_literals_reach_the_server_unchanged(opener: Opener) -> None:
    db = opener()
    row = db.query("SELECT ?, 'a?b', '100%', 'it''s ?', 7 % 4", (5,))[0]
    assert tuple(row) == (5, "a?b", "100%", "it's ?", 3)


def test_like_pattern_parameter(opener: Opener) -> None:
    db = opener()
    db.execute("INSERT INTO items (name) VALUES (?), (?)", ("50% off", "full price"))
    assert [r[0] for r in db.query("SELECT name FROM items WHERE name LIKE ?", ("%off",))] == [
        "50% off"]
    assert [r[0] for r in db.query("SELECT name FROM items WHERE name LIKE '50%'")] == [
        "50% off"]


# --- the interface, on both databases -------------------------------------------------------
def test_round_trip(opener: Opener) -> None:
    db = opener()
    assert db.execute("INSERT INTO items (name, weight, body) VALUES (?, ?, ?)",
                      ("a", 1.5, b"\x00\xff")) == 1
    with db.transaction(doing="add an item") as conn:
        new_id = conn.execute("INSERT INTO items (name, weight) VALUES (?, ?) RETURNING id",
                              ("b", 2.25)).fetchone()[0]
        conn.executemany("INSERT INTO items (name, n) VALUES (?, ?)", [("c", 1), ("d", 2)])
        assert conn.execute("UPDATE items SET n = n + 1 WHERE n > ?", (0,)).rowcount == 2
    rows = [tuple(r) for r in db.query("SELECT id, name, weight, body, n FROM items "
                                       "ORDER BY id")]
    assert [r[1] for r in rows] == ["a", "b", "c", "d"]
    assert rows[0][2:4] == (1.5, b"\x00\xff") and bytes(rows[0][3]) == b"\x00\xff"
    assert rows[1][0] == new_id and rows[1][2] == 2.25
    assert [r[4] for r in rows] == [0, 0, 2, 3]
    assert db.execute("DELETE FROM items WHERE n = ?", (0,)) == 2
    assert db.query("SELECT COUNT(*) FROM items")[0][0] == 2


def test_upsert_with_excluded(opener: Opener) -> None:
    db = opener()
    sql = ("INSERT INTO items (name, n) VALUES (?, ?) "
           "ON CONFLICT (name) DO UPDATE SET n = excluded.n")
    db.execute(sql, ("a", 1))
    db.execute(sql, ("a", 5))
    db.execute("INSERT INTO items (name, n) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
               ("a", 9))
    assert [tuple(r) for r in db.query("SELECT name, n FROM items")] == [("a", 5)]


def test_aggregates_are_plain_numbers(opener: Opener) -> None:
    db = opener()
    with db.transaction() as conn:
        conn.executemany("INSERT INTO items (name, weight, n) VALUES (?, ?, ?)",
                         [("a", 0.5, 1), ("b", 1.0, 2)])
    total, mean_n, mean_w, count = db.query(
        "SELECT SUM(n), AVG(n), AVG(weight), COUNT(*) FROM items")[0]
    assert (total, count) == (3, 2) and type(total) is int and type(count) is int
    assert mean_n == 1.5 and type(mean_n) is float
    assert mean_w == 0.75 and type(mean_w) is float
    assert total * 0.5 == 1.5  # a Decimal would refuse


def test_query_of_a_statement_without_rows_is_empty(opener: Opener) -> None:
    db = opener()
    assert db.query("UPDATE items SET n = 1 WHERE name = ?", ("none",)) == []


def test_an_exception_rolls_the_transaction_back(opener: Opener) -> None:
    db = opener()
    with pytest.raises(RuntimeError, match="boom"), db.transaction() as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("a",))
        raise RuntimeError("boom")
    assert _names(db) == []


def test_an_sql_error_is_a_store_error_naming_the_database(opener: Opener) -> None:
    db = opener()
    with pytest.raises(StoreError) as caught, db.transaction(doing="add items") as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("a",))
        conn.execute("INSERT INTO items (name) VALUES (?)", ("a",))  # UNIQUE
    assert not isinstance(caught.value, StoreUnavailable)
    assert str(caught.value).startswith(f"{db.display}: cannot add items the test store: ")
    assert "\n" not in str(caught.value)
    assert _names(db) == []
    with pytest.raises(StoreError, match="cannot count the test store"):
        db.query("SELECT COUNT(*) FROM no_such_table", doing="count")


def test_nested_transaction_is_a_savepoint(opener: Opener) -> None:
    db = opener()
    with db.transaction() as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("outer",))
        with pytest.raises(StoreError), db.transaction() as inner:
            inner.execute("INSERT INTO items (name) VALUES (?)", ("inner",))
            inner.execute("INSERT INTO items (name) VALUES (?)", ("outer",))  # UNIQUE
        # The failed inner level is undone; the outer one goes on.
        conn.execute("INSERT INTO items (name) VALUES (?)", ("after",))
        with db.transaction() as inner:
            inner.execute("INSERT INTO items (name) VALUES (?)", ("kept",))
        assert db.query("SELECT COUNT(*) FROM items")[0][0] == 3  # sees its own writes
    assert _names(db) == ["after", "kept", "outer"]


def test_callbacks_follow_what_committed(opener: Opener) -> None:
    db = opener()
    events: list[str] = []
    with db.transaction():
        db.after_commit(lambda: events.append("outer committed"))
        db.on_rollback(lambda: events.append("outer undone"))
        with pytest.raises(RuntimeError), db.transaction():
            db.on_rollback(lambda: events.append("inner undone 1"))
            db.on_rollback(lambda: events.append("inner undone 2"))
            db.after_commit(lambda: events.append("inner committed"))
            raise RuntimeError
        assert events == ["inner undone 2", "inner undone 1"]
        with db.transaction():
            db.after_commit(lambda: events.append("second inner committed"))
        assert events == ["inner undone 2", "inner undone 1"]
    assert events == ["inner undone 2", "inner undone 1", "outer committed",
                      "second inner committed"]
    events.clear()
    with pytest.raises(RuntimeError), db.transaction():
        db.after_commit(lambda: events.append("committed"))
        db.on_rollback(lambda: events.append("undone"))
        raise RuntimeError
    assert events == ["undone"]
    events.clear()
    db.on_rollback(lambda: events.append("never"))
    db.after_commit(lambda: events.append("at once"))
    assert events == ["at once"]


def test_after_commit_may_open_its_own_transaction(opener: Opener) -> None:
    db = opener()

    def follow_up() -> None:
        with db.transaction() as conn:
            conn.execute("INSERT INTO items (name) VALUES (?)", ("follow-up",))

    with db.transaction() as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("first",))
        db.after_commit(follow_up)
    assert _names(db) == ["first", "follow-up"]


def test_after_begin_runs_inside_the_transaction(opener: Opener) -> None:
    db = opener()
    seen: list[Any] = []
    with db.transaction(after_begin=lambda conn: seen.append(  # type: ignore[call-arg]
            conn.execute("SELECT COUNT(*) FROM items").fetchone()[0])) as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("a",))
    assert seen == [0]


def test_two_objects_share_one_database(opener: Opener) -> None:
    first, second = opener(), opener()
    first.execute("INSERT INTO items (name) VALUES (?)", ("from first",))
    assert _names(second) == ["from first"]
    with second.transaction() as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("from second",))
    assert _names(first) == ["from first", "from second"]


def test_a_snapshot_does_not_see_later_commits(opener: Opener) -> None:
    reader, writer = opener(), opener()
    writer.execute("INSERT INTO items (name) VALUES (?)", ("before",))
    with reader.snapshot() as snap:
        assert [r[0] for r in snap.execute("SELECT name FROM items")] == ["before"]
        writer.execute("INSERT INTO items (name) VALUES (?)", ("during",))
        assert snap.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 1
        assert reader.query("SELECT COUNT(*) FROM items")[0][0] == 1  # same snapshot
    assert _names(reader) == ["before", "during"]


def test_no_transaction_inside_a_snapshot(opener: Opener) -> None:
    db = opener()
    with db.snapshot(), pytest.raises(StoreError), db.transaction():
        pytest.fail("a transaction began inside a snapshot")
    with db.transaction() as conn:  # usable afterwards
        conn.execute("INSERT INTO items (name) VALUES (?)", ("a",))
    assert _names(db) == ["a"]


def test_a_snapshot_inside_a_transaction_is_that_transaction(opener: Opener) -> None:
    db = opener()
    with db.transaction() as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("a",))
        with db.snapshot() as snap:
            assert snap.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 1
    assert _names(db) == ["a"]


def test_readonly_refuses_writes(opener: Opener) -> None:
    opener().execute("INSERT INTO items (name) VALUES (?)", ("a",))
    ro = opener(readonly=True)
    assert ro.readonly
    assert _names(ro) == ["a"]
    with pytest.raises(StoreError, match=r"read-?only"):
        ro.execute("INSERT INTO items (name) VALUES (?)", ("b",))
    with pytest.raises(StoreError, match="read-only"), ro.transaction():
        pytest.fail("a read-only database began a transaction")
    with pytest.raises(StoreError):  # refused by the database itself too
        ro.query("DELETE FROM items RETURNING name")
    assert _names(ro) == ["a"]


def test_closed(opener: Opener) -> None:
    db = opener()
    assert not db.closed
    db.close()
    db.close()
    assert db.closed
    with pytest.raises(StoreError, match="closed"):
        db.query("SELECT 1")


def test_migrations_from_two_threads_apply_each_step_once(opener: Opener) -> None:
    steps = [
        ["CREATE TABLE counted (id INTEGER PRIMARY KEY, note TEXT)"],
        ["INSERT INTO counted (id, note) VALUES (1, 'step 2')"],
        ["ALTER TABLE counted ADD COLUMN extra REAL"],
    ]
    dbs = [opener(schema=()), opener(schema=())]
    barrier = threading.Barrier(2, timeout=WAIT_S)
    applied: list[int] = []
    errors: list[BaseException] = []

    def run(db: SqlDatabase) -> None:
        try:
            barrier.wait()
            applied.append(migrate(db, "test", steps))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(db,)) for db in dbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not errors, errors
    assert sorted(applied) == [0, 3]
    assert [tuple(r) for r in dbs[0].query("SELECT id, note, extra FROM counted")] == [
        (1, "step 2", None)]
    assert dbs[1].query("SELECT version FROM vigil_schema WHERE component = ?",
                        ("test",))[0][0] == 3
    assert migrate(dbs[1], "test", steps) == 0


def test_a_newer_schema_is_refused(opener: Opener) -> None:
    db = opener(schema=())
    migrate(db, "test", [["CREATE TABLE a (x INTEGER)"], ["CREATE TABLE b (x INTEGER)"]])
    with pytest.raises(StoreError, match="newer than this Vigil knows"):
        migrate(db, "test", [["CREATE TABLE a (x INTEGER)"]])


# --- PostgreSQL only ------------------------------------------------------------------------
def test_the_schema_is_translated(pg: PostgresDatabase) -> None:
    types = dict(pg.query("SELECT column_name, data_type FROM information_schema.columns "
                          "WHERE table_name = 'items'"))
    assert types == {"id": "bigint", "name": "text", "weight": "double precision",
                     "body": "bytea", "n": "bigint"}
    assert pg.dialect.postgres and pg.dialect.name == "postgresql"


def test_instances_opening_together_do_not_race_on_the_schema(postgres_url: str) -> None:
    schema = tuple(f"CREATE TABLE IF NOT EXISTS t{i} (id INTEGER PRIMARY KEY, v TEXT)"
                   for i in range(8))
    barrier = threading.Barrier(6, timeout=WAIT_S)
    errors: list[BaseException] = []
    opened: list[PostgresDatabase] = []

    def open_() -> None:
        try:
            barrier.wait()
            opened.append(PostgresDatabase(postgres_url, what="the test store", schema=schema))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 3)
    for db in opened:
        db.close()
    assert not errors, errors
    assert len(opened) == 6


def test_threads_have_transactions_of_their_own(pg: PostgresDatabase) -> None:
    inside, checked = threading.Event(), threading.Event()
    seen: list[int] = []

    def other() -> None:
        inside.wait(WAIT_S)
        seen.append(pg.query("SELECT COUNT(*) FROM items")[0][0])
        pg.execute("INSERT INTO items (name) VALUES (?)", ("other",))  # not in the first one
        checked.set()

    thread = threading.Thread(target=other)
    thread.start()
    with pytest.raises(RuntimeError), pg.transaction() as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("uncommitted",))
        inside.set()
        assert checked.wait(WAIT_S)
        raise RuntimeError
    thread.join(WAIT_S)
    assert seen == [0]
    assert _names(pg) == ["other"]


def test_skip_locked_hands_out_disjoint_rows(pg: PostgresDatabase) -> None:
    pg.execute("INSERT INTO items (name) VALUES " + ", ".join(["(?)"] * 6),
               [f"job{i}" for i in range(6)])
    claim = ("SELECT id FROM items WHERE n = 0 ORDER BY id LIMIT 2"
             + pg.dialect.skip_locked())
    first_claimed, second_done = threading.Event(), threading.Event()
    claims: dict[str, list[int]] = {}

    def claimer(name: str, before: Callable[[], None], after: Callable[[], None]) -> None:
        before()
        with pg.transaction(doing="claim jobs") as conn:
            ids = [r[0] for r in conn.execute(claim)]
            conn.executemany("UPDATE items SET n = 1 WHERE id = ?", [(i,) for i in ids])
            claims[name] = ids
            after()

    a = threading.Thread(target=claimer, args=(
        "a", lambda: None, lambda: (first_claimed.set(), second_done.wait(WAIT_S))))
    b = threading.Thread(target=claimer, args=(
        "b", lambda: first_claimed.wait(WAIT_S), second_done.set))
    a.start()
    b.start()
    a.join(WAIT_S)
    b.join(WAIT_S)
    assert len(claims["a"]) == len(claims["b"]) == 2
    assert not set(claims["a"]) & set(claims["b"])
    assert pg.query("SELECT COUNT(*) FROM items WHERE n = 1")[0][0] == 4


def test_server_down_is_unavailable_then_the_same_object_recovers(
        postgres_server: PostgresServer, postgres_url: str) -> None:
    dbname = postgres_url.rsplit("/", 1)[1]
    url = postgres_server.url(dbname, password="s3cret-pw")
    db = PostgresDatabase(url, what="the test store", schema=SCHEMA, connect_timeout=1.0)
    try:
        db.execute("INSERT INTO items (name) VALUES (?)", ("before",))
        postgres_server.stop()
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                db.query("SELECT name FROM items")
            assert time.monotonic() - started < 5.0
            message = str(caught.value)
            assert message.startswith(f"{redact_url(url)}: cannot read the test store: ")
            assert "s3cret-pw" not in message and "postgres:***@127.0.0.1" in message
            # The pool only knows it timed out; the message also says why connecting failed.
            assert "no connection within 1 s (" in message and "refused" in message, message
            with pytest.raises(StoreUnavailable), db.transaction() as conn:
                conn.execute("INSERT INTO items (name) VALUES (?)", ("lost",))
            with pytest.raises(StoreUnavailable):
                db.execute("INSERT INTO items (name) VALUES (?)", ("lost",))
        finally:
            postgres_server.start()
        db.execute("INSERT INTO items (name) VALUES (?)", ("after",))
        assert _names(db) == ["after", "before"]
    finally:
        db.close()


def test_a_restart_under_an_idle_pool_goes_unnoticed(postgres_server: PostgresServer,
                                                      pg: PostgresDatabase) -> None:
    pg.execute("INSERT INTO items (name) VALUES (?)", ("a",))
    postgres_server.restart()
    # The pooled connection is dead; the pool's check replaces it before handing it out.
    assert _names(pg) == ["a"]
    with pg.transaction() as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("b",))
    assert _names(pg) == ["a", "b"]


def test_a_transaction_cut_by_a_restart_is_unavailable(postgres_server: PostgresServer,
                                                        pg: PostgresDatabase) -> None:
    with pytest.raises(StoreUnavailable), pg.transaction() as conn:
        conn.execute("INSERT INTO items (name) VALUES (?)", ("lost",))
        postgres_server.restart()
        conn.execute("INSERT INTO items (name) VALUES (?)", ("lost too",))
    assert _names(pg) == []


def test_opening_an_unreachable_server_is_unavailable() -> None:
    url = f"postgresql://vigil:hunter2@127.0.0.1:{free_port()}/vigil"
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        PostgresDatabase(url, what="the gateway records", connect_timeout=1.0)
    assert time.monotonic() - started < 5.0
    message = str(caught.value)
    assert message.startswith(f"{redact_url(url)}: cannot connect to the gateway records: ")
    assert "hunter2" not in message and "vigil:***@127.0.0.1" in message


def test_a_missing_database_is_an_error_not_unavailable(postgres_server: PostgresServer
                                                        ) -> None:
    with pytest.raises(StoreError) as caught:
        PostgresDatabase(postgres_server.url("no_such_database"), what="the test store")
    assert not isinstance(caught.value, StoreUnavailable)
    assert "no_such_database" in str(caught.value)


def test_repr_and_display_hide_the_password(postgres_server: PostgresServer,
                                            postgres_url: str) -> None:
    url = postgres_server.url(postgres_url.rsplit("/", 1)[1], password="pw-123")
    with PostgresDatabase(url, what="the test store") as db:
        assert db.display == redact_url(url)
        assert "pw-123" not in repr(db) and "pw-123" not in db.display


def test_without_psycopg_the_extra_is_named() -> None:
    url = "postgresql://vigil:pw@127.0.0.1:1/vigil"  # never reached
    code = ("import sys\n"
            "sys.modules['psycopg'] = None\n"
            "from vigil.errors import ExtraMissingError\n"
            "from vigil.storage.database import open_database\n"
            "try:\n"
            f"    open_database({url!r}, what='the records')\n"
            "except ExtraMissingError as exc:\n"
            "    print(exc.extra, exc.module)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["gateway", "psycopg"]


@pytest.mark.parametrize(("url", "shown", "password"), [
    ("postgresql://u:pw@h:5/db", "postgresql://u:***@h:5/db", "pw"),
    ("postgresql://u@h/db?password=secret&sslmode=require",
     "postgresql://u@h/db?password=***&sslmode=require", "secret"),
    ("postgresql://u:p%40w@h1:5432,h2:5433/db", "postgresql://u:***@h1:5432,h2:5433/db", "p@w"),
    ("postgres://h/db", "postgres://h/db", ""),
    ("postgresql:///db?host=/run/postgresql", "postgresql:///db?host=/run/postgresql", ""),
])
def test_urls_are_shown_without_their_password(url: str, shown: str, password: str) -> None:
    from vigil.storage.database import url_password

    assert redact_url(url) == shown
    assert url_password(url) == password


def test_a_failover_url_with_several_hosts_is_accepted(postgres_server: PostgresServer,
                                                         postgres_url: str) -> None:
    """libpq tries the hosts in turn; the first here refuses connections."""
    dead = free_port()  # closed again: nothing listens there
    dbname = postgres_url.rsplit("/", 1)[1]
    url = f"postgresql://postgres@127.0.0.1:{dead},127.0.0.1:{postgres_server.port}/{dbname}"
    db = PostgresDatabase(url, what="the test store")
    try:
        assert db.query("SELECT 1") == [(1,)]
        assert db.display == url
    finally:
        db.close()


def test_an_sqlite_too_old_for_the_common_sql_is_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    from vigil.errors import StoreError

    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    with pytest.raises(StoreError, match=r"gw\.db: cannot open the batch queue: .*SQLite "
                                         r"3\.31\.1, older than 3\.35\.0"):
        open_database(tmp_path / "gw.db", what="the batch queue")
    assert not (tmp_path / "gw.db").exists()
