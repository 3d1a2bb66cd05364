"""Writing a batch of rows, and what happens to a row the database refuses: one policy for
every store that writes in batches (the gateway's request records, the shared cache entries).

A batch goes in one transaction. When the database refuses it for what it holds (a constraint,
a value the driver cannot send), the batch is halved and each half written in a transaction of
its own, down to single rows: only the rows the database refuses alone are refused, and every
other row is written. Halving, not row by row: a batch of 1,000 with one bad row costs about
20 transactions (two per level of halving) instead of 1,000, and a clean batch costs one.

When the database cannot be written *now* (``retry_later``: PostgreSQL down or restarting, an
SQLite file locked or full), the writing stops there and the rows not yet written are handed
back as they are: the store decides whether to keep them for a retry (request records) or to
drop them (cache entries, which the instance still holds in memory).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from vigil.errors import StoreError, StoreUnavailable

__all__ = ["BatchOutcome", "reason", "retry_later", "write_batch"]

Row = TypeVar("Row")

#: SQLite's primary result codes that mean "the file cannot be written now" (busy, locked,
#: out of memory, read-only, I/O error, disk full, cannot open): worth retrying, as
#: PostgreSQL's ``StoreUnavailable`` is. Any other error is about the rows.
_SQLITE_LATER = frozenset({5, 6, 7, 8, 10, 13, 14})
#: PostgreSQL SQLSTATEs (or their classes) of refusals that do not depend on the rows: out of
#: resources (53: disk full, out of memory), a read-only transaction (25006: a standby after a
#: fail-over), a serialization failure or deadlock (40), a lock or statement timeout (55P03,
#: 57014).
_POSTGRES_LATER = ("53", "25006", "40", "55P03", "57014")
#: What a driver raises for a value it cannot send (a float in an integer column, an integer
#: beyond 64 bits): a refusal of that row, as the database's own.
CONVERSION_ERRORS: tuple[type[Exception], ...] = (TypeError, ValueError, OverflowError)


@dataclass
class BatchOutcome(Generic[Row]):
    """What became of a batch: the positions (in the batch) of the rows written, those refused
    with the error that refused each alone, and the error that stopped the writing when the
    database could not be written now (the rows in neither list are then not written)."""

    written: list[int] = field(default_factory=list)
    refused: list[tuple[int, BaseException]] = field(default_factory=list)
    stopped_by: BaseException | None = None
    #: An error that was neither the database's refusal nor a driver's conversion error when
    #: the whole batch was tried: a defect, worth a traceback in the store's log.
    unexpected: BaseException | None = None

    def not_written(self, rows: Sequence[Row]) -> list[Row]:
        """The rows of ``rows`` (the batch written) neither written nor refused, in order."""
        done = set(self.written) | {i for i, _ in self.refused}
        return [row for i, row in enumerate(rows) if i not in done]


def write_batch(rows: Sequence[Row], insert: Callable[[Sequence[Row]], object], *,
                later: Callable[[BaseException], bool] | None = None) -> BatchOutcome[Row]:
    """Write ``rows`` through ``insert`` (which writes the rows it is given in one transaction,
    or raises having written none of them) with the refused-row policy of the module
    docstring; nothing is raised for the rows' or the database's errors.

    ``later`` tells an error that means "cannot be written now" (default ``retry_later``).
    Older rows are written first, so a store that stops on an outage keeps the newer ones.
    """
    is_later = later or retry_later
    outcome: BatchOutcome[Row] = BatchOutcome()
    parts: list[list[int]] = [list(range(len(rows)))] if rows else []
    while parts:
        part = parts.pop()
        try:
            insert([rows[i] for i in part])
        except Exception as exc:
            if is_later(exc):
                outcome.stopped_by = exc
                return outcome
            if (len(part) == len(rows) and outcome.unexpected is None
                    and not isinstance(exc, (StoreError, *CONVERSION_ERRORS))):
                outcome.unexpected = exc
            if len(part) == 1:
                outcome.refused.append((part[0], exc))
                continue
            middle = len(part) // 2
            parts += (part[middle:], part[:middle])  # the older half first
            continue
        outcome.written += part
    return outcome


def retry_later(exc: BaseException) -> bool:
    """Whether ``exc`` (from writing a batch) says the database cannot be written now, so the
    same rows are worth writing again later, rather than that it refuses these rows."""
    if isinstance(exc, StoreUnavailable):
        return True
    if not isinstance(exc, StoreError):
        return False
    # The stores raise their StoreError from the driver's exception: its code tells.
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, sqlite3.Error):
        code = getattr(cause, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in _SQLITE_LATER
        return "locked" in str(cause) or "busy" in str(cause)
    state = getattr(cause, "sqlstate", None)
    return isinstance(state, str) and state.startswith(_POSTGRES_LATER)


def reason(exc: BaseException) -> str:
    """The reason a row was refused, for a log line: a store's error says it whole (it names
    the database); anything else is given with its type."""
    return str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
