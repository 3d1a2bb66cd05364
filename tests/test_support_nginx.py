"""The nginx test front (tests/support/nginx.py) against real Prometheus servers: each of its
modes refuses and admits what it says it does, so tests of Vigil's Prometheus client can trust
it. Two Prometheus servers hold one marker series each (``tenant="a"``, ``tenant="b"``), so an
answer shows which one it came from."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.nginx import (
    BEARER_REALM,
    CA,
    LOGIN_PAGE,
    LOGIN_PATH,
    SERVICE_UNAVAILABLE,
    SSO_REDIRECT,
    TOO_MANY_REQUESTS,
    Canned,
    NginxError,
    NginxFront,
    Site,
    make_ca,
    require_nginx,
    run_nginx,
)
from support.prometheus import PrometheusServer, PromSeries, require_prometheus, run_prometheus

#: The marker samples' time (Unix ms) and the query time that finds them (Unix seconds).
MARK_MS = 1_700_000_000_000
AT_S = MARK_MS / 1000
QUERY = {"query": "vigil_nginx_marker", "time": repr(AT_S)}


def marker_prometheus(tenant: str, value: float) -> PromSeries:
    return PromSeries("vigil_nginx_marker", {"tenant": tenant},
                      [(MARK_MS - 60_000, value), (MARK_MS, value)])


def tenant_of(resp: httpx.Response) -> str:
    """Which Prometheus answered a marker query (its series' ``tenant`` label)."""
    assert resp.status_code == 200, resp.text
    result = resp.json()["data"]["result"]
    assert len(result) == 1, result
    return str(result[0]["metric"]["tenant"])


@pytest.fixture(scope="module")
def proms() -> Iterator[tuple[PrometheusServer, PrometheusServer]]:
    require_nginx()  # skip before starting two Prometheus servers for nothing
    binaries = require_prometheus()
    with run_prometheus([marker_prometheus("a", 1.0)], binaries=binaries) as a, \
            run_prometheus([marker_prometheus("b", 2.0)], binaries=binaries) as b:
        yield a, b


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    """A CA nobody here trusts."""
    return make_ca(tmp_path_factory.mktemp("other-ca"), "unrelated-ca")


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, ca: CA,
          proms: tuple[PrometheusServer, PrometheusServer]) -> Iterator[NginxFront]:
    """One nginx exposing every mode at once, a site per mode."""
    a, b = proms
    folder = tmp_path_factory.mktemp("nginx")
    named = ca.issue("named", dns=["prometheus.internal"], ip=[], folder=folder)
    sites = [
        Site("plain", upstream=a.base_url),
        Site("tls", upstream=a.base_url, tls=True),
        Site("named", upstream=a.base_url, cert=named),
        Site("mtls", upstream=a.base_url, client_cert=True),
        Site("basic", upstream=a.base_url, basic_auth=("vigil", "pa$$ \"word\"")),
        Site("prefix", upstream=b.base_url, prefix="/prometheus"),
        Site("tenants", tenants={"team-a": a.base_url, "team-b": b.base_url}),
        # Mimir behind an authenticating gateway: token, then tenant, under /prometheus.
        Site("mimir", tenants={"team-a": a.base_url, "team-b": b.base_url},
             prefix="/prometheus", bearer=True, tls=True),
        Site("login", canned=LOGIN_PAGE),
        Site("sso", canned=SSO_REDIRECT),
        Site("limited", canned=TOO_MANY_REQUESTS),
        Site("unavailable", canned=SERVICE_UNAVAILABLE),
        Site("guarded", canned=SERVICE_UNAVAILABLE, basic_auth=("vigil", "pw")),
    ]
    with run_nginx(folder, sites, ca=ca, bearer_tokens=["mimir-t0ken"]) as running:
        yield running


def get(url: str, path: str = "/api/v1/query", *, headers: dict[str, str] | None = None,
        **client_args: Any) -> httpx.Response:
    """GET ``url + path`` with the marker query, through a new ``httpx.Client(**client_args)``
    (``verify``, ``auth``, ``follow_redirects``)."""
    with httpx.Client(trust_env=False, timeout=10.0, **client_args) as client:
        return client.get(url + path, params=QUERY, headers=headers)


# -- TLS ---------------------------------------------------------------------------------------


def test_plain_http_proxies_to_the_upstream(front: NginxFront) -> None:
    assert front["plain"].url.startswith("http://127.0.0.1:")
    assert tenant_of(get(front.url("plain"))) == "a"


def test_https_verifies_with_its_ca_only(front: NginxFront, ca: CA, other_ca: CA) -> None:
    url = front.url("tls")
    assert url.startswith("https://127.0.0.1:")
    assert tenant_of(get(url, verify=ca.ssl_context())) == "a"
    assert front.requests("tls", at_least=1)[-1]["ssl_protocol"] == "TLSv1.3"
    with pytest.raises(httpx.ConnectError, match="unable to get local issuer certificate"):
        get(url, verify=other_ca.ssl_context())
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        get(url)  # the system's CAs


