"""One HTTP client for every read of a Prometheus-compatible API, from ``[engine.http]``
(``vigil.config.HttpClientConfig``, shaped like Prometheus's ``http_config``).

``build_session`` gives the ``requests.Session`` that ``prometheus_api_client`` sends through
(``PrometheusSource`` hands it over): the credential as a ``requests`` auth object that reads
its file or variable at every request (a rotated token is used from the next request on),
extra headers, the CA bundle and client certificate, the proxy. ``mount_tls`` adds what a
session cannot say by itself, the server name the certificate must carry. ``describe``
says which credential was sent without its value, for the messages of a refused request;
``thanos_params`` are the query parameters of the Thanos querier's deduplication.

Secrets never leave this module but on the wire: the objects print as ``<secret>``, and
every message names a file or variable, never what it holds.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from requests.auth import AuthBase, _basic_auth_str

from vigil.config import HttpClientConfig
from vigil.errors import SourceError

__all__ = ["build_session", "describe", "forget_token", "mount_tls", "redact", "thanos_params"]

#: What stands in an error's text where a secret the requests carried was echoed back.
REDACTED = "(a secret, not shown)"
#: How many recent values of each secret are kept to redact (a rotated token may still be
#: echoed by an answer to a request sent just before the rotation).
_KEPT_VALUES = 4

#: An OAuth2 token is fetched again this long before it expires (seconds), so that a request
#: never carries one that runs out on its way.
TOKEN_MARGIN_S = 30.0


def _path(name: str, base_dir: Path | None) -> Path:
    p = Path(name).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


def _checked(value: str, what: str, where: str, url: str) -> str:
    """``value``, refused when a header could not carry it: a line break or another control
    character inside would otherwise surface in the HTTP library's own error, secret and
    all."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise SourceError(f"{what} from {where} holds a line break or another control "
                          "character, which no HTTP header can carry", url=url)
    return value


def _read_secret(name: str, base_dir: Path | None, what: str, url: str) -> str:
    """The contents of the file ``name`` without surrounding white space; ``SourceError``
    naming the file (never its contents) when it cannot be read, is empty or holds what a
    header cannot carry."""
    path = _path(name, base_dir)
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise SourceError(f"cannot read {what} from {path}: {reason or exc}",
                          url=url) from None
    if not value:
        raise SourceError(f"{what} file {path} is empty", url=url)
    return _checked(value, what, str(path), url)


