"""API keys: ``Authorization: Bearer <key>`` -> SHA-256 -> the configured tenant and tier.

The config holds only each key's SHA-256 (``[[gateway.api_keys]] sha256``); a presented key is
hashed and compared with every configured digest by ``hmac.compare_digest``, without stopping at
the first match, so the time taken says nothing about which digest (or how much of it) matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from serving.gateway.errors import Unauthorized
from serving.gateway.tiers import Caller
from vigil.config import ApiKeyConfig

__all__ = ["KeyRing", "key_sha256"]

_BEARER = "bearer "


def key_sha256(key: str) -> str:
    """The hex SHA-256 of an API key, as the config stores it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyRing:
    """The configured keys; ``authenticate`` turns an Authorization header into a ``Caller``."""

    def __init__(self, keys: Sequence[ApiKeyConfig]) -> None:
        self._keys = [(bytes.fromhex(k.sha256), Caller(tenant=k.tenant, tier=k.tier,
                                                       key_id=k.sha256[:12]))
                      for k in keys]

    def __len__(self) -> int:
        return len(self._keys)

    def authenticate(self, authorization: str | None) -> Caller:
        """The caller of a request whose ``Authorization`` header is ``authorization``.

        Raises ``Unauthorized`` (401) when the header is missing, not a Bearer token, or the
        key is unknown. Only the key's digest is compared and nothing of the key is logged.
        """
        if not authorization:
            raise Unauthorized("You didn't provide an API key. Send it in the Authorization "
                               "header as 'Bearer YOUR_KEY'.")
        if authorization[:len(_BEARER)].lower() != _BEARER:
            raise Unauthorized("The Authorization header must be 'Bearer YOUR_KEY'.")
        key = authorization[len(_BEARER):].strip()
        if not key:
            raise Unauthorized("The Authorization header carries an empty API key.")
        try:
            # ASGI servers decode header bytes as latin-1: encoding back gives the bytes the
            # client sent (a UTF-8 key hashes as the config's `sha256sum` of it).
            raw = key.encode("latin-1")
        except UnicodeEncodeError:
            raw = key.encode("utf-8")
        digest = hashlib.sha256(raw).digest()
        found: Caller | None = None
        for known, caller in self._keys:
            # Every digest is compared (no early exit): constant time in the matching key.
            if hmac.compare_digest(digest, known):
                found = caller
        if found is None:
            raise Unauthorized("Incorrect API key provided.")
        return found