def test_a_certificate_for_another_name_needs_the_server_name(front: NginxFront,
                                                             ca: CA) -> None:
    """The certificate names only prometheus.internal: connecting to 127.0.0.1 fails the
    hostname check unless the client sends that name (Prometheus's ``server_name``)."""
    url = front.url("named")
    with pytest.raises(httpx.ConnectError, match="IP address mismatch"):
        get(url, verify=ca.ssl_context())
    with httpx.Client(verify=ca.ssl_context(), trust_env=False) as client:
        resp = client.get(url + "/api/v1/query", params=QUERY,
                          extensions={"sni_hostname": "prometheus.internal"})
    assert tenant_of(resp) == "a"


def test_client_certificate_mode_refuses_without_a_good_one(front: NginxFront, ca: CA,
                                                            other_ca: CA,
                                                            tmp_path: Path) -> None:
    url = front.url("mtls")
    resp = get(url, verify=ca.ssl_context())
    assert resp.status_code == 400
    assert "No required SSL certificate was sent" in resp.text
    stranger = other_ca.issue("stranger", client=True, folder=tmp_path)
    resp = get(url, verify=ca.ssl_context(stranger))
    assert resp.status_code == 400
    assert "The SSL certificate error" in resp.text
    mine = ca.issue("vigil-client", client=True, folder=tmp_path)
    assert tenant_of(get(url, verify=ca.ssl_context(mine))) == "a"
    assert front.requests("mtls", at_least=3)[-1]["client_dn"] == "CN=vigil-client"


# -- credentials -------------------------------------------------------------------------------


def test_basic_auth(front: NginxFront) -> None:
    url = front.url("basic")
    resp = get(url)
    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"] == f'Basic realm="{BEARER_REALM}"'
    assert get(url, auth=("vigil", "wrong")).status_code == 401
    assert get(url, auth=("other", "pa$$ \"word\"")).status_code == 401
    assert tenant_of(get(url, auth=("vigil", "pa$$ \"word\""))) == "a"
    assert front.requests("basic", at_least=4)[-1]["user"] == "vigil"


def test_bearer_token_and_its_rotation(tmp_path: Path,
                                       proms: tuple[PrometheusServer, PrometheusServer]
                                       ) -> None:
    """A front of its own: the rotation must not leak into the module's other tests."""
    sites = [Site("bearer", upstream=proms[0].base_url, bearer=True)]
    with run_nginx(tmp_path, sites, bearer_tokens=["old-t0ken"]) as front, \
            httpx.Client(base_url=front.url("bearer"), trust_env=False) as client:

        def status(token: str | None, via: httpx.Client = client) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
            return via.get("/api/v1/query", params=QUERY, headers=headers).status_code

        resp = client.get("/api/v1/query", params=QUERY)
        assert resp.status_code == 401
        assert resp.text == "missing bearer token\n"
        assert resp.headers["WWW-Authenticate"] == f'Bearer realm="{BEARER_REALM}"'
        resp = client.get("/api/v1/query", params=QUERY,
                          headers={"Authorization": "Bearer wrong"})
        assert (resp.status_code, resp.text) == (401, "invalid bearer token\n")
        assert 'error="invalid_token"' in resp.headers["WWW-Authenticate"]
        assert status("OLD-T0KEN") == 401  # tokens are case-sensitive
        assert status("old-t0ken") == 200

        front.set_bearer_token("new-t0ken")
        # The kept-alive connection and a new one alike see the new config at once.
        assert status("old-t0ken") == 401
        assert status("new-t0ken") == 200
        with httpx.Client(base_url=front.url("bearer"), trust_env=False) as fresh:
            assert status("old-t0ken", fresh) == 401
            assert status("new-t0ken", fresh) == 200

        front.set_bearer_token("newer-t0ken", "new-t0ken")  # an overlap: both accepted
        assert (status("new-t0ken"), status("newer-t0ken"), status("old-t0ken")) \
            == (200, 200, 401)
        front.set_bearer_tokens([])
        assert status("newer-t0ken") == 401
        assert front.generation == 4


# -- routing -----------------------------------------------------------------------------------


def test_path_prefix(front: NginxFront) -> None:
    assert front.url("prefix") == front["prefix"].origin + "/prometheus"
    assert tenant_of(get(front.url("prefix"))) == "b"
    assert get(front["prefix"].origin).status_code == 404
    assert front.requests("prefix", at_least=1)[0]["uri"].startswith(
        "/prometheus/api/v1/query?")


def test_tenants_get_their_own_prometheus(front: NginxFront) -> None:
    url = front.url("tenants")
    assert tenant_of(get(url, headers={"X-Scope-OrgID": "team-a"})) == "a"
    assert tenant_of(get(url, headers={"X-Scope-OrgID": "team-b"})) == "b"
    # A POSTed form query (what Prometheus clients send for long queries) routes the same.
    with httpx.Client(trust_env=False) as client:
        resp = client.post(url + "/api/v1/query", data=QUERY,
                           headers={"X-Scope-OrgID": "team-b"})
    assert tenant_of(resp) == "b"
    resp = get(url)
    assert (resp.status_code, resp.text) == (401, "no org id\n")
    resp = get(url, headers={"X-Scope-OrgID": "team-c"})
    assert (resp.status_code, resp.text) == (403, "unknown org id\n")
    assert get(url, headers={"X-Scope-OrgID": "TEAM-A"}).status_code == 403
    assert [e["org_id"] for e in front.requests("tenants", at_least=6)][:2] \
        == ["team-a", "team-b"]


