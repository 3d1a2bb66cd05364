"""The batch tier: the durable queue and its release loop (``queue``), the OpenAI batches API
(``api``), their tables (``store``), and what the queue and the gateway call of each other
(``interface``)."""
