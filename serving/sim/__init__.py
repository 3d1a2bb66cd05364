"""A vLLM-compatible simulator: continuous batching on a calibrated virtual GPU.

Modules, one job each:

- ``profiles``   GPU/model calibration (frozen dataclasses; every number a parameter)
- ``text``       the deterministic tokenizer, chat template and generated text
- ``kv_cache``   the paged KV-cache block pool with prefix caching
- ``request``    one request's state inside the engine
- ``queues``     the waiting queue under the ``fcfs`` and ``priority`` policies
- ``engine``     the pure continuous-batching engine, driven by an injected clock
- ``virtual``    a virtual-clock driver that runs load at full speed (tests, what-ifs)
- ``runner``     the asyncio driver that runs an engine in real time for the HTTP layer
- ``metrics``    vLLM 0.33's Prometheus families on a per-replica registry
- ``http_metrics`` prometheus-fastapi-instrumentator's ``http_*`` families as ASGI middleware
- ``dcgm``       a DCGM-exporter-style exposition derived from the engine's activity
- ``protocol``   OpenAI/vLLM request parsing, validation and response shapes
- ``api``        the FastAPI app of one replica
- ``replica``    one simulated vLLM server (engine + registry + GPU + app), restartable
- ``server``     N replicas on consecutive ports in one process and one event loop
- ``testing``    ``running_fleet(...)``: a fleet on free ports for tests
"""

from slo.planning.replica.engine import Engine, EngineConfig, SpecDecodeConfig
from slo.planning.replica.profiles import PROFILES, Profile, get_profile

__all__ = ["PROFILES", "Engine", "EngineConfig", "Profile", "SpecDecodeConfig", "get_profile"]
