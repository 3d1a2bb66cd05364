"""``parse``: a scraped body in whichever of the two formats it is."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from collector.exposition.body import DEFAULT_SOURCE, decode
from collector.exposition.openmetrics import parse_openmetrics
from collector.exposition.text import parse_text

__all__ = ["OPENMETRICS_CONTENT_TYPE", "parse"]

OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text"


def parse(
    body: str | bytes, *, content_type: str | None = None, source: str = DEFAULT_SOURCE
) -> list[Metric]:
    """Parse a scraped body in whichever format it is.

    OpenMetrics when ``content_type`` is ``application/openmetrics-text``; the text format when
    it is ``text/plain``; otherwise OpenMetrics if the body's last line is ``# EOF``. Bytes are
    decoded as UTF-8 (invalid UTF-8 raises ``ParseError``).
    """
    text = body if isinstance(body, str) else decode(body, source)
    if _wants_openmetrics(content_type, text):
        return parse_openmetrics(text, source=source)
    return parse_text(text, source=source)


def _wants_openmetrics(content_type: str | None, text: str) -> bool:
    if content_type:
        media_type = content_type.split(";", 1)[0].strip().lower()
        if media_type == OPENMETRICS_CONTENT_TYPE:
            return True
        if media_type == "text/plain":
            return False
    tail = text[-4096:].rstrip()  # only the end matters; never copy a huge body
    return tail == "# EOF" or tail.endswith("\n# EOF")
