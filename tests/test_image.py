"""The container image (``deploy/Containerfile``, ``make image``): one image runs ``vigil serve``,
``vigil gateway`` and ``vigil dashboard`` as its non-root user on a read-only root, each
answering its health route and the image's own health check; the gateway inside proxies a chat
completion to a simulated replica on the host, and serve scrapes it. The image is built from
this tree on the offline base, with buildah (``tests/support/image.py``: how, and how
``make test`` overlaps the build with the other tests)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from support.image import (
    BUILD_TIMEOUT_S,
    DATA,
    GID,
    IMAGE,
    ROOT,
    UID,
    Build,
    Container,
    Started,
    built_image,
    changes,
    container,
    data_folder,
    ids,
    snapshot,
)
from support.loopback import free_port, wait_for

from serving.gateway.front.api_keys import key_sha256
from serving.sim.testing import running_fleet
from slo.planning.replica.profiles import DEFAULT_MODEL

KEY = "sk-image-test"


@pytest.fixture
def image() -> Iterator[Build]:
    """The image built from this tree (waited for, or built now and removed after)."""
    with built_image() as build:
        yield build


def _healthcheck() -> ModuleType:
    """``deploy/image/healthcheck.py`` (the image's ``vigil-healthcheck``) as a module."""
    spec = importlib.util.spec_from_file_location("vigil_healthcheck",
                                                  ROOT / "deploy" / "image" / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_containerignore_and_dockerignore_match() -> None:
    """docker reads only .dockerignore, buildah and podman .containerignore first: the two
    must say the same, and keep the venvs, the data and the history out of the build."""
    ignore = (ROOT / ".containerignore").read_text()
    assert (ROOT / ".dockerignore").read_text() == ignore
    patterns = {line.strip() for line in ignore.splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".venv-*", "demo-data", "tests"} <= patterns


def test_healthcheck_reads_each_commands_address(tmp_path: Path) -> None:
    config = tmp_path / "vigil.toml"
    config.write_text("""
[[pools]]
name = "chat"
model = "m"
[[targets]]
name = "r0"
url = "http://127.0.0.1:9/metrics"
pool = "chat"
[gateway]
listen = "0.0.0.0:8081"
[dashboard]
address = "::"
port = 8601
""")
    health_url = _healthcheck().health_url
    assert health_url(["serve", "--config", str(config)]) == "http://127.0.0.1:9464/healthz"
    assert health_url(["--log-level", "DEBUG", "serve", "-c", str(config), "--listen",
                       "0.0.0.0:9500", "--allow-remote"]) == "http://127.0.0.1:9500/healthz"
    assert health_url(["gateway", "--config", str(config)]) == "http://127.0.0.1:8081/health"
    assert health_url(["gateway", "--config", str(config), "--listen", "127.0.0.2:9"]) \
        == "http://127.0.0.2:9/health"
    assert health_url(["dashboard", "--config", str(config)]) \
        == "http://[::1]:8601/_stcore/health"
    assert health_url(["dashboard", "--config", str(config), "--listen", "0.0.0.0:8502"]) \
        == "http://127.0.0.1:8502/_stcore/health"
    assert health_url(["collect", "--config", str(config)]) is None


def _config(sim: str, ports: dict[str, int]) -> str:
    """Every path absolute under the data folder: a relative one would be relative to the
    config file, in the read-only /etc/vigil."""
    return f"""
[store]
path = "{DATA}/vigil.db"
[collector]
scrape_interval = "1s"
scrape_timeout = "800ms"
[engine]
evaluation_interval = "2s"
window = "1m"
[[pools]]
name = "chat"
model = "{DEFAULT_MODEL}"
gpu = "H100"
[[targets]]
name = "r0"
url = "{sim}/metrics"
pool = "chat"
[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
threshold_seconds = 2.0
objective = 0.99
[alerts]
outbox_path = "{DATA}/vigil-alerts.db"
[gateway]
listen = "127.0.0.1:{ports['gateway']}"
records_path = "{DATA}/vigil-gateway.db"
health_interval = "0.5s"
[[gateway.api_keys]]
sha256 = "{key_sha256(KEY)}"
tenant = "acme"
tier = "standard"
[capacity]
profiles_path = "{DATA}/vigil-capacity.json"
[dashboard]
address = "127.0.0.1"
port = {ports['dashboard']}
"""


def _get(url: str) -> httpx.Response | None:
    """The answer to GET ``url``, or None while nothing listens."""
    try:
        return httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return None


def _target_up(metrics: str) -> bool:
    """Whether serve's exposition says target r0 is up."""
    return any(re.fullmatch(r'vigil_target_up\{.*instance="r0".*\} 1(\.0)?', line)
               for line in metrics.splitlines())


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S + 600)
def test_one_image_runs_serve_gateway_and_dashboard(image: Build, tmp_path: Path) -> None:
    build = image
    # The build's time, for docs/benchmarks.md (shown with -s, or in the report's output).
    size = build.buildah("images", "--format", "{{.Size}}", IMAGE).stdout.strip()
    print(f"{IMAGE}: built in {build.seconds} s, {size}", file=sys.stderr)

    config = json.loads(build.buildah("inspect", "--type", "image", IMAGE).stdout)
    docker = config["Docker"]["config"]
    assert docker["User"] == f"{UID}:{GID}"
    assert docker["Entrypoint"] == ["vigil"]
    assert docker["WorkingDir"] == DATA
    assert docker["Healthcheck"]["Test"] == ["CMD", "vigil-healthcheck"]
    assert {"9464/tcp", "8080/tcp", "8501/tcp"} <= set(docker["ExposedPorts"])
    assert {"HF_HUB_OFFLINE=1", "PYTHONDONTWRITEBYTECODE=1", f"HOME={DATA}"} <= set(docker["Env"])
    labels = docker["Labels"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.title"] == "vigil"
    assert re.fullmatch(r"[0-9a-f]{40}", labels["org.opencontainers.image.revision"])

    ports = {name: free_port() for name in ("serve", "gateway", "dashboard")}
    etc = tmp_path / "etc"
    etc.mkdir()
    etc.chmod(0o755)
    with running_fleet(1, subprocess=True) as fleet, container(build) as box:
        sim = fleet.base_urls[0]
        cfg = etc / "vigil.toml"
        cfg.write_text(_config(sim, ports))
        cfg.chmod(0o644)
        data = data_folder(tmp_path)

        # The image's user by default; nothing but the data folder is writable for it (this
        # checks the read-only binds as much as the image).
        assert box.run("id", "-u").stdout.strip() == str(UID)
        probe = box.run("sh", "-c", "for d in / /etc /opt/vigil /tmp /usr /var/tmp /run "
                        f"{DATA}; do touch $d/.probe 2>/dev/null && echo $d; done",
                        data=data, config=cfg)
        assert probe.stdout.split() == [DATA], probe.stdout + probe.stderr
        (data / ".probe").unlink()

        before = snapshot(box.root)
        cfg_in = "/etc/vigil/vigil.toml"
        started: dict[str, Started] = {}
        try:
            started["serve"] = box.start(
                "vigil", "serve", "--config", cfg_in, "--listen", f"127.0.0.1:{ports['serve']}",
                data=data, config=cfg, log=tmp_path / "serve.log")
            started["gateway"] = box.start("vigil", "gateway", "--config", cfg_in, data=data,
                                           config=cfg, log=tmp_path / "gateway.log")
            started["dashboard"] = box.start("vigil", "dashboard", "--config", cfg_in,
                                             data=data, config=cfg, log=tmp_path / "dash.log")
            _check_running(box, started, ports)
        finally:
            codes = {name: s.stop() for name, s in started.items()}
        logs = {name: s.output()[-3000:] for name, s in started.items()}
        assert codes == {"serve": 0, "gateway": 0, "dashboard": 0}, logs
        after = snapshot(box.root)

    # The root file system is as the image left it: each process wrote only into the data
    # folder. (/run's own time changes: buildah's mount point for /run/.containerenv.)
    assert set(changes(before, after)) <= {"run"}
    written = {p.name for p in data.iterdir()}
    assert {"vigil.db", "vigil-alerts.db", "vigil-gateway.db"} <= written, written
    assert {(p.stat().st_uid, p.stat().st_gid) for p in data.iterdir()} == {(UID, GID)}


def _check_running(box: Container, started: dict[str, Started], ports: dict[str, int]) -> None:
    """Each process answers its health route, runs as the image's user and passes the image's
    health check; the gateway relays a chat completion; serve scrapes the replica."""
    base = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    routes = {"serve": "/healthz", "gateway": "/health", "dashboard": "/_stcore/health"}
    for name, route in routes.items():
        def healthy(name: str = name, route: str = route) -> bool:
            if started[name].proc.poll() is not None:
                raise AssertionError(f"{name} exited:\n{started[name].output()[-3000:]}")
            answer = _get(base[name] + route)
            return answer is not None and answer.status_code == 200
        wait_for(f"{name} healthy", healthy, timeout_s=180, interval_s=0.5)

    def replica_healthy() -> bool:
        answer = _get(base["gateway"] + "/health")
        return answer is not None and answer.json()["pools"]["chat"]["healthy_replicas"] == 1
    wait_for("the replica healthy at the gateway", replica_healthy, timeout_s=60)
    answer = httpx.post(base["gateway"] + "/v1/chat/completions", timeout=60,
                        headers={"Authorization": f"Bearer {KEY}"},
                        json={"model": DEFAULT_MODEL, "max_tokens": 8,
                              "messages": [{"role": "user", "content": "Hello from the image"}]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["choices"][0]["message"]["content"]
    assert 0 < body["usage"]["completion_tokens"] <= 8

    def scraped() -> bool:
        answer = _get(base["serve"] + "/metrics")
        return answer is not None and _target_up(answer.text)
    wait_for("serve scraping the replica", scraped, timeout_s=60, interval_s=0.5)

    for name, process in started.items():
        pid = process.vigil_pid()
        uids, gids = ids(pid)
        assert (uids, gids) == ({UID}, {GID}), name
        # The image's HEALTHCHECK command, from another run of the image: it finds the
        # process's command line and config through /proc, as it does beside PID 1.
        check = box.run("vigil-healthcheck", "--pid", str(pid))
        assert check.returncode == 0, check.stdout + check.stderr
        assert f":{ports[name]}{routes[name]}: 200" in check.stdout, check.stdout
