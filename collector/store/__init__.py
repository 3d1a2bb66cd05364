"""The embedded sample store: SQLite in WAL mode, one file, shared by every Vigil process.

One ``Store`` object owns one connection. The collector keeps a single writer ``Store``; every
reader (the dashboard, ``vigil targets``, a thread) opens its own ``Store`` (or
``Store.open_readonly``) on the same path. WAL lets readers work from a snapshot while the writer
appends, so a reader never waits for a scrape to commit and never makes it wait.

Time units: sample timestamps (``ts``, ``*_ms``) are Unix **milliseconds** (int); retention,
resolution and ``now`` are Unix **seconds** (float), like the ``Clock``.

One module per job, all over one ``vigil.storage.sqlite.Database``:

* ``schema``: the tables, schema versions and migrations, opening the file;
* ``codec``: how labels and values (NaN, staleness markers) are stored;
* ``chunks``: the compressed chunk format (pcodec), a run of one series' samples in one blob;
* ``sealed``: the ``chunks`` table: sealing rows into chunks, turning them back, reading them;
* ``head``: the write path: series ids, the write head, moving the head to ``samples``;
* ``reads``: points, last points, series lookups, the rollup windows;
* ``compaction``: expiry, downsampling, keeping the rollup up to date;
* ``rollup``: the rollup's tables and marks: what ``increase()`` and ``avg_over_time()`` need
  of a long window, as lookups;
* ``rollup_maintenance``: rebuilding the rollup's rows from the samples (SQL);
* ``rollup_reads``: reading a long window from the rollup, its edges and the chunks there;
* ``windows``: what a window of samples comes to (``CounterWindow``, ``GaugeWindow``);
* ``store``: ``Store``, which composes them.
"""

from collector.store.codec import counter_like
from collector.store.compaction import CompactionReport
from collector.store.schema import APPLICATION_ID, SCHEMA_VERSION
from collector.store.store import Store
from collector.store.windows import CounterWindow, GaugeWindow

__all__ = [
    "APPLICATION_ID",
    "SCHEMA_VERSION",
    "CompactionReport",
    "CounterWindow",
    "GaugeWindow",
    "Store",
    "counter_like",
]
