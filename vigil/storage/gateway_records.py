"""The gateway's request log as stored: the record, its table and schema steps, and the
conversion of a record to a row and back.

One row per request that reached the gateway, including refusals (401, 400, 404, 413, 429) and
cancellations; see docs/gateway.md for the columns. The gateway writes them
(``serving.gateway.telemetry.record_writer.RecordWriter``) and the engine reads them
(``slo.sources.request_log.GatewayRecords``): both take the table from here, so that neither
imports the other. The table lives in the gateway's database (``[gateway] database``: a
PostgreSQL URL that several gateway instances share, else the SQLite file ``records_path``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from vigil.conventions import GATEWAY_RECORDS_TABLE

__all__ = ["COLUMNS", "COMPONENT", "MIGRATIONS", "SCHEMA", "TABLE", "WHAT", "GatewayRecord",
           "from_row", "pg_type", "to_row"]

#: How the records database names itself in errors.
WHAT = "the gateway records"
#: The records' name in ``vigil_schema`` (``vigil.storage.database.migrate``).
COMPONENT = "gateway_records"
TABLE = GATEWAY_RECORDS_TABLE

_T = TABLE
SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {_T} (
    id TEXT PRIMARY KEY,
    start_s REAL NOT NULL,
    ts_s REAL NOT NULL,
    pool TEXT NOT NULL,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    tenant TEXT NOT NULL,
    tier TEXT NOT NULL,
    key_id TEXT NOT NULL,
    replica TEXT NOT NULL,
    status INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    tokens_source TEXT NOT NULL,
    ttft_s REAL,
    e2e_s REAL,
    queue_s REAL NOT NULL,
    error INTEGER NOT NULL,
    error_class TEXT NOT NULL,
    cache_hit TEXT NOT NULL,
    requested_max_tokens INTEGER,
    max_tokens INTEGER,
    max_tokens_decision TEXT NOT NULL,
    cost_usd REAL,
    saved_usd REAL,
    upstream_id TEXT NOT NULL,
    batch_id TEXT NOT NULL,
    message TEXT NOT NULL
)""",
    f"CREATE INDEX IF NOT EXISTS {_T}_pool_ts ON {_T} (pool, ts_s)",
)


class GatewayRecord(NamedTuple):
    """One finished request, as stored. Times are Unix seconds, durations seconds, money USD.

    ``ttft_s`` is None without a first token (and for non-streaming requests, whose first token
    the gateway cannot see); ``e2e_s`` is None for requests that were never served (refused
    before reaching a replica or the cache). ``error`` is a server-side failure (timeout,
    upstream 5xx, OOM) — a client cancel and 4xx refusals are not errors.
    """

    id: str
    start_s: float
    ts_s: float
    pool: str
    model: str
    endpoint: str
    tenant: str
    tier: str
    key_id: str
    replica: str
    status: int
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    #: "usage" | "chunks" (streamed content chunks counted, a lower bound) | "unknown"
    tokens_source: str
    ttft_s: float | None
    e2e_s: float | None
    #: Seconds waited at the gateway's admission (tiers) before going upstream.
    queue_s: float
    error: bool
    error_class: str
    #: "l1" | "l2" | ""
    cache_hit: str
    #: What the client asked (None: nothing), what went upstream and why.
    requested_max_tokens: int | None
    max_tokens: int | None
    max_tokens_decision: str
    cost_usd: float | None
    saved_usd: float | None
    #: The upstream's response id (``chatcmpl-...``), "" when none.
    upstream_id: str
    #: The batch this request belongs to ("" for synchronous requests).
    batch_id: str
    #: The error message for refusals and failures ("" otherwise), at most 500 characters.
    message: str
    #: Prompt tokens served from the engine's prefix cache (of ``prompt_tokens``); None when
    #: the source does not say (schema step 2: a router's or vLLM's span may).
    cached_tokens: int | None = None



COLUMNS: tuple[str, ...] = GatewayRecord._fields
#: The records' schema steps (append-only). Step 1 is the table as the SQLite-only versions
#: created it, so their files are adopted unchanged; step 2 adds the cached prompt tokens
#: (nullable: a release that does not know the column still inserts its rows).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    SCHEMA,
    (f"ALTER TABLE {_T} ADD COLUMN cached_tokens INTEGER",),
)
_STREAM, _ERROR = COLUMNS.index("stream"), COLUMNS.index("error")


def pg_type(column: str) -> str:
    """The PostgreSQL type of ``column`` as the schema steps declare it (``Dialect.ddl``'s)."""
    steps = "\n".join(statement for step in MIGRATIONS for statement in step)
    found = re.search(rf"^(?:    |ALTER TABLE \w+ ADD COLUMN ){column} (TEXT|REAL|INTEGER)\b",
                      steps, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"column {column!r} is not in the records schema")
    return {"TEXT": "text", "REAL": "double precision", "INTEGER": "bigint"}[found[1]]


def to_row(record: GatewayRecord) -> tuple[Any, ...]:
    """``record`` as inserted: the flags as 0/1 (PostgreSQL's BIGINT column refuses a bool),
    NUL characters in text as U+FFFD.

    PostgreSQL's text cannot hold NUL (psycopg refuses it before sending, in a statement or
    a COPY); SQLite can. Replacing it on both keeps a record that quotes a client's NUL (a
    model name, an error message) instead of refusing it, and reads it back the same from
    either database.
    """
    values: list[Any] = list(record)
    if len(values) != len(COLUMNS):
        raise TypeError(f"a record has {len(COLUMNS)} fields, got {len(values)}")
    for i, value in enumerate(values):
        if isinstance(value, str) and "\x00" in value:
            values[i] = value.replace("\x00", "\ufffd")
    values[_STREAM] = int(record.stream)
    values[_ERROR] = int(record.error)
    return tuple(values)


def from_row(row: Sequence[Any]) -> GatewayRecord:
    """The record a row (the columns in ``COLUMNS``' order) holds."""
    values = dict(zip(COLUMNS, row, strict=True))
    values["stream"] = bool(values["stream"])
    values["error"] = bool(values["error"])
    return GatewayRecord(**values)
