"""``[engine.http]``: how every read of a Prometheus-compatible API authenticates
(slo/sources/http_client.py through slo/sources/prometheus.py), against a real HTTP server on
loopback that records what arrives: credentials read afresh at every request (a rotated token
is used at once), basic auth, OAuth2 client credentials, tenant and secret headers, the Thanos
querier's parameters, the API's warnings carried into the status, and refusals whose messages
say what to change without ever showing a secret.

TLS (a private CA, client certificates, the server name) and authenticating proxies are in
tests/test_prometheus_http_tls.py, against nginx.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.loopback import Answer, Request, serve_http

from slo.sources.prometheus import PrometheusSource
from vigil.config import HttpClientConfig, parse_config
from vigil.errors import ConfigError, SourceError

TOKEN_1 = "tok-first-9f8e7d"
TOKEN_2 = "tok-rotated-1a2b3c"
PASSWORD = "pa55-w0rd-xyz"
CLIENT_SECRET = "client-secret-4d5e6f"
API_KEY = "api-key-7g8h9i"
SECRETS = (TOKEN_1, TOKEN_2, PASSWORD, CLIENT_SECRET, API_KEY)

EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}


class Api:
    """A Prometheus-like API that records requests and answers as ``answer`` says; its
    ``/token`` is an OAuth2 token endpoint for client ``vigil`` and ``CLIENT_SECRET``."""

    def __init__(self) -> None:
        self.answer: tuple[int, dict[str, Any] | str] = (200, EMPTY)
        self.tokens_issued = 0

    def __call__(self, req: Request) -> Answer:
        if req.path.startswith("/token"):
            auth = req.headers.get("authorization", "")
            if auth != "Basic " + base64.b64encode(f"vigil:{CLIENT_SECRET}".encode()).decode():
                return 401, "application/json", b'{"error": "invalid_client"}'
            self.tokens_issued += 1
            return 200, "application/json", json.dumps(
                {"access_token": f"oauth-{self.tokens_issued}", "token_type": "bearer",
                 "expires_in": 3600}).encode()
        status, body = self.answer
        text = body if isinstance(body, str) else json.dumps(body)
        return status, "application/json", text.encode()


@pytest.fixture
def api() -> Iterator[tuple[str, Api, Any]]:
    behaviour = Api()
    with serve_http(behaviour) as server:
        yield server.url, behaviour, server


def _http(**kw: Any) -> HttpClientConfig:
    return parse_config({"engine": {"http": kw}}).engine.http


def _query(req: Request) -> dict[str, list[str]]:
    return urllib.parse.parse_qs(urllib.parse.urlsplit(req.path).query)


def test_a_rotated_bearer_token_is_used_from_the_next_request(api: Any, tmp_path: Path) -> None:
    url, _, server = api
    (tmp_path / "token").write_text(TOKEN_1 + "\n")
    with PrometheusSource(url, http=_http(bearer_token_file="token"),
                          base_dir=tmp_path) as source:
        source.instant("up", {}, 1e9)
        (tmp_path / "token").write_text(TOKEN_2)  # the kubelet rotated it
        source.instant("up", {}, 1e9)
    sent = [r.headers["authorization"] for r in server.requests]
    assert sent == [f"Bearer {TOKEN_1}", f"Bearer {TOKEN_2}"]


def test_basic_auth_from_a_file_or_the_environment(api: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url, _, server = api
    (tmp_path / "pw").write_text(PASSWORD)
    monkeypatch.setenv("PROM_PASSWORD", PASSWORD + "-env")
    for cfg in (_http(basic_auth={"username": "vigil", "password_file": str(tmp_path / "pw")}),
                _http(basic_auth={"username": "vigil", "password_env": "PROM_PASSWORD"})):
        with PrometheusSource(url, http=cfg) as source:
            source.instant("up", {}, 1e9)
    got = [base64.b64decode(r.headers["authorization"].split()[1]).decode()
           for r in server.requests]
    assert got == [f"vigil:{PASSWORD}", f"vigil:{PASSWORD}-env"]


def test_tenant_and_secret_headers_and_the_thanos_parameters(api: Any, tmp_path: Path) -> None:
    url, _, server = api
    (tmp_path / "key").write_text(API_KEY)
    cfg = _http(headers={"X-Scope-OrgID": "team-a"}, header_files={"X-Api-Key": "key"},
                replica_labels=["prometheus_replica", "replica"])
    with PrometheusSource(url + "/prometheus", http=cfg, base_dir=tmp_path) as source:
        source.instant("up", {}, 1e9)
        source.bucket_increase("vllm:time_to_first_token_seconds", {"pool": "chat"}, 1e9, 300)
    for req in server.requests:
        assert req.path.startswith("/prometheus/api/v1/query?")
        assert req.headers["x-scope-orgid"] == "team-a"
        assert req.headers["x-api-key"] == API_KEY
        q = _query(req)
        assert q["dedup"] == ["true"] and q["partial_response"] == ["false"]
        assert q["replicaLabels[]"] == ["prometheus_replica", "replica"]


def test_oauth2_client_credentials_fetch_one_token_and_reuse_it(api: Any,
                                                                tmp_path: Path) -> None:
    url, behaviour, server = api
    (tmp_path / "secret").write_text(CLIENT_SECRET)
    cfg = _http(oauth2={"client_id": "vigil", "client_secret_file": "secret",
                        "token_url": f"{url}/token", "scopes": ["metrics.read"],
                        "endpoint_params": {"audience": "mimir"}})
    with PrometheusSource(url, http=cfg, base_dir=tmp_path) as source:
        source.instant("up", {}, 1e9)
        source.instant("up", {}, 1e9)
    token_requests = [r for r in server.requests if r.path.startswith("/token")]
    assert len(token_requests) == 1 and behaviour.tokens_issued == 1
    form = urllib.parse.parse_qs(token_requests[0].body.decode())
    assert form == {"grant_type": ["client_credentials"], "scope": ["metrics.read"],
                    "audience": ["mimir"]}
    queries = [r for r in server.requests if r.path.startswith("/api/")]
    assert [r.headers["authorization"] for r in queries] == ["Bearer oauth-1"] * 2
    (tmp_path / "secret").write_text("wrong")
    with PrometheusSource(url, http=cfg, base_dir=tmp_path) as source, \
            pytest.raises(SourceError, match=r"token endpoint .* refused client 'vigil': "
                                             r"HTTP 401") as err:
        source.instant("up", {}, 1e9)
    assert "wrong" not in str(err.value) and CLIENT_SECRET not in str(err.value)


def test_warnings_reach_the_status(api: Any) -> None:
    from slo.status import evaluate

    url, behaviour, _ = api
    behaviour.answer = (200, {**EMPTY, "warnings": [
        "partial response: store 10.0.0.3:10901 did not answer"]})
    # Raw series only: the server's warning alone, not the one about recorded series.
    config = parse_config({"pools": [{"name": "chat", "model": "m"}],
                           "engine": {"recorded_rules": "off"}})
    with PrometheusSource(url) as source:
        status = evaluate(config, source, 1e9)
        assert status["warnings"] == ["partial response: store 10.0.0.3:10901 did not answer"]
        behaviour.answer = (200, EMPTY)
        assert "warnings" not in evaluate(config, source, 1e9)  # taken once, then cleared


@pytest.mark.parametrize(("answer", "says"), [
    ((401, {"status": "error", "errorType": "unauthorized", "error": "bad token"}),
     r"HTTP 401 \(unauthorized\): bad token: the server refused the credential \(sent a "
     r"bearer token from .*token, headers X-Scope-OrgID: team-a\); check \[engine.http\]"),
    ((401, "no org id"),
     r"no tenant, or one the server does not know: Mimir and Cortex need the X-Scope-OrgID "
     r"header"),
    ((422, {"status": "error", "errorType": "execution", "error":
            "cannot select more than -search.maxSamplesPerQuery=1000000000 samples"}),
     r"past the server's limit \(VictoriaMetrics' -search.maxSamplesPerQuery\): shorten the "
     r"window, or let the server evaluate Vigil's recording rules"),
    ((422, {"status": "error", "errorType": "execution", "error":
            "query processing would load too many samples into memory in query execution"}),
     r"Prometheus's --query.max-samples"),
])
def test_refusals_say_what_to_change_and_never_a_secret(api: Any, tmp_path: Path,
                                                        answer: Any, says: str) -> None:
    url, behaviour, _ = api
    behaviour.answer = answer
    (tmp_path / "token").write_text(TOKEN_1)
    cfg = _http(bearer_token_file=str(tmp_path / "token"), headers={"X-Scope-OrgID": "team-a"})
    with PrometheusSource(url, http=cfg) as source, \
            pytest.raises(SourceError, match=says) as err:
        source.instant("up", {}, 1e9)
    assert not [s for s in SECRETS if s in str(err.value)]


def test_an_unreadable_credential_names_its_file(api: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    url, _, server = api
    with PrometheusSource(url, http=_http(bearer_token_file="missing"), base_dir=tmp_path) as s, \
            pytest.raises(SourceError, match=r"cannot read the bearer token from .*missing"):
        s.instant("up", {}, 1e9)
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    cfg = _http(basic_auth={"username": "u", "password_env": "NOT_SET_ANYWHERE"})
    with PrometheusSource(url, http=cfg) as s, \
            pytest.raises(SourceError, match="environment variable NOT_SET_ANYWHERE is not set"):
        s.instant("up", {}, 1e9)
    assert server.requests == []  # nothing was sent without its credential


@pytest.mark.parametrize(("http", "says"), [
    ({"headers": {"Authorization": "Bearer x"}}, "set the credential with bearer_token_file"),
    ({"bearer_token_file": "t", "basic_auth": {"username": "u"}},
     "bearer_token_file and basic_auth: give one credential"),
    ({"proxy_url": "http://u:secret@proxy:3128"}, "the proxy URL carries a password"),
    ({"tls": {"cert_file": "c.pem"}}, "cert_file and key_file go together"),
    ({"oauth2": {"client_id": "c", "token_url": "https://sso/token"}},
     "exactly one of client_secret_file and client_secret_env"),
    ({"headers": {"Bad Header": "x"}}, "is not an HTTP header name"),
])
def test_bad_http_settings_are_refused_with_the_key(http: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        parse_config({"engine": {"http": http}})
    assert "engine.http" in str(err.value)
    assert "secret@" not in str(err.value)


def test_a_secret_that_no_header_can_carry_is_refused_by_name(api: Any, tmp_path: Path) -> None:
    url, _, server = api
    (tmp_path / "token").write_text(f"{TOKEN_1}\n{TOKEN_2}\n")  # two tokens pasted together
    with PrometheusSource(url, http=_http(bearer_token_file="token"), base_dir=tmp_path) as s, \
            pytest.raises(SourceError, match=r"the bearer token from .*token holds a line "
                                             r"break") as err:
        s.instant("up", {}, 1e9)
    assert TOKEN_1 not in str(err.value) and TOKEN_2 not in str(err.value)
    assert server.requests == []


def test_secret_headers_do_not_follow_a_redirect_to_another_host(tmp_path: Path) -> None:
    """requests drops Authorization on a redirect to another host; the headers of
    header_files (an API key) are dropped the same way."""
    with serve_http(lambda _req: (200, "application/json", json.dumps(EMPTY).encode())) as b:
        other = b.url.replace("127.0.0.1", "localhost")

        import http.server
        import threading

        class Redirect(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", other + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                """No access log on stderr: the test reads what arrives at the other host."""

        a = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        threading.Thread(target=a.serve_forever, daemon=True).start()
        try:
            (tmp_path / "key").write_text(API_KEY)
            cfg = _http(header_files={"X-Api-Key": "key"})
            with PrometheusSource(f"http://127.0.0.1:{a.server_address[1]}", http=cfg,
                                  base_dir=tmp_path) as source:
                source.instant("up", {}, 1e9)
        finally:
            a.shutdown()
            a.server_close()
        assert len(b.requests) == 1
        assert "x-api-key" not in b.requests[0].headers


def test_a_url_with_a_password_is_refused(api: Any) -> None:
    url, _, _ = api
    with pytest.raises(ValueError, match="carries a password") as err:
        PrometheusSource(url.replace("http://", f"http://vigil:{PASSWORD}@"))
    assert PASSWORD not in str(err.value)
    with pytest.raises(ConfigError, match="carries a password") as cfg_err:
        parse_config({"engine": {"prometheus_url": f"http://vigil:{PASSWORD}@prom:9090"}})
    assert PASSWORD not in str(cfg_err.value)
