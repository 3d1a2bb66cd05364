"""Start the dashboard's server with the app's code already loaded.

Streamlit runs ``app.py`` and the page scripts anew for each session, and a module is imported
by the first script that needs it. Without this, the first person to open a page after the
server starts waits for the SLO engine, pandas, Altair and the app's own modules to be
imported, and for Altair to build its schema validator on the first chart (about 0.7 s on
two cores; ``bench/dashboard_bench.py``), and for the Plan page's capacity estimates, which
the simulator computes from the config alone (about a second a pool). ``vigil dashboard``
runs ``python -m dashboard.warm run app.py ...``: ``prepare`` does that work once, then
Streamlit's own command line starts the server in the same process, so every session finds
it done. Nothing about the data is computed here: a page's figures are always the store's
at the time it is drawn.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

__all__ = ["MODULES", "main", "prepare"]

#: What the entry point and the pages import, heaviest first.
MODULES = (
    "pandas",
    "altair",
    "streamlit",
    "dashboard.data",
    "dashboard.charts",
    "dashboard.layout",
    "dashboard.controls",
    "dashboard.auth",
    "dashboard.status_view",
    "dashboard.alerts_view",
    "dashboard.empty_states",
    "dashboard.gateway_data",
    "dashboard.cost_data",
    "dashboard.plan_data",
    "dashboard.backtest_data",
    "dashboard.whatif",
    "dashboard.format",
)


def prepare() -> None:
    """Import ``MODULES`` and draw one chart off screen (Altair builds and caches its schema
    validator on the first chart it checks)."""
    # The app's cached functions are declared before Streamlit's runtime exists; their
    # caches are made at the first call, inside it, so its "no runtime" warning is moot.
    # (Streamlit sets its loggers' levels as it creates them: import it first.)
    importlib.import_module("streamlit.runtime.caching.cache_data_api")
    quiet = logging.getLogger("streamlit.runtime.caching.cache_data_api")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        for name in MODULES:
            importlib.import_module(name)
    finally:
        quiet.setLevel(level)
    from dashboard import charts

    frame = charts.long_frame([(0.0, "warm", 1.0), (60.0, "warm", 2.0)])
    charts.lines(frame, y_title="", y_format=".1f",
                 rules=[charts.Rule(1.5, "rule")]).to_dict()
    _estimates()


def _estimates() -> None:
    """Run the simulator's capacity searches the Plan page asks for (about a second each):
    they depend on the config alone, never on the data, and ``slo.planning.estimate`` keeps
    each search's result by its inputs, so the page finds them done. A config that cannot be
    read is left for the app to report."""
    import time

    from slo.planning import estimate
    from slo.planning.candidates import estimates
    from vigil.config import load_config
    from vigil.conventions import DASHBOARD_ENV_CONFIG
    from vigil.errors import VigilError

    path = os.environ.get(DASHBOARD_ENV_CONFIG)
    if not path:
        return
    try:
        config = load_config(path)
    except VigilError:
        return
    for pool in config.pools:
        estimates(config, pool, estimate, time.time(), [])


def main(argv: list[str] | None = None) -> int:
    """``prepare``, then Streamlit's command line with ``argv`` (``run app.py ...``)."""
    prepare()
    from streamlit.web import cli

    sys.argv = ["streamlit", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli.main(prog_name="streamlit")
    except SystemExit as done:
        return int(done.code or 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
