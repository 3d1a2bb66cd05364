"""One simulated vLLM server: engine, runner, registry, GPU model and FastAPI app.

``restart()`` does what restarting a vLLM process does to its ``/metrics``: a fresh engine (empty
queue and cache) and a fresh registry, so counters start from zero again, ``_created`` samples and
``process_start_time_seconds`` move forward. The GPU (and its energy counter) stays.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from serving.sim.api import create_app
from serving.sim.dcgm import GpuActivity
from serving.sim.http_metrics import HttpMetrics
from serving.sim.metrics import VllmMetrics, new_replica_registry
from serving.sim.protocol import ApiError
from serving.sim.runner import EngineRunner
from slo.planning.replica.engine import Engine, EngineConfig, StepPlan
from slo.planning.replica.profiles import Profile
from vigil.clock import Clock, system_clock
from vigil.conventions import SIM_DCGM_PATH

__all__ = ["ReplicaConfig", "SimReplica"]

_BUSY = ("The engine is currently busy and cannot accept new requests. Please try again later "
         "or on a different instance.")
_BACKLOG = ("The engine has reached its prefill token backlog limit and cannot accept new "
            "requests. Please try again later or on a different instance.")


@dataclass(frozen=True)
class ReplicaConfig:
    """What one replica serves and where."""

    name: str
    served_model: str
    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8000
    #: GPUs behind the replica (tensor parallel); each appears in the DCGM exposition.
    gpus: int = 1
    #: LoRA adapters served under their own model names (needs ``engine.enable_lora``).
    lora_modules: tuple[str, ...] = ()
    #: vLLM's opt-in load shedding (``--max-num-queued-reqs`` / ``--max-num-queued-tokens``):
    #: beyond these, requests get HTTP 503. None = unbounded queue, vLLM's default.
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    #: vLLM's ``--custom-histogram-buckets``: bucket family -> bounds replacing its defaults.
    custom_histogram_buckets: tuple[tuple[str, tuple[float, ...]], ...] = ()


class SimReplica:
    """A simulated vLLM replica. Call ``start()`` inside the event loop that will serve it."""

    def __init__(self, config: ReplicaConfig, *, clock: Clock = system_clock) -> None:
        self.config = config
        self.name = config.name
        self.profile: Profile = config.engine.profile
        self.served_model = config.served_model
        self._clock = clock
        self.created = int(clock())
        self.restarts = 0
        self.gpu = GpuActivity(self.profile, config.name, gpus=config.gpus, clock=clock)
        self._build()
        self.app = create_app(self)

    def _build(self) -> None:
        self.start_time = self._clock()
        self.registry: CollectorRegistry = new_replica_registry(self.start_time)
        ec = self.config.engine
        self.metrics = VllmMetrics(self.registry, model_name=self.served_model,
                                   profile=self.profile, spec_decode=ec.spec_decode,
                                   max_loras=ec.max_loras if ec.enable_lora else None,
                                   enable_prefix_caching=ec.enable_prefix_caching,
                                   custom_buckets=dict(self.config.custom_histogram_buckets))
        self.http_metrics = HttpMetrics(self.registry)
        self.engine = Engine(ec, observer=self.metrics)
        self.runner = EngineRunner(self.engine, clock=self._clock, on_step=self._on_step)

    def _on_step(self, plan: StepPlan, end: float) -> None:
        self.gpu.record_step(plan.start, end, prefill_tokens=plan.prefill_tokens,
                             decode_seqs=plan.decode_seqs)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine loop (must run inside the serving event loop)."""
        self.runner.start()

    async def stop(self) -> None:
        """Stop the engine; in-flight requests end with an error."""
        await self.runner.stop("the server is shutting down")

    async def restart(self) -> None:
        """Restart vLLM: in-flight requests fail, engine and registry start from scratch."""
        await self.runner.stop("the engine was restarted")
        self.restarts += 1
        self._build()
        self.runner.start()

    # --- addresses ------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def api_url(self) -> str:
        """OpenAI API base URL (``.../v1``)."""
        return f"{self.base_url}/v1"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def dcgm_url(self) -> str:
        return f"{self.base_url}{SIM_DCGM_PATH}"

    # --- what the API layer asks ----------------------------------------------------------

    def resolve_model(self, model: str | None) -> str | None:
        """The LoRA adapter a request's ``model`` names (None: the base model); 404 if unknown."""
        if model is None or model == self.served_model:
            return None
        if self.config.engine.enable_lora and model in self.config.lora_modules:
            return model
        raise ApiError(f"The model `{model}` does not exist.", status=404, type="NotFoundError",
                       param="model")

    def model_cards(self) -> list[dict[str, Any]]:
        """``GET /v1/models`` entries in vLLM's shape."""

        def permission() -> dict[str, Any]:
            return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                    "created": self.created, "allow_create_engine": False,
                    "allow_sampling": True, "allow_logprobs": True,
                    "allow_search_indices": False, "allow_view": True,
                    "allow_fine_tuning": False, "organization": "*", "group": None,
                    "is_blocking": False}

        cards = [{"id": self.served_model, "object": "model", "created": self.created,
                  "owned_by": "vllm", "root": self.served_model, "parent": None,
                  "max_model_len": self.profile.max_model_len, "permission": [permission()]}]
        if self.config.engine.enable_lora:
            cards.extend({"id": name, "object": "model", "created": self.created,
                          "owned_by": "vllm", "root": f"/adapters/{name}",
                          "parent": self.served_model, "max_model_len": None,
                          "permission": [permission()]} for name in self.config.lora_modules)
        return cards

    def check_admission(self, prompt_tokens: int) -> None:
        """vLLM's optional queue limits: raise a 503 (and count it) when a limit is reached."""
        limit = self.config.max_num_queued_reqs
        if limit is not None and self.runner.num_unfinished >= limit:
            self.metrics.record_rejection("max_num_queued_reqs")
            raise ApiError(_BUSY, status=503, type="Service Unavailable")
        limit = self.config.max_num_queued_tokens
        if limit is not None and self.engine.prefill_backlog() + prompt_tokens > limit:
            self.metrics.record_rejection("max_num_queued_tokens")
            raise ApiError(_BACKLOG, status=503, type="Service Unavailable")
