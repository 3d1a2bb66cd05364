"""Request records from OpenTelemetry: an OTLP/HTTP receiver that turns the request spans of
any router (LiteLLM, Envoy AI Gateway) and of vLLM itself into the records Vigil's gateway
writes, so every per-request figure works where Vigil's gateway is not in the path.

``spans`` flattens an export and tells request spans apart; ``mapping`` reads one span and
joins the parts of a request into a record; ``join`` holds parts until a request's spans have
arrived; ``receiver`` is the HTTP side (``POST /v1/traces``).
"""
