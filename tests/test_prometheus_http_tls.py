"""``[engine.http]`` against real servers: two Prometheus servers behind nginx
(tests/support/nginx.py) with TLS from a CA made here, a certificate for another name, client
certificates, a bearer token rotated while Vigil reads, basic auth, Mimir-style tenants on
``X-Scope-OrgID`` under ``/prometheus``, and a login page and rate limits in the way. Each
tenant's answer comes from its own data only; every refusal says what to change; no secret
appears in any message. ``vigil slo status`` reads through the same settings from its config.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.nginx import (
    CA,
    LOGIN_PAGE,
    TOO_MANY_REQUESTS,
    NginxFront,
    Site,
    make_ca,
    require_nginx,
    run_nginx,
)
from support.prometheus import PrometheusServer, PromSeries, require_prometheus, run_prometheus

from slo.sources.prometheus import PrometheusSource
from vigil.config import HttpClientConfig, parse_config
from vigil.errors import SourceError

MARK_MS = 1_700_000_000_000
AT_S = MARK_MS / 1000
TOKEN_1, TOKEN_2 = "mimir-t0ken-one", "mimir-t0ken-two"
PASSWORD = "pa55 w0rd"
SECRETS = (TOKEN_1, TOKEN_2, PASSWORD)


def _marker(tenant: str, value: float) -> PromSeries:
    return PromSeries("vigil_marker", {"tenant": tenant},
                      [(MARK_MS - 60_000, value), (MARK_MS, value)])


@pytest.fixture(scope="module")
def proms() -> Iterator[tuple[PrometheusServer, PrometheusServer]]:
    require_nginx()
    binaries = require_prometheus()
    with run_prometheus([_marker("a", 1.0)], binaries=binaries) as a, \
            run_prometheus([_marker("b", 2.0)], binaries=binaries) as b:
        yield a, b


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[CA, CA]:
    return (make_ca(tmp_path_factory.mktemp("ca")),
            make_ca(tmp_path_factory.mktemp("other-ca"), "unrelated-ca"))


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, pki: tuple[CA, CA],
          proms: tuple[PrometheusServer, PrometheusServer]) -> Iterator[NginxFront]:
    ca, _ = pki
    a, b = proms
    folder = tmp_path_factory.mktemp("nginx")
    named = ca.issue("named", dns=["prometheus.internal"], ip=[], folder=folder)
    sites = [
        Site("tls", upstream=a.base_url, tls=True),
        Site("named", upstream=a.base_url, cert=named),
        Site("mtls", upstream=a.base_url, client_cert=True),
        Site("basic", upstream=a.base_url, basic_auth=("vigil", PASSWORD)),
        Site("mimir", tenants={"team-a": a.base_url, "team-b": b.base_url},
             prefix="/prometheus", bearer=True, tls=True),
        Site("login", canned=LOGIN_PAGE),
        Site("limited", canned=TOO_MANY_REQUESTS),
    ]
    with run_nginx(folder, sites, ca=ca, bearer_tokens=[TOKEN_1]) as running:
        yield running


def _http(**kw: Any) -> HttpClientConfig:
    return parse_config({"engine": {"http": kw}}).engine.http


def _marker_of(url: str, http: HttpClientConfig) -> dict[str, float]:
    with PrometheusSource(url, http=http) as source:
        return {dict(k)["tenant"]: v for k, v in source.instant("vigil_marker", {},
                                                                  AT_S).items()}


def _refused(url: str, http: HttpClientConfig, says: str) -> str:
    with PrometheusSource(url, http=http) as source, pytest.raises(SourceError,
                                                                   match=says) as err:
        source.instant("vigil_marker", {}, AT_S)
    text = str(err.value)
    assert not [s for s in SECRETS if s in text], text
    return text


def test_tls_with_the_ca_that_signs_the_server(front: NginxFront, pki: tuple[CA, CA]) -> None:
    ca, other = pki
    url = front.url("tls")
    assert _marker_of(url, _http(tls={"ca_file": str(ca.cert)})) == {"a": 1.0}
    for http in (_http(), _http(tls={"ca_file": str(other.cert)})):
        _refused(url, http, r"TLS failed \(.*certificate verify failed.*\): the server's "
                            r"certificate is not signed by a CA Vigil trusts: set "
                            r"\[engine.http.tls\] ca_file")
    assert _marker_of(url, _http(tls={"insecure_skip_verify": True})) == {"a": 1.0}


def test_a_certificate_for_another_name_needs_server_name(front: NginxFront,
                                                          pki: tuple[CA, CA]) -> None:
    ca, _ = pki
    url = front.url("named")  # https://127.0.0.1:PORT, certificate for prometheus.internal
    _refused(url, _http(tls={"ca_file": str(ca.cert)}),
             r"the certificate is for another name: set \[engine.http.tls\] server_name")
    http = _http(tls={"ca_file": str(ca.cert), "server_name": "prometheus.internal"})
    assert _marker_of(url, http) == {"a": 1.0}


def test_a_client_certificate_where_the_server_asks_for_one(front: NginxFront,
                                                            pki: tuple[CA, CA],
                                                            tmp_path: Path) -> None:
    ca, other = pki
    url = front.url("mtls")
    wants = (r"HTTP 400, '400 .*SSL certificate.*': the server wants a client certificate it "
             r"trusts: set \[engine.http.tls\] cert_file and key_file")
    _refused(url, _http(tls={"ca_file": str(ca.cert)}), wants)
    cert, key = ca.issue("vigil-client", client=True, folder=tmp_path)
    http = _http(tls={"ca_file": str(ca.cert), "cert_file": str(cert), "key_file": str(key)})
    assert _marker_of(url, http) == {"a": 1.0}
    foreign = other.issue("stranger", client=True, folder=tmp_path)
    _refused(url, _http(tls={"ca_file": str(ca.cert), "cert_file": str(foreign[0]),
                             "key_file": str(foreign[1])}), wants)


def test_basic_auth_from_a_file(front: NginxFront, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    url = front.url("basic")
    assert _marker_of(url, _http(basic_auth={"username": "vigil",
                                             "password_file": str(tmp_path / "pw")})) == {
        "a": 1.0}
    (tmp_path / "pw").write_text("wrong")
    text = _refused(url, _http(basic_auth={"username": "vigil",
                                           "password_file": str(tmp_path / "pw")}),
                    r"HTTP 401 \(401 Authorization Required\): the server refused the "
                    r"credential \(sent basic auth as 'vigil' \(password from .*pw\)\); the "
                    r"server asks for Basic")
    assert "wrong" not in text


def test_mimir_tenants_behind_a_rotating_token(front: NginxFront, pki: tuple[CA, CA],
                                               tmp_path: Path) -> None:
    ca, _ = pki
    url = front.url("mimir")  # https://.../prometheus
    token = tmp_path / "token"
    token.write_text(TOKEN_1)
    base = {"bearer_token_file": str(token), "tls": {"ca_file": str(ca.cert)}}
    team_a = _http(**base, headers={"X-Scope-OrgID": "team-a"})
    team_b = _http(**base, headers={"X-Scope-OrgID": "team-b"})
    # Each tenant sees its own data only.
    assert _marker_of(url, team_a) == {"a": 1.0}
    assert _marker_of(url, team_b) == {"b": 2.0}
    _refused(url, _http(**base), r"no tenant, or one the server does not know: Mimir and "
                                 r"Cortex need the X-Scope-OrgID header")
    _refused(url, _http(**base, headers={"X-Scope-OrgID": "team-z"}), r"no tenant")
    # The token rotates on both sides: one source keeps working, reading the file again.
    with PrometheusSource(url, http=team_a) as source:
        assert source.instant("vigil_marker", {}, AT_S)
        front.set_bearer_token(TOKEN_2)
        with pytest.raises(SourceError, match=r"refused the credential \(sent a bearer token "
                                              r"from .*token, headers X-Scope-OrgID: "
                                              r"team-a\); the server asks for Bearer") as err:
            source.instant("vigil_marker", {}, AT_S)
        assert TOKEN_1 not in str(err.value)
        token.write_text(TOKEN_2)
        assert source.instant("vigil_marker", {}, AT_S)
    sent = [r["authorization"] for r in front.requests("mimir")]
    assert f"Bearer {TOKEN_2}" in sent


def test_a_login_page_and_a_rate_limit_say_so(front: NginxFront) -> None:
    _refused(front.url("login"), _http(),
             r"HTTP 200: an HTML page \(text/html, 'Sign in'\) where Prometheus's JSON API was "
             r"expected: the login page of a proxy")
    _refused(front.url("limited"), _http(),
             r"HTTP 429.*the server asks to wait 7 s before asking again \(Retry-After\)")


def test_vigil_slo_status_reads_through_the_config(front: NginxFront, pki: tuple[CA, CA],
                                                   tmp_path: Path) -> None:
    """The settings as a team writes them: relative files beside vigil.toml."""
    import argparse

    from vigil_shell import slo_status_cli

    ca, _ = pki
    front.set_bearer_token(TOKEN_1)
    (tmp_path / "token").write_text(TOKEN_1)
    (tmp_path / "ca.pem").write_bytes(ca.cert.read_bytes())
    (tmp_path / "vigil.toml").write_text(f"""
