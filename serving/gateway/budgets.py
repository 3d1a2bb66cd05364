"""Budgets at the gateway: demote or refuse the new requests of a tenant whose monthly budget is
spent.

`vigil serve` computes every ``[[budgets]]`` entry's status and serves it as JSON at
``/budgets`` (``vigil.conventions.SERVE_BUDGETS_PATH``). ``BudgetPoller`` reads that URL
(``[gateway] budgets_url``) every ``budgets_poll_interval`` seconds and keeps the last good
answer; ``decide`` says, for a request's (tenant, pool, tier), which spent budget applies:

* a budget applies to a request when its tenant is the request's, its pool is "" or the
  request's, its tier is "" or the request's tier (the API key's);
* among the applicable budgets that are ``over`` (spent), one whose ``enforce`` is "refuse" wins
  over one whose ``enforce`` is "demote"; a request demoted to ``batch`` is refused when a
  "refuse" budget of the batch tier applies to it there;
* the gateway's own ``[[budgets]]`` say what is enforced: an entry of the answer counts only
  when the config has a budget of the same name, tenant, pool and tier whose ``enforce`` is not
  "off", and that config entry's ``enforce`` is the action (so a gateway restarted with
  ``enforce = "off"`` stops enforcing whatever serve says). Serve gives the figures: ``over``,
  ``spent``, ``monthly``, ``month``, ``currency``;
* an entry of a month that has ended (in ``[cost] timezone``, on the gateway's clock) no longer
  applies: the new month starts with nothing spent, even before serve says so.

Fail open: the gateway never refuses traffic because serve cannot be read. A poll that fails
(connection refused, a timeout, a status other than 200, a body that is not the expected JSON)
keeps the last known state, and is logged once per change of state, not at every poll; a
gateway that has never read an answer enforces nothing. An answer whose ``at`` is null (serve
has computed no chargeback yet, e.g. just restarted) keeps the last state too, so that a serve
restart does not lift enforcement for a minute.

Only new requests are checked, at admission (``gateway.Gateway``): a request already admitted,
a stream included, runs to its end whatever the budget does meanwhile. Batch-API requests are
checked when the queue releases them (``Gateway.send_batch``): they run at the batch tier
already, so "demote" changes nothing; "refuse" answers each the 429, which the queue retries like
a busy pool's and then writes as the request's error line. Creating a batch is not refused.

Units: seconds, amounts in the budget's currency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from slo.cost.months import month_of
from vigil.clock import Clock, system_clock
from vigil.config import Config
from vigil.conventions import HEADER_BUDGET, TIER_BATCH

__all__ = [
    "DEMOTE",
    "HEADER_BUDGET",
    "REFUSE",
    "BudgetPoller",
    "BudgetState",
    "decide",
    "enforced_budgets",
    "header_value",
    "parse_budgets",
]

log = logging.getLogger("vigil.gateway.budgets")

DEMOTE = "demote"
REFUSE = "refuse"
_ACTIONS = (DEMOTE, REFUSE)
_USER_AGENT = "vigil-gateway/0.1"
#: A /budgets answer larger than this is refused (bytes): a budget takes about 300.
_MAX_ANSWER_BYTES = 4 * 1024 * 1024
#: A poll's timeout (seconds): the interval, within these bounds (the first poll delays the
#: gateway's start by at most the upper one).
_TIMEOUT_BOUNDS_S = (1.0, 10.0)
_MONTH = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One budget as the gateway enforces it: scope and action from the gateway's
    ``[[budgets]]``, figures from serve's ``/budgets``."""

    name: str
    tenant: str
    #: "" = every pool / every tier.
    pool: str
    tier: str
    #: ``YYYY-MM`` in ``[cost] timezone``.
    month: str
    #: The amount per month and what is spent of it this month, in ``currency``.
    monthly: float
    spent: float
    over: bool
    #: "off", "demote" or "refuse".
    enforce: str
    currency: str

    @property
    def share(self) -> float:
        """Spent over the amount (1.0 = spent)."""
        return self.spent / self.monthly

    def applies_to(self, tenant: str, pool: str, tier: str) -> bool:
        """The budget covers a request of ``tenant`` to ``pool`` at ``tier``."""
        return (self.tenant == tenant and (not self.pool or self.pool == pool)
                and (not self.tier or self.tier == tier))


