"""Alerts: evaluation rules, Alertmanager-style grouping, and durable webhook delivery.

``alerts.model`` (the ``Alert``), ``alerts.grouping`` (routes and aggregation groups),
``alerts.formats`` (payload renderers), ``alerts.outbox`` (the SQLite outbox),
``alerts.delivery`` (one signed HTTP POST) and ``alerts.notifier`` (the façade that ``vigil
serve`` drives). See docs/alerts.md.
"""
