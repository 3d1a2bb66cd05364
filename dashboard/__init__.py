"""The Streamlit dashboard (``vigil dashboard``): SLO health, cost per 1000 requests and what to
do about capacity, at one look.

``app.py`` is the Streamlit entry point (``st.navigation`` over ``views/``); the views only lay
out what plain modules compute: ``timeseries`` (thin loops over the SLO engine's functions),
``status_view`` (the status JSON shaped for tiles), ``alerts_view`` (firing alerts),
``gateway_data`` (the gateway's per-request records), ``whatif``, ``charts`` (Altair),
``layout`` and ``format``. ``data`` caches them for Streamlit, ``controls`` holds the time range
and filters (in the URL), ``auth`` the login gate; ``vigil_shell.dashboard_cli`` starts
Streamlit. Every number comes from the SLO engine (``slo/``). See docs/dashboard.md.
"""
