"""http_sd: target groups from an HTTP endpoint, as Prometheus's ``http_sd_configs``.

Prometheus's rules for the endpoint: a GET (with ``X-Prometheus-Refresh-Interval-Seconds``)
answered with HTTP 200, ``Content-Type: application/json`` and a UTF-8 JSON list of target
groups, the whole list every time; an empty list means no targets. Any other answer, or none,
keeps the previous targets and is reported.
"""

from __future__ import annotations

import json

import httpx

from collector.discovery.model import DiscoveryError, TargetGroup, parse_groups
from collector.scrape import root_cause
from vigil.config import DiscoveryConfig
from vigil.conventions import USER_AGENT

__all__ = ["HTTP_SD_TIMEOUT_S", "HttpSource"]

#: At most this long for one read (seconds); a shorter refresh interval bounds it further.
HTTP_SD_TIMEOUT_S = 30.0

#: The label Prometheus sets on every http_sd target (internal: not a series label).
META_URL = "__meta_url"


class HttpSource:
    """The endpoint of one ``[[discovery]]`` entry with ``url``. ``client`` is used when
    given (and not closed here); otherwise each read opens and closes its own."""

    def __init__(self, config: DiscoveryConfig, *, client: httpx.AsyncClient | None = None):
        self.config = config
        self.client = client
        self.groups: dict[str, list[TargetGroup]] = {}
        self.problems: list[str] = []

    async def read(self) -> None:
        """GET the URL once; on any failure keep the previous groups and report why."""
        url = self.config.url
        try:
            if self.client is not None:
                groups = await self._get(self.client)
            else:
                async with httpx.AsyncClient(trust_env=False, follow_redirects=True) as client:
                    groups = await self._get(client)
        except DiscoveryError as exc:
            kept = len({t for g in self.groups.get(url, []) for t in g.targets})
            self.problems = [f"{url}: {exc.reason}; the previous {kept} target(s) are kept"]
            return
        self.groups[url] = [
            TargetGroup(g.targets, tuple(sorted((*g.labels, (META_URL, url))))) for g in groups
        ]
        self.problems = []

    async def _get(self, client: httpx.AsyncClient) -> list[TargetGroup]:
        url = self.config.url
        interval = self.config.refresh_interval
        headers = {
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
            "X-Prometheus-Refresh-Interval-Seconds": f"{interval:g}",
        }
        try:
            resp = await client.get(url, headers=headers,
                                    timeout=min(HTTP_SD_TIMEOUT_S, interval))
        except httpx.TimeoutException:
            raise DiscoveryError(f"no answer within {min(HTTP_SD_TIMEOUT_S, interval):g}s",
                                 source=url) from None
        except httpx.HTTPError as exc:
            raise DiscoveryError(f"request failed: {root_cause(exc)}", source=url) from None
        if resp.status_code != 200:
            raise DiscoveryError(f"HTTP status {resp.status_code} {resp.reason_phrase} "
                                 "(http_sd wants 200)", source=url)
        ctype = resp.headers.get("content-type", "")
        if ctype.split(";", 1)[0].strip().lower() != "application/json":
            raise DiscoveryError(f"Content-Type {ctype or '(none)'!r}, not application/json",
                                 source=url)
        try:
            doc = json.loads(resp.content.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DiscoveryError(f"the body is not UTF-8 ({exc.reason})", source=url) from None
        except json.JSONDecodeError as exc:
            raise DiscoveryError(f"invalid JSON at line {exc.lineno} column {exc.colno}: "
                                 f"{exc.msg}", source=url) from None
        return parse_groups(doc, where=url)
