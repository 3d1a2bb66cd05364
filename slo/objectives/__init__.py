"""SLOs and what they are judged on: ``spec`` (the configured SLOs with defaults), ``sli``
(error ratios), ``burn_rate`` (burn rates, multiwindow alerts, the error budget),
``quantiles`` (latency and token quantiles per pool and model) and ``anomaly`` (requests with
many times the mean tokens)."""
