"""A real nginx in front of real servers: TLS, client certificates, basic auth, bearer tokens,
``X-Scope-OrgID`` tenants, path prefixes and canned failures, for testing HTTP clients.

Usage in a test::

    from support.nginx import LOGIN_PAGE, Site, make_ca, run_nginx

    def test_client(tmp_path, prom):                   # prom: a PrometheusServer
        ca = make_ca(tmp_path / "ca")                  # a second make_ca: an unrelated CA
        sites = [Site("tls", upstream=prom.base_url, tls=True),
                 Site("mtls", upstream=prom.base_url, client_cert=True),
                 Site("basic", upstream=prom.base_url, basic_auth=("vigil", "s3cret")),
                 Site("bearer", upstream=prom.base_url, bearer=True),
                 Site("mimir", tenants={"team-a": prom.base_url}, prefix="/prometheus"),
                 Site("sso", canned=LOGIN_PAGE)]
        with run_nginx(tmp_path, sites, ca=ca, bearer_tokens=["t0k3n"]) as front:
            front["tls"].url          # "https://127.0.0.1:PORT"
            front["mimir"].url        # "http://127.0.0.1:PORT/prometheus"
            ca.ssl_context()          # httpx's verify=; ca.ssl_context(ca.issue("c", client=True))
            front.set_bearer_token("n3w")   # "t0k3n" now answers 401

How it works: one nginx master process (Debian's ``/usr/sbin/nginx``, found through
``conftest.require_binary``: missing, the test is skipped, or fails under CI) runs in the
foreground (``daemon off``) in a process group of its own, with its prefix, config, pid file,
logs and temporary folders in a fresh folder under the test's ``workdir``; it never touches
``/etc/nginx`` or ``/var/log``. Each ``Site`` is one ``server`` block on a free loopback port.
A control server on one more port answers ``GET /generation`` with a counter written into the
config, which is how start-up and reloads are waited for: ``set_bearer_token`` rewrites the
included token map, runs ``nginx -s reload`` and returns once a fresh connection sees the new
generation and the old worker has exited, so no connection can reach the old configuration.
Stopping (always, also when the test fails) sends SIGTERM then SIGKILL to the process group; a
watchdog process does the same if the test process itself is killed.

Order of checks in a site, as in real gateways: the client certificate (TLS), then the
credentials (bearer token or basic auth), then the tenant or the canned answer (the login page
at ``LOGIN_PATH`` of a canned site needs no credentials). nginx's own pages answer the
TLS failures: 400 "No required SSL certificate was sent" without a client certificate, 400
"The SSL certificate error" with one it cannot verify.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from conftest import require_binary

from support.loopback import free_port

__all__ = [
    "BEARER_REALM",
    "CA",
    "INVALID_TOKEN_BODY",
    "LOGIN_PAGE",
    "LOGIN_PATH",
    "MISSING_TOKEN_BODY",
    "NO_ORG_ID_BODY",
    "SERVICE_UNAVAILABLE",
    "SSO_REDIRECT",
    "TOO_MANY_REQUESTS",
    "UNKNOWN_ORG_ID_BODY",
    "Canned",
    "NginxError",
    "NginxFront",
    "RunningSite",
    "Site",
    "make_ca",
    "require_nginx",
    "run_nginx",
]

#: Debian's package holding the binary.
APT_PACKAGE = "nginx"

#: How long start-up and a reload may take before we give up (seconds).
READY_TIMEOUT_S = 15.0
#: How long nginx gets to exit after SIGTERM before the group is killed (seconds).
STOP_TIMEOUT_S = 5.0
#: Validity of the certificates ``make_ca`` and ``CA.issue`` write (days).
CERT_DAYS = 30

#: The realm of the ``WWW-Authenticate`` headers of bearer and basic sites.
BEARER_REALM = "vigil-test"

#: Where the login page of every canned site is (``SSO_REDIRECT`` points there).
LOGIN_PATH = "/sso/login"

#: Bodies of the front's own refusals (plain text), for asserting on a client's message.
NO_ORG_ID_BODY = "no org id\n"  # what Mimir's and Cortex's tenant middleware answers
UNKNOWN_ORG_ID_BODY = "unknown org id\n"
MISSING_TOKEN_BODY = "missing bearer token\n"
INVALID_TOKEN_BODY = "invalid bearer token\n"

# RFC 6750's b64token, so a token can sit in an nginx regex and config without quoting games.
_TOKEN_RE = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
# Mimir's tenant ID characters (pkg/tenant: alphanumerics and !-_.*'()), at most 150 of them.
_TENANT_RE = re.compile(r"[A-Za-z0-9!\-_.*'()]{1,150}")
_PREFIX_RE = re.compile(r"(/[A-Za-z0-9._~-]+)+")
_FILE_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


class NginxError(RuntimeError):
    """nginx or openssl failed; the message carries the relevant log or output."""


def require_nginx() -> str:
    """The path of ``nginx``, or end the test (``require_binary``'s policy)."""
    return require_binary("nginx", apt=APT_PACKAGE, also=("/usr/sbin/nginx",))


# -- certificates ------------------------------------------------------------------------------


def _openssl(*args: str, stdin: str | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True,
                          timeout=60, check=False, cwd=cwd)
    if done.returncode != 0:
        raise NginxError(f"openssl {' '.join(args)} exited {done.returncode}:\n"
                         f"{done.stdout}{done.stderr}")
    return done.stdout


def _checked_file_name(name: str) -> str:
    if not _FILE_NAME_RE.fullmatch(name):
        raise ValueError(f"{name!r}: use letters, digits, '.', '_' and '-' only")
    return name


@dataclass(frozen=True)
class CA:
    """A certificate authority in ``folder``: ``cert`` (PEM) and ``key`` (PEM, unencrypted).

    Keys are ECDSA P-256 (fast to make, accepted by Go, OpenSSL and nginx alike)."""

    name: str
    folder: Path
    cert: Path
    key: Path

    def issue(self, name: str, *, dns: Sequence[str] = ("localhost",),
              ip: Sequence[str] = ("127.0.0.1",), client: bool = False,
              days: int = CERT_DAYS, folder: Path | None = None) -> tuple[Path, Path]:
        """A certificate signed by this CA: ``(cert_path, key_path)`` named ``name.crt`` and
        ``name.key`` in ``folder`` (default the CA's; an earlier one of that name is replaced).

        ``dns`` and ``ip`` become the subjectAltName (none when both are empty); ``client``
        makes a client certificate (extendedKeyUsage clientAuth) instead of a server one
        (serverAuth). Valid from now for ``days`` days."""
        _checked_file_name(name)
        out = folder or self.folder
        cert, key = out / f"{name}.crt", out / f"{name}.key"
        csr, ext = out / f"{name}.csr", out / f"{name}.ext"
        alt = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ip]
        ext.write_text(
            "[leaf]\n"
            "basicConstraints = critical, CA:FALSE\n"
            "keyUsage = critical, digitalSignature, keyEncipherment\n"
            f"extendedKeyUsage = {'clientAuth' if client else 'serverAuth'}\n"
            "subjectKeyIdentifier = hash\n"
            # Python 3.13's default context (VERIFY_X509_STRICT) refuses a leaf without it.
            "authorityKeyIdentifier = keyid, issuer\n"
            + (f"subjectAltName = {', '.join(alt)}\n" if alt else "")
        )
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
        # A random serial: two leaves of one CA with one serial confuse some verifiers.
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey",
                 str(self.key), "-set_serial", str(secrets.randbits(63)), "-days", str(days),
                 "-extfile", str(ext), "-extensions", "leaf", "-out", str(cert))
        csr.unlink()
        ext.unlink()
        return cert, key

    def ssl_context(self, client_cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """A client-side context that trusts only this CA (hostname checked), presenting
        ``client_cert`` (``(cert, key)``) when given: pass it as httpx's ``verify=``."""
        ctx = ssl.create_default_context(cafile=str(self.cert))
        if client_cert is not None:
            ctx.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
        return ctx


def make_ca(folder: Path, name: str = "vigil-test-ca", *, days: int = CERT_DAYS) -> CA:
    """A fresh self-signed CA in ``folder`` (created if missing): ``ca.crt`` and ``ca.key``.

    Call it twice (two folders) for an unrelated CA whose certificates the first one's clients
    refuse ("unable to get local issuer certificate")."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key, config = folder / "ca.crt", folder / "ca.key", folder / "ca.cnf"
    # The subject must not contain characters the config file would read as syntax.
    subject = re.sub(r"[^A-Za-z0-9 ._-]", "_", name)
    config.write_text(
        "[req]\ndistinguished_name = dn\nx509_extensions = ca\nprompt = no\n"
        f"[dn]\nCN = {subject}\n"
        "[ca]\nbasicConstraints = critical, CA:TRUE\n"
        "keyUsage = critical, keyCertSign, cRLSign\nsubjectKeyIdentifier = hash\n"
    )
    _openssl("req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", str(days),
             "-config", str(config))
    return CA(name, folder, cert, key)


# -- what a site does --------------------------------------------------------------------------


@dataclass(frozen=True)
class Canned:
    """A fixed answer for every path of a site: ``status``, ``content_type``, ``body`` (text)
    and extra ``headers``. A redirect (301, 302, 303, 307, 308) needs a ``Location`` header
    and answers nginx's own small HTML body instead of ``body``."""

    status: int
    content_type: str
    body: str
    headers: Mapping[str, str] = field(default_factory=dict)


#: A proxy's single-sign-on page, answered 200 (what a client gets when an SSO proxy intercepts
#: it: HTML where JSON was expected).
LOGIN_PAGE = Canned(
    200, "text/html; charset=utf-8",
    "<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>\n"
    f'<form method="post" action="{LOGIN_PATH}"><h1>Sign in to continue</h1>\n'
    '<input name="username"><input name="password" type="password">'
    "<button>Sign in</button></form>\n</body></html>\n")
#: The same proxy, redirecting first (302 to ``LOGIN_PATH``, which answers ``LOGIN_PAGE``).
SSO_REDIRECT = Canned(302, "text/html", "", {"Location": LOGIN_PATH})
#: Rate limited: 429 with ``Retry-After: 7`` (seconds).
TOO_MANY_REQUESTS = Canned(429, "text/plain; charset=utf-8", "too many requests\n",
                           {"Retry-After": "7"})
#: Overloaded or in maintenance: 503 with ``Retry-After: 30`` (seconds) and an HTML body, as a
#: proxy's own error page is.
SERVICE_UNAVAILABLE = Canned(
    503, "text/html; charset=utf-8",
    "<html><head><title>503 Service Temporarily Unavailable</title></head>\n"
    "<body><center><h1>503 Service Temporarily Unavailable</h1></center></body></html>\n",
    {"Retry-After": "30"})


def _origin(url: str) -> str:
    """``url`` as ``scheme://host:port``; ValueError when it has a path, query or fragment
    (a tenant's upstream is proxied to by variable, which would drop such a path)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"upstream {url!r}: expected http(s)://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"upstream {url!r}: give an origin without a path")
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class Site:
    """One ``server`` block of the front, on a loopback port of its own.

    Exactly one of ``upstream`` (an origin, ``http://127.0.0.1:9090``, proxied to), ``tenants``
    (``X-Scope-OrgID`` value -> origin; no header: 401 ``no org id``, another value: 403
    ``unknown org id``) and ``canned`` (a fixed answer) says what it serves.

    ``prefix``: serve under this path (``/prometheus``: ``/prometheus/api/v1/query`` is the
    upstream's ``/api/v1/query``; anything else is nginx's 404). ``tls``: HTTPS with ``cert``
    (``(cert, key)``; default a certificate of the front's CA for ``localhost`` and
    ``127.0.0.1``). ``client_cert``: HTTPS that requires a client certificate signed by
    ``client_ca`` (default the front's CA). ``basic_auth``: ``(user, password)`` required.
    ``bearer``: ``Authorization: Bearer <token>`` required, the token one of the front's
    current ones (``NginxFront.set_bearer_token``); the scheme must be spelled ``Bearer``.
    """

    name: str
    upstream: str | None = None
    tenants: Mapping[str, str] | None = None
    canned: Canned | None = None
    prefix: str = ""
    tls: bool = False
    client_cert: bool = False
    cert: tuple[Path, Path] | None = None
    client_ca: Path | None = None
    basic_auth: tuple[str, str] | None = None
    bearer: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a site needs a name")
        if sum(x is not None for x in (self.upstream, self.tenants, self.canned)) != 1:
            raise ValueError(f"site {self.name!r}: give one of upstream, tenants, canned")
        if self.prefix and not _PREFIX_RE.fullmatch(self.prefix):
            raise ValueError(f"site {self.name!r}: prefix {self.prefix!r} is not like "
                             "'/prometheus'")
        if self.basic_auth is not None and self.bearer:
            raise ValueError(f"site {self.name!r}: basic_auth or bearer, not both")
        if self.basic_auth is not None and (":" in self.basic_auth[0]
                                            or not self.basic_auth[0]):
            raise ValueError(f"site {self.name!r}: a basic auth user must be non-empty and "
                             "without ':'")
        if self.upstream is not None:
            _origin(self.upstream)
        for tenant, upstream in (self.tenants or {}).items():
            if not _TENANT_RE.fullmatch(tenant):
                raise ValueError(f"site {self.name!r}: tenant {tenant!r} is not a valid "
                                 "org ID")
            _origin(upstream)
        if self.canned is not None and self.canned.status in (301, 302, 303, 307, 308) \
                and "Location" not in self.canned.headers:
            raise ValueError(f"site {self.name!r}: a redirect needs a Location header")

    @property
    def https(self) -> bool:
        return self.tls or self.client_cert or self.cert is not None


@dataclass(frozen=True)
class RunningSite:
    """A site of a running front: ``origin`` (``scheme://127.0.0.1:port``) and ``url``
    (the origin plus the site's prefix: the base URL a client is given)."""

    site: Site
    port: int

    @property
    def origin(self) -> str:
        return f"{'https' if self.site.https else 'http'}://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.origin + self.site.prefix


# -- the config --------------------------------------------------------------------------------


def _q(text: str) -> str:
    """``text`` as a double-quoted nginx string that means exactly ``text`` where variables
    are expanded (``return``, ``add_header``): nginx has no escape for ``$``, so a dollar is
    written as the variable ``$vigil_dollar`` (a ``geo`` whose value is "$")."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "${vigil_dollar}")
    return f'"{escaped}"'


def _exact(value: str) -> str:
    """A ``map`` key matching exactly ``value``, case-sensitively (plain map keys ignore case).

    Only for values checked against ``_TOKEN_RE`` or ``_TENANT_RE``: no quote, no dollar."""
    return f'"~^{re.escape(value)}$"'


def _bearer_map(tokens: Sequence[str]) -> str:
    lines = ["map $http_authorization $vigil_bearer_ok {", "    default 0;"]
    if tokens:
        alternatives = "|".join(re.escape(t) for t in tokens)
        lines.append(f'    "~^Bearer ({alternatives})$" 1;')
    lines.append("}")
    return "\n".join(lines) + "\n"


class NginxFront:
    """A running (or about to run) nginx serving ``sites``; ``front[name]`` is a
    ``RunningSite`` with its ``url``. Made by ``run_nginx``, which also stops it."""

    def __init__(self, nginx: str, workdir: Path, sites: Sequence[Site], *, ca: CA | None,
                 bearer_tokens: Sequence[str]) -> None:
        names = [s.name for s in sites]
        if len(set(names)) != len(names):
            raise ValueError(f"site names must differ: {names}")
        self.nginx = nginx
        self.sites = list(sites)
        workdir.mkdir(parents=True, exist_ok=True)
        #: nginx's prefix: config, pid, logs, temporary files, htpasswd and token files.
        self.root = Path(tempfile.mkdtemp(prefix="nginx-", dir=workdir))
        self.conf_path = self.root / "nginx.conf"
        self.error_log = self.root / "error.log"
        self.access_log = self.root / "access.log"
        self.pid_path = self.root / "nginx.pid"
        if ca is None and any(s.https and (s.cert is None or s.client_cert) for s in sites):
            ca = make_ca(self.root / "ca")
        #: The CA of the TLS sites' default certificates and of client-certificate checks.
        self.ca = ca
        #: ``(cert, key)`` of the TLS sites that bring no certificate of their own.
        self.server_cert: tuple[Path, Path] | None = (
            ca.issue("nginx-server", folder=self.root) if ca is not None and any(
                s.https and s.cert is None for s in sites) else None)
        self._check_tokens(bearer_tokens)
        #: The bearer tokens the bearer sites accept now.
        self.tokens: tuple[str, ...] = tuple(bearer_tokens)
        self.generation = 1
        self.ports: dict[str, int] = {}
        self.control_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        for i, site in enumerate(self.sites):
            if site.basic_auth is not None:
                user, password = site.basic_auth
                hashed = _openssl("passwd", "-apr1", "-stdin", stdin=password + "\n").strip()
                (self.root / f"htpasswd-{i}").write_text(f"{user}:{hashed}\n")
        for sub in ("tmp", "html"):
            (self.root / sub).mkdir()

    # -- access -------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> RunningSite:
        for site in self.sites:
            if site.name == name:
                return RunningSite(site, self.ports[name])
        raise KeyError(f"no site {name!r}; sites: {[s.name for s in self.sites]}")

    def url(self, name: str) -> str:
        """The base URL of site ``name`` (origin plus prefix)."""
        return self[name].url

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    def log_tail(self, lines: int = 40) -> str:
        """The end of nginx's error log."""
        try:
            text = self.error_log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def requests(self, site: str | None = None, *, at_least: int = 0,
                 timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """The requests the sites answered so far (of ``site`` only when given), oldest
        first, from nginx's access log: dicts with ``site``, ``method``, ``uri`` (with the
        query), ``status`` (int), ``authorization``, ``org_id``, ``user`` (basic auth),
        ``client_dn`` (the client certificate's subject) and ``ssl_protocol``; empty strings
        where absent. nginx writes a line just after the response, so this waits up to
        ``timeout_s`` seconds for ``at_least`` entries (AssertionError if they don't come)."""
        by_port = {str(p): n for n, p in self.ports.items()}
        deadline = time.monotonic() + timeout_s
        while True:
            entries = []
            with contextlib.suppress(FileNotFoundError):
                for line in self.access_log.read_text(encoding="utf-8").splitlines():
                    if not line.endswith("}"):
                        continue  # a line being written
                    entry = json.loads(line)
                    entry["site"] = by_port.get(entry.pop("port"), "")
                    entry["status"] = int(entry["status"])
                    if site is None or entry["site"] == site:
                        entries.append(entry)
            if len(entries) >= at_least:
                return entries
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(entries)} requests logged, expected {at_least}")
            time.sleep(0.02)

    # -- bearer tokens ------------------------------------------------------------------------

    @staticmethod
    def _check_tokens(tokens: Sequence[str]) -> None:
        for token in tokens:
            if not isinstance(token, str) or not _TOKEN_RE.fullmatch(token):
                raise ValueError(f"bearer token {token!r}: use RFC 6750 token characters "
                                 "(letters, digits, -._~+/, trailing =)")

    def set_bearer_token(self, token: str, *also: str) -> None:
        """Accept ``token`` (and ``also``: more tokens, e.g. the old one during an overlap)
        and no other on the bearer sites, from the moment this returns: nginx is reloaded
        and waited for (NginxError when the reload fails or takes over ``READY_TIMEOUT_S``
        seconds)."""
        self.set_bearer_tokens([token, *also])

    def set_bearer_tokens(self, tokens: Sequence[str]) -> None:
        """Accept exactly ``tokens`` (none: every request of a bearer site answers 401)."""
        self._check_tokens(tokens)
        self.tokens = tuple(tokens)
        self.reload()

    # -- config -------------------------------------------------------------------------------

    def _write_dynamic(self) -> None:
        """The files a reload changes: the token map and the generation."""
        (self.root / "bearer.conf").write_text(_bearer_map(self.tokens))
        (self.root / "generation.conf").write_text(f'return 200 "{self.generation}";\n')

    def _site_block(self, i: int, site: Site, port: int) -> str:
        root = self.root
        out = ["    server {"]
        out.append(f"        listen 127.0.0.1:{port}{' ssl' if site.https else ''};")
        if site.https:
            cert = site.cert or self.server_cert
            assert cert is not None
            out.append(f"        ssl_certificate {cert[0]};")
            out.append(f"        ssl_certificate_key {cert[1]};")
            # nginx 1.22 leaves TLS 1.3 out by default (1.23.4 added it); clients prefer it.
            out.append("        ssl_protocols TLSv1.2 TLSv1.3;")
        if site.client_cert:
            client_ca = site.client_ca or (self.ca.cert if self.ca is not None else None)
            if client_ca is None:
                raise ValueError(f"site {site.name!r}: client_cert needs a CA")
            out.append(f"        ssl_client_certificate {client_ca};")
            out.append("        ssl_verify_client on;")
        if site.canned is not None:
            out.append(f"        location = {LOGIN_PATH} {{")
            out.append(f"            default_type {_q(LOGIN_PAGE.content_type)};")
            out.append(f"            return 200 {_q(LOGIN_PAGE.body)};")
            out.append("        }")
        out.append(f"        location {site.prefix}/ {{")
        if site.bearer:
            # Rewrite phase: before auth_basic and the tenant check, as a gateway would.
            challenge = f"Bearer realm={json.dumps(BEARER_REALM)}"
            invalid = f'{challenge}, error="invalid_token"'
            out += ['            if ($http_authorization = "") {',
                    f"                add_header WWW-Authenticate {_q(challenge)} always;",
                    f"                return 401 {_q(MISSING_TOKEN_BODY)};",
                    "            }",
                    "            if ($vigil_bearer_ok != 1) {",
                    f"                add_header WWW-Authenticate {_q(invalid)} always;",
                    f"                return 401 {_q(INVALID_TOKEN_BODY)};",
                    "            }"]
        if site.basic_auth is not None:
            out.append(f"            auth_basic {_q(BEARER_REALM)};")
            out.append(f"            auth_basic_user_file {root / f'htpasswd-{i}'};")
        if site.upstream is not None:
            # With a URI part ("/"), nginx replaces the matched prefix by it.
            target = _origin(site.upstream) + ("/" if site.prefix else "")
            out.append(f"            proxy_pass {target};")
        else:
            # A `return` here would answer in the rewrite phase, before auth_basic; try_files
            # runs after the access phase, so credentials are checked first. The "file" never
            # exists: the fallback, a named location (by tenant), answers.
            fallback = (f"@vigil_s{i}_canned" if site.canned is not None
                        else f"$vigil_s{i}_route")
            out.append(f"            try_files /.vigil-no-such-file {fallback};")
        out.append("        }")
        if site.canned is not None:
            canned = site.canned
            out.append(f"        location @vigil_s{i}_canned {{")
            out.append(f"            default_type {_q(canned.content_type)};")
            headers = dict(canned.headers)
            location = headers.pop("Location", None)
            for name, value in headers.items():
                out.append(f"            add_header {name} {_q(value)} always;")
            if canned.status in (301, 302, 303, 307, 308):
                out.append(f"            return {canned.status} {_q(location or '/')};")
            else:
                out.append(f"            return {canned.status} {_q(canned.body)};")
            out.append("        }")
        if site.tenants is not None:
            out.append(f"        location @vigil_s{i}_proxy {{")
            if site.prefix:
                out.append(f"            rewrite ^{re.escape(site.prefix)}(/.*)$ $1 break;")
            out.append(f"            proxy_pass $vigil_s{i}_upstream;")
            out.append("        }")
            out.append(f"        location @vigil_s{i}_no_org_id {{")
            out.append("            default_type text/plain;")
            out.append(f"            return 401 {_q(NO_ORG_ID_BODY)};")
            out.append("        }")
            out.append(f"        location @vigil_s{i}_unknown_org_id {{")
            out.append("            default_type text/plain;")
            out.append(f"            return 403 {_q(UNKNOWN_ORG_ID_BODY)};")
            out.append("        }")
        out.append("    }")
        return "\n".join(out)

    def _tenant_maps(self, i: int, site: Site) -> str:
        assert site.tenants is not None
        # The empty key, not "~^$": nginx tries no regex on an empty value.
        route = [f"    map $http_x_scope_orgid $vigil_s{i}_route {{",
                 f'        "" @vigil_s{i}_no_org_id;',
                 f"        default @vigil_s{i}_unknown_org_id;"]
        upstream = [f"    map $http_x_scope_orgid $vigil_s{i}_upstream {{",
                    '        default "";']
        for tenant, url in site.tenants.items():
            route.append(f"        {_exact(tenant)} @vigil_s{i}_proxy;")
            upstream.append(f"        {_exact(tenant)} {_origin(url)};")
        return "\n".join([*route, "    }", *upstream, "    }"])

    def _config(self) -> str:
        root = self.root
        main = [
            "# Written by tests/support/nginx.py for one test; nothing outside this folder.",
            "worker_processes 1;",
            f"pid {self.pid_path};",
            f"lock_file {root / 'nginx.lock'};",
            f"error_log {self.error_log} notice;",
        ]
        if os.geteuid() == 0:
            # Else the worker runs as nobody, who cannot read the htpasswd files in our
            # private temporary folder (they are read per request, by the worker).
            main.append("user root;")
        tmp = root / "tmp"
        http = [
            "    log_format vigil escape=json '{\"port\":\"$server_port\","
            "\"method\":\"$request_method\",\"uri\":\"$request_uri\",\"status\":\"$status\","
            "\"authorization\":\"$http_authorization\",\"org_id\":\"$http_x_scope_orgid\","
            "\"user\":\"$remote_user\",\"client_dn\":\"$ssl_client_s_dn\","
            "\"ssl_protocol\":\"$ssl_protocol\"}';",
            # Explicitly: the compiled-in defaults are under /var/log and /var/lib/nginx.
            f"    access_log {self.access_log} vigil;",
            *(f"    {kind}_temp_path {tmp / kind};"
              for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")),
            f"    root {root / 'html'};",
            "    default_type application/octet-stream;",
            "    server_tokens off;",
            '    geo $vigil_dollar { default "$"; }',
            f"    include {root / 'bearer.conf'};",
            *(self._tenant_maps(i, s) for i, s in enumerate(self.sites)
              if s.tenants is not None),
            "    server {",
            f"        listen 127.0.0.1:{self.control_port};",
            "        access_log off;",
            "        default_type text/plain;",
            f"        location = /generation {{ include {root / 'generation.conf'}; }}",
            "    }",
            *(self._site_block(i, s, self.ports[s.name]) for i, s in enumerate(self.sites)),
        ]
        return "\n".join([*main, "events { worker_connections 512; }", "http {", *http,
                          "}", ""])

    def _args(self, *more: str) -> list[str]:
        return [self.nginx, "-p", f"{self.root}/", "-c", str(self.conf_path),
                "-e", str(self.error_log), *more]

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Pick free ports, write the config and start nginx; waits until it answers
        (NginxError with the error log's tail if it exits or times out)."""
        self.control_port = free_port()
        self.ports = {s.name: free_port() for s in self.sites}
        self._write_dynamic()
        self.conf_path.write_text(self._config())
        self.error_log.unlink(missing_ok=True)
        with (self.root / "stderr.log").open("ab") as out:
            # A session of its own: its group holds the master and its workers, killed
            # together however the test ends.
            self.process = subprocess.Popen(
                self._args("-g", "daemon off;"), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True)
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(self.process.pid)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait_generation()

    def _workers(self) -> int:
        """How many children the master has (workers, old ones still shutting down included)."""
        assert self.process is not None
        master = str(self.process.pid)
        count = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                # The command name is in parentheses and may contain spaces: split after it.
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if fields[1] == master:
                    count += 1
        return count

    def _wait_generation(self) -> None:
        """Until a fresh connection gets the current generation and only one worker is left,
        so every new connection meets the current config."""
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        want = str(self.generation)
        seen = ""
        while True:
            if self.process.poll() is not None:
                raise NginxError(f"nginx exited with {self.process.returncode}:\n"
                                 f"{self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                # A new connection each time: an old worker may still hold a kept-alive one.
                seen = httpx.get(f"{self.control_url}/generation", timeout=2.0,
                                 trust_env=False).text
            if seen == want and self._workers() <= 1:
                return
            if time.monotonic() > deadline:
                raise NginxError(f"nginx did not reach generation {want} (at {seen!r}, "
                                 f"{self._workers()} workers) within {READY_TIMEOUT_S:g} s:\n"
                                 f"{self.log_tail()}")
            time.sleep(0.02)

    def reload(self) -> None:
        """Rewrite the token map, ``nginx -s reload`` and wait until it took effect."""
        if self.process is None or self.process.poll() is not None:
            raise NginxError("nginx is not running")
        self.generation += 1
        self._write_dynamic()
        done = subprocess.run(self._args("-s", "reload"), capture_output=True, text=True,
                              timeout=30, check=False, cwd=self.root)
        if done.returncode != 0:
            raise NginxError(f"nginx -s reload exited {done.returncode}:\n{done.stdout}"
                             f"{done.stderr}\n{self.log_tail()}")
        self._wait_generation()

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL it; idempotent."""
        proc = self.process
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
            # Workers outlive a master that was killed; the group still names them.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._watchdog is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self._watchdog.stdin.close()  # type: ignore[union-attr]
                self._watchdog.wait(10)
            self._watchdog = None

    def __enter__(self) -> NginxFront:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: The watchdog's program: argv[1] the process group to kill once its stdin closes, which only
#: the test process holds open, so a killed test run does not leave nginx listening.
_WATCHDOG = """
import contextlib, os, signal, sys
sys.stdin.buffer.read()
with contextlib.suppress(ProcessLookupError):
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
"""


@contextlib.contextmanager
def run_nginx(workdir: Path, sites: Sequence[Site], *, ca: CA | None = None,
              bearer_tokens: Sequence[str] = (), attempts: int = 3,
              keep_files: bool = True) -> Iterator[NginxFront]:
    """Start nginx serving ``sites`` and yield the ``NginxFront``; stopped when the block ends.

    ``workdir``: nginx's folder is made inside it (``nginx-`` and a random suffix; kept for the logs
    after a failure unless ``keep_files`` is false). ``ca``: the CA of the default server
    certificate and of client-certificate checks (a fresh one in that folder when None and a
    site needs it). ``bearer_tokens``: the tokens the bearer sites accept at first.

    Start-up is retried on fresh ports (``attempts`` times) in case another process took a
    port between ``free_port`` and nginx binding it."""
    nginx = require_nginx()
    front = NginxFront(nginx, workdir, sites, ca=ca, bearer_tokens=bearer_tokens)
    try:
        for attempt in range(1, attempts + 1):
            try:
                front.start()
                break
            except NginxError:
                front.stop()
                if attempt == attempts:
                    raise
        yield front
    finally:
        front.stop()
        if not keep_files:
            shutil.rmtree(front.root, ignore_errors=True)
