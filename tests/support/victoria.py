"""A real single-node VictoriaMetrics loaded with given series, with vmalert and vmauth beside it,
for comparing what the generated rules give on VictoriaMetrics with what they give on Prometheus.

Usage in a test module::

    from support.prometheus import PromSeries
    from support.victoria import run_victoria, run_vmalert_replay, run_vmauth, VmauthUser

    with run_victoria([PromSeries("x_total", {"instance": "a"}, samples)]) as vm:
        vm.query("increase_prometheus(x_total[5m])", at_s=...)   # {labels: value}
        run_vmalert_replay(vm, rules_yaml, from_s, to_s)           # recorded series land in vm
        with run_vmauth([VmauthUser(vm.base_url, bearer_token="t0k3n")]) as auth: ...

How it works: ``victoria-metrics`` (Debian's package, found through ``conftest.require_binary``:
missing, the test is skipped, or fails under CI) starts on a free loopback port with a fresh
storage folder. The series are imported through ``/api/v1/import/prometheus`` (the text format
with millisecond timestamps, so each timestamp is an exact integer; values are written with
``repr``, the shortest spelling that reads back as the same float64), then
``/internal/force_flush`` makes them searchable, and we poll (bounded) until every sample reads
back exactly. Stopping sends SIGTERM, then SIGKILL. Flags that matter:

* ``-retentionPeriod=100y``: the tests use fixed timestamps years in the past; retention is
  measured from the wall clock, so the default (1 month) would drop them at import.
* ``-search.latencyOffset=0s``: by default, points newer than now - 30 s are hidden; harmless for
  old data, but set so that no query's answer depends on the wall clock.
* ``-search.disableCache``: the rollup result cache is for range queries over live data; a
  backfill under a cached range would not be seen.
* ``-dedup.minScrapeInterval=0s`` (also the default): deduplication would drop samples closer
  than the interval, and the comparison needs every sample.

What VictoriaMetrics cannot store: NaN (dropped at import, so ``import_series`` refuses it), and
float64s with more than ~12 significant decimal digits (values are stored as a decimal mantissa
and exponent, lib/decimal ``FromFloat``; integers below 2**55 are exact). ``run_victoria``
compares every sample it reads back with what it wrote and names the first that differs.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import require_binary

from support.loopback import free_port
from support.prometheus import PrometheusError, PrometheusServer, PromSeries
from vigil.model import labels_of

__all__ = [
    "VictoriaError",
    "VictoriaServer",
    "VmauthFront",
    "VmauthUser",
    "import_text",
    "require_victoria",
    "require_vmalert",
    "require_vmauth",
    "run_victoria",
    "run_vmalert_replay",
    "run_vmauth",
    "tenant_prefix",
    "victoria_fixture",
]

#: Debian's package holding victoria-metrics, vmalert and vmauth.
APT_PACKAGE = "victoria-metrics"

#: Bounds on start-up, on the data becoming searchable, and on a replay (seconds).
READY_TIMEOUT_S = 30.0
SEARCHABLE_TIMEOUT_S = 30.0
REPLAY_TIMEOUT_S = 120.0


class VictoriaError(PrometheusError):
    """victoria-metrics, vmalert or vmauth failed; the message names the binary and its log."""


def require_victoria() -> str:
    """The path of ``victoria-metrics``, or end the test (``require_binary``'s policy)."""
    return require_binary("victoria-metrics", apt=APT_PACKAGE)


def require_vmalert() -> str:
    """The path of ``vmalert``, or end the test."""
    return require_binary("vmalert", apt=APT_PACKAGE)


def require_vmauth() -> str:
    """The path of ``vmauth``, or end the test."""
    return require_binary("vmauth", apt=APT_PACKAGE)


# -- the text format ----------------------------------------------------------------------------


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value_text(name: str, value: float) -> str:
    if math.isnan(value):
        # VictoriaMetrics drops NaN at import (only Prometheus's stale-marker NaN is kept), so a
        # NaN sample would silently be missing from one store and present in the other.
        raise ValueError(f"{name}: VictoriaMetrics does not store NaN samples")
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def import_text(series: Iterable[PromSeries]) -> tuple[str, int]:
    """``series`` in the Prometheus text format with millisecond timestamps, as
    ``/api/v1/import/prometheus`` reads it, and the number of samples in it."""
    lines: list[str] = []
    for s in series:
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
        head = f"{s.name}{{{label_text}}}"
        last: int | None = None
        for ts_ms, value in s.samples:
            if last is not None and ts_ms <= last:
                raise ValueError(f"{s.name}{dict(s.labels)}: timestamps must increase")
            last = int(ts_ms)
            lines.append(f"{head} {_value_text(s.name, value)} {int(ts_ms)}")
    return "".join(line + "\n" for line in lines), len(lines)


# -- victoria-metrics ---------------------------------------------------------------------------


class VictoriaServer(PrometheusServer):
    """A running single-node victoria-metrics. Its Prometheus-compatible API is read exactly as
    a Prometheus's (``query``, ``query_raw``, ``query_range_samples``: VictoriaMetrics too
    writes shortest round-trip floats); ``import_series`` and ``flush`` add data."""

    binary = "victoria-metrics"

    def _post(self, path: str, body: str) -> None:
        resp = self.http.post(path, content=body.encode())
        if resp.status_code not in (200, 204):
            raise VictoriaError(f"POST {resp.url}: HTTP {resp.status_code}: {resp.text}\n"
                                f"{self.log_tail()}")

    def flush(self) -> None:
        """Make everything imported so far searchable (``/internal/force_flush``)."""
        resp = self.http.get("/internal/force_flush")
        if resp.status_code != 200:
            raise VictoriaError(f"force_flush: HTTP {resp.status_code}: {resp.text}")

    def import_series(self, series: Sequence[PromSeries]) -> None:
        """Import ``series``, flush, and wait (bounded) until every sample reads back exactly."""
        body, count = import_text(series)
        if count == 0:
            raise ValueError("no samples to import")
        self._post("/api/v1/import/prometheus", body)
        self.flush()
        self.wait_samples(series)

    def stored(self, series: Sequence[PromSeries]) -> dict[tuple[tuple[str, str], ...],
                                                             list[tuple[int, float]]]:
        """The raw samples stored for the names of ``series`` over their time span:
        ``{labels (with __name__): [(ts_ms, value)]}``."""
        stamps = [ts for s in series for ts, _ in s.samples]
        first, last = min(stamps), max(stamps)
        names = "|".join(sorted({s.name for s in series}))
        return self.query_range_samples(f'{{__name__=~"{names}"}}', last / 1000,
                                        (last - first + 1) / 1000)

    def mismatch(self, series: Sequence[PromSeries]) -> tuple[str, bool] | None:
        """``None`` when every sample of ``series`` is stored exactly, else what differs first
        and whether that is final: a sample stored with another value or time will not change,
        while missing samples may still be on their way into the searchable parts."""
        got = self.stored(series)
        for s in series:
            key = labels_of({"__name__": s.name, **s.labels})
            want = [(int(t), float(v)) for t, v in s.samples]
            have = got.get(key, [])
            if have != want:
                for i, (w, h) in enumerate(zip(want, have, strict=False)):
                    if w != h:
                        return f"{s.name}{dict(s.labels)} sample {i}: wrote {w}, stored {h}", True
                return (f"{s.name}{dict(s.labels)}: wrote {len(want)} samples, "
                        f"{len(have)} are searchable"), False
        return None

    def wait_samples(self, series: Sequence[PromSeries],
                     timeout: float = SEARCHABLE_TIMEOUT_S) -> None:
        """Poll until ``mismatch`` is None. A sample stored differently (a value with more
        digits than VictoriaMetrics keeps, most likely), or samples still missing after
        ``timeout`` seconds, is a VictoriaError."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.mismatch(series)
            if found is None:
                return
            problem, final = found
            if final or time.monotonic() > deadline:
                raise VictoriaError(
                    f"victoria-metrics did not store the series exactly: "
                    f"{problem} (it keeps ~12 significant decimal digits, lib/decimal)\n"
                    f"{self.log_tail()}")
            time.sleep(0.1)
            self.flush()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll ``/health`` until it answers ``OK``, the process dies, or ``timeout`` s pass."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if self.process.poll() is not None:
                raise VictoriaError(f"{self.binary} exited with {self.process.returncode}:\n"
                                    f"{self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                resp = self.http.get("/health", timeout=2.0)
                if resp.status_code == 200 and resp.text.strip() == "OK":
                    break
            if time.monotonic() > deadline:
                raise VictoriaError(f"{self.binary} not ready after {timeout:.0f}s (log "
                                    f"{self.log_path}):\n{self.log_tail()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        # Debian's build leaves the version empty (vm_app_version{version=""}); kept for logs.
        self.version = ""

    def semantics(self) -> str:
        """Not Prometheus: PromQL's semantics flags do not apply."""
        raise VictoriaError("victoria-metrics implements MetricsQL, not a PromQL version")


def start_victoria(binary: str, workdir: Path, *extra_args: str) -> VictoriaServer:
    """Start ``binary`` on a free loopback port with storage in ``workdir/data`` and its log in
    ``workdir/victoria-metrics.log``. Not yet waited for: call ``wait_ready``."""
    port = free_port()
    log_path = workdir / "victoria-metrics.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [binary, f"-storageDataPath={workdir / 'data'}",
             f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y",
             "-search.latencyOffset=0s", "-search.disableCache", "-dedup.minScrapeInterval=0s",
             "-loggerLevel=WARN", *extra_args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
        )
    return VictoriaServer(process, f"http://127.0.0.1:{port}", workdir, log_path)


