"""Every stored sample of a ``Store`` as rows, wherever the store keeps it (for tests that
check the rollup against the samples it was built from)."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from collector.store import Store
from collector.store.chunks import decode_chunk


def stored_rows(store: Store, *, counter: bool | None = None, below_ms: int = 2**62,
                with_markers: bool = True) -> list[tuple[int, int, object]]:
    """``(series id, ts, value)`` of every sample below ``below_ms`` in ``samples`` and in
    ``chunks`` (not the write head), sorted, spelled as in ``samples``: a NaN sample is the
    TEXT ``'NaN'``, a staleness marker None. ``counter``: only counter-like series (True),
    only the others (False), or all."""
    rows = list(_rows(store, counter, below_ms))
    if not with_markers:
        rows = [r for r in rows if r[2] is not None]
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows


def _rows(store: Store, counter: bool | None,
          below_ms: int) -> Iterator[tuple[int, int, object]]:
    c = store._c
    kinds = {sid: bool(flag) for sid, flag in c.execute("SELECT id, counter FROM series")}

    def wanted(sid: int) -> bool:
        return counter is None or kinds.get(sid) == counter

    for sid, ts, v in c.execute("SELECT series_id, ts, value FROM samples WHERE ts >= 0 "
                                "AND ts < ?", (below_ms,)):
        if wanted(sid):
            yield sid, ts, v
    for sid, data in c.execute("SELECT series_id, data FROM chunks"):
        if not wanted(sid):
            continue
        ts, vals, stale = decode_chunk(data)
        for t, v, s in zip(ts.tolist(), vals.tolist(), stale.tolist(), strict=True):
            if 0 <= t < below_ms:
                yield sid, t, None if s else ("NaN" if math.isnan(v) else v)


def downgrade_to_v3(path: Path) -> None:
    """Make the store at ``path`` one of schema version 3 (before chunks): every chunked
    sample back in ``samples``, the table and its meta keys gone."""
    conn = sqlite3.connect(path)
    with conn:
        for sid, data in conn.execute("SELECT series_id, data FROM chunks").fetchall():
            ts, vals, stale = decode_chunk(data)
            conn.executemany(
                "INSERT OR IGNORE INTO samples (series_id, ts, value) VALUES (?, ?, ?)",
                [(sid, t, None if s else ("NaN" if math.isnan(v) else v))
                 for t, v, s in zip(ts.tolist(), vals.tolist(), stale.tolist(), strict=True)])
        conn.execute("DROP TABLE chunks")
        conn.execute("DELETE FROM meta WHERE key IN ('chunk_span_ms', 'sealed_below_ms', "
                     "'vacuum_pending')")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.close()
