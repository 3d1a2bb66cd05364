"""Who may see the dashboard.

On 127.0.0.1 (the default) the machine's users may; anywhere else the dashboard needs one of:

* a password in the environment variable that ``[dashboard] password_env`` names: a login form
  (``st.text_input(type="password")``) comes before any page, and the answer is compared with
  ``hmac.compare_digest`` (constant time);
* Streamlit's own OIDC login (``st.login``), configured by an ``[auth]`` section in
  ``.streamlit/secrets.toml`` (``redirect_uri``, ``cookie_secret`` and a provider).

``vigil dashboard`` refuses to bind elsewhere without one (``access_problem``); the app checks
again at run time (``require_login``), so that ``streamlit run`` by hand cannot skip it.
"""

from __future__ import annotations

import hmac
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from vigil.config import Config
from vigil.conventions import LOOPBACK_ADDRESSES

__all__ = [
    "AUTH_STATE_KEY",
    "access_problem",
    "is_loopback",
    "oidc_configured",
    "password_from_env",
    "password_matches",
    "require_login",
    "secrets_files",
]

#: Session-state key set once the password was given in this browser session.
AUTH_STATE_KEY = "vigil.authenticated"
#: Keys st.login needs in the ``[auth]`` section (Streamlit's documentation).
_OIDC_KEYS = ("redirect_uri", "cookie_secret")


def is_loopback(address: str) -> bool:
    """True when ``address`` only accepts connections from this machine."""
    return address.strip().lower().strip("[]") in LOOPBACK_ADDRESSES


def password_from_env(config: Config, environ: Mapping[str, str]) -> str | None:
    """The dashboard password: the value of the variable ``[dashboard] password_env`` names,
    or ``None`` when none is named or it is empty."""
    name = config.dashboard.password_env
    value = environ.get(name, "") if name else ""
    return value or None


def password_matches(given: str, expected: str) -> bool:
    """Constant-time comparison of the typed password with the expected one."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def secrets_files(cwd: Path | None = None, home: Path | None = None) -> list[Path]:
    """Where Streamlit reads ``secrets.toml``: the working directory's ``.streamlit/`` first,
    then the user's ``~/.streamlit/``."""
    here = Path.cwd() if cwd is None else cwd
    user = Path.home() if home is None else home
    return [here / ".streamlit" / "secrets.toml", user / ".streamlit" / "secrets.toml"]


def _has_oidc(secrets: Mapping[str, Any]) -> bool:
    auth = secrets.get("auth")
    return isinstance(auth, Mapping) and all(auth.get(k) for k in _OIDC_KEYS)


def oidc_configured(files: Iterable[Path]) -> bool:
    """True when a secrets file has an ``[auth]`` section st.login can use. An unreadable or
    malformed file counts as not configured (Streamlit would refuse it too)."""
    for path in files:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if _has_oidc(data):
            return True
    return False


def access_problem(address: str, config: Config, environ: Mapping[str, str],
                   files: Iterable[Path]) -> str | None:
    """Why the dashboard must not listen on ``address``, or ``None`` when it may: loopback,
    or a password, or OIDC configured. The message says how to fix it."""
    if is_loopback(address):
        return None
    if password_from_env(config, environ) or oidc_configured(files):
        return None
    name = config.dashboard.password_env
    if name:
        how = (f"the environment variable {name} (named by [dashboard] password_env) is not "
               f"set or empty: export {name}=<a password>")
    else:
        how = ('set [dashboard] password_env = "VIGIL_DASHBOARD_PASSWORD" and export that '
               "variable with a password")
    return (f"binding the dashboard to {address} exposes it beyond this machine, and no "
            f"authentication is configured: {how}; or configure Streamlit's st.login (an "
            "[auth] section with redirect_uri, cookie_secret and a provider in "
            ".streamlit/secrets.toml); or bind to 127.0.0.1")


def require_login(config: Config, environ: Mapping[str, str]) -> bool:
    """Draw the login step when one is needed; True when the pages may be shown.

    A password (``password_env``) takes precedence over OIDC. Without either, the pages are
    shown only when the server listens on loopback; otherwise an error says why not.
    """
    import streamlit as st

    password = password_from_env(config, environ)
    if password is not None:
        if st.session_state.get(AUTH_STATE_KEY):
            return True
        st.title("Vigil")
        with st.form("vigil-login"):
            given = st.text_input("Password", type="password",
                                  help=f"The value of ${config.dashboard.password_env}.")
            submitted = st.form_submit_button("Log in")
        if submitted:
            if password_matches(given or "", password):
                st.session_state[AUTH_STATE_KEY] = True
                st.rerun()
            st.error("Wrong password.")
        return False
    if _has_oidc(_secrets(st)):
        # getattr: st.user has the attribute only where Streamlit's auth is set up.
        if getattr(st.user, "is_logged_in", False):
            if st.sidebar.button("Log out"):
                st.logout()
            return True
        st.title("Vigil")
        st.button("Log in", on_click=st.login, type="primary")
        return False
    from streamlit import config as st_config  # module attribute: AppTest patches it

    # AppTest runs no server: nothing listens, so there is nothing to expose.
    if st_config.get_option("global.appTest"):
        return True
    address = st_config.get_option("server.address") or "0.0.0.0"  # unset: every interface
    problem = access_problem(address, config, environ, [])
    if problem:
        st.error(f"Refusing to show the dashboard: {problem}.")
        return False
    return True


def _secrets(st: Any) -> Mapping[str, Any]:
    """``st.secrets`` as a mapping; empty when there is no secrets file (Streamlit raises
    ``StreamlitSecretNotFoundError``, a ``FileNotFoundError``: no file is no OIDC here)."""
    try:
        return {k: st.secrets[k] for k in st.secrets}
    except FileNotFoundError:
        return {}
