"""The fast paths both parsers share, with the per-parse caches they live on.

How a line meets them:

- bucket runs: consecutive ``_bucket`` lines of one label set differ only in ``le`` and the
  value, so a line that matches the previous bucket's text around its ``le`` reuses its labels
  and histogram state (most of a vLLM exposition is histogram buckets);
- a per-parse cache from label-set text to parsed labels, since most label sets repeat across
  families (``engine="0",model_name="..."`` in vLLM, the per-GPU set in DCGM);
- a fast path on ``str.find``/``split`` for ``name{k="v",...} value [ts]`` without escapes.

Anything else goes to the format's careful slow path, which the fast paths never contradict:
a line they accept parses to what the slow path would return.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice

from prometheus_client.samples import Sample

from collector.exposition.families import NO_TS_TAIL, new_tuple
from collector.exposition.histograms import INF, HistGroup, hist_bucket, le_value
from collector.exposition.labels import NO_LABELS, LabelEntry, fast_labels, label_entry
from collector.exposition.problems import Bad, Slow, duplicate
from collector.exposition.tokens import number

__all__ = ["BucketCheck", "FastPath", "skip_lines"]

_BARE: LabelEntry = (NO_LABELS, NO_LABELS, None)  # the entry of a sample without labels

#: A format's own rules for a bucket: ``(le text, value, le cache, 1-based line)``; raises Bad.
BucketCheck = Callable[[str, int | float, dict[str, float], int], None]


class FastPath:
    """One parse's caches, its series seen so far, and the fast paths over them.

    ``openmetrics``: a label set closes at the first ``}`` (an exemplar's may follow), a
    timestamp sends the line to the slow path (OpenMetrics timestamps are ``Timestamp``s) and
    lines are taken as they are; otherwise (the text format) the label set closes at the last
    ``}``, the fast path takes an integer millisecond timestamp token, and lines are stripped
    and blank ones skipped. ``bucket_check`` runs on every bucket a run takes.
    """

    __slots__ = ("bodies", "bucket_check", "label_keys", "les", "max_tokens", "openmetrics",
                 "seen", "values")

    def __init__(self, *, openmetrics: bool, bucket_check: BucketCheck | None = None) -> None:
        self.openmetrics = openmetrics
        self.bucket_check = bucket_check
        # `` value ts`` splits into 3 tokens; OpenMetrics leaves timestamps to the slow path
        self.max_tokens = 3 if openmetrics else 4  # exclusive bound on the token count
        #: (sample name, labels without le, le, timestamp) -> the 1-based line it was first on
        self.seen: dict[tuple, int] = {}
        self.label_keys: dict[str, str] = {}  # ',name=' -> 'name', label names validated
        # label-set text -> (labels, their label_entry): most label sets repeat
        self.bodies: dict[str, tuple] = {}
        self.values: dict[str, int | float] = {}  # number token -> value
        self.les: dict[str, float] = {}  # le text -> bound

    def sample(self, line: str) -> tuple[str, dict[str, str], LabelEntry, int | float,
                                         str | None]:
        """Split ``name value [ts]`` or ``name{k="v",...} value [ts]``; ``Slow`` if unusual.

        Returns ``(name, labels, label_entry(labels), value, timestamp token or None)``. The
        name is not validated here.
        """
        brace = line.find("{")
        if brace < 0:
            space = line.find(" ")
            if space < 0:
                raise Slow
            name = line[:space]
            rest = line[space:]
            labels: dict[str, str] = {}
            entry = _BARE
        else:
            close = line.find("}", brace) if self.openmetrics else line.rfind("}")
            if close < brace:
                raise Slow
            name = line[:brace]
            rest = line[close + 1:]
            body = line[brace + 1:close]
            known = self.bodies.get(body)
            if known is None:
                labels = fast_labels(body, self.label_keys)
                known = self.bodies[body] = (labels, label_entry(labels))
            else:
                labels = known[0].copy()
            entry = known[1]
        toks = rest.split(" ")
        if toks[0] or not 1 < len(toks) < self.max_tokens:
            raise Slow
        values = self.values
        value = values.get(toks[1])
        if value is None:
            value = number(toks[1])
            if value is None:
                raise Slow
            values[toks[1]] = value
        return name, labels, entry, value, toks[2] if len(toks) == 3 else None

    def bucket_run(self, lines: list[str], start: int, line: str, le: str, name: str,
                   family: str, labels: dict[str, str], key: frozenset[tuple[str, str]],
                   group: HistGroup, samples: list[Sample]) -> int:
        """Take the lines after bucket line ``start`` (1-based) that are its series' next buckets.

        ``line`` (that line, as the parser read it) was split by ``sample`` (no timestamp) and
        its bucket kept; ``le`` is its le, ``name`` its sample name, ``family`` the family's
        name (for messages), ``key`` its labels without le, ``group`` the label set's histogram
        state and ``samples`` the list the buckets go to. Each line taken is kept and checked
        as the parser would; returns how many lines it took (0: none), so the parser goes on
        after them. ``Bad`` carries the line it is about.

        A run line is the start line's text around a new le: the text up to the le value
        (``prefix``) and from the quote after it through ``"} "`` (``mid``), then the value.
        """
        brace = line.find("{")
        close = line.find("}", brace) if self.openmetrics else line.rfind("}")  # as sample()
        plen = _bucket_run_start(line, brace, close, le)
        if not plen:
            return 0
        prefix = line[:plen]
        mid = line[plen + len(le):close + 2]
        mlen = len(mid)
        values, seen, les, check = self.values, self.seen, self.les, self.bucket_check
        strip = not self.openmetrics
        lineno = start
        try:
            for lineno in range(start + 1, len(lines) + 1):
                line = lines[lineno - 1]
                if strip:
                    line = line.strip()
                    if not line:
                        continue
                if not line.startswith(prefix):
                    break
                quote = line.find('"', plen)
                if quote < 0 or not line.startswith(mid, quote):
                    break
                le = line[plen:quote]
                token = line[quote + mlen:]
                value = values.get(token)
                if value is None:
                    value = number(token)
                    if value is None:
                        break
                    values[token] = value
                if "\\" in le:
                    break
                bucket = labels.copy()  # keeps the library's label order
                bucket["le"] = le
                first = seen.setdefault((name, key, le, None), lineno)
                if first != lineno:
                    raise Bad(duplicate(name, bucket, first))
                if check is not None:
                    check(le, value, les, lineno)
                samples.append(new_tuple(Sample, (name, bucket, value) + NO_TS_TAIL))  # noqa: RUF005 (see SAMPLE_TAIL)
                bound = les.get(le)
                if bound is None:
                    bound = les[le] = le_value(le, lineno)
                if bound <= group.le or value < group.value or bound < 0:
                    hist_bucket(family, group, le, value, lineno, les)
                else:  # hist_bucket, inlined for the hot path
                    group.le = bound
                    group.value = value
                    group.line = lineno
                    if bound == INF:
                        group.inf = value
            else:
                return len(lines) - start
        except Bad as bad:
            bad.line = bad.line or lineno
            raise
        return lineno - 1 - start


def _bucket_run_start(line: str, brace: int, close: int, le: str) -> int:
    """Offset of the le value in a fast-path bucket line (0 if the run path cannot use it).

    ``le`` parses as a float, so ``,le="<le>"`` cannot be the tail of another label's value:
    there the text after the quote would be ``,name=`` or ``}``, which is not a float.
    """
    if line[close + 1:close + 2] != " ":
        return 0
    piece = 'le="' + le + '"'
    if line.startswith(piece, brace + 1):
        return brace + 5
    at = line.find("," + piece, brace, close)
    return at + 5 if at >= 0 else 0


def skip_lines(numbered: Iterator[tuple[int, str]], count: int) -> tuple[int, str]:
    """Advance a parser's ``enumerate(lines, 1)`` past ``count`` (> 0) lines; the last of them."""
    return next(islice(numbered, count - 1, None))
