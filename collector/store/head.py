"""The write path: series ids, the write head (``samples_head``), and moving the head.

Why a head table: ``samples`` is clustered by series, which makes reads and downsampling one
seek per series, but a scrape then dirties one b-tree page *per series* (700 page writes per
scrape once each series has a page of history; that capped writes at ~30k samples/s). So
``write()`` puts samples in the small ``samples_head`` (same key, but only minutes of data: a
scrape dirties a few dozen pages) and compaction moves them to ``samples`` in bulk, a chunk of
series per transaction, one page write per series per move. Readers read both tables in one
statement (one snapshot). A (series, ts) is in both only when it was re-written after its
move; the head's copy is then the newer one and wins, in reads and in the next move.

Series ids are cached per ``Store`` (``SeriesKey`` -> id): the hot path's only lookup. An id
handed out inside a transaction that rolls back is forgotten with it; ids are dropped when
another process (compaction) deleted series rows, which it announces in ``meta``.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable
from contextlib import AbstractContextManager
from operator import itemgetter
from typing import Any

from collector.store import rollup
from collector.store.codec import JSON, NAN_TEXT, counter_like, encode_labels, floor_to
from collector.store.schema import K_BACKFILL, K_SERIES_GEN, K_WATERMARK, read_meta
from vigil.clock import Clock
from vigil.errors import StoreError
from vigil.model import SeriesKey, TargetHealth
from vigil.storage.sqlite import Database

__all__ = ["HEAD_KEEP_MS", "SERIES_CHUNK", "WriteHead", "move_rows"]

#: Moving the head leaves samples younger than this (ms) where they are, so that a re-write of
#: a just-scraped sample (a late or repeated scrape) stays in the head.
HEAD_KEEP_MS = 60_000
#: Once a ``Store`` has written this many samples without a move, it moves the head itself
#: after the commit: a safety valve for when nobody compacts.
_HEAD_MAX_ROWS = 2_000_000
#: Series ids per transaction when the head moves (and in compaction), so that no
#: transaction holds the write lock for long: the collector must keep writing.
SERIES_CHUNK = 2_000

_INSERT_HEAD = "INSERT OR REPLACE INTO samples_head (series_id, ts, value) VALUES (?, ?, ?)"

# Moving one chunk of series from the head, in key order so that each series' page of
# ``samples`` is written once; REPLACE because the head's copy of a sample is the newer.
_MOVE_HEAD = """
INSERT OR REPLACE INTO samples (series_id, ts, value)
SELECT series_id, ts, value FROM samples_head
WHERE series_id >= :a AND series_id < :b AND ts < :cut
ORDER BY series_id, ts
"""
_MOVE_HEAD_DELETE = (
    "DELETE FROM samples_head WHERE series_id >= :a AND series_id < :b AND ts < :cut"
)

_RESOLVE_UPSERT = """INSERT INTO series (name, labels, type, counter) VALUES (?, ?, ?, ?)
ON CONFLICT (name, labels) DO UPDATE
SET type = excluded.type, counter = excluded.counter
WHERE type != excluded.type"""
_RESOLVE_IDS = """SELECT j.key, s.id FROM json_each(:keys) AS j
JOIN series AS s ON s.name = j.value ->> 0 AND s.labels = j.value ->> 1"""
_NOTE_BACKFILL = """INSERT INTO meta (key, value) VALUES (?, ?)
ON CONFLICT (key) DO UPDATE
SET value = MIN(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))"""


def move_rows(conn: sqlite3.Connection, a: int, b: int, cut_ms: int) -> int:
    """Move the head samples of series ids ``a <= id < b`` with ts < ``cut_ms`` (Unix ms) to
    ``samples``, in the caller's transaction. Returns how many moved."""
    params = {"a": a, "b": b, "cut": cut_ms}
    moved = conn.execute(_MOVE_HEAD, params).rowcount
    conn.execute(_MOVE_HEAD_DELETE, params)
    return moved