def _spent_budgets(budgets: Iterable[BudgetState], tenant: str, pool: str, tier: str,
                   month: str | None) -> list[BudgetState]:
    return [b for b in budgets
            if b.over and b.enforce in _ACTIONS and b.applies_to(tenant, pool, tier)
            and (month is None or b.month >= month)]  # YYYY-MM sorts as it reads


def _worst(budgets: list[BudgetState]) -> BudgetState:
    # The most overspent names the decision (the name breaks ties, so it is deterministic).
    return max(budgets, key=lambda b: (b.share, b.name))


def decide(budgets: Iterable[BudgetState], *, tenant: str, pool: str, tier: str,
           month: str | None = None) -> BudgetState | None:
    """The spent budget that decides what becomes of a new request of ``tenant`` to ``pool`` at
    ``tier``, or None (it goes on as it is). Its ``enforce`` is the action: "refuse" (429) or
    "demote" (the request goes on at the batch tier).

    Only budgets that are ``over`` with ``enforce`` "demote" or "refuse" count; "refuse" wins
    over "demote"; a request that would be demoted is refused when a "refuse" budget applies to
    it at the batch tier. Among several of the winning action, the most overspent (highest
    ``share``) is returned. ``month`` (``YYYY-MM``): budgets of an earlier month are ignored
    (None: no such check). Pure: no clock, no I/O.
    """
    budgets = tuple(budgets)
    spent = _spent_budgets(budgets, tenant, pool, tier, month)
    if not spent:
        return None
    refuse = [b for b in spent if b.enforce == REFUSE]
    if refuse:
        return _worst(refuse)
    if tier != TIER_BATCH:
        refuse = [b for b in _spent_budgets(budgets, tenant, pool, TIER_BATCH, month)
                  if b.enforce == REFUSE]
        if refuse:
            return _worst(refuse)
    return _worst(spent)


def header_value(action: str, budget: BudgetState) -> str:
    """``HEADER_BUDGET``'s value: ``demoted; budget="<name>"`` or ``refused; ...``. The name
    is a JSON string: quotes and backslashes escaped, anything outside ASCII as ``\\uXXXX``, so
    that any name makes a valid (latin-1) header."""
    word = "demoted" if action == DEMOTE else "refused"
    return f"{word}; budget={json.dumps(budget.name)}"


def enforced_budgets(cfg: Config) -> dict[tuple[str, str, str, str], str]:
    """(name, tenant, pool, tier) -> ``enforce`` of every ``[[budgets]]`` entry the gateway
    enforces (``enforce`` not "off"); the name is ``display_name()``, as serve reports it."""
    return {(b.display_name(), b.tenant, b.pool, b.tier): b.enforce
            for b in cfg.budgets if b.enforce != "off"}


def _text(entry: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key!r} is not a string")
    return value


def _number(entry: Mapping[str, Any], key: str) -> float:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value):
        raise ValueError(f"{key!r} is not a finite number")
    return float(value)


def parse_budgets(data: Any) -> tuple[float | None, list[BudgetState]]:
    """(``at``, the budgets) of a ``/budgets`` answer (parsed JSON); ``at`` (Unix seconds) is
    None when serve has no figures yet. The budgets carry serve's ``enforce``. ``ValueError``
    saying what is wrong when the answer is not of the expected shape (then none of it is
    used)."""
    if not isinstance(data, dict):
        raise ValueError("the answer is not a JSON object")
    at = data.get("at")
    if at is not None:
        at = _number(data, "at")
    items = data.get("budgets")
    if not isinstance(items, list):
        raise ValueError("'budgets' is not a list")
    currency = data.get("currency", "")
    out: list[BudgetState] = []
    for i, entry in enumerate(items):
        try:
            if not isinstance(entry, dict):
                raise ValueError("not an object")
            month = _text(entry, "month")
            if not _MONTH.match(month):
                raise ValueError(f"'month' is not YYYY-MM: {month[:20]!r}")
            monthly = _number(entry, "monthly")
            if monthly <= 0:
                raise ValueError("'monthly' is not above 0")
            over = entry.get("over")
            if not isinstance(over, bool):
                raise ValueError("'over' is not true or false")
            out.append(BudgetState(
                name=_text(entry, "name"), tenant=_text(entry, "tenant"),
                pool=_text(entry, "pool", ""), tier=_text(entry, "tier", ""), month=month,
                monthly=monthly, spent=_number(entry, "spent"), over=over,
                enforce=_text(entry, "enforce", "off"),
                currency=_text(entry, "currency", currency if isinstance(currency, str)
                               else "")))
        except ValueError as exc:
            raise ValueError(f"budgets[{i}]: {exc}") from None
    return at, out


