"""``Joiner``: the parts of one request, held until its other spans have had time to arrive.

A router and vLLM export their spans separately, in batches seconds apart, out of order, and a
collector may send a batch twice. Parts are grouped by any key they share (a request id, or a
router span and the engine span it is the parent of) and a group is released as one record
``join_window`` seconds after its first part arrived. A part whose key belongs to a group
released less than ``remember`` seconds ago is a late arrival or a repeat: counted, not
written again (the database's insert skips a record id it holds anyway, so a repeat after
that is harmless too). Time is injected (``now`` arguments, seconds).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from serving.otlp.mapping import Part, merge
from serving.otlp.spans import ENGINE
from vigil.storage.gateway_records import GatewayRecord

__all__ = ["Joiner"]


@dataclass
class _Group:
    first_s: float
    parts: list[Part] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)


class Joiner:
    """Groups parts by shared keys; ``due`` releases the groups older than ``window_s``.
    ``max_groups`` bounds what is held: past it, the oldest groups are released early."""

    def __init__(self, window_s: float, *, max_groups: int = 100_000,
                 remember_s: float | None = None) -> None:
        if window_s <= 0:
            raise ValueError(f"the join window must be positive, got {window_s!r}")
        self.window_s = window_s
        self.max_groups = max_groups
        self.remember_s = 4 * window_s if remember_s is None else remember_s
        self._groups: OrderedDict[int, _Group] = OrderedDict()
        self._by_key: dict[str, int] = {}
        self._released: OrderedDict[str, float] = OrderedDict()
        self._next = 0
        #: Parts joined to a group another part had started.
        self.joined = 0
        #: Parts that arrived after their request's record was released (or twice).
        self.late = 0

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, part: Part, now: float) -> list[GatewayRecord]:
        """Hold ``part``; returns the records released early to stay within ``max_groups``."""
        self._forget(now)
        if self._is_late(part):
            self.late += 1
            return []
        found = sorted({gid for k in part.keys
                        if (gid := self._by_key.get(k)) is not None and self._fits(gid, part)})
        if found and any(p.span_id == part.span_id and p.trace_id == part.trace_id
                         for gid in found for p in self._groups[gid].parts):
            self.late += 1  # the same span twice (a collector's retry)
            return []
        if found:
            self.joined += 1
            target = self._groups[found[0]]
            for other in found[1:]:  # the part links two groups: one request after all
                group = self._groups.pop(other)
                target.parts += group.parts
                target.keys |= group.keys
                target.first_s = min(target.first_s, group.first_s)
            for k in target.keys:
                if self._by_key.get(k) in found:
                    self._by_key[k] = found[0]
        else:
            found = [self._next]
            self._next += 1
            target = self._groups[found[0]] = _Group(now)
        target.parts.append(part)
        target.keys |= set(part.keys)
        for k in part.keys:
            # A key another live group holds stays that group's: an engine span's parent may
            # be a client's span that several requests share (see ``_fits``).
            self._by_key.setdefault(k, found[0])
        released: list[GatewayRecord] = []
        while len(self._groups) > self.max_groups:
            released.append(self._release(next(iter(self._groups)), now))
        return released

    def _fits(self, gid: int, part: Part) -> bool:
        """Whether ``part`` may join group ``gid``: not when both hold an engine span of a
        different request id. vLLM's span is the child of whatever span the caller sent in
        ``traceparent``; with LiteLLM forwarding the client's, every request an agent makes
        under one span has the same parent, and they are separate requests all the same."""
        if part.source != ENGINE or not part.request_id:
            return True
        return not any(p.source == ENGINE and p.request_id and p.request_id != part.request_id
                       for p in self._groups[gid].parts)

    def _is_late(self, part: Part) -> bool:
        """Whether ``part``'s request was released already: its request id, its own span, or
        (an engine span) the router span it is the child of, released less than
        ``remember_s`` ago and not held again since."""
        if any(k in self._by_key for k in part.keys):
            return False
        return any(k in self._released for k in part.keys)

    def due(self, now: float) -> list[GatewayRecord]:
        """The records of every group whose first part is at least ``window_s`` old."""
        out = []
        while self._groups:
            gid, group = next(iter(self._groups.items()))
            if now - group.first_s < self.window_s:
                break
            out.append(self._release(gid, now))
        return out

    def drain(self, now: float) -> list[GatewayRecord]:
        """Every group's record, whatever its age (at shutdown)."""
        return [self._release(gid, now) for gid in list(self._groups)]

    def _release(self, gid: int, now: float) -> GatewayRecord:
        group = self._groups.pop(gid)
        # Remembered (late arrivals): the ids, and the span keys that are a router span's own
        # id. An engine's parent that no router span of the group has may be a client's span
        # that other requests share: remembering it would count them late.
        routers = {f"span:{p.span_id}" for p in group.parts if p.source != ENGINE}
        for k in group.keys:
            if self._by_key.get(k) == gid:
                del self._by_key[k]
            if not k.startswith("span:") or k in routers:
                self._released[k] = now
                self._released.move_to_end(k)
        return merge(group.parts)

    def _forget(self, now: float) -> None:
        while self._released:
            key, at = next(iter(self._released.items()))
            if now - at < self.remember_s:
                break
            del self._released[key]
