"""The dashboard under Streamlit's ``AppTest``: run one page over a config, and its text."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from support.dashboard_seed import AT
from vigil.conventions import DASHBOARD_ENV_AT, DASHBOARD_ENV_CONFIG

REPO = Path(__file__).resolve().parents[2]


APP = str(REPO / "dashboard" / "app.py")


def run_page(config: Path, monkeypatch: pytest.MonkeyPatch, page: str | None = None,
             **params: str | list[str]) -> AppTest:
    """The app for ``config`` pinned at ``AT`` (URL ``at``), on ``page`` (None: Overview)."""
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(config))
    monkeypatch.delenv(DASHBOARD_ENV_AT, raising=False)
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["at"] = repr(AT)
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    if page is not None:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [c.value for c in at.caption]
                     + [i.value for i in at.info] + [w.value for w in at.warning]
                     + [e.value for e in at.error] + [s.value for s in at.success])
