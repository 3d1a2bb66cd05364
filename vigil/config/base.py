"""The ground of the configuration models: the section base class, duration and ratio types,
URL checks, and the default GPU prices."""

from __future__ import annotations

from typing import Annotated

import httpx
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)

from vigil.durations import parse_duration


def check_http_url(v: str) -> str:
    """``v`` if it is an http(s) URL with a host and a valid port, else ``ValueError``."""
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
    try:
        url = httpx.URL(v)
        port = url.port
    except (httpx.InvalidURL, ValueError, OverflowError) as exc:
        raise ValueError(f"not a valid URL ({exc}), got {v!r}") from None
    if not url.host:
        raise ValueError(f"the URL has no host, got {v!r}")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range 1-65535, got {v!r}")
    return v


#: What to do instead of a password in an http(s) URL of a Prometheus-compatible API.
USE_BASIC_AUTH = "give it in [engine.http] basic_auth (password_file or password_env)"


def refuse_password(url: str, what: str, instead: str) -> str:
    """``url`` unless it carries a password (in its user part or a ``password=`` parameter),
    else ``ValueError`` saying ``what`` and ``instead``: the config holds no secret, and every
    message naming the URL would show it."""
    from vigil.storage.database import url_password

    if url_password(url):
        raise ValueError(f"{what} carries a password; {instead}")
    return url


#: Seconds; accepts "15s", "5m", "48h", "35d" or a plain number of seconds.
Duration = Annotated[float, BeforeValidator(parse_duration)]
Ratio = Annotated[float, Field(ge=0.0, le=1.0)]

#: USD per GPU-hour, on-demand list prices of late 2026 rounded; illustrative defaults that
#: every deployment should override in ``[prices]`` with what it really pays.
DEFAULT_PRICES: dict[str, float] = {
    "H100": 6.88,
    "H200": 8.00,
    "A100": 4.10,
    "L40S": 1.96,
    "A10G": 1.21,
    "L4": 0.80,
}


class Section(BaseModel):
    # strict: a string "0.8" or a boolean where a number belongs is a mistake, not a value.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
