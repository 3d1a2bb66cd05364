"""A named lease in a database that several processes share: at most one holder at a time.

Copies of `vigil serve` elect the one that delivers alerts with it. The rules:

* **The database's clock decides.** Every time in the table is the server's (PostgreSQL's
  ``clock_timestamp()``, SQLite's ``julianday('now')``), so copies on hosts whose clocks
  disagree still agree on who holds the lease and until when.
* **One statement takes or renews it** (an upsert whose ``WHERE`` admits the holder itself
  or anybody once the lease has expired), so two copies asking at once cannot both win.
* **Terms are numbered** (``token``): a new holder, or a holder coming back after its own
  lease ran out, starts a new term. A write fenced by ``fence`` names the term it acts in,
  so a copy that was paused past its lease (a long GC, a frozen VM, a cut network) and does
  not know it yet cannot write as leader: the write finds another term and is refused.
* **The holder stops before the database would let another in.** ``deadline`` is measured
  on the holder's monotonic clock from the moment it *sent* its last successful renewal, so
  it passes no later than the expiry the database recorded (the server stamped it later).

``Lease`` does no waiting or scheduling of its own; the caller renews it every third of its
duration or so (``alerts.leadership`` does, for `vigil serve`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from vigil.errors import LeaseLost
from vigil.storage.database import Connection, SqlDatabase

__all__ = ["LEASE_SCHEMA", "Lease", "LeaseState", "db_now_sql"]

#: The leases, one row each. Times are Unix seconds by the database's clock.
LEASE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS vigil_lease (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        token INTEGER NOT NULL,
        acquired_at REAL NOT NULL,
        renewed_at REAL NOT NULL,
        expires_at REAL NOT NULL
    )""",
)


def db_now_sql(db: SqlDatabase) -> str:
    """An SQL expression for the database server's current time in Unix seconds (float)."""
    if db.dialect.postgres:
        # clock_timestamp(), not now(): now() is the start of the transaction.
        return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
    return "((julianday('now') - 2440587.5) * 86400.0)"


@dataclass(frozen=True)
class LeaseState:
    """What one ``acquire`` found.

    ``held``: this process holds the lease; ``holder``, ``token``: the holder and its term
    (``""``, 0 when nobody ever held it); ``expires_at``, ``db_now``: Unix seconds by the
    database's clock; ``deadline``: this process's monotonic time until which it may act as
    holder (``None`` when it does not hold the lease).
    """

    held: bool
    holder: str
    token: int
    expires_at: float
    db_now: float
    deadline: float | None

    @property
    def remaining(self) -> float:
        """Seconds of the lease left by the database's clock (0 once expired)."""
        return max(0.0, self.expires_at - self.db_now)


class Lease:
    """The lease ``name`` in ``db`` (whose schema includes ``LEASE_SCHEMA``), asked for by
    ``holder`` for ``duration`` seconds at a time. ``monotonic``: the local clock deadlines
    are measured on (injected in tests)."""

    def __init__(self, db: SqlDatabase, name: str, holder: str, duration: float, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not holder:
            raise ValueError("a lease holder needs a name")
        if duration <= 0:
            raise ValueError(f"a lease lasts a positive time, got {duration}")
        self.db = db
        self.name = name
        self.holder = holder
        self.duration = float(duration)
        self._monotonic = monotonic
        self._now = db_now_sql(db)

    def acquire(self) -> LeaseState:
        """Take the lease if it is free or expired, renew it if this process holds it; else
        report who does. Raises ``StoreError`` (``StoreUnavailable`` when the database cannot
        be reached): then the caller holds nothing it did not hold before, and must stop
        acting as holder at its last ``deadline``."""
        sent = self._monotonic()
        now = self._now
        with self.db.transaction(doing=f"renew the lease {self.name!r}") as c:
            # The clock is read once, so the times of one renewal agree to the last bit.
            # (SQLite needs the WHERE to parse an upsert whose rows come from a SELECT.)
            row = c.execute(
                f"WITH clock AS (SELECT {now} AS now) "
                "INSERT INTO vigil_lease (name, holder, token, acquired_at, renewed_at, "
                "expires_at) SELECT ?, ?, 1, now, now, now + ? FROM clock WHERE true "
                "ON CONFLICT (name) DO UPDATE SET "
                # The same holder within its lease keeps its term; anyone else, or the same
                # holder after its lease ran out, starts the next one.
                "token = CASE WHEN vigil_lease.holder = excluded.holder "
                "AND vigil_lease.expires_at > excluded.renewed_at "
                "THEN vigil_lease.token ELSE vigil_lease.token + 1 END, "
                "acquired_at = CASE WHEN vigil_lease.holder = excluded.holder "
                "AND vigil_lease.expires_at > excluded.renewed_at "
                "THEN vigil_lease.acquired_at ELSE excluded.acquired_at END, "
                "holder = excluded.holder, renewed_at = excluded.renewed_at, "
                "expires_at = excluded.expires_at "
                "WHERE vigil_lease.holder = excluded.holder "
                "OR vigil_lease.expires_at <= excluded.renewed_at "
                "RETURNING token, expires_at, renewed_at",
                (self.name, self.holder, self.duration),
            ).fetchone()
            if row is not None:
                token, expires_at, db_now = int(row[0]), float(row[1]), float(row[2])
                return LeaseState(True, self.holder, token, expires_at, db_now,
                                  sent + self.duration)
            found = c.execute(f"SELECT holder, token, expires_at, {now} FROM vigil_lease "
                              "WHERE name = ?", (self.name,)).fetchone()
        holder, token, expires_at, db_now = found
        return LeaseState(False, str(holder), int(token), float(expires_at), float(db_now), None)

    def release(self, token: int) -> bool:
        """End term ``token`` now (a clean shutdown), so another copy need not wait for the
        lease to run out; whether it was still this process's."""
        rows = self.db.execute(
            f"UPDATE vigil_lease SET expires_at = {self._now} "
            "WHERE name = ? AND holder = ? AND token = ?",
            (self.name, self.holder, token), doing=f"release the lease {self.name!r}")
        return rows == 1

    def fence(self, token: int) -> Callable[[Connection, float], None]:
        """A check to run first inside a write transaction on ``db``: it refuses the write
        (``LeaseLost``) unless this process still holds term ``token`` with at least
        ``hold`` seconds left. On PostgreSQL it also locks the lease row until the
        transaction ends, so no other copy can take the lease while the write commits."""
        lock = " FOR SHARE" if self.db.dialect.postgres else ""
        now = self._now

        def check(conn: Connection, hold: float) -> None:
            row = conn.execute(
                f"SELECT holder, token, expires_at - {now} FROM vigil_lease WHERE name = ?"
                f"{lock}", (self.name,)).fetchone()
            if row is None or row[0] != self.holder or int(row[1]) != token:
                who = "nobody" if row is None else f"{row[0]} (term {row[1]})"
                raise LeaseLost(f"{self.db.display}: the lease {self.name!r} is held by "
                                f"{who}, not by {self.holder} (term {token})")
            if float(row[2]) < hold:
                raise LeaseLost(f"{self.db.display}: the lease {self.name!r} has "
                                f"{max(0.0, float(row[2])):.1f} s left, less than the "
                                f"{hold:g} s this write needs")

        return check