def _safe_url(url: str) -> str:
    """``url`` without user information, query or fragment, for log lines (the config refuses
    a password in it; a token in a query parameter is not shown either)."""
    try:
        return str(httpx.URL(url).copy_with(username=None, password=None, query=None,
                                            fragment=None))
    except (httpx.InvalidURL, ValueError):
        return "budgets_url"


class BudgetPoller:
    """Polls serve's ``/budgets`` and answers ``decide`` from the last good answer (see the
    module docstring: it fails open).

    Runs only when ``[gateway] budgets_url`` is set and some ``[[budgets]]`` entry has
    ``enforce`` other than "off"; otherwise ``decide`` always answers None. ``clock`` (Unix
    seconds) dates the current month; ``transport`` replaces httpx's (tests).
    """

    def __init__(self, cfg: Config, *, clock: Clock = system_clock,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        gw = cfg.gateway
        self._url = gw.budgets_url
        self._shown_url = _safe_url(self._url) if self._url else ""
        self._interval = gw.budgets_poll_interval
        self._connect_timeout = gw.connect_timeout
        self._tz = cfg.cost.timezone
        self._clock = clock
        self._transport = transport
        #: What the gateway's config enforces: (name, tenant, pool, tier) -> action.
        self._enforced = enforced_budgets(cfg)
        #: Poll only with something to enforce and somewhere to read it.
        self.enabled = bool(self._url and self._enforced)
        #: The enforced budgets of the last good answer, and its ``at`` (Unix seconds).
        self.budgets: tuple[BudgetState, ...] = ()
        self.as_of: float | None = None
        #: Of those, the spent ones of the current month or later: what ``decide`` reads.
        self._spent: tuple[BudgetState, ...] = ()
        self._month = ""
        #: The kind of the last poll's problem (None: it went well), and the config's enforced
        #: budgets the last answer lacked: each logged when it changes, not at every poll.
        self._problem: str | None = None
        self._missing: frozenset[tuple[str, str, str, str]] = frozenset()
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the budgets once (so enforcement starts informed; a failure is logged and
        enforces nothing), then every ``budgets_poll_interval`` in the background. Nothing
        when there is nothing to enforce (said once when that leaves a setting unused)."""
        if not self.enabled:
            if self._url:
                log.warning("[gateway] budgets_url is set but no [[budgets]] entry has enforce "
                            "\"demote\" or \"refuse\": the budgets are not polled and nothing "
                            "is enforced at the gateway")
            elif self._enforced:
                log.warning("%d budget(s) have enforce \"demote\" or \"refuse\" but [gateway] "
                            "budgets_url is not set: nothing is enforced at the gateway",
                            len(self._enforced))
            return
        timeout = min(max(self._interval, _TIMEOUT_BOUNDS_S[0]), _TIMEOUT_BOUNDS_S[1])
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, self._connect_timeout)),
            headers={"User-Agent": _USER_AGENT, "Accept": "application/json"},
            transport=self._transport, follow_redirects=False)
        log.info("enforcing %d budget(s) from %s every %g s", len(self._enforced),
                 self._shown_url, self._interval)
        try:
            await self.poll_once()
        except Exception:  # a bug here must not keep the gateway from serving: fail open
            log.exception("budgets: the first poll failed")
        self._task = asyncio.create_task(self._loop(), name="gateway-budgets-poll")

    async def aclose(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.poll_once()
            except Exception:  # never let one bad round stop enforcement's updates
                log.exception("budgets poll round failed")

    # --- what the request path asks ---------------------------------------------------------

    def decide(self, tenant: str, pool: str, tier: str) -> BudgetState | None:
        """``decide`` on the last known state, in the current month (as of the last poll
        round: the rounds go on while serve cannot be read)."""
        if not self._spent:  # the usual case: nothing spent, nothing to look through
            return None
        return decide(self._spent, tenant=tenant, pool=pool, tier=tier, month=self._month)

    # --- polling ----------------------------------------------------------------------------

    async def _fetch(self) -> tuple[int, bytes]:
        """(status, body) of one GET of the URL; the body is cut at ``_MAX_ANSWER_BYTES`` + 1."""
        assert self._client is not None  # started
        for attempt in (1, 2):
            try:
                async with self._client.stream("GET", self._url) as r:
                    body = bytearray()
                    async for piece in r.aiter_bytes():
                        body += piece
                        if len(body) > _MAX_ANSWER_BYTES:
                            break
                    return r.status_code, bytes(body)
            except httpx.RemoteProtocolError as exc:
                # Serve closed a kept-alive connection as it was reused: nothing was
                # answered, so the GET is tried once more on a new connection.
                if attempt == 2 or "without sending a response" not in str(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def poll_once(self) -> bool:
        """Read the URL once; True when it gave a usable answer (then the state is that
        answer), False when the last known state is kept (the reason logged if it changed)."""
        self._month = month_of(self._clock(), self._tz)
        try:
            status, body = await self._fetch()
        except httpx.HTTPError as exc:
            what = f"{type(exc).__name__}: {exc}".rstrip(": ").replace(self._url,
                                                                      self._shown_url)
            self._trouble("unreachable", f"cannot be read ({what})")
            return False
        if status != 200:
            self._trouble(f"status {status}", f"answered HTTP {status}")
            return False
        if len(body) > _MAX_ANSWER_BYTES:
            self._trouble("malformed", f"answered more than {_MAX_ANSWER_BYTES} bytes")
            return False
        try:
            at, found = parse_budgets(json.loads(body))
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError included
            self._trouble("malformed", f"answered something malformed ({str(exc)[:200]})")
            return False
        if at is None:
            self._trouble("no figures", "has no figures yet (serve computes its first "
                                        "chargeback)", level=logging.INFO)
            return False
        if self._problem is not None:
            log.info("budgets: %s answers again", self._shown_url)
            self._problem = None
        self._take(at, found)
        return True

    def _trouble(self, kind: str, what: str, *, level: int = logging.WARNING) -> None:
        """A poll that left the state as it was: logged when ``kind`` differs from the last
        poll's, and the month's end still lifts the budgets of the month that ended."""
        if kind != self._problem:
            log.log(level, "budgets: %s %s; enforcing the last known state (%d budget(s) "
                    "spent), never refusing because of this", self._shown_url, what,
                    len(self._spent))
            self._problem = kind
        self._set_spent(self.budgets)

    def _take(self, at: float, found: list[BudgetState]) -> None:
        """Keep the enforced budgets of a good answer, with the config's action."""
        kept: list[BudgetState] = []
        seen: set[tuple[str, str, str, str]] = set()
        for b in found:
            key = (b.name, b.tenant, b.pool, b.tier)
            action = self._enforced.get(key)
            if action is None:
                continue  # not enforced here (or serve's config differs from this one)
            seen.add(key)
            kept.append(BudgetState(b.name, b.tenant, b.pool, b.tier, b.month, b.monthly,
                                    b.spent, b.over, action, b.currency))
        missing = frozenset(self._enforced) - seen
        if missing != self._missing:
            if missing:
                log.warning("budgets: %s has no figures for %s, enforced in this config: "
                            "not enforced until it does", self._shown_url,
                            ", ".join(sorted(repr(k[0]) for k in missing)))
            self._missing = missing
        self.budgets = tuple(kept)
        self.as_of = at
        self._set_spent(self.budgets)

    def _set_spent(self, budgets: tuple[BudgetState, ...]) -> None:
        """``_spent`` from ``budgets`` (this month's spent ones); changes logged."""
        spent = tuple(b for b in budgets if b.over and b.month >= self._month)
        before = {(b.name, b.tenant, b.pool, b.tier) for b in self._spent}
        after = {(b.name, b.tenant, b.pool, b.tier) for b in spent}
        for b in spent:
            if (b.name, b.tenant, b.pool, b.tier) not in before:
                log.warning("budget %r of tenant %r (%.2f of %.2f %s for %s) is spent: new "
                            "requests are %s", b.name, b.tenant, b.spent, b.monthly,
                            b.currency, b.month,
                            "refused" if b.enforce == REFUSE else "demoted to the batch tier")
        for b in self._spent:
            if (b.name, b.tenant, b.pool, b.tier) not in after:
                log.info("budget %r of tenant %r is no longer enforced (not spent, or its "
                         "month ended)", b.name, b.tenant)
        self._spent = spent
