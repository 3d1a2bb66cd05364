"""What the SLO engine reads: ``protocol`` (the ``Source`` and ``RequestLog`` protocols),
``embedded`` (Vigil's own store), ``prometheus`` (a Prometheus-compatible API), and ``open``
(which of them the configuration and flags choose)."""
