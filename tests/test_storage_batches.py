"""The storage layer's batch writer: a batch the database refuses is halved down to the rows it
refuses alone; an outage stops the writing and hands the rest back. On a real SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from vigil.errors import StoreError, StoreUnavailable
from vigil.storage.database import SqlDatabase, open_database
from vigil.storage.split_writes import BatchOutcome, retry_later, write_batch

SCHEMA = ("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL "
          "CHECK (v >= 0))",)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqlDatabase]:
    database = open_database(tmp_path / "t.db", what="the test table", schema=SCHEMA)
    yield database
    database.close()


def _inserter(db: SqlDatabase, calls: list[int]):
    def insert(rows: Sequence[tuple[int, int]]) -> None:
        calls.append(len(rows))
        with db.transaction(doing="write rows to") as conn:
            conn.executemany("INSERT INTO t (id, v) VALUES (?, ?)", rows)
    return insert


def _stored(db: SqlDatabase) -> list[int]:
    return [row[0] for row in db.query("SELECT id FROM t ORDER BY id")]


def test_a_clean_batch_is_one_transaction(db: SqlDatabase) -> None:
    calls: list[int] = []
    rows = [(i, i) for i in range(100)]
    outcome = write_batch(rows, _inserter(db, calls))
    assert calls == [100]
    assert outcome.written == list(range(100)) and not outcome.refused
    assert outcome.stopped_by is None and outcome.unexpected is None
    assert _stored(db) == list(range(100))


def test_only_the_refused_rows_are_refused_and_found_by_halving(db: SqlDatabase) -> None:
    calls: list[int] = []
    bad = {17, 600, 601, 999}
    rows = [(i, -1 if i in bad else i) for i in range(1000)]
    outcome = write_batch(rows, _inserter(db, calls))
    assert sorted(i for i, _ in outcome.refused) == sorted(bad)
    assert all(isinstance(exc, StoreError) and "CHECK" in str(exc) for _, exc in outcome.refused)
    assert sorted(outcome.written) == sorted(set(range(1000)) - bad)
    assert _stored(db) == sorted(set(range(1000)) - bad)
    # Halving: a few dozen transactions for four bad rows in 1,000, not one per row.
    assert len(calls) < 100, len(calls)
    assert outcome.unexpected is None  # the database's refusal is not a defect


def test_a_value_the_driver_cannot_send_is_that_rows_refusal(db: SqlDatabase) -> None:
    rows = [(1, 1), (2, 2**70), (3, 3)]
    outcome = write_batch(rows, _inserter(db, []))
    assert [i for i, _ in outcome.refused] == [1]
    assert isinstance(outcome.refused[0][1], OverflowError)
    assert _stored(db) == [1, 3]


def test_an_outage_stops_the_writing_and_hands_the_rest_back(db: SqlDatabase) -> None:
    written: list[Sequence[tuple[int, int]]] = []

    def insert(rows: Sequence[tuple[int, int]]) -> None:
        if any(v < 0 for _, v in rows) and len(rows) == 1:
            raise StoreUnavailable("the database went away")
        if any(v < 0 for _, v in rows):
            raise StoreError("refused")
        written.append(rows)

    rows = [(i, -1 if i == 5 else i) for i in range(10)]
    outcome: BatchOutcome[tuple[int, int]] = write_batch(rows, insert)
    assert isinstance(outcome.stopped_by, StoreUnavailable)
    # The older half went in first; the row that met the outage and the newer ones are back.
    assert outcome.written == [0, 1, 2, 3, 4] and not outcome.refused
    assert outcome.not_written(rows) == rows[5:]


def test_an_error_that_is_neither_a_refusal_nor_a_conversion_is_reported_once() -> None:
    def insert(rows: Sequence[int]) -> None:
        raise KeyError("a defect")

    outcome = write_batch([1, 2, 3], insert)
    assert isinstance(outcome.unexpected, KeyError)
    assert sorted(i for i, _ in outcome.refused) == [0, 1, 2]


def _store_error_from(driver_error: sqlite3.Error, code: int) -> StoreError:
    """A ``StoreError`` raised from ``driver_error`` carrying SQLite's result ``code``, as the
    SQLite driver raises them."""
    driver_error.sqlite_errorcode = code  # type: ignore[attr-defined]
    try:
        try:
            raise driver_error
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc
    except StoreError as wrapped:
        return wrapped


def test_what_counts_as_an_outage() -> None:
    assert retry_later(StoreUnavailable("down"))
    assert not retry_later(ValueError("a row"))
    assert retry_later(_store_error_from(sqlite3.OperationalError("database is locked"), 5))
    assert retry_later(_store_error_from(sqlite3.OperationalError("disk full"), 13))
    assert not retry_later(_store_error_from(sqlite3.IntegrityError("CHECK constraint"), 275))
