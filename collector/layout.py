"""The repeat-scrape fast path: a target's exposition keeps its shape from scrape to scrape.

A vLLM server exposes the same ~500 series in the same order on every scrape; only the values
change. Once a body has been parsed and validated in full, we remember its *layout*: the text of
every metadata line, and for each sample line the text before its value together with the stored
series it became. The next scrape is then checked line by line against that layout and only the
values are read, which skips building prometheus_client ``Metric`` objects and merging target
labels again — the two costs that kept parse+store below 100k samples/s on one core.

Anything that differs (a new or missing series, reordered lines, a timestamp, an odd number
spelling, a histogram whose new values break the bucket rules) makes ``read`` return None and
the caller parses the body in full, which also produces the precise error message. So the fast
path can only ever accept what the full parser accepts, with the same stored result; a test
checks that the two paths store identical points.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from collector.exposition import sample_value
from vigil.model import SeriesKey

__all__ = ["Layout"]

#: (series, family type) of one sample line, as the full path stores it.
_Slot = tuple[SeriesKey, str]


class _Histogram(NamedTuple):
    """Positions (in sample order) of one histogram child's buckets, by rising ``le``."""

    buckets: tuple[int, ...]
    count: int | None  # the ``_count`` sample, which must equal the ``+Inf`` bucket


class Layout:
    """The remembered shape of one target's text-format exposition."""

    __slots__ = ("_comments", "_heads", "_histograms", "_slots")

    def __init__(self, comments: str, heads: list[str], slots: list[_Slot],
                 histograms: list[_Histogram]):
        self._comments = comments
        self._heads = heads
        self._slots = slots
        self._histograms = histograms

    @property
    def samples(self) -> int:
        return len(self._heads)

    @classmethod
    def build(
        cls, text: str, points: Sequence[tuple[SeriesKey, str, int, float | None]], ts_ms: int
    ) -> Layout | None:
        """A layout from a body the full path accepted and the points it produced, in order.

        ``ts_ms`` is the scrape's timestamp. Returns None when the body is not eligible (a
        sample with its own timestamp, or a line/point mismatch, which would mean the order
        assumption does not hold for it).
        """
        if any(p[2] != ts_ms for p in points):
            return None
        comments: list[str] = []
        heads: list[str] = []
        for line in text.split("\n"):
            if not line or line[0] == "#":
                comments.append(line)
                continue
            head, sep, _ = line.rpartition(" ")
            if not sep:
                return None
            heads.append(head)
        if len(heads) != len(points):
            return None
        slots = [(key, ftype) for key, ftype, _, _ in points]
        layout = cls("\n".join(comments), heads, slots, _histograms(slots))
        # Self-check: the fast read of the same body must give exactly the full path's points.
        again = layout.read(text, ts_ms)
        if again is None or not all(map(_same_point, again, points)):
            return None
        return layout

    def read(self, text: str, ts_ms: int) -> list[tuple[SeriesKey, str, int, float]] | None:
        """The points of ``text`` at ``ts_ms`` if it has this layout, else None."""
        heads = self._heads
        slots = self._slots
        n = len(heads)
        out: list[tuple[SeriesKey, str, int, float]] = []
        append = out.append
        comments: list[str] = []
        i = 0
        for line in text.split("\n"):
            if not line or line[0] == "#":
                comments.append(line)
                continue
            if i >= n:
                return None
            head, _, tok = line.rpartition(" ")
            if head != heads[i]:
                return None
            value = sample_value(tok)
            if value is None:
                return None
            key, ftype = slots[i]
            append((key, ftype, ts_ms, float(value)))
            i += 1
        if i != n or "\n".join(comments) != self._comments:
            return None
        for h in self._histograms:
            if not _valid_histogram(out, h):
                return None
        return out


def _same_point(a: tuple, b: tuple) -> bool:
    """Equal points, NaN equal to NaN (a NaN gauge must not make the layout unlearnable)."""
    if a[:3] != b[:3]:
        return False
    x, y = a[3], b[3]
    return x == y or (x != x and y != y)


def _histograms(slots: list[_Slot]) -> list[_Histogram]:
    """Group the bucket samples of every histogram child (same name and labels but ``le``)."""
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, int]]] = {}
    counts: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    for pos, (key, ftype) in enumerate(slots):
        if ftype != "histogram":
            continue
        if key.name.endswith("_bucket"):
            rest = tuple(kv for kv in key.labels if kv[0] != "le")
            le = float(key.label("le"))
            groups.setdefault((key.name[:-7], rest), []).append((le, pos))
        elif key.name.endswith("_count"):
            counts[(key.name[:-6], key.labels)] = pos
    return [
        _Histogram(tuple(pos for _, pos in sorted(b)), counts.get(child))
        for child, b in groups.items()
    ]


def _valid_histogram(points: list[tuple[SeriesKey, str, int, float]], h: _Histogram) -> bool:
    """Buckets cumulative and ``_count`` equal to ``+Inf``; NaN goes to the full path."""
    prev = -1.0
    for pos in h.buckets:
        v = points[pos][3]
        if not v >= prev:  # also false for NaN
            return False
        prev = v
    return h.count is None or points[h.count][3] == prev
