"""The storage layer every store of Vigil's opens through.

- ``sqlite``: the embedded driver (WAL, one connection behind a lock, write transactions that
  take the lock up front, errors that name the file) that every SQLite file opens through;
- ``postgres``: the same interface over a PostgreSQL pool, for gateway instances that share one
  database;
- ``database``: that interface, the SQL subset both accept, numbered schema steps, the
  advisory-lock key;
- ``split_writes``: writing a batch, and the one policy for a row the database refuses;
- ``gateway_records``: the request log's table, which the gateway writes and the engine reads.
"""
