"""One delivery attempt: a signed HTTP POST of stored bytes, and what came of it.

The request carries:

* ``Content-Type: application/json``;
* ``X-Vigil-Signature: sha256=<hex>``: HMAC-SHA256 of the exact body bytes, keyed with the
  secret in the environment variable the route's ``secret_env`` names (when it has one);
* ``Idempotency-Key: <key>``: the same on every attempt of one notification, different for
  every notification, so a receiver can drop a retry of something it already processed;
* ``X-Vigil-Attempt: <n>``: 1 on the first attempt.

A 2xx answer is a delivery; anything else (another status, a redirect, which is not
followed, a timeout, a refused connection) is a failure with a specific reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from alerts.formats import CONTENT_TYPE
from vigil.conventions import (
    ALERTS_USER_AGENT,
    HEADER_ATTEMPT,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_SIGNATURE,
    SIGNATURE_PREFIX,
)

__all__ = [
    "DeliveryResult",
    "MissingSecret",
    "build_headers",
    "post",
    "resolve_secret",
    "sign",
    "verify",
]

#: At most this many characters of an error answer's body go into the failure reason.
_BODY_SNIPPET = 200


def sign(body: bytes, secret: str | bytes) -> str:
    """The ``X-Vigil-Signature`` value: ``sha256=`` + hex HMAC-SHA256 of ``body``."""
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    return SIGNATURE_PREFIX + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify(body: bytes, secret: str | bytes, header: str | None) -> bool:
    """True when ``header`` is the signature of ``body`` (constant-time comparison)."""
    return header is not None and hmac.compare_digest(sign(body, secret), header.strip())


class MissingSecret(Exception):
    """A route names a secret environment variable that is not set (or empty)."""


def resolve_secret(secret_env: str | None, env: Mapping[str, str]) -> str | None:
    """The route's HMAC secret from ``env``; None when the route signs nothing.

    Raises ``MissingSecret`` when ``secret_env`` is named but unset: sending unsigned would
    make a verifying receiver reject every notification, silently from our side.
    """
    if not secret_env:
        return None
    value = env.get(secret_env, "")
    if not value:
        raise MissingSecret(f"environment variable {secret_env} (the route's secret_env) "
                            "is not set: not sending unsigned")
    return value


def build_headers(body: bytes, *, key: str, attempt: int,
                  secret: str | None) -> dict[str, str]:
    """Every header of one attempt."""
    headers = {
        "Content-Type": CONTENT_TYPE,
        "User-Agent": ALERTS_USER_AGENT,
        HEADER_IDEMPOTENCY_KEY: key,
        HEADER_ATTEMPT: str(attempt),
    }
    if secret is not None:
        headers[HEADER_SIGNATURE] = sign(body, secret)
    return headers


@dataclass(frozen=True)
class DeliveryResult:
    """The outcome of one attempt: ``ok`` for a 2xx; ``reason`` says why not otherwise;
    ``duration`` in seconds."""

    ok: bool
    status_code: int | None
    reason: str
    duration: float


def _snippet(response: httpx.Response) -> str:
    try:
        text = response.text.strip()
    except Exception:  # undecodable body: the status says enough
        return ""
    text = " ".join(text.split())
    return text[:_BODY_SNIPPET] + ("…" if len(text) > _BODY_SNIPPET else "")


async def post(client: httpx.AsyncClient, url: str, body: bytes, *, key: str, attempt: int,
               timeout: float, secret: str | None) -> DeliveryResult:
    """POST ``body`` to ``url``; the whole exchange gets at most ``timeout`` seconds."""
    headers = build_headers(body, key=key, attempt=attempt, secret=secret)
    start = time.monotonic()

    def done(ok: bool, status: int | None, reason: str) -> DeliveryResult:
        return DeliveryResult(ok, status, reason, time.monotonic() - start)

    try:
        # httpx's timeout bounds each phase (connect, each read...); the outer one bounds the
        # total, so a receiver trickling bytes cannot hold a delivery slot forever.
        async with asyncio.timeout(timeout):
            response = await client.post(url, content=body, headers=headers, timeout=timeout)
    except (TimeoutError, httpx.TimeoutException):
        return done(False, None, f"timeout after {timeout:g} s")
    except httpx.ConnectError as exc:
        return done(False, None, f"cannot connect: {exc or type(exc).__name__}")
    except httpx.HTTPError as exc:
        return done(False, None, f"network error ({type(exc).__name__}): {exc}")
    except Exception as exc:
        # Whatever went wrong, the caller must record a failed attempt: an exception escaping
        # here would leave the notification marked in flight and block its group.
        return done(False, None, f"unexpected error ({type(exc).__name__}): {exc}")
    code = response.status_code
    if 200 <= code < 300:
        return done(True, code, "")
    if 300 <= code < 400:
        where = response.headers.get("location", "?")
        return done(False, code, f"HTTP {code} redirect to {where} (not followed)")
    snippet = _snippet(response)
    return done(False, code, f"HTTP {code}" + (f": {snippet}" if snippet else ""))