def test_mimir_like_site_checks_the_token_before_the_tenant(front: NginxFront,
                                                            ca: CA) -> None:
    url = front.url("mimir")
    assert url.startswith("https://") and url.endswith("/prometheus")
    verify = ca.ssl_context()
    resp = get(url, verify=verify)
    assert (resp.status_code, resp.text) == (401, "missing bearer token\n")
    token = {"Authorization": "Bearer mimir-t0ken"}
    resp = get(url, verify=verify, headers=token)
    assert (resp.status_code, resp.text) == (401, "no org id\n")
    assert tenant_of(get(url, verify=verify, headers={**token, "X-Scope-OrgID": "team-b"})) \
        == "b"
    assert get(front["mimir"].origin, verify=verify,
               headers={**token, "X-Scope-OrgID": "team-b"}).status_code == 404


# -- canned failures ---------------------------------------------------------------------------


@pytest.mark.parametrize(("site", "canned"), [("login", LOGIN_PAGE),
                                              ("limited", TOO_MANY_REQUESTS),
                                              ("unavailable", SERVICE_UNAVAILABLE)])
def test_canned_answers(front: NginxFront, site: str, canned: Canned) -> None:
    resp = get(front.url(site))
    assert resp.status_code == canned.status
    assert resp.headers["Content-Type"] == canned.content_type
    assert resp.text == canned.body
    for name, value in canned.headers.items():
        assert resp.headers[name] == value


def test_canned_answer_details(front: NginxFront) -> None:
    assert get(front.url("limited")).headers["Retry-After"] == "7"
    assert get(front.url("unavailable")).headers["Retry-After"] == "30"
    login = get(front.url("login"))
    assert login.headers["Content-Type"].startswith("text/html")
    assert "<form" in login.text
    resp = get(front.url("sso"))
    assert resp.status_code == 302
    assert resp.headers["Location"] == front["sso"].origin + LOGIN_PATH
    followed = get(front.url("sso"), follow_redirects=True)
    assert (followed.status_code, followed.text) == (200, LOGIN_PAGE.body)
    # Credentials first, then the canned answer (a gateway that authenticates, then fails).
    assert get(front.url("guarded")).status_code == 401
    assert get(front.url("guarded"), auth=("vigil", "pw")).status_code == 503


# -- the harness itself ------------------------------------------------------------------------


def test_site_specs_are_checked() -> None:
    with pytest.raises(ValueError, match="one of upstream, tenants, canned"):
        Site("x")
    with pytest.raises(ValueError, match="without a path"):
        Site("x", upstream="http://127.0.0.1:9090/prometheus")
    with pytest.raises(ValueError, match="basic_auth or bearer"):
        Site("x", upstream="http://127.0.0.1:1", basic_auth=("u", "p"), bearer=True)
    with pytest.raises(ValueError, match="not a valid org ID"):
        Site("x", tenants={"a b": "http://127.0.0.1:1"})
    with pytest.raises(ValueError, match="prefix"):
        Site("x", upstream="http://127.0.0.1:1", prefix="prometheus/")


def test_stopping_kills_the_process_group_even_when_the_test_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the test failed"), \
            run_nginx(tmp_path, [Site("s", canned=TOO_MANY_REQUESTS)]) as front:
        assert front.process is not None
        group = front.process.pid
        assert get(front.url("s"), "/").status_code == 429
        raise RuntimeError("the test failed")
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)  # does any process of the group remain?
    with pytest.raises(httpx.ConnectError):
        get(front.url("s"), "/")


def test_a_start_failure_reports_the_error_log(tmp_path: Path) -> None:
    missing = (tmp_path / "none.crt", tmp_path / "none.key")
    with pytest.raises(NginxError, match="cannot load certificate"), \
            run_nginx(tmp_path, [Site("s", canned=TOO_MANY_REQUESTS, cert=missing)],
                      attempts=1):
        pytest.fail("nginx started with a certificate that does not exist")


def test_the_ca_makes_server_and_client_certificates(ca: CA, tmp_path: Path) -> None:
    def extensions(cert: Path) -> str:
        return subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-ext",
                               "subjectAltName,extendedKeyUsage,basicConstraints"],
                              capture_output=True, text=True, check=True).stdout

    server, _ = ca.issue("srv", dns=["localhost", "prom.example"], ip=["127.0.0.1"],
                         folder=tmp_path)
    text = extensions(server)
    assert "DNS:localhost, DNS:prom.example, IP Address:127.0.0.1" in text
    assert "TLS Web Server Authentication" in text and "CA:FALSE" in text
    client, _ = ca.issue("cli", client=True, dns=[], ip=[], folder=tmp_path)
    text = extensions(client)
    assert "TLS Web Client Authentication" in text and "Alternative Name" not in text
    assert "CA:TRUE" in extensions(ca.cert)