@contextlib.contextmanager
def run_victoria(series: Iterable[PromSeries] = (), *, binary: str | None = None,
                 attempts: int = 3) -> Iterator[VictoriaServer]:
    """A fresh victoria-metrics holding ``series`` (checked to read back exactly); always
    stopped and its folder removed. Start-up is retried on a fresh port (``attempts`` times) in
    case another process took the port between ``free_port`` and the bind."""
    vm_binary = binary or require_victoria()
    loaded = list(series)
    workdir = Path(tempfile.mkdtemp(prefix="vigil-vm-"))
    server: VictoriaServer | None = None
    try:
        for attempt in range(1, attempts + 1):
            server = start_victoria(vm_binary, workdir)
            try:
                server.wait_ready()
                break
            except VictoriaError:
                server.stop()
                if attempt == attempts:
                    raise
        assert server is not None
        if loaded:
            server.import_series(loaded)
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def victoria_fixture(make_series: Callable[[], Iterable[PromSeries]],
                     scope: str = "module") -> Any:
    """A pytest fixture that yields a ``VictoriaServer`` loaded with ``make_series()``."""

    @pytest.fixture(scope=scope)  # type: ignore[call-overload]
    def _victoria() -> Iterator[VictoriaServer]:
        binary = require_victoria()
        with run_victoria(make_series(), binary=binary) as server:
            yield server

    return _victoria


