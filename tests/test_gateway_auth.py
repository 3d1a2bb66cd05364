"""API keys: only hashes in the config; Bearer keys map to tenant and tier; 401 otherwise."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from support.gateway import MODEL, gateway_config, running_gateway, scripted_upstream

from serving.gateway.errors import Unauthorized
from serving.gateway.front.api_keys import KeyRing, key_sha256
from serving.gateway.tiers import Caller
from vigil.config import ApiKeyConfig


def _ring() -> KeyRing:
    return KeyRing([ApiKeyConfig(sha256=key_sha256("sk-a"), tenant="acme", tier="premium"),
                    ApiKeyConfig(sha256=key_sha256("sk-b"), tenant="beta", tier="batch")])


def test_key_sha256_matches_sha256sum() -> None:
    assert key_sha256("sk-a") == hashlib.sha256(b"sk-a").hexdigest()


def test_bearer_key_maps_to_its_caller() -> None:
    ring = _ring()
    assert ring.authenticate("Bearer sk-a") == Caller("acme", "premium", key_sha256("sk-a")[:12])
    assert ring.authenticate("bearer   sk-b").tier == "batch"


@pytest.mark.parametrize("header", [None, "", "sk-a", "Basic sk-a", "Bearer", "Bearer ",
                                    "Bearer sk-c", "Bearer sk-a2"])
def test_missing_malformed_or_unknown_keys(header: str | None) -> None:
    with pytest.raises(Unauthorized) as info:
        _ring().authenticate(header)
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    assert "sk-a" not in info.value.reason  # the key is never echoed


def test_non_ascii_key_hashes_as_its_utf8_bytes() -> None:
    key = "sk-clé"
    ring = KeyRing([ApiKeyConfig(sha256=key_sha256(key), tenant="t", tier="standard")])
    # An ASGI server hands the header over decoded as latin-1.
    assert ring.authenticate("Bearer " + key.encode().decode("latin-1")).tenant == "t"


def test_401_over_http_is_recorded(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        with running_gateway(gateway_config(tmp_path, [up.url])) as gw, gw.http(key=None) as c:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "invalid_api_key"
            r2 = c.post("/v1/chat/completions", json=body,
                        headers={"Authorization": "Bearer sk-wrong"})
            assert r2.status_code == 401
            rec = gw.record(r2.headers["x-vigil-request-id"])
        assert up.bodies == []
    assert (rec.error_class, rec.tenant, rec.tier, rec.key_id) == ("unauthorized", "", "", "")
