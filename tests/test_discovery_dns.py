"""DNS discovery against a real DNS server on 127.0.0.1 (dnslib): A, AAAA and SRV records,
records added and removed between refreshes, NXDOMAIN, and a server that stops answering."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSRecord
from dnslib.dns import DNSError
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from collector.discovery import TargetSet
from vigil.config import parse_config


class Zone(BaseResolver):
    """Records by (name, type), changeable while the server runs; ``silent`` drops queries."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], list[object]] = {}
        self.lock = threading.Lock()
        self.silent = False
        self.queries = 0

    def set(self, name: str, rtype: str, *rdata: object) -> None:
        with self.lock:
            self.records[(name.rstrip(".") + ".", rtype)] = list(rdata)

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        self.queries += 1
        if self.silent:
            raise DNSError("dropped")  # dnslib's handler then sends nothing
        reply = request.reply()
        qname, qtype = str(request.q.qname), QTYPE[request.q.qtype]
        with self.lock:
            names = {n for n, _ in self.records}
            for rdata in self.records.get((qname, qtype), []):
                reply.add_answer(RR(qname, request.q.qtype, rdata=rdata, ttl=0))
        if qname not in names:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


@pytest.fixture
def zone() -> Iterator[tuple[Zone, str]]:
    z = Zone()
    server = DNSServer(z, address="127.0.0.1", port=0,
                       logger=DNSLogger(log="-recv,-send,-request,-reply,-truncated,-error",
                                        logf=lambda s: None))
    server.start_thread()
    port = server.server.server_address[1]
    try:
        yield z, f"127.0.0.1:{port}"
    finally:
        server.stop()
        server.server.server_close()


def config(nameserver: str, names: list[str], rtype: str = "A", **extra: object):
    return parse_config({
        "pools": [{"name": "chat", "model": "m"}],
        "discovery": [{"name": "chat-dns", "names": names, "type": rtype, "pool": "chat",
                       "nameserver": nameserver, "refresh_interval": "1s", **extra}],
    })


def refresh(ts: TargetSet):
    return asyncio.run(ts.refresh(force=True))


def test_a_records_with_the_configured_port(zone):
    z, ns = zone
    z.set("chat.llm.test", "A", A("10.0.0.1"), A("10.0.0.2"))
    ts = TargetSet(config(ns, ["chat.llm.test"], port=8000))
    refresh(ts)
    cur = ts.current()
    assert list(cur) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    t = cur["10.0.0.1:8000"]
    assert t.origin == "dns chat-dns (A chat.llm.test)"
    assert t.target.url == "http://10.0.0.1:8000/metrics"
    assert t.target.labels == {}  # __meta_dns_name is internal
    assert ts.errors() == {"chat-dns": ""}


def test_aaaa_records_are_bracketed(zone):
    z, ns = zone
    z.set("chat.llm.test", "AAAA", AAAA("fd00::1"))
    ts = TargetSet(config(ns, ["chat.llm.test"], "AAAA", port=8000))
    refresh(ts)
    (t,) = ts.current().values()
    assert t.name == "[fd00::1]:8000" and t.target.url == "http://[fd00::1]:8000/metrics"


def test_srv_records_give_the_target_name_and_port(zone):
    z, ns = zone
    z.set("_http._tcp.chat.llm.test", "SRV", SRV(0, 0, 8001, "replica-0.chat.llm.test."),
          SRV(0, 0, 8002, "replica-1.chat.llm.test."))
    ts = TargetSet(config(ns, ["_http._tcp.chat.llm.test"], "SRV"))
    refresh(ts)
    cur = ts.current()
    # As Prometheus: the SRV target's name is the address, not resolved here.
    assert list(cur) == ["replica-0.chat.llm.test:8001", "replica-1.chat.llm.test:8002"]
    assert cur["replica-0.chat.llm.test:8001"].origin == \
        "dns chat-dns (SRV _http._tcp.chat.llm.test)"


def test_records_added_and_removed_between_refreshes(zone):
    z, ns = zone
    z.set("chat.llm.test", "A", A("10.0.0.1"))
    ts = TargetSet(config(ns, ["chat.llm.test"], port=8000))
    refresh(ts)
    z.set("chat.llm.test", "A", A("10.0.0.1"), A("10.0.0.2"))
    assert [t.name for t in refresh(ts).added] == ["10.0.0.2:8000"]
    z.set("chat.llm.test", "A", A("10.0.0.2"))
    assert [t.name for t in refresh(ts).removed] == ["10.0.0.1:8000"]


def test_nxdomain_is_no_targets_not_an_error(zone):
    z, ns = zone
    z.set("chat.llm.test", "A", A("10.0.0.1"))
    ts = TargetSet(config(ns, ["chat.llm.test", "gone.llm.test"], port=8000))
    refresh(ts)
    assert list(ts.current()) == ["10.0.0.1:8000"] and ts.errors() == {"chat-dns": ""}
    with z.lock:
        z.records.clear()
    assert [t.name for t in refresh(ts).removed] == ["10.0.0.1:8000"]
    assert ts.errors() == {"chat-dns": ""}


def test_a_server_that_stops_answering_keeps_the_previous_targets(zone):
    z, ns = zone
    z.set("chat.llm.test", "A", A("10.0.0.1"))
    ts = TargetSet(config(ns, ["chat.llm.test"], port=8000))
    refresh(ts)
    z.silent = True
    assert not refresh(ts)  # times out after the refresh interval (1 s)
    assert list(ts.current()) == ["10.0.0.1:8000"]
    err = ts.errors()["chat-dns"]
    assert "A chat.llm.test: no answer within 1s" in err and "previous 1 target(s)" in err
    z.silent = False
    refresh(ts)
    assert ts.errors() == {"chat-dns": ""}


def test_a_malformed_nameserver_is_a_config_error():
    from vigil.errors import ConfigError

    with pytest.raises(ConfigError, match=r"discovery\[0\]\.nameserver"):
        TargetSet(config("127.0.0.1:notaport", ["x.test"], port=8000))
