"""Target discovery: the targets to scrape, static and found at run time.

``TargetSet`` holds the static ``[[targets]]`` and what each ``[[discovery]]`` entry finds
with Prometheus's own mechanisms (``file_sd``, ``http_sd``, DNS A/AAAA/SRV), refreshes them
on their intervals and tells its subscribers (the collector, the gateway) what changed.
"""

from collector.discovery.model import (
    ORIGIN_STATIC,
    DiscoveredTarget,
    DiscoveryError,
    TargetChanges,
    TargetGroup,
    parse_groups,
)
from collector.discovery.target_set import TargetSet, address_of

__all__ = [
    "ORIGIN_STATIC",
    "DiscoveredTarget",
    "DiscoveryError",
    "TargetChanges",
    "TargetGroup",
    "TargetSet",
    "address_of",
    "parse_groups",
]
