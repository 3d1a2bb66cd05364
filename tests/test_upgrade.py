"""An upgrade, as a rolling update runs it: what the previous release wrote is opened by this
one, migrated, with nothing lost, while a copy of the previous release still runs beside it.

The previous release is this repository at ``PREVIOUS_RELEASE`` (``git archive``), run from
its own tree with the same dependencies. It writes, with its own code:

* the embedded store (the dashboard tests' seeded history: two pools, counters, histograms,
  gauges, compacted into chunks and the rollup);
* the alert outbox, with a notification queued and not yet delivered, and its notification
  log;
* gateway records in the PostgreSQL database several gateways share, and then a gateway of the
  previous release serves on that database.

Then this release opens each: the store for writing (its schema steps run) and compacted, with
every series' samples as the previous release read them; the outbox, whose queued notification
it delivers under the key the previous release gave it and whose log keeps the same alert
from being notified again; and a gateway of this release on the same database, while the old
one keeps serving: both record their requests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.alerts import receiver
from support.dashboard_seed import AT
from support.gateway import MODEL
from support.loopback import free_port, wait_for
from support.serve import stop_process
from support.shared_gateways import start_gateway, write_config

ROOT = Path(__file__).resolve().parent.parent
#: The release before this one's schema changes (the serve lease and the outbox that moved
#: onto the storage layer). Move it forward when a release changes what it writes.
PREVIOUS_RELEASE = "5399c0701e47e2828c757ee78062e3767ab01763"

#: A script run by either release: every series of the store at ``sys.argv[1]`` with its
#: sample count, first and last timestamps and sum (NaN and stale markers counted apart).
_DUMP_STORE = """
import json, math, sys
from collector.store import Store
out = {}
with Store.open_readonly(sys.argv[1]) as store:
    for name in store.metric_names():
        for key, points in store.points(name, {}).items():
            values = [p.value for p in points]
            finite = [v for v in values if v is not None and not math.isnan(v)]
            out[name + json.dumps(sorted(key.labels))] = [
                len(points), points[0].ts_ms if points else None,
                points[-1].ts_ms if points else None,
                sum(v is None for v in values), round(math.fsum(finite), 6)]
print(json.dumps(out, sort_keys=True))
"""

#: The previous release queues one notification (never delivered: the route's port is
#: closed) and logs it; argv: config path.
_QUEUE_ALERT = """
import sys
from alerts.model import Alert
from alerts.notifier import Notifier
from vigil.config import load_config
config = load_config(sys.argv[1])
alert = Alert({"alertname": "ErrorBudgetBurn", "severity": "page", "pool": "chat",
               "slo": "chat-ttft", "model": "m"}, {"summary": "burning"}, starts_at=1000.0)
with Notifier(config, config.outbox_path()) as n:
    items = n.process(1000.0, [alert])
    print(items[0].key)
"""


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's tree, from this clone's history."""
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e",
                            f"{PREVIOUS_RELEASE}^{{commit}}"], capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"this clone has no commit {PREVIOUS_RELEASE[:12]} (the previous release): "
                    "a shallow clone; `git fetch --unshallow` brings it")
    tree = tmp_path_factory.mktemp("previous-release")
    archive = tree / "release.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive),
                    PREVIOUS_RELEASE], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def _run(code: Path, script: str, *args: str, cwd: Path) -> str:
    """``script`` run by the Vigil in ``code`` (its tests' support modules importable)."""
    env = {**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{code / 'tests'}"}
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_previous_release_runs_from_its_own_tree(previous: Path, tmp_path: Path) -> None:
    where = _run(previous, "import vigil_shell, collector; print(vigil_shell.__file__, "
                 "collector.__file__)", cwd=tmp_path).split()
    assert all(Path(w).is_relative_to(previous) for w in where), where


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vigil_shell.cli", "sim", "--replicas", "1",
                             "--port", str(port), "--model", MODEL], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import httpx

        wait_for("sim healthy", lambda: httpx.get(f"http://127.0.0.1:{port}/health",
                                                  timeout=1).status_code == 200, 30,
                 ignore=(httpx.HTTPError,))
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


