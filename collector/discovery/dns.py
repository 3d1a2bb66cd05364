"""DNS discovery: targets from A, AAAA or SRV records, as Prometheus's ``dns_sd_configs``.

Each name is looked up on every read (no cache: a record added or removed shows at the next
refresh). A / AAAA records give addresses, each with the configured ``port``; an SRV record
gives its target name and port, and the address is that name as it stands (trailing dot
removed), not resolved further here: this is what Prometheus does, and the scrape resolves it.
A name that does not exist (NXDOMAIN) or has no record of the type has no targets. A lookup
that fails (timeout, SERVFAIL, no server reachable) keeps that name's previous targets and is
reported. The ``__meta_dns_*`` labels are internal: DNS adds no series labels.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import dns.asyncresolver
import dns.exception
import dns.resolver

from collector.discovery.model import TargetGroup
from vigil.config import DiscoveryConfig
from vigil.errors import ConfigError

__all__ = ["DNS_TIMEOUT_S", "DnsSource", "join_host_port"]

#: At most this long for one name's lookup (seconds); a shorter refresh interval bounds it.
DNS_TIMEOUT_S = 5.0

META_DNS_NAME = "__meta_dns_name"
META_SRV_TARGET = "__meta_dns_srv_record_target"
META_SRV_PORT = "__meta_dns_srv_record_port"


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (Go's ``net.JoinHostPort``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_nameserver(text: str, *, index: int = 0) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets; port 53 when left out) as (host, port)."""
    host, port = text, "53"
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"nameserver {text!r} is not host:port",
                                  key=f"discovery[{index}].nameserver")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"nameserver {text!r} is not host:port (port 1-65535)",
                          key=f"discovery[{index}].nameserver")
    return host, int(port)


class DnsSource:
    """The names of one ``[[discovery]]`` entry with ``names``."""

    def __init__(self, config: DiscoveryConfig, *, index: int = 0):
        self.config = config
        self.groups: dict[str, list[TargetGroup]] = {}
        self.problems: list[str] = []
        self._server = split_nameserver(config.nameserver, index=index) \
            if config.nameserver else None
        self._resolver: dns.asyncresolver.Resolver | None = None

    def key(self, name: str) -> str:
        """What is shown as the query in a target's origin: ``SRV _http._tcp.x``."""
        return f"{self.config.type} {name}"

    async def _make_resolver(self) -> dns.asyncresolver.Resolver:
        if self._server is None:
            resolver = dns.asyncresolver.Resolver()  # the system's (/etc/resolv.conf)
        else:
            host, port = self._server
            try:
                ipaddress.ip_address(host)
            except ValueError:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_DGRAM)
                host = str(infos[0][4][0])
            resolver = dns.asyncresolver.Resolver(configure=False)
            resolver.nameservers = [host]
            resolver.port = port
        limit = min(DNS_TIMEOUT_S, self.config.refresh_interval)
        resolver.timeout = resolver.lifetime = limit
        resolver.cache = None
        return resolver

    async def read(self) -> None:
        """Look every name up (concurrently); a failed lookup keeps that name's groups."""
        try:
            if self._resolver is None:
                self._resolver = await self._make_resolver()
        except (OSError, dns.exception.DNSException) as exc:
            where = self.config.nameserver or "the system's resolver"
            self.problems = [f"cannot set up {where}: {exc}; previous targets are kept"]
            return
        results = await asyncio.gather(*(self._lookup(n) for n in self.config.names))
        problems: list[str] = []
        for name, result in zip(self.config.names, results, strict=True):
            if isinstance(result, str):
                kept = len({t for g in self.groups.get(self.key(name), []) for t in g.targets})
                problems.append(f"{self.key(name)}: {result}; its previous {kept} target(s) "
                                "are kept")
            else:
                self.groups[self.key(name)] = result
        self.problems = problems

    async def _lookup(self, name: str) -> list[TargetGroup] | str:
        """The groups of ``name`` (one per record), or why the lookup failed."""
        assert self._resolver is not None  # read() made it
        rdtype = self.config.type
        try:
            answer = await self._resolver.resolve(name, rdtype, raise_on_no_answer=False,
                                                  search=False)
        except dns.resolver.NXDOMAIN:
            return []
        except dns.resolver.LifetimeTimeout:
            return f"no answer within {self._resolver.lifetime:g}s"
        except dns.resolver.NoNameservers as exc:
            return f"no server could answer ({_first_line(exc)})"
        except dns.exception.DNSException as exc:
            return f"lookup failed: {_first_line(exc) or type(exc).__name__}"
        groups: list[TargetGroup] = []
        for rr in answer.rrset or ():
            meta = [(META_DNS_NAME, name)]
            if rdtype == "SRV":
                target = rr.target.to_text(omit_final_dot=True)
                address = join_host_port(target, int(rr.port))
                meta += [(META_SRV_TARGET, rr.target.to_text()), (META_SRV_PORT, str(rr.port))]
            else:
                assert self.config.port is not None  # the config requires it for A / AAAA
                address = join_host_port(rr.address, self.config.port)
            groups.append(TargetGroup((address,), tuple(sorted(meta))))
        return groups


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""