[engine]
prometheus_url = "{front.url('mimir')}"
promql_semantics = "2"
[engine.http]
bearer_token_file = "token"
headers = {{ "X-Scope-OrgID" = "team-a" }}
[engine.http.tls]
ca_file = "ca.pem"
[[pools]]
name = "chat"
model = "m"
""")
    parser = argparse.ArgumentParser()
    slo_status_cli.add_arguments(parser)
    out = io.StringIO()
    args = parser.parse_args(["--config", str(tmp_path / "vigil.toml"), "--json", "--at",
                              str(AT_S)])
    assert slo_status_cli.run(args, out=out) == 0
    status = json.loads(out.getvalue())
    assert status["source"] == "prometheus" and [s["name"] for s in status["slos"]]
    assert all(r["org_id"] == "team-a" for r in front.requests("mimir")[-3:])
    assert not [s for s in SECRETS if s in out.getvalue()]


@pytest.mark.slow
def test_serve_keeps_running_through_a_refused_credential(front: NginxFront,
                                                          pki: tuple[CA, CA],
                                                          tmp_path: Path) -> None:
    """`vigil serve` in Prometheus mode with a stale token: it keeps running, `/healthz` says
    503 with the credential it sent (never its value), `/metrics` says the evaluations fail;
    the rotated token in the file brings it back without a restart. Nothing it prints or
    serves holds a secret."""
    import signal
    import subprocess
    import sys

    import httpx
    from support.loopback import free_port, wait_for

    ca, _ = pki
    front.set_bearer_token(TOKEN_2)
    token = tmp_path / "token"
    token.write_text(TOKEN_1)  # stale
    (tmp_path / "vigil.toml").write_text(f"""