# -- vmalert ------------------------------------------------------------------------------------


def _rfc3339(at_s: float) -> str:
    if at_s != int(at_s):
        raise ValueError(f"vmalert's replay takes whole seconds, not {at_s}")
    return datetime.fromtimestamp(int(at_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_vmalert_replay(vm: VictoriaServer, rules: str, from_s: float, to_s: float, *,
                       binary: str | None = None,
                       timeout: float = REPLAY_TIMEOUT_S) -> str:
    """Evaluate the rule file ``rules`` (YAML text) over ``[from_s, to_s)`` (Unix seconds,
    whole) with vmalert's replay mode against ``vm``, writing recorded series back into
    ``vm``, then flush so they are searchable. Returns vmalert's output.

    Replay asks ``/api/v1/query_range`` with the group's interval as the step
    (``-datasource.queryStep=0s``), so each result lands on ``from_s + k * interval`` up to
    ``to_s`` included, and a bare selector looks back one interval (MetricsQL's lookback is
    the step), not the 5 minutes of live vmalert's default step; vmalert exits when done (bounded by
    ``timeout`` seconds) and a non-zero exit is a VictoriaError with its output."""
    vmalert = binary or require_vmalert()
    workdir = Path(tempfile.mkdtemp(prefix="vigil-vmalert-", dir=vm.workdir))
    rule_file = workdir / "rules.yml"
    rule_file.write_text(rules)
    args = [vmalert, f"-rule={rule_file}", f"-datasource.url={vm.base_url}",
            f"-remoteWrite.url={vm.base_url}", f"-replay.timeFrom={_rfc3339(from_s)}",
            f"-replay.timeTo={_rfc3339(to_s)}", "-replay.disableProgressBar",
            # One rule per group in our files: no chained rule to wait for between rules.
            "-replay.rulesDelay=0s",
            # The default (5m) is sent as every query's step and overrides the group's
            # interval: a replay would record one point per 5 minutes. 0s: the interval.
            "-datasource.queryStep=0s",
            # Replay serves nothing, but the default :8880 on every interface must not be taken.
            f"-httpListenAddr=127.0.0.1:{free_port()}", "-loggerLevel=WARN"]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=workdir, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise VictoriaError(f"vmalert replay did not finish within {timeout:g} s:\n"
                            f"{exc.stdout!r}\n{exc.stderr!r}") from None
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise VictoriaError(f"vmalert replay exited {done.returncode}:\n{output[-4000:]}")
    vm.flush()
    return output


# -- vmauth -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VmauthUser:
    """One vmauth user: requests with its credential are proxied to ``url_prefix`` (query
    arguments in it, such as ``extra_label=tenant=a``, win over the request's own, which is how
    a single-node VictoriaMetrics is split into tenants). Give ``bearer_token`` or
    ``username`` and ``password``. ``headers``: ``"Name: value"`` lines added upstream."""

    url_prefix: str
    bearer_token: str = ""
    username: str = ""
    password: str = ""
    headers: Sequence[str] = field(default_factory=tuple)

    def yaml(self) -> str:
        """This user as an item of vmauth's ``users:`` list (every string JSON-quoted, which
        YAML reads as the same string)."""
        lines = []
        if self.bearer_token:
            lines.append(f"bearer_token: {json.dumps(self.bearer_token)}")
        elif self.username:
            lines.append(f"username: {json.dumps(self.username)}")
            lines.append(f"password: {json.dumps(self.password)}")
        else:
            raise ValueError("a vmauth user needs a bearer token or a username")
        lines.append(f"url_prefix: {json.dumps(self.url_prefix)}")
        if self.headers:
            lines.append("headers:")
            lines.extend(f"  - {json.dumps(h)}" for h in self.headers)
        return "  - " + "\n    ".join(lines) + "\n"


def tenant_prefix(vm: VictoriaServer, label: str, value: str) -> str:
    """A ``url_prefix`` that confines every query to series with ``label="value"``
    (VictoriaMetrics' ``extra_label``), the single-node way of routing a tenant."""
    return f"{vm.base_url}?{httpx.QueryParams({'extra_label': f'{label}={value}'})}"


@dataclass
class VmauthFront:
    """A running vmauth: ``url`` is where clients connect."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll ``/health`` (answered without credentials) until ``OK``, bounded."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise VictoriaError(f"vmauth exited with {self.process.returncode} (log "
                                    f"{self.log_path}):\n{self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/health", timeout=2.0, trust_env=False).text == "OK":
                    return
            if time.monotonic() > deadline:
                raise VictoriaError(f"vmauth not ready after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@contextlib.contextmanager
def run_vmauth(users: Sequence[VmauthUser], *, binary: str | None = None,
               attempts: int = 3) -> Iterator[VmauthFront]:
    """vmauth on a free loopback port with ``users`` as its ``-auth.config``; stopped and its
    folder removed when the block ends."""
    vmauth = binary or require_vmauth()
    workdir = Path(tempfile.mkdtemp(prefix="vigil-vmauth-"))
    config = workdir / "auth.yml"
    config.write_text("users:\n" + "".join(u.yaml() for u in users))
    front: VmauthFront | None = None
    try:
        for attempt in range(1, attempts + 1):
            port = free_port()
            log_path = workdir / f"vmauth-{attempt}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [vmauth, f"-auth.config={config}", f"-httpListenAddr=127.0.0.1:{port}",
                     "-loggerLevel=WARN"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
            front = VmauthFront(process, f"http://127.0.0.1:{port}", log_path)
            try:
                front.wait_ready()
                break
            except VictoriaError:
                front.stop()
                if attempt == attempts:
                    raise
        assert front is not None
        yield front
    finally:
        if front is not None:
            front.stop()
        shutil.rmtree(workdir, ignore_errors=True)
