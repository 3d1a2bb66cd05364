"""The gateway's request log, read: ``GatewayRecords`` is the ``RequestLog``
(``slo.sources.protocol``) over the table the gateway writes (``vigil.storage.gateway_records``).

SQLite is opened read-only per read (the file is in WAL mode, so readers never block the
gateway's writer, nor the batch queue that shares the file); PostgreSQL through one small pool
per reader. The engine (``slo.sources.open.request_log``) and, through it, ``vigil slo status``,
``vigil serve`` and the dashboard read the records here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from vigil.conventions import ERROR_SERVER_CLASSES
from vigil.model import RequestRecord
from vigil.storage.database import SqlDatabase, is_postgres_url, open_database
from vigil.storage.gateway_records import COLUMNS, TABLE, WHAT, GatewayRecord, from_row

__all__ = ["POOL_SIZE", "GatewayRecords"]

#: PostgreSQL connections of a reader: one is in use at a time; the second lets a broken
#: connection be replaced without waiting.
POOL_SIZE = 2

_T = TABLE
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM {_T}"
#: The columns of a RequestRecord, in its fields' order (``error`` derived from the class).
_RECORD_SELECT = (f"SELECT id, ts_s, pool, model, endpoint, prompt_tokens, completion_tokens, "
                  f"ttft_s, e2e_s, tenant, tier, error_class, cache_hit, cost_usd, saved_usd, "
                  f"tokens_source, status, cached_tokens, replica, queue_s FROM {_T}")


class GatewayRecords:
    """The records, read-only: ``slo.sources.protocol.RequestLog`` and a few queries.

    ``target`` is the SQLite file or the PostgreSQL URL. On SQLite each read opens the file and
    closes it again (a missing file or table means no records yet), so one instance may serve
    any thread. On PostgreSQL the instance keeps one small pool, opened at the first read and
    shared by the threads that use it (a missing table means no records yet); ``close`` it.
    """

    def __init__(self, target: str | Path) -> None:
        self.target: str | Path = target if is_postgres_url(target) else Path(target)
        self._lock = threading.Lock()
        self._pg: SqlDatabase | None = None
        self._pg_table = False

    def _query(self, sql: str, args: Sequence[Any]) -> list[Any]:
        if isinstance(self.target, str):
            db = self._postgres(self.target)
            return db.query(sql, args) if db is not None else []
        sqlite = self._open_sqlite(self.target)
        if sqlite is None:
            return []
        try:
            return sqlite.query(sql, args)
        finally:
            sqlite.close()

    def _postgres(self, url: str) -> SqlDatabase | None:
        """The pool, opened at the first read; None while the table does not exist."""
        with self._lock:
            if self._pg is None:
                self._pg = open_database(url, what=WHAT, readonly=True,
                                         pool_size=POOL_SIZE)
            db = self._pg
            if not self._pg_table:
                # Tables are not dropped: once there, it is not looked for again.
                (found,) = db.query("SELECT to_regclass(?) IS NOT NULL", (_T,))
                self._pg_table = bool(found[0])
            return db if self._pg_table else None

    @staticmethod
    def _open_sqlite(path: Path) -> SqlDatabase | None:
        if not path.exists():
            return None  # the gateway never ran: no records yet, not an error
        db = open_database(path, what=WHAT, readonly=True)
        try:
            found = db.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                             (_T,))
        except BaseException:
            db.close()
            raise
        if not found:
            db.close()
            return None  # created by the batch queue alone: no request recorded yet
        return db

    def close(self) -> None:
        """Close the PostgreSQL pool, if one was opened (a later read opens it again)."""
        with self._lock:
            if self._pg is not None:
                self._pg.close()
                self._pg = None

    def __enter__(self) -> GatewayRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows(self, pool: str | None, at_s: float, window_s: float) -> list[GatewayRecord]:
        """Every stored column of the requests (of ``pool``, or all pools when None) that
        finished in ``(at_s - window_s, at_s]`` (Unix seconds), oldest first."""
        sql = f"{_SELECT} WHERE ts_s > ? AND ts_s <= ?"
        args: list[Any] = [at_s - window_s, at_s]
        if pool is not None:
            sql += " AND pool = ?"
            args.append(pool)
        # The id breaks ties, so that both databases return the same order.
        return [from_row(row) for row in self._query(sql + " ORDER BY ts_s, id", args)]

    def get(self, request_id: str) -> GatewayRecord | None:
        """The record of one request (by the ``X-Vigil-Request-Id`` the client got)."""
        found = self._query(f"{_SELECT} WHERE id = ?", (request_id,))
        return from_row(found[0]) if found else None

    def records(self, pool: str, at_s: float, window_s: float) -> Iterable[RequestRecord]:
        """``slo.sources.protocol.RequestLog``: the pool's requests that finished in
        ``(at_s - window_s, at_s]`` (Unix seconds), oldest first."""
        # Only the columns a RequestRecord holds, built straight from each row: a month's
        # chargeback reads a million of them.
        found = self._query(f"{_RECORD_SELECT} WHERE ts_s > ? AND ts_s <= ? AND pool = ? "
                            "ORDER BY ts_s, id", (at_s - window_s, at_s, pool))
        server = frozenset(ERROR_SERVER_CLASSES)
        return [RequestRecord(i, ts, p, m, ep, pt, ct, ttft, e2e, ec in server, ten, tier, ec,
                              hit, cost, saved, src, status, cached, rep, queue)
                for (i, ts, p, m, ep, pt, ct, ttft, e2e, ten, tier, ec, hit, cost, saved, src,
                     status, cached, rep, queue) in found]
