"""A real Prometheus loaded with given series, for comparing our PromQL math with the original.

Usage in a test module::

    from support.prometheus import PromSeries, prometheus_fixture

    prom = prometheus_fixture(lambda: [PromSeries("x_total", {"instance": "a"}, samples)])

    def test_something(prom):
        assert prom.query("rate(x_total[5m])", at_s=...) == {...}

How it works: the series are written to an OpenMetrics file, ``promtool tsdb
create-blocks-from openmetrics`` turns them into persistent TSDB blocks in a fresh data
directory, and ``prometheus`` is started on that directory with a config that scrapes nothing,
on a free loopback port. Prometheus loads the blocks at start-up; we wait for ``/-/ready``
(bounded), check that the data really is queryable, and stop the process (SIGTERM, then
SIGKILL) at teardown. Notes that matter:

* Timestamps: any past time works. Blocks are cut on 2 h boundaries from the file's own
  timestamps, and time retention (15 d) is measured from the newest *block*, not from the
  wall clock (tsdb/db.go ``BeyondTimeRetention``), so fixed timestamps years old are kept.
  ``promtool`` reads OpenMetrics timestamps as float seconds and truncates ``ts*1000`` to
  ms; ``_om_timestamp`` picks a spelling that lands on the intended millisecond.
* Values are written with ``repr`` (shortest round-trip), and the HTTP API answers with Go's
  shortest round-trip formatting, so ``float()`` of the answer is the exact float64.
* Staleness markers cannot be imported this way (the text format has no stale NaN), so
  "stale" series are modelled as gaps longer than the lookback.

The binaries are found by ``conftest.require_binary``: a missing one skips the test with the
command that installs it, and fails it under CI.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import require_binary

from support.loopback import free_port
from vigil.model import Labels, labels_of

__all__ = [
    "PromSeries",
    "PrometheusError",
    "PrometheusServer",
    "prometheus_fixture",
    "require_prometheus",
    "run_prometheus",
    "start_prometheus",
    "write_openmetrics",
]

#: Debian's package holding both binaries.
APT_PACKAGE = "prometheus"

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class PrometheusError(RuntimeError):
    """Prometheus or promtool failed; the message carries the relevant log."""


@dataclass(frozen=True)
class PromSeries:
    """One series to load: metric ``name``, ``labels``, and ``(ts_ms, value)`` samples in
    ascending time order (values are floats; NaN and ±Inf are allowed)."""

    name: str
    labels: Mapping[str, str]
    samples: Sequence[tuple[int, float]] = field(default_factory=list)


def _om_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _om_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _om_timestamp(ts_ms: int) -> str:
    """A seconds timestamp that promtool reads back as exactly ``ts_ms``.

    The OpenMetrics parser does ``int64(ts * 1000)`` (model/textparse/openmetricsparse.go),
    truncating; a decimal ``s.mmm`` whose float is just below the intended ms would lose it.
    Python's float ops are the same IEEE-754 operations, so we can check each candidate.
    """
    candidates = [f"{ts_ms // 1000}.{ts_ms % 1000:03d}", repr(ts_ms / 1000)]
    x = ts_ms / 1000
    for _ in range(4):
        x = math.nextafter(x, math.inf)
        candidates.append(repr(x))
    for text in candidates:
        if int(float(text) * 1000) == ts_ms:
            return text
    raise ValueError(f"no OpenMetrics spelling of {ts_ms} ms survives int64(ts*1000)")


def write_openmetrics(series: Iterable[PromSeries], path: Path) -> int:
    """Write ``series`` as an OpenMetrics file (families contiguous, ``# EOF`` last).

    Returns the number of samples written. Metric families get no ``# TYPE`` line (type
    "unknown"), which lets ``x_bucket``/``x_count`` be plain series: PromQL does not look at
    the type.
    """
    by_name: dict[str, list[PromSeries]] = {}
    for s in series:
        by_name.setdefault(s.name, []).append(s)
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for name, members in by_name.items():
            for s in members:
                label_text = ",".join(
                    f'{k}="{_om_escape(v)}"' for k, v in sorted(s.labels.items())
                )
                head = f"{name}{{{label_text}}}" if label_text else name
                last = None
                for ts_ms, value in s.samples:
                    if last is not None and ts_ms <= last:
                        raise ValueError(f"{name}{dict(s.labels)}: timestamps must increase")
                    last = ts_ms
                    f.write(f"{head} {_om_value(value)} {_om_timestamp(int(ts_ms))}\n")
                    count += 1
        f.write("# EOF\n")
    return count


def require_prometheus() -> tuple[str, str]:
    """``(prometheus, promtool)`` paths, or end the test (``require_binary``'s policy)."""
    return (require_binary("prometheus", apt=APT_PACKAGE),
            require_binary("promtool", apt=APT_PACKAGE))


class PrometheusServer:
    """A running Prometheus with our blocks loaded; ``query`` evaluates instant queries."""

    def __init__(self, process: subprocess.Popen[bytes], base_url: str, workdir: Path,
                 log_path: Path):
        self.process = process
        self.base_url = base_url
        self.workdir = workdir
        self.log_path = log_path
        self.version = ""
        # One keep-alive connection for the thousands of queries a comparison makes.
        self.http = httpx.Client(base_url=base_url, timeout=30.0, trust_env=False)

    # -- HTTP ---------------------------------------------------------------------------------

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        resp = self.http.get(path, params=params)
        if resp.status_code != 200:
            raise PrometheusError(f"GET {resp.url}: HTTP {resp.status_code}: {resp.text}")
        return resp.json()

    def query_raw(self, expr: str, at_s: float) -> dict[str, Any]:
        """The ``data`` object of ``/api/v1/query`` for ``expr`` at ``at_s`` (Unix seconds).

        ``at_s`` is sent as ``repr(at_s)``, which Prometheus parses back to the same float.
        """
        answer = self._get("/api/v1/query", {"query": expr, "time": repr(float(at_s))})
        if answer.get("status") != "success":
            raise PrometheusError(f"query {expr!r} at {at_s}: {answer}")
        return answer["data"]

    def query(self, expr: str, at_s: float) -> dict[Labels, float]:
        """Evaluate ``expr`` at ``at_s``: ``{labels: value}`` (a scalar answers ``{(): v}``).

        Labels are the series' labels including ``__name__`` when the result keeps it.
        Values are parsed with ``float`` (Go writes shortest round-trip floats, ``NaN``,
        ``+Inf``, ``-Inf``), so they are the server's exact float64s.
        """
        data = self.query_raw(expr, at_s)
        kind = data["resultType"]
        if kind == "scalar":
            return {(): float(data["result"][1])}
        if kind != "vector":
            raise PrometheusError(f"query {expr!r}: expected a vector, got {kind}")
        return {labels_of(item["metric"]): float(item["value"][1]) for item in data["result"]}

    def query_range_samples(self, selector: str, at_s: float,
                            range_s: float) -> dict[Labels, list[tuple[int, float]]]:
        """The raw samples of ``selector[range]`` at ``at_s``: ``{labels: [(ts_ms, value)]}``.

        Used to check that what Prometheus stored is exactly what we wrote.
        """
        data = self.query_raw(f"{selector}[{int(range_s * 1000)}ms]", at_s)
        out: dict[Labels, list[tuple[int, float]]] = {}
        for item in data["result"]:
            out[labels_of(item["metric"])] = [
                (round(float(t) * 1000), float(v)) for t, v in item["values"]
            ]
        return out

    def semantics(self) -> str:
        """The ``slo`` semantics this server implements: ``"2"`` for 2.42.x, ``"3"`` for 3.x.

        Later 2.x releases mix the two (they picked up the 3.x extrapolation order, #13725,
        and Kahan sums, #14074, but kept left-closed ranges), so a bit-exact comparison against
        them would fail in confusing ways; say so plainly instead (docs/promql-semantics.md).
        """
        if self.version.startswith("3."):
            return "3"
        if self.version.startswith("2.42."):
            return "2"
        raise PrometheusError(
            f"Prometheus {self.version or '(unknown version)'} is neither 2.42.x nor 3.x; "
            "slo has no bit-exact semantics for it (see docs/promql-semantics.md)"
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll ``/-/ready`` until 200, the process dies, or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if self.process.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                if self.http.get("/-/ready", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"prometheus not ready after {timeout:.0f}s:\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        build = self._get("/api/v1/status/buildinfo")
        self.version = str(build.get("data", {}).get("version", ""))

    def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL: never leave the process behind."""
        self.http.close()
        proc = self.process
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)


def _create_blocks(promtool: str, om_file: Path, data_dir: Path) -> None:
    result = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om_file), str(data_dir)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    if result.returncode != 0:
        raise PrometheusError(
            f"promtool create-blocks-from failed ({result.returncode}):\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        )
    if not any(p.is_dir() for p in data_dir.iterdir()):
        raise PrometheusError(f"promtool wrote no block into {data_dir}:\n{result.stdout}")


def start_prometheus(prometheus: str, workdir: Path, config_text: str, data_dir: Path,
                     *extra_args: str) -> PrometheusServer:
    """Start ``prometheus`` on a free loopback port with ``config_text`` as its config (written
    to ``workdir/prometheus.yml``) and ``data_dir`` as its TSDB; its log goes to
    ``workdir/prometheus.log``. Not yet waited for: call ``wait_ready``."""
    config = workdir / "prometheus.yml"
    config.write_text(config_text)
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *extra_args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
        )
    return PrometheusServer(process, f"http://127.0.0.1:{port}", workdir, log_path)


def _start(prometheus: str, workdir: Path, data_dir: Path,
           rule_files: Sequence[str] = ()) -> PrometheusServer:
    # No scrape jobs: the only data is the blocks we created. Retention is relative to the
    # newest block; it is explicit anyway so that a future default can't drop old test data.
    rules = "".join(f"- {json.dumps(name)}\n" for name in rule_files)
    config = ("global:\n  evaluation_interval: 1h\nscrape_configs: []\n"
              + (f"rule_files:\n{rules}" if rules else ""))
    return start_prometheus(prometheus, workdir, config, data_dir,
                            "--storage.tsdb.retention.time=100y")


def _check_loaded(server: PrometheusServer, series: Sequence[PromSeries]) -> None:
    """Fail fast if Prometheus did not load every series we wrote (e.g. a block it skipped)."""
    stamps = [ts for s in series for ts, _ in s.samples]
    first, last = min(stamps), max(stamps)
    # last_over_time keeps the metric name, so series of different metrics stay distinct.
    expr = f'count(last_over_time({{__name__=~".+"}}[{last - first + 1000}ms]))'
    got = server.query(expr, last / 1000)
    want = len({(s.name, tuple(sorted(s.labels.items()))) for s in series if s.samples})
    if got != {(): float(want)}:
        raise PrometheusError(f"Prometheus loaded {got} series, expected {want}:\n"
                              f"{server.log_tail()}")


@contextlib.contextmanager
def run_prometheus(series: Iterable[PromSeries], *, binaries: tuple[str, str] | None = None,
                   attempts: int = 3, rules: Mapping[str, str] | None = None
                   ) -> Iterator[PrometheusServer]:
    """Load ``series`` into a fresh Prometheus and yield it; always stopped and cleaned up.
    ``rules``: rule files (name -> text) it loads and evaluates, at their groups' intervals.

    Retries start-up (a fresh port each time) in case another process grabbed the port
    between ``free_port`` and Prometheus binding it.
    """
    prometheus, promtool = binaries or require_prometheus()
    loaded = list(series)
    workdir = Path(tempfile.mkdtemp(prefix="vigil-prom-"))
    server: PrometheusServer | None = None
    try:
        data_dir = workdir / "data"
        data_dir.mkdir()
        om_file = workdir / "series.om"
        if write_openmetrics(loaded, om_file) == 0:
            raise ValueError("no samples to load")
        _create_blocks(promtool, om_file, data_dir)
        for name, text in (rules or {}).items():
            (workdir / name).write_text(text)
        for attempt in range(1, attempts + 1):
            server = _start(prometheus, workdir, data_dir, tuple(rules or ()))
            try:
                server.wait_ready()
                break
            except PrometheusError:
                server.stop()
                if attempt == attempts:
                    raise
        assert server is not None
        _check_loaded(server, loaded)
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def prometheus_fixture(make_series: Callable[[], Iterable[PromSeries]],
                       scope: str = "module") -> Any:
    """A pytest fixture that yields a ``PrometheusServer`` loaded with ``make_series()``."""

    @pytest.fixture(scope=scope)  # type: ignore[call-overload]
    def _prometheus() -> Iterator[PrometheusServer]:
        binaries = require_prometheus()
        with run_prometheus(make_series(), binaries=binaries) as server:
            yield server

    return _prometheus
