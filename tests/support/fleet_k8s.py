"""A fleet as Kubernetes shows it to Prometheus, on loopback: pods found through ``file_sd``.

The file_sd file is what a service-discovery sidecar would write: one group per pod, whose
labels are the pod's Kubernetes labels (``namespace``, ``service``, ``pod``, ``job``) plus
``pool`` for Vigil's ``[[discovery]]``. Prometheus reads the same file and keeps the
Kubernetes labels only (its relabelling drops ``pool``), so its series look like a
kube-prometheus-stack's; Vigil's collector reads it too and labels its own series with
``pool``/``kind`` as always.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from support.prometheus import PrometheusServer, require_prometheus, start_prometheus

__all__ = [
    "NAMESPACE",
    "POD_PREFIX",
    "SERVICE",
    "Load",
    "live_prometheus",
    "pod_labels",
    "prometheus_yml",
    "write_file_sd",
]

NAMESPACE = "llm"
SERVICE = "chat-vllm"
POD_PREFIX = "chat-vllm-"
#: The Kubernetes labels a pod's series carry in Prometheus (and nothing of Vigil's).
K8S_LABELS = ("namespace", "service", "pod", "job")


def pod_labels(pod: str) -> dict[str, str]:
    """The Kubernetes labels of pod ``pod`` of the chat service."""
    return {"namespace": NAMESPACE, "service": SERVICE, "pod": pod,
            "job": f"{NAMESPACE}/{SERVICE}"}


def write_file_sd(path: Path, pods: Mapping[str, str], *, pool: str) -> None:
    """The file_sd file listing ``pods`` (name -> ``host:port``), one group each, with the
    ``pool`` label for Vigil; written whole at once (a reader never sees half a file)."""
    groups = [{"targets": [address], "labels": {**pod_labels(pod), "pool": pool}}
              for pod, address in sorted(pods.items())]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(groups, indent=1))
    tmp.replace(path)


def prometheus_yml(sd_file: Path, rule_files: Sequence[str], *, interval_s: float = 1.0) -> str:
    """A scrape job over ``sd_file`` that keeps the group labels but ``pool`` and renames the
    escaped ``vllm_`` names back to ``vllm:`` (as the generated scrape jobs do), plus the rule
    files, every ``interval_s``."""
    rules = "".join(f"  - {f}\n" for f in rule_files)
    return f"""global:
  scrape_interval: {interval_s:g}s
  scrape_timeout: {round(interval_s * 900)}ms
  evaluation_interval: {interval_s:g}s
rule_files:
{rules}scrape_configs:
  - job_name: kubernetes-pods
    honor_labels: false
    file_sd_configs:
      - files: ["{sd_file}"]
        refresh_interval: 1s
    relabel_configs:
      - action: labeldrop
        regex: pool
    metric_relabel_configs:
      - source_labels: [__name__]
        regex: "vllm_(.+)"
        target_label: __name__
        replacement: "vllm:${{1}}"
"""


@contextlib.contextmanager
def live_prometheus(workdir: Path, config_text: str) -> Iterator[PrometheusServer]:
    """A scraping Prometheus with ``config_text`` (relative rule files are in ``workdir``);
    stopped at exit."""
    prometheus, _ = require_prometheus()
    data = workdir / "prom-data"
    data.mkdir()
    # A retention that covers the 30-day SLO periods, as a deployment for them must keep.
    server = start_prometheus(prometheus, workdir, config_text, data,
                              "--storage.tsdb.retention.time=100y")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


class Load:
    """``threads`` clients sending short completions through the gateway until stopped;
    ``served`` counts answers per replica (the gateway's ``x-vigil-replica``)."""

    def __init__(self, url: str, key: str, model: str, *, threads: int = 3):
        self.url = url
        self.key = key
        self.model = model
        self.served: dict[str, int] = {}
        self.errors = 0
        #: Requests each thread has finished (answered or failed).
        self._rounds = [0] * threads
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(threads)]

    def _run(self, index: int) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hello " * 8}],
                "max_tokens": 8}
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.url, timeout=30, trust_env=False) as client:
            while not self._stop.is_set():
                try:
                    r = client.post("/v1/chat/completions", json=body, headers=headers)
                except httpx.HTTPError:
                    ok, replica = False, ""
                else:
                    ok, replica = r.status_code == 200, r.headers.get("x-vigil-replica", "")
                with self._lock:
                    self._rounds[index] += 1
                    if ok:
                        self.served[replica] = self.served.get(replica, 0) + 1
                    else:
                        self.errors += 1
                if not ok:
                    self._stop.wait(0.2)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.served)

    def rounds(self) -> list[int]:
        """Requests finished so far, per thread. Once every thread has finished two more
        than at some moment, every request in flight at that moment has finished."""
        with self._lock:
            return list(self._rounds)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=35)
