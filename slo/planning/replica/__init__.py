"""A model of one vLLM replica: continuous batching on a GPU calibrated per model and GPU
(``profiles``), with its KV-cache blocks (``kv_cache``), scheduler queues (``queues``), requests
(``request``), token counting (``text``) and the engine step (``engine``); ``virtual`` runs it on
a virtual clock. Capacity estimates (``slo.planning.estimate``) and policy replays
(``slo.planning.policy_replay``) run on it, and the simulator (``serving.sim``) serves it over
HTTP with vLLM's API and ``/metrics``. Pure Python, no I/O, no wall clock."""
