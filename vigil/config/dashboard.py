"""The dashboard (``[dashboard]``)."""

from __future__ import annotations

from pydantic import (
    Field,
)

from vigil.config.base import Duration, Section


class DashboardConfig(Section):
    """The Streamlit dashboard (``vigil dashboard``)."""

    #: 127.0.0.1 by default; any other address requires authentication.
    address: str = "127.0.0.1"
    port: int = Field(default=8501, ge=1, le=65535)
    #: Environment variable holding the dashboard password ("" = none); required off loopback
    #: unless Streamlit's st.login (OIDC, in .streamlit/secrets.toml) is configured.
    password_env: str = ""
    #: Default auto-refresh interval of live pages (seconds; 0 = off).
    refresh_interval: Duration = 30.0
