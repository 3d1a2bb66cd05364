"""Grafana dashboards from the same config and SLO specs as the rules (``vigil rules grafana``).

``queries`` holds the PromQL of every panel (reading Vigil's recording rules wherever one holds
the number), ``panels`` the building blocks over grafana-foundation-sdk, ``dashboards`` the four
dashboards (SLO overview, SLO detail, fleet, cost), ``output`` the JSON files or the Kubernetes
objects (Grafana sidecar ConfigMaps, Grafana Operator dashboards).
"""

from alerts.rules.grafana.output import GrafanaOptions, GrafanaOutput, generate_grafana

__all__ = ["GrafanaOptions", "GrafanaOutput", "generate_grafana"]
