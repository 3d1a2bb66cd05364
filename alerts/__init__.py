"""Alerts: the rule generator and the alerting runtime, two jobs that share no code.

``alerts.rules`` generates files for the team's own stack from the SLO specs: Prometheus
recording and alerting rules, their ``promtool`` tests, the scrape configuration, KEDA and
Prometheus Operator objects (``vigil rules``). It runs once, writes text and holds no state.

The runtime is what ``vigil serve`` runs in the embedded mode: ``alerts.conditions`` (the
status JSON in, alerts out), ``alerts.model`` (the ``Alert``), ``alerts.grouping`` (routes and
aggregation groups), ``alerts.formats`` (payload renderers), ``alerts.outbox`` (the SQLite
outbox), ``alerts.delivery`` (one signed HTTP POST), ``alerts.notifier`` (the façade ``vigil
serve`` drives) and ``alerts.exporter`` (its ``/metrics``). See docs/alerts.md.
"""
