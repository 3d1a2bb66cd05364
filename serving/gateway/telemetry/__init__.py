"""What the gateway tells of its requests: its own ``/metrics`` (``metrics``), OpenTelemetry
(``otel``), and the request records it writes (``record_writer``)."""
