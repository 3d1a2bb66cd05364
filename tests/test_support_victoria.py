"""The VictoriaMetrics harness (tests/support/victoria.py) against the real binaries: data reads
back exactly, vmalert's replay records into the same store, and vmauth refuses a wrong credential
and routes each credential to its tenant."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from support.loopback import wait_for
from support.prometheus import PromSeries
from support.victoria import (
    VictoriaError,
    VictoriaServer,
    VmauthUser,
    import_text,
    require_vmalert,
    require_vmauth,
    run_victoria,
    run_vmalert_replay,
    run_vmauth,
    tenant_prefix,
)

#: A whole minute, years in the past (Unix seconds): retention must keep it.
T0_S = 1_700_000_040
T0_MS = T0_S * 1000

#: Irregular timestamps (one off the second) and values with few digits, integers and ±Inf.
SERIES = [
    PromSeries("vigil_vm_requests_total", {"tenant": "a"},
               [(T0_MS + i * 15_000 + (7 if i == 3 else 0), float(10 * i)) for i in range(9)]),
    PromSeries("vigil_vm_requests_total", {"tenant": "b"},
               [(T0_MS, 0.25), (T0_MS + 30_000, 1.1), (T0_MS + 60_000, 123456.789)]),
    PromSeries("vigil_vm_gauge", {"tenant": "a", "quote": 'say "hi"\\'},
               [(T0_MS, float("inf")), (T0_MS + 1, -float("inf")), (T0_MS + 2, -0.5)]),
]


@pytest.fixture(scope="module")
def vm() -> Iterator[VictoriaServer]:
    with run_victoria(SERIES) as server:
        yield server


def test_samples_read_back_exactly(vm: VictoriaServer) -> None:
    stored = vm.stored(SERIES)
    for s in SERIES:
        key = tuple(sorted({"__name__": s.name, **s.labels}.items()))
        assert stored[key] == list(s.samples)


def test_instant_query_at_a_millisecond(vm: VictoriaServer) -> None:
    at_s = (T0_MS + 45_007) / 1000
    got = vm.query('vigil_vm_requests_total{tenant="a"}', at_s)
    assert got == {(("__name__", "vigil_vm_requests_total"), ("tenant", "a")): 30.0}


def test_more_digits_than_stored_are_named(vm: VictoriaServer) -> None:
    third = [PromSeries("vigil_vm_third", {}, [(T0_MS, 1 / 3)])]
    body, count = import_text(third)
    assert count == 1 and body.startswith("vigil_vm_third{} 0.3333333333333333 ")
    with pytest.raises(VictoriaError, match=r"sample 0: wrote \(1700000040000, 0\.333"):
        vm.import_series(third)


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError, match="does not store NaN"):
        import_text([PromSeries("x", {}, [(T0_MS, float("nan"))])])


def test_vmalert_replay_records_a_series(vm: VictoriaServer) -> None:
    require_vmalert()
    rules = ("groups:\n"
             "  - name: vigil-vm-test\n"
             "    interval: 30s\n"
             "    rules:\n"
             "      - record: tenant:vigil_vm_requests:max\n"
             "        expr: max by (tenant) (max_over_time(vigil_vm_requests_total[1m]))\n")
    run_vmalert_replay(vm, rules, T0_S, T0_S + 120)

    key = (("__name__", "tenant:vigil_vm_requests:max"), ("tenant", "a"))
    # One point per interval from the first to the last evaluation, both included.
    want = [(T0_MS + k * 30_000, float(20 * k)) for k in range(5)]

    def recorded() -> list[tuple[int, float]] | None:
        vm.flush()
        got = vm.query_range_samples('tenant:vigil_vm_requests:max{tenant="a"}', T0_S + 120, 121)
        points = got.get(key, [])
        return points if len(points) >= len(want) else None

    # Remote write lands asynchronously in the store's in-memory parts: flush until it shows.
    assert wait_for("the recorded series in victoria-metrics", recorded, timeout_s=30) == want


@pytest.fixture(scope="module")
def auth(vm: VictoriaServer) -> Iterator[str]:
    require_vmauth()
    users = [VmauthUser(tenant_prefix(vm, "tenant", "a"), bearer_token="token-a"),
             VmauthUser(tenant_prefix(vm, "tenant", "b"), username="team-b", password="s3cret")]
    with run_vmauth(users) as front:
        yield front.url


def _tenants(resp: httpx.Response) -> set[str]:
    assert resp.status_code == 200, resp.text
    return {item["metric"]["tenant"] for item in resp.json()["data"]["result"]}


QUERY = {"query": "vigil_vm_requests_total", "time": repr(T0_S + 60)}


def test_vmauth_routes_each_credential_to_its_tenant(auth: str) -> None:
    a = httpx.get(f"{auth}/api/v1/query", params=QUERY, trust_env=False,
                  headers={"Authorization": "Bearer token-a"})
    b = httpx.get(f"{auth}/api/v1/query", params=QUERY, trust_env=False,
                  auth=("team-b", "s3cret"))
    assert _tenants(a) == {"a"}
    assert _tenants(b) == {"b"}


def test_vmauth_tenant_cannot_widen_its_filter(auth: str) -> None:
    # The url_prefix's extra_label wins over one the client sends (vmauth mergeURLs).
    params = {**QUERY, "extra_label": "tenant=b"}
    a = httpx.get(f"{auth}/api/v1/query", params=params, trust_env=False,
                  headers={"Authorization": "Bearer token-a"})
    assert _tenants(a) == {"a"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "Basic dGVhbS1iOndyb25n"}],
                         ids=["none", "wrong-token", "wrong-password"])
def test_vmauth_refuses_a_wrong_credential(auth: str, headers: dict[str, str]) -> None:
    resp = httpx.get(f"{auth}/api/v1/query", params=QUERY, headers=headers, trust_env=False)
    # 401 without credentials; an unknown one is 400 in 1.79 ("cannot find the provided auth
    # token"), 401 in later releases. Either way no data.
    assert resp.status_code in (400, 401)
    assert "vigil_vm_requests_total" not in resp.text