class WriteHead:
    """A ``Store``'s writes: samples to the head, target health, series ids, moving the head.

    ``resolution_ms``: the downsampling bucket (Unix ms), to which a backfill mark is aligned.
    """

    def __init__(self, db: Database, clock: Clock, resolution_ms: int) -> None:
        self._db = db
        self._clock = clock
        self._res_ms = resolution_ms
        #: SeriesKey -> (series id, family type).
        self.ids: dict[SeriesKey, tuple[int, str]] = {}
        self._gen: str | None = None
        #: The downsampling and rollup watermarks (Unix ms) as the open transaction saw them.
        self._tx_watermark: int | None = None
        self._tx_rollup_watermark: int | None = None
        #: Samples written to the head since this ``WriteHead`` last moved it (the safety valve).
        self._head_rows = 0

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction of the store (``Database.transaction``), which starts by
        reading what other processes changed since our last one."""
        return self._db.transaction(after_begin=self._after_begin)

    def _after_begin(self, conn: sqlite3.Connection) -> None:
        meta = read_meta(conn)
        gen = meta.get(K_SERIES_GEN)
        if gen != self._gen:
            # Series rows were deleted (compaction, maybe in another process): cached ids
            # may point at nothing.
            self.ids.clear()
            self._gen = gen
        wm = meta.get(K_WATERMARK)
        self._tx_watermark = int(wm) if wm is not None else None
        rwm = meta.get(rollup.K_WATERMARK)
        self._tx_rollup_watermark = int(rwm) if rwm is not None else None

    def forget_ids(self) -> None:
        """Drop every cached series id (series rows were deleted)."""
        self.ids.clear()

    # --- writing ---------------------------------------------------------------------------
    def write(self, points: Iterable[tuple[SeriesKey, str, int, float | None]]) -> int:
        """``Store.write``: ``(key, family type, ts Unix ms, value)`` rows to the head, in one
        transaction (or the caller's); returns how many."""
        db = self._db
        db.require_writable("write samples")
        rows: list[Any] = []
        append = rows.append
        ids = self.ids
        new: dict[SeriesKey, str] = {}
        with self.transaction() as conn:
            try:
                for key, family_type, ts, number in points:
                    # NaN is the only value unequal to itself (None == None): store it as text.
                    value: float | str | None = NAN_TEXT if number != number else number
                    entry = ids.get(key)
                    if entry is not None and entry[1] == family_type:
                        append((entry[0], ts, value))
                    else:
                        # Unknown series: resolved in bulk below, the key stands in for its id.
                        new[key] = family_type
                        append((key, ts, value))
                if not rows:
                    return 0
                if new:
                    self._resolve(conn, new)
                    rows = [
                        r if type(r[0]) is int else (ids[r[0]][0], r[1], r[2])
                        for r in rows
                    ]
                conn.executemany(_INSERT_HEAD, rows)
                wm, rwm = self._tx_watermark, self._tx_rollup_watermark
                if wm is not None or rwm is not None:
                    oldest = min(map(itemgetter(1), rows))
                    if wm is not None and oldest < wm:
                        self._note_backfill(conn, oldest)
                    if rwm is not None and oldest < rwm:
                        # The rollup of that hour (and later ones) no longer matches.
                        rollup.note_dirty(conn, oldest)
            except sqlite3.Error as exc:
                raise db.fail(f"write {len(rows)} samples", exc) from None
            self._head_rows += len(rows)
            if self._head_rows >= _HEAD_MAX_ROWS:
                db.after_commit(self._relieve)
        return len(rows)

    def _resolve(self, conn: sqlite3.Connection, new: dict[SeriesKey, str]) -> None:
        """Cache the ids of ``new`` keys (creating rows, updating changed types), in bulk.

        Runs in the open transaction. Two statements for any number of series, because a
        first scrape of a target brings hundreds of new series at once.
        """
        recs = [
            (key.name, encode_labels(key.labels), t, int(counter_like(t, key.name)))
            for key, t in new.items()
        ]
        # A changed type (the exporter changed the family) is followed: downsampling must
        # treat later data by its new type.
        conn.executemany(_RESOLVE_UPSERT, recs)
        found = conn.execute(
            _RESOLVE_IDS, {"keys": JSON.encode([[r[0], r[1]] for r in recs])}
        ).fetchall()
        if len(found) != len(recs):
            raise StoreError(f"{self._db.path}: series rows vanished while writing")
        ids = self.ids
        keys = list(new)
        undo: list[tuple[SeriesKey, tuple[int, str] | None]] = []
        for i, sid in found:
            key = keys[i]
            undo.append((key, ids.get(key)))
            ids[key] = (sid, new[key])
        # Ids handed out inside a part that rolls back no longer exist (and may be reused).
        self._db.on_rollback(lambda: self._restore(undo))

    def _restore(self, undo: list[tuple[SeriesKey, tuple[int, str] | None]]) -> None:
        for key, prev in reversed(undo):
            if prev is None:
                self.ids.pop(key, None)
            else:
                self.ids[key] = prev

    def _note_backfill(self, conn: sqlite3.Connection, oldest_ms: int) -> None:
        """Samples landed in the already-downsampled past: have compaction revisit from there."""
        conn.execute(_NOTE_BACKFILL, (K_BACKFILL, str(floor_to(oldest_ms, self._res_ms))))

    def set_target_health(self, h: TargetHealth) -> None:
        """``Store.set_target_health``: record a target's latest scrape."""
        db = self._db
        db.require_writable("record target health")
        with self.transaction() as conn, db.errors_as(f"record the health of target {h.target!r}"):
            conn.execute(
                "INSERT OR REPLACE INTO target_health VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (h.target, h.pool, h.kind, h.url, int(h.up), float(h.last_scrape),
                 float(h.duration), int(h.samples), h.error),
            )

    def forget_target(self, name: str) -> bool:
        """``Store.forget_target``: drop a target's health record; whether there was one."""
        db = self._db
        db.require_writable("forget a target")
        with self.transaction() as conn, db.errors_as(f"forget target {name!r}"):
            cur = conn.execute("DELETE FROM target_health WHERE target = ?", (name,))
        return cur.rowcount > 0

    # --- moving ----------------------------------------------------------------------------
    def move(self, cut_ms: int, doing: str) -> int:
        """Move head samples with ts < ``cut_ms`` (Unix ms) to ``samples``, a chunk of series
        per transaction (so that other writers wait briefly). Returns how many moved; an
        SQLite error is reported as ``cannot {doing}``."""
        db = self._db
        with db.lock:
            self._head_rows = 0
            with db.errors_as(doing):
                max_id = db.conn.execute("SELECT MAX(series_id) FROM samples_head").fetchone()[0]
            moved = 0
            for a in range(0, (max_id or -1) + 1, SERIES_CHUNK):
                with self.transaction() as conn, db.errors_as(doing):
                    moved += move_rows(conn, a, a + SERIES_CHUNK, cut_ms)
            return moved

    def _relieve(self) -> None:
        """After a commit: nobody compacts, so move the head now, in its own transactions."""
        if self._head_rows >= _HEAD_MAX_ROWS:
            self.move(math.floor(self._clock() * 1000) - HEAD_KEEP_MS,
                      "move recent samples (they are written)")
