"""The SLO engine: pure functions of samples and configuration, in subpackages by subject.

Each imports only those listed before it (``tests/test_layers.py``):

* ``slo.promql``: PromQL-exact primitives (rate, increase, histogram_quantile, lookups,
  aggregation, Go's float arithmetic);
* ``slo.sources``: what the engine reads, the ``Source`` protocol over the embedded store or a
  Prometheus and the gateway's ``RequestLog``, and opening them as the configuration says;
* ``slo.objectives``: SLO specs, SLIs, burn rates and budgets, latency quantiles, token
  anomalies;
* ``slo.cost``: what a pool costs, per 1000 requests and per million tokens, and the waste;
* ``slo.scaling``: the scaling signals and the policy that turns them into a recommendation;
* ``slo.planning``: capacity at the SLO (searched, observed, saved), the traffic forecast, the
  cheapest plan, and the replay of the scaling policy over history.

``slo.status`` composes them into the status JSON of one instant (``vigil slo status``,
``vigil serve``); ``vigil_shell.slo_status_cli`` prints it. Nothing under ``slo/`` reads a clock.
"""