def _env_secret(name: str, what: str, url: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise SourceError(f"{what}: the environment variable {name} is not set or empty",
                          url=url)
    return _checked(value, what, f"${name}", url)


class _Credentials(AuthBase):
    """The credential and secret headers of ``cfg``, read afresh for every request."""

    def __init__(self, cfg: HttpClientConfig, base_dir: Path | None, url: str) -> None:
        self.cfg = cfg
        self.base_dir = base_dir
        self.url = url
        self._token: tuple[str, float] | None = None  # (OAuth2 access token, expires at)
        self._lock = threading.Lock()
        # The token endpoint is reached the way the API is (proxy, CA, client certificate),
        # without the API's credential.
        self._token_session: requests.Session | None = None
        # Per secret, the values recently sent: ``redact`` removes them from error texts
        # (a proxy such as vmauth echoes an unknown token in its error body).
        self._sent: dict[str, list[str]] = {}

    def _remember(self, what: str, *values: str) -> None:
        with self._lock:
            kept = self._sent.setdefault(what, [])
            for value in values:
                if value and value not in kept:
                    kept.append(value)
            del kept[:-_KEPT_VALUES]

    def sent(self) -> list[str]:
        """Every secret value recently sent, longest first."""
        with self._lock:
            values = {v for kept in self._sent.values() for v in kept}
        return sorted(values, key=len, reverse=True)

    def forget_token(self) -> None:
        """Drop the cached OAuth2 token (the server refused it: revoked, or the secret
        rotated); the next request fetches another."""
        with self._lock:
            self._token = None

    def __repr__(self) -> str:
        return "<secret>"

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        cfg = self.cfg
        for name, file in cfg.header_files.items():
            r.headers[name] = _read_secret(file, self.base_dir, f"the {name} header", self.url)
            self._remember(name, str(r.headers[name]))
        if cfg.bearer_token_file:
            token = _read_secret(cfg.bearer_token_file, self.base_dir, "the bearer token",
                                 self.url)
            self._remember("bearer", token)
            r.headers["Authorization"] = f"Bearer {token}"
        elif cfg.basic_auth is not None:
            b = cfg.basic_auth
            if b.password_file:
                password = _read_secret(b.password_file, self.base_dir, "the basic-auth password",
                                        self.url)
            elif b.password_env:
                password = _env_secret(b.password_env, "the basic-auth password", self.url)
            else:
                password = ""
            header = _basic_auth_str(b.username, password)
            self._remember("basic", password, header.split(" ", 1)[-1])
            r.headers["Authorization"] = header
        elif cfg.oauth2 is not None:
            token = self._oauth2_token()
            self._remember("oauth2", token)
            r.headers["Authorization"] = f"Bearer {token}"
        return r

    def _oauth2_token(self) -> str:
        """A client-credentials access token, cached until ``TOKEN_MARGIN_S`` before it
        expires."""
        o = self.cfg.oauth2
        assert o is not None
        with self._lock:
            now = time.monotonic()
            if self._token is not None and now < self._token[1]:
                return self._token[0]
            if o.client_secret_file:
                secret = _read_secret(o.client_secret_file, self.base_dir,
                                      "the OAuth2 client secret", self.url)
            else:
                secret = _env_secret(o.client_secret_env, "the OAuth2 client secret", self.url)
            form = {"grant_type": "client_credentials", **o.endpoint_params}
            if o.scopes:
                form["scope"] = " ".join(o.scopes)
            if self._token_session is None:
                self._token_session = _session(self.cfg, self.base_dir)
            try:
                # Client authentication in the Authorization header (RFC 6749 2.3.1), as
                # Prometheus's oauth2 client sends it first.
                answer = self._token_session.post(o.token_url, data=form,
                                                  timeout=self.cfg.timeout,
                                                  auth=(o.client_id, secret))
            except requests.RequestException as exc:
                raise SourceError(f"cannot get an OAuth2 token from {o.token_url}: "
                                  f"{type(exc).__name__}", url=self.url) from None
            if answer.status_code != 200:
                raise SourceError(f"the OAuth2 token endpoint {o.token_url} refused client "
                                  f"{o.client_id!r}: HTTP {answer.status_code}", url=self.url)
            try:
                body = answer.json()
                token = _checked(str(body["access_token"]), "the OAuth2 access token",
                                 o.token_url, self.url)
                lifetime = float(body.get("expires_in", 3600))
            except (ValueError, KeyError, TypeError):
                raise SourceError(f"the OAuth2 token endpoint {o.token_url} answered no "
                                  "access_token", url=self.url) from None
            self._token = (token, now + max(0.0, lifetime - TOKEN_MARGIN_S))
            return token


def _verify(cfg: HttpClientConfig, base_dir: Path | None) -> bool | str:
    if cfg.tls.insecure_skip_verify:
        return False
    if cfg.tls.ca_file:
        return str(_path(cfg.tls.ca_file, base_dir))
    return True


class _Session(requests.Session):
    """A session that drops the secret headers of ``header_files`` on a redirect to another
    host, as requests drops ``Authorization`` (it knows nothing of the others)."""

    secret_headers: tuple[str, ...] = ()

    def rebuild_auth(self, prepared_request: requests.PreparedRequest,
                     response: requests.Response) -> None:
        url = prepared_request.url or ""
        if self.secret_headers and self.should_strip_auth(response.request.url or "", url):
            for name in self.secret_headers:
                prepared_request.headers.pop(name, None)
        super().rebuild_auth(prepared_request, response)


def _session(cfg: HttpClientConfig, base_dir: Path | None) -> _Session:
    """A session with ``cfg``'s proxy, headers and TLS, and no credential."""
    session = _Session()
    # Only what the config says: no proxy or CA bundle picked up from the environment unless
    # asked for (as the collector's scraper does).
    session.trust_env = cfg.proxy_from_environment
    if cfg.proxy_url:
        session.proxies = {"http": cfg.proxy_url, "https": cfg.proxy_url}
    session.headers.update(cfg.headers)
    session.verify = _verify(cfg, base_dir)
    if cfg.tls.cert_file:
        session.cert = (str(_path(cfg.tls.cert_file, base_dir)),
                        str(_path(cfg.tls.key_file, base_dir)))
    return session


def build_session(cfg: HttpClientConfig, url: str, *,
                  base_dir: Path | None = None) -> requests.Session:
    """The session every request to ``url`` goes through, configured by ``cfg`` (relative
    files are relative to ``base_dir``, the config file's folder)."""
    session = _session(cfg, base_dir)
    session.secret_headers = tuple(cfg.header_files)
    if cfg.bearer_token_file or cfg.basic_auth or cfg.oauth2 or cfg.header_files:
        session.auth = _Credentials(cfg, base_dir, url)
    return session


def redact(text: str, session: requests.Session) -> str:
    """``text`` without any secret value the session's requests recently carried (a token, a
    password, its base64 form, a secret header): what a server or proxy echoes back in an
    error must not reach a log line or a JSON answer."""
    if isinstance(session.auth, _Credentials):
        for value in session.auth.sent():
            text = text.replace(value, REDACTED)
    return text


def forget_token(session: requests.Session) -> None:
    """After a refused answer: drop a cached OAuth2 token, so the next request fetches one."""
    if isinstance(session.auth, _Credentials):
        session.auth.forget_token()


class _ServerNameAdapter(HTTPAdapter):
    """An adapter whose connections expect ``server_name`` in the certificate and send it
    as SNI (urllib3's ``server_hostname``/``assert_hostname``), whatever the URL's host."""

    def __init__(self, server_name: str, **kwargs: Any) -> None:
        self.server_name = server_name
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["server_hostname"] = self.server_name
        kwargs["assert_hostname"] = self.server_name
        super().init_poolmanager(*args, **kwargs)


def mount_tls(session: requests.Session, cfg: HttpClientConfig, url: str,
              **adapter_kwargs: Any) -> None:
    """With ``tls.server_name``: mount the adapter that checks it for ``url``; call after
    anything else mounted an adapter there (prometheus_api_client does, for its retries)."""
    if cfg.tls.server_name and url.startswith("https://"):
        session.mount(url, _ServerNameAdapter(cfg.tls.server_name, **adapter_kwargs))


def thanos_params(cfg: HttpClientConfig) -> dict[str, Any]:
    """Query parameters of the Thanos querier (Prometheus, Mimir and VictoriaMetrics ignore
    parameters they do not know): deduplication and partial responses."""
    params: dict[str, Any] = {"dedup": "true" if cfg.dedup else "false",
                              "partial_response": "true" if cfg.partial_response else "false"}
    if cfg.replica_labels:
        params["replicaLabels[]"] = list(cfg.replica_labels)
    return params


def describe(cfg: HttpClientConfig, base_dir: Path | None = None) -> str:
    """Which credential a request carries, never its value: ``"a bearer token from
    /var/run/secrets/token"``, ``"basic auth as 'vigil' (password from $PROM_PASSWORD)"``,
    ``"no credential"``; with the extra headers' names (tenant headers with their value,
    which is not a secret)."""
    parts: list[str] = []
    if cfg.bearer_token_file:
        parts.append(f"a bearer token from {_path(cfg.bearer_token_file, base_dir)}")
    elif cfg.basic_auth is not None:
        b = cfg.basic_auth
        where = (f"from {_path(b.password_file, base_dir)}" if b.password_file
                 else f"from ${b.password_env}" if b.password_env else "empty")
        parts.append(f"basic auth as {b.username!r} (password {where})")
    elif cfg.oauth2 is not None:
        parts.append(f"an OAuth2 token of client {cfg.oauth2.client_id!r} from "
                     f"{cfg.oauth2.token_url}")
    else:
        parts.append("no credential")
    if cfg.tls.cert_file:
        parts.append(f"the client certificate {_path(cfg.tls.cert_file, base_dir)}")
    shown = dict(cfg.headers)
    named = [*shown, *cfg.header_files]
    if named:
        tenant = {k: v for k, v in shown.items() if k.lower() == "x-scope-orgid"}
        text = ", ".join(f"{k}: {tenant[k]}" if k in tenant else k for k in named)
        parts.append(f"headers {text}")
    return ", ".join(parts)