[engine]
prometheus_url = "{front.url('mimir')}"
promql_semantics = "2"
evaluation_interval = "1s"
[engine.http]
bearer_token_file = "token"
headers = {{ "X-Scope-OrgID" = "team-a" }}
[engine.http.tls]
ca_file = "{ca.cert}"
[[pools]]
name = "chat"
model = "m"
""")
    port = free_port()
    log = tmp_path / "serve.log"
    root = Path(__file__).resolve().parent.parent
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vigil_shell", "serve", "--config",
                                 str(tmp_path / "vigil.toml"), "--listen", f"127.0.0.1:{port}"],
                                cwd=root, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    seen: list[str] = []
    try:
        def refused() -> httpx.Response | None:
            r = httpx.get(base + "/healthz", timeout=2)
            return r if r.status_code == 503 else None

        health = wait_for("serve says the credential is refused", refused, 30,
                          ignore=(httpx.HTTPError,))
        assert "the server refused the credential (sent a bearer token from" in health.text
        metrics = httpx.get(base + "/metrics", timeout=2).text
        assert "vigil_evaluation_success 0.0" in metrics
        assert proc.poll() is None  # still running
        seen += [health.text, metrics]
        token.write_text(TOKEN_2)  # the rotation reaches the file

        def recovered() -> httpx.Response | None:
            r = httpx.get(base + "/healthz", timeout=2)
            return r if r.status_code == 200 else None

        health = wait_for("serve recovers with the rotated token", recovered, 30,
                          ignore=(httpx.HTTPError,))
        metrics = httpx.get(base + "/metrics", timeout=2).text
        assert "vigil_evaluation_success 1.0" in metrics
        assert "vigil_evaluation_failures_total" in metrics
        seen += [health.text, metrics]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    seen.append(log.read_text())
    assert "recovered after" in seen[-1]
    for text in seen:
        assert not [s for s in SECRETS if s in text], text[-2000:]
