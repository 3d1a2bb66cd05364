"""How Vigil reaches a Prometheus-compatible API (``[engine.http]``), shaped like Prometheus's
own ``http_config`` so that a team copies it from ``prometheus.yml`` or a Grafana datasource:
extra headers (Mimir's and Cortex's ``X-Scope-OrgID``), a bearer token, basic auth or OAuth2
client credentials, TLS, a proxy, and the Thanos querier's deduplication settings.

Secrets never sit in the file: a token, a password or a client secret is read from a file
(re-read at every request, so a rotated projected service-account token is picked up) or an
environment variable named here. Relative paths are relative to the config file.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from vigil.config.base import Duration, Section, check_http_url, refuse_password

__all__ = ["BasicAuthConfig", "HttpClientConfig", "OAuth2Config", "TlsConfig"]

#: Headers the credential keys set; a plain ``headers`` entry must not smuggle one in.
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
_HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"
_ENV_NAME = r"^(|[A-Za-z_][A-Za-z0-9_]*)$"


class BasicAuthConfig(Section):
    """HTTP basic auth: a user name, its password from a file or an environment variable."""

    username: str = Field(min_length=1)
    #: File holding the password (its trailing newline ignored); re-read at every request.
    password_file: str = ""
    #: Environment variable holding the password.
    password_env: str = Field(default="", pattern=_ENV_NAME)

    @model_validator(mode="after")
    def _one_source(self) -> BasicAuthConfig:
        if self.password_file and self.password_env:
            raise ValueError("give password_file or password_env, not both")
        return self


class OAuth2Config(Section):
    """OAuth2 client credentials (RFC 6749 section 4.4): a token from ``token_url``, sent as
    a bearer token and fetched again shortly before it expires."""

    client_id: str = Field(min_length=1)
    #: File holding the client secret; re-read at every token request.
    client_secret_file: str = ""
    #: Environment variable holding the client secret.
    client_secret_env: str = Field(default="", pattern=_ENV_NAME)
    token_url: str
    scopes: list[str] = []
    #: Extra form parameters of the token request (e.g. ``audience``).
    endpoint_params: dict[str, str] = {}

    @field_validator("token_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_http_url(refuse_password(v, "the token URL",
                                              "this file must hold no secret"))

    @model_validator(mode="after")
    def _one_source(self) -> OAuth2Config:
        if bool(self.client_secret_file) == bool(self.client_secret_env):
            raise ValueError("give exactly one of client_secret_file and client_secret_env")
        return self


class TlsConfig(Section):
    """TLS towards the server (Prometheus's ``tls_config``)."""

    #: CA bundle that signs the server's certificate ("" = the system's).
    ca_file: str = ""
    #: Client certificate and its key, for servers that ask for one (both or neither).
    cert_file: str = ""
    key_file: str = ""
    #: The name the server's certificate must carry, when it differs from the URL's host
    #: (also sent as SNI).
    server_name: str = ""
    #: Accept any certificate. Only for a test setup: anyone on the path can read and change
    #: every answer.
    insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together")
        return self


class HttpClientConfig(Section):
    """Every request Vigil sends to ``[engine] prometheus_url`` (see the module docstring)."""

    #: Extra headers of every request, e.g. ``{ "X-Scope-OrgID" = "team-a" }`` (not for
    #: credentials: those go in bearer_token_file, basic_auth, oauth2 or header_files).
    headers: dict[str, str] = {}
    #: Headers whose value is read from a file at every request (a secret API key).
    header_files: dict[str, str] = {}
    #: File holding a bearer token (a projected service-account token); re-read at every
    #: request, so a rotated token is picked up.
    bearer_token_file: str = ""
    basic_auth: BasicAuthConfig | None = None
    oauth2: OAuth2Config | None = None
    tls: TlsConfig = TlsConfig()
    #: Proxy of every request ("" = none, unless proxy_from_environment).
    proxy_url: str = ""
    #: Use HTTP_PROXY, HTTPS_PROXY and NO_PROXY from the environment.
    proxy_from_environment: bool = False
    #: One request may take this long (seconds); `vigil serve` also keeps it under its
    #: evaluation interval.
    timeout: Duration = Field(default=30.0, gt=0.0)
    #: Thanos querier: merge the series of HA replicas (sent as ``dedup``)...
    dedup: bool = True
    #: ...told apart by these labels (``replicaLabels[]``; "" = the querier's own flags).
    replica_labels: list[str] = []
    #: Thanos: answer when a store is missing (``partial_response``). Off: a budget computed
    #: from part of the data would look better than it is.
    partial_response: bool = False

    @field_validator("headers", "header_files")
    @classmethod
    def _header_names(cls, v: dict[str, str]) -> dict[str, str]:
        import re

        for name in v:
            if not re.fullmatch(_HEADER_NAME, name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if name.lower() in _CREDENTIAL_HEADERS:
                raise ValueError(f"{name}: set the credential with bearer_token_file, "
                                 "basic_auth or oauth2, which requests authenticate with "
                                 "(and never in headers, which would put a secret in the file)")
        return v

    @field_validator("proxy_url")
    @classmethod
    def _proxy(cls, v: str) -> str:
        if v:
            check_http_url(refuse_password(v, "the proxy URL", "this file must hold no secret "
                                              "(use proxy_from_environment and HTTPS_PROXY)"))
        return v

    @model_validator(mode="after")
    def _one_credential(self) -> HttpClientConfig:
        given = [k for k in ("bearer_token_file", "basic_auth", "oauth2") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: give one credential, not several")
        if self.proxy_url and self.proxy_from_environment:
            raise ValueError("proxy_url and proxy_from_environment: give one")
        return self
