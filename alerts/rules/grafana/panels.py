"""The building blocks of the dashboards over grafana-foundation-sdk's builders: the data source,
the variables, and panels with their units and thresholds set.

grafana-foundation-sdk is Grafana's own dashboards-as-code library, generated from the same
schema as Grafana's dashboard model (the JSON schema the tests validate against comes from its
repository), so the dashboards follow Grafana's current model without Vigil keeping a copy of
it. Its versions carry a timestamp epoch (``1769699379!11.6.0``), which is why pyproject pins it
exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import (
    bargauge,
    dashboard,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import (
    common as common_builders,
)
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

__all__ = [
    "DATASOURCE",
    "Query",
    "bar_gauge_panel",
    "datasource_variable",
    "query_variable",
    "stat_panel",
    "state_timeline_panel",
    "table_panel",
    "threshold_lines",
    "thresholds",
    "timeseries_panel",
]

#: Every panel reads the data source chosen by the ``datasource`` variable.
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: A query: (legend, expr).
Query = tuple[str, str]
_REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: Colours of a threshold's steps, Grafana's named palette.
GREEN, ORANGE, RED = "green", "orange", "red"


def datasource_variable() -> dashboard.DatasourceVariable:
    return (dashboard.DatasourceVariable("datasource").label("Data source")
            .type("prometheus"))


def query_variable(name: str, label: str, query: str, *, multi: bool = True
                   ) -> dashboard.QueryVariable:
    """A variable whose values are a label's values (``label_values(...)``), refreshed with the
    time range; with ``multi``, several values and "All" (``.*``) may be chosen."""
    v = (dashboard.QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC))
    if multi:
        v = v.multi(True).include_all(True).all_value(".*")
    return v


def thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    """Absolute thresholds: ``(None, base colour), (value, colour), ...``."""
    return (dashboard.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=v, color=c) for v, c in steps]))


def _targets(queries: Sequence[Query], *, instant: bool = False
             ) -> list[prometheus.Dataquery]:
    out = []
    for ref, (legend, expr) in zip(_REF_IDS, queries, strict=False):
        q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
        q = q.instant() if instant else q.range()
        out.append(q.datasource(DATASOURCE))
    if len(queries) > len(_REF_IDS):
        raise ValueError(f"a panel takes at most {len(_REF_IDS)} queries")
    return out


def timeseries_panel(title: str, queries: Sequence[Query], *, unit: str,
                     description: str = "", lines: Sequence[Query] = (),
                     minimum: float | None = None, maximum: float | None = None,
                     width: int = 12, height: int = 8) -> timeseries.Panel:
    """A time series. ``lines``: queries of reference lines (an objective, an alert factor that
    differs per SLO), drawn after ``queries``; their legends say what they are. (A style
    override per series would need a ``byName`` matcher, whose string options Grafana's
    dashboard schema refuses.)"""
    p = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
         .unit(unit).span(width).height(height).line_width(1).fill_opacity(0)
         .legend(common_builders.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
                 .placement(cm.LegendPlacement.BOTTOM).show_legend(True)
                 .calcs(["lastNotNull", "max"])))
    if minimum is not None:
        p = p.min(minimum)
    if maximum is not None:
        p = p.max(maximum)
    for target in _targets([*queries, *lines]):
        p = p.with_target(target)
    return p


def threshold_lines(p: timeseries.Panel, steps: dashboard.ThresholdsConfig) -> timeseries.Panel:
    """Draw ``steps`` (constants: the scaling thresholds) as dashed lines on ``p``."""
    return p.thresholds(steps).thresholds_style(
        common_builders.GraphThresholdsStyleConfig().mode(
            cm.GraphThresholdsStyleMode.DASHED))


def stat_panel(title: str, queries: Sequence[Query], *, unit: str, description: str = "",
               steps: dashboard.ThresholdsConfig | None = None, width: int = 6,
               height: int = 6, decimals: float | None = None) -> stat.Panel:
    """A stat panel of instant queries (the value now), coloured by ``steps``."""
    p = (stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
         .span(width).height(height).color_mode(cm.BigValueColorMode.BACKGROUND)
         .graph_mode(cm.BigValueGraphMode.NONE)
         .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"])
                         .values(False)))
    if decimals is not None:
        p = p.decimals(decimals)
    if steps is not None:
        p = p.thresholds(steps)
    for target in _targets(queries, instant=True):
        p = p.with_target(target)
    return p


def bar_gauge_panel(title: str, queries: Sequence[Query], *, unit: str, description: str = "",
                    steps: dashboard.ThresholdsConfig | None = None,
                    minimum: float | None = None, maximum: float | None = None,
                    width: int = 12, height: int = 8, decimals: float | None = None
                    ) -> bargauge.Panel:
    """Horizontal bars of instant queries (the value now), one per series in the order the
    query returns them (``sort_desc`` puts the largest on top), named by the legend and
    coloured by ``steps``."""
    p = (bargauge.Panel().title(title).description(description).datasource(DATASOURCE)
         .unit(unit).span(width).height(height).orientation(cm.VizOrientation.HORIZONTAL)
         .display_mode(cm.BarGaugeDisplayMode.BASIC).value_mode(cm.BarGaugeValueMode.COLOR)
         .show_unfilled(True)
         .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"])
                         .values(False)))
    if decimals is not None:
        p = p.decimals(decimals)
    if minimum is not None:
        p = p.min(minimum)
    if maximum is not None:
        p = p.max(maximum)
    if steps is not None:
        p = p.thresholds(steps)
    for target in _targets(queries, instant=True):
        p = p.with_target(target)
    return p


def table_panel(title: str, queries: Sequence[Query], *, description: str = "",
                width: int = 24, height: int = 8,
                link: dashboard.DashboardLink | None = None
                ) -> table.Panel:
    """A table of instant queries, one row per series and one column per query, named by the
    query's legend: Grafana's ``merge`` joins the queries' rows on their labels, ``organize``
    hides the time and names the value columns (``Value #A`` ...). Each query is wrapped in
    ``max without () (...)``, which keeps every label but the metric name: two recorded series
    differ in their names, and rows that differ in a column are not merged."""
    names = {f"Value #{ref}": legend for ref, (legend, _) in zip(_REF_IDS, queries,
                                                                  strict=False)}
    p = (table.Panel().title(title).description(description).datasource(DATASOURCE)
         .span(width).height(height)
         .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
         .with_transformation(dm.DataTransformerConfig(
             id_val="organize", options={"excludeByName": {"Time": True},
                                         "renameByName": names})))
    wrapped = [(legend, f"max without () ({expr})") for legend, expr in queries]
    for target in _targets(wrapped, instant=True):
        p = p.with_target(target.format(pm.PromQueryFormat.TABLE))
    if link is not None:
        p = p.links([link])
    return p


def state_timeline_panel(title: str, queries: Sequence[Query], *, description: str = "",
                         width: int = 24, height: int = 6) -> statetimeline.Panel:
    """Which alerts fired when: 1 is firing (red), no value is quiet."""
    firing = dm.ValueMap(options={"1": dm.ValueMappingResult(text="firing", color=RED)})
    p = (statetimeline.Panel().title(title).description(description).datasource(DATASOURCE)
         .span(width).height(height).unit("none").mappings([firing])
         .thresholds(thresholds((None, GREEN), (1, RED))))
    for target in _targets(queries):
        p = p.with_target(target)
    return p