@pytest.mark.slow
def test_store_and_outbox_of_the_previous_release(previous: Path, tmp_path: Path) -> None:
    from alerts.model import Alert
    from alerts.notifier import Notifier
    from collector.store import Store
    from vigil.config import load_config
    from vigil.conventions import OUTBOX_DONE

    folder = tmp_path / "data"
    folder.mkdir()
    with receiver() as hook:
        dead = f"http://127.0.0.1:{free_port()}/hook"  # nobody listens: stays queued
        (folder / "vigil.toml").write_text(
            _run(previous, "from support.dashboard_seed import config_toml; "
                           "print(config_toml())", cwd=folder)
            + f'\n[[alerts.routes]]\nname = "oncall"\nurl = "{dead}"\ngroup_wait = "0s"\n')
        _run(previous, "import sys; from pathlib import Path; "
                       "from support.dashboard_seed import seed_store; "
                       "seed_store(Path(sys.argv[1]))", str(folder / "vigil.db"), cwd=folder)
        key = _run(previous, _QUEUE_ALERT, str(folder / "vigil.toml"), cwd=folder).strip()
        before = json.loads(_run(previous, _DUMP_STORE, str(folder / "vigil.db"), cwd=folder))
        assert len(before) > 50

        # This release opens the store for writing (its schema steps run) and compacts it
        # ten minutes after the seeded history ends, as its collector would.
        with Store(folder / "vigil.db") as store:
            store.compact(now=AT + 600)
        after = json.loads(_run(ROOT, _DUMP_STORE, str(folder / "vigil.db"), cwd=folder))
        lost = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
        assert lost == {}
        assert set(after) == set(before)

        # ...and the outbox: the queued notification goes out under its key, once, now that
        # the route points at a receiver; the same alert is not notified again.
        config = load_config(folder / "vigil.toml")
        routes = [r.model_copy(update={"url": hook.url}) for r in config.alerts.routes]
        config = config.model_copy(update={"alerts": config.alerts.model_copy(
            update={"routes": routes})})
        alert = Alert({"alertname": "ErrorBudgetBurn", "severity": "page", "pool": "chat",
                       "slo": "chat-ttft", "model": "m"}, {"summary": "burning"},
                      starts_at=1000.0)
        with Notifier(config, config.outbox_path(), clock=lambda: 1001.0) as n:
            import asyncio

            done = asyncio.run(n.deliver_due(1001.0))
            assert done.delivered == 1
            assert n.process(1002.0, [alert]) == []
            assert [i.status for i in n.outbox.items()] == [OUTBOX_DONE]
    assert [r.key for r in hook.accepted()] == [key]


@pytest.mark.slow
def test_gateways_of_both_releases_share_one_database(previous: Path, tmp_path: Path,
                                                      postgres_url: str, sim: str) -> None:
    from vigil.storage.database import open_database
    from vigil.storage.gateway_records import COLUMNS, TABLE, from_row

    seeded = int(_run(previous, "import sys; from support.dashboard_seed import seed_gateway;"
                                " print(seed_gateway(sys.argv[1]))", postgres_url,
                      cwd=tmp_path))
    config = write_config(tmp_path, postgres_url, [sim])
    old = start_gateway(config, "previous", code=previous)
    new: Any = None
    try:
        old.wait_serving()
        old.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "before"}], max_tokens=4)
        new = start_gateway(config, "this", code=ROOT)
        new.wait_serving()
        for gw, text in ((new, "new"), (old, "old after the new one opened the database")):
            gw.client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=4)
        db = open_database(postgres_url, what="the gateway records", readonly=True)
        try:
            def recorded() -> list[Any]:
                rows = [from_row(r) for r in
                        db.query(f"SELECT {', '.join(COLUMNS)} FROM {TABLE}")]
                return rows if len(rows) >= seeded + 3 else []

            rows = wait_for("every request recorded", recorded, 20)
        finally:
            db.close()
        assert len(rows) == seeded + 3
        assert old.alive() and new.alive()
    finally:
        for gw in (old, new):
            if gw is not None:
                assert gw.stop() == 0, gw.log()[-3000:]
