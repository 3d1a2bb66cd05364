"""Payload renderers: a ``Notification`` to the exact bytes a route POSTs.

Pure functions, no I/O and no clock: every time they print comes from the notification
(``created_at``) or its alerts, so the same notification always renders to the same bytes
(the outbox stores them; retries resend them unchanged; the signature covers them).

Formats (``[[alerts.routes]] format``):

``generic``
    Vigil's own JSON, schema version ``"1"`` (docs/alerts.md lists every field).
``slack``
    A Slack incoming-webhook message: ``text`` fallback plus Block Kit ``blocks`` within
    Slack's limits (section text 3000 chars, at most 10 fields of 2000, context at most 10
    elements, 50 blocks), with ``&``, ``<`` and ``>`` escaped.
``alertmanager``
    Alertmanager's webhook payload, version 4, byte-for-byte the way Alertmanager 0.25
    encodes it (Go ``encoding/json``: compact, ``<``/``>``/``&`` as ``\\u003c``..., a final
    newline), so receivers written for Alertmanager work unchanged.
``alertmanager_api``
    The body of Alertmanager's ``POST /api/v2/alerts``: a JSON array of alerts. A firing
    alert's ``endsAt`` is ``created_at`` + ``API_ALERT_VALIDITY``, the way Prometheus sends
    them, so Alertmanager resolves it by itself if Vigil stops re-posting it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from alerts.model import Alert, Notification
from vigil.conventions import (
    ALERTMANAGER_WEBHOOK_VERSION,
    ANNOTATION_DASHBOARD_URL,
    ANNOTATION_DESCRIPTION,
    ANNOTATION_OBJECTIVE,
    ANNOTATION_OBSERVED,
    ANNOTATION_RUNBOOK_URL,
    ANNOTATION_SUMMARY,
    FORMAT_ALERTMANAGER,
    FORMAT_ALERTMANAGER_API,
    FORMAT_GENERIC,
    FORMAT_SLACK,
    GENERIC_PAYLOAD_VERSION,
    LABEL_ALERTNAME,
    LABEL_MODEL,
    LABEL_POOL,
    LABEL_SEVERITY,
    LABEL_SLO,
)

__all__ = [
    "API_ALERT_VALIDITY",
    "API_RESEND_INTERVAL",
    "API_RESOLVED_RETENTION",
    "CONTENT_TYPE",
    "FORMATS",
    "GO_ZERO_TIME",
    "SLACK_MAX_ALERTS",
    "alertmanager_webhook_payload",
    "go_json",
    "render",
    "render_alertmanager_api",
    "render_alertmanager_webhook",
    "render_generic",
    "render_slack",
    "rfc3339",
    "slack_escape",
]

#: Every format is JSON.
CONTENT_TYPE = "application/json"
#: What Go prints for a zero ``time.Time``: Alertmanager's ``endsAt`` of a firing alert.
GO_ZERO_TIME = "0001-01-01T00:00:00Z"

#: ``alertmanager_api``: firing alerts are re-posted at least this often (seconds), like
#: Prometheus's ``--rules.alert.resend-delay`` default. Alertmanager's ``resolve_timeout``
#: default is 5 minutes; the re-post keeps every firing alert alive well within it.
API_RESEND_INTERVAL = 60.0
#: ``alertmanager_api``: a firing alert's ``endsAt`` is this far after the post (seconds),
#: Prometheus's 4 x resend delay: if Vigil dies, Alertmanager resolves the alert by itself
#: after 4 minutes instead of showing it firing forever.
API_ALERT_VALIDITY = 4 * API_RESEND_INTERVAL
#: ``alertmanager_api``: a resolved alert is re-posted for this long after it resolved
#: (seconds), like Prometheus (15 minutes), so an Alertmanager that restarted in between
#: still learns about the resolution.
API_RESOLVED_RETENTION = 15 * 60.0

#: Slack: at most this many alerts get their own section (the message allows 50 blocks); the
#: rest are counted in a final "and N more" line.
SLACK_MAX_ALERTS = 20
_SLACK_TEXT_MAX = 3000
_SLACK_FIELD_MAX = 2000
_SLACK_FIELDS_MAX = 10
_SLACK_CONTEXT_MAX = 10


# --- shared helpers ---------------------------------------------------------------------
def rfc3339(ts: float | None) -> str:
    """Unix seconds as Go's RFC3339Nano in UTC: ``2026-11-30T03:19:24.21Z``.

    Trailing zeros of the fraction are dropped (and the dot with them), as Go prints
    ``time.Time``; None is Go's zero time. Floats carry about a microsecond at today's
    epoch, so the fraction is rounded to microseconds.
    """
    if ts is None:
        return GO_ZERO_TIME
    if not math.isfinite(ts):
        raise ValueError(f"not a finite timestamp: {ts!r}")
    micros = round(ts * 1_000_000)
    seconds, frac = divmod(micros, 1_000_000)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        text += "." + f"{frac:06d}".rstrip("0")
    return text + "Z"


def _human_time(ts: float) -> str:
    return datetime.fromtimestamp(math.floor(ts), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def go_json(value: Any, *, indent: int | None = None) -> bytes:
    """JSON bytes the way Go's ``encoding/json`` writes them (compact unless ``indent``).

    Go escapes ``<``, ``>`` and ``&`` (HTML safety) and U+2028/U+2029 inside strings and
    writes every other character as UTF-8. Those characters can only occur inside JSON
    strings, so replacing them in the serialized text is safe.
    """
    text = json.dumps(
        value,
        ensure_ascii=False,
        indent=indent,
        separators=(",", ": ") if indent is not None else (",", ":"),
        allow_nan=False,
    )
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text.encode("utf-8", "replace")


def _group_name(n: Notification) -> str:
    return (n.group_labels.get(LABEL_ALERTNAME) or n.common_labels.get(LABEL_ALERTNAME)
            or "alerts")


# --- generic ----------------------------------------------------------------------------
def _generic_alert(a: Alert) -> dict[str, Any]:
    return {
        "status": a.status,
        "fingerprint": a.fingerprint,
        "labels": dict(a.labels),
        "annotations": dict(a.annotations),
        "startsAt": rfc3339(a.starts_at),
        "endsAt": None if a.ends_at is None else rfc3339(a.ends_at),
        "generatorURL": a.generator_url,
    }


def render_generic(n: Notification, *, external_url: str = "") -> bytes:
    """Vigil's generic JSON (schema ``"version": "1"``; see docs/alerts.md)."""
    payload = {
        "version": GENERIC_PAYLOAD_VERSION,
        "source": "vigil",
        "receiver": n.route,
        "status": n.status,
        "reason": n.reason,
        "groupKey": n.group_key,
        "groupLabels": dict(n.group_labels),
        "commonLabels": n.common_labels,
        "commonAnnotations": n.common_annotations,
        "externalURL": external_url,
        "createdAt": rfc3339(n.created_at),
        "firing": len(n.firing),
        "resolved": len(n.resolved),
        "alerts": [_generic_alert(a) for a in n.alerts],
    }
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "replace"
    )


# --- Alertmanager webhook v4 ------------------------------------------------------------
def _am_alert(a: Alert) -> dict[str, Any]:
    # Field order of Alertmanager's template.Alert struct (the JSON keys follow it).
    return {
        "status": a.status,
        "labels": dict(a.labels),
        "annotations": dict(a.annotations),
        "startsAt": rfc3339(a.starts_at),
        "endsAt": rfc3339(a.ends_at),
        "generatorURL": a.generator_url,
        "fingerprint": a.fingerprint,
    }


def alertmanager_webhook_payload(n: Notification, *, external_url: str = "") -> dict[str, Any]:
    """The v4 webhook message as a dict, keys in Alertmanager's order (``webhook.Message``)."""
    return {
        "receiver": n.route,
        "status": n.status,
        "alerts": [_am_alert(a) for a in n.alerts],
        "groupLabels": dict(n.group_labels),
        "commonLabels": n.common_labels,
        "commonAnnotations": n.common_annotations,
        "externalURL": external_url,
        "version": ALERTMANAGER_WEBHOOK_VERSION,
        "groupKey": n.group_key,
        # Alertmanager's max_alerts (0 = unlimited) is not offered: nothing is truncated.
        "truncatedAlerts": 0,
    }


def render_alertmanager_webhook(n: Notification, *, external_url: str = "") -> bytes:
    """Alertmanager's webhook payload version 4, encoded as Alertmanager encodes it."""
    # json.Encoder.Encode in Go ends the document with a newline.
    return go_json(alertmanager_webhook_payload(n, external_url=external_url)) + b"\n"


# --- Alertmanager API v2 ----------------------------------------------------------------
def render_alertmanager_api(n: Notification, *, validity: float = API_ALERT_VALIDITY) -> bytes:
    """The body of ``POST /api/v2/alerts``: ``[{labels, annotations, startsAt, endsAt,
    generatorURL}]``.

    A firing alert's ``endsAt`` is ``n.created_at + validity`` (seconds); a resolved one's is
    its real end, never before its start (Alertmanager answers 400 to that).
    """
    out = []
    for a in n.alerts:
        end = n.created_at + validity if a.ends_at is None else max(a.ends_at, a.starts_at)
        item: dict[str, Any] = {
            "labels": dict(a.labels),
            "annotations": dict(a.annotations),
            "startsAt": rfc3339(a.starts_at),
            "endsAt": rfc3339(end),
        }
        # The API validates generatorURL as a URI: leave it out rather than send "".
        if a.generator_url:
            item["generatorURL"] = a.generator_url
        out.append(item)
    return go_json(out)


# --- Slack ------------------------------------------------------------------------------
def slack_escape(text: str) -> str:
    """Slack's three control characters as HTML entities (``&`` first)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(escaped: str, limit: int) -> str:
    """Cut escaped text to ``limit`` characters with an ellipsis, never inside an entity."""
    if len(escaped) <= limit:
        return escaped
    cut = escaped[: limit - 1]
    amp = cut.rfind("&")
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]  # a half "&amp;" would show as garbage
    return cut + "…"


def _slack_link(url: str, label: str) -> str:
    """``<url|label>``; a ``|`` or ``>`` in the URL would end the link early, so encode it."""
    safe = slack_escape(url.replace("|", "%7C"))
    return f"<{safe}|{slack_escape(label)}>"


def _mrkdwn(text: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": text}


def _slack_section_text(a: Alert) -> str:
    firing = a.firing
    head = ":red_circle: *FIRING*" if firing else ":large_green_circle: *RESOLVED*"
    summary = a.annotations.get(ANNOTATION_SUMMARY) or a.name or "alert"
    description = a.annotations.get(ANNOTATION_DESCRIPTION, "")
    when = (f"since {_human_time(a.starts_at)}" if firing else
            f"{_human_time(a.starts_at)} → {_human_time(a.ends_at or a.starts_at)}")
    tail = when
    if a.generator_url:
        link = _slack_link(a.generator_url, "Query")
        if len(link) < _SLACK_TEXT_MAX // 2:  # an absurd URL is dropped, not the text
            tail = f"{link} · {when}"
    # The links and times are kept whole; the free text is clipped to what is left.
    budget = _SLACK_TEXT_MAX - len(tail) - 1
    body = f"{head} {slack_escape(summary)}"
    if description:
        body += "\n" + slack_escape(description)
    return _clip(body, budget) + "\n" + tail


def _slack_fields(a: Alert, common: Mapping[str, str]) -> list[dict[str, str]]:
    pairs: list[tuple[str, str]] = []
    for name, title in ((LABEL_SLO, "SLO"), (LABEL_POOL, "Pool"), (LABEL_MODEL, "Model")):
        if name in a.labels:
            pairs.append((title, f"`{a.labels[name]}`"))
    # Other labels that differ between the alerts of the group identify this one.
    shown = {LABEL_SLO, LABEL_POOL, LABEL_MODEL, LABEL_ALERTNAME}
    for name, value in a.labels.items():
        if name not in shown and name not in common:
            pairs.append((name, f"`{value}`"))
    for name, title in ((ANNOTATION_OBSERVED, "Observed"), (ANNOTATION_OBJECTIVE, "Objective")):
        if name in a.annotations:
            pairs.append((title, a.annotations[name]))
    return [
        _mrkdwn(_clip(f"*{slack_escape(t)}*\n{slack_escape(v)}", _SLACK_FIELD_MAX))
        for t, v in pairs[:_SLACK_FIELDS_MAX]
    ]


def render_slack(n: Notification, *, external_url: str = "") -> bytes:
    """A Slack incoming-webhook message (``text`` + Block Kit ``blocks``) for ``n``."""
    name = _group_name(n)
    common = n.common_labels
    firing, resolved = n.firing, n.resolved
    if firing:
        title = f"[FIRING:{len(firing)}] {name}"
        icon = ":rotating_light:"
    else:
        title = f"[RESOLVED] {name}"
        icon = ":white_check_mark:"
    model = common.get(LABEL_MODEL)
    header = f"{icon} *{slack_escape(title)}*"
    if model:
        header += f" on `{slack_escape(model)}`"
    facts = [f"{k} `{slack_escape(common[k])}`" for k in (LABEL_POOL, LABEL_SLO) if k in common]
    if LABEL_SEVERITY in common:
        facts.append(f"severity *{slack_escape(common[LABEL_SEVERITY])}*")
    if firing and resolved:
        facts.append(f"{len(resolved)} resolved in this group")
    if facts:
        header += "\n" + " · ".join(facts)

    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": _mrkdwn(_clip(header, _SLACK_TEXT_MAX))},
        {"type": "divider"},
    ]
    for a in n.alerts[:SLACK_MAX_ALERTS]:
        section: dict[str, Any] = {"type": "section", "text": _mrkdwn(_slack_section_text(a))}
        fields = _slack_fields(a, common)
        if fields:
            section["fields"] = fields
        blocks.append(section)
    hidden = len(n.alerts) - SLACK_MAX_ALERTS
    if hidden > 0:
        blocks.append({"type": "section", "text": _mrkdwn(f"…and {hidden} more alerts")})
    blocks.append({"type": "divider"})

    links = []
    dashboard = n.common_annotations.get(ANNOTATION_DASHBOARD_URL) or external_url
    if dashboard:
        links.append(_slack_link(dashboard, "Dashboard"))
    runbook = n.common_annotations.get(ANNOTATION_RUNBOOK_URL)
    if runbook:
        links.append(_slack_link(runbook, "Runbook"))
    context = []
    if links:
        context.append(_mrkdwn(_clip(" · ".join(links), _SLACK_TEXT_MAX)))
    context.append(_mrkdwn(_clip(
        f"Vigil · route `{slack_escape(n.route)}` · {slack_escape(n.reason)} · "
        f"sent {_human_time(n.created_at)}", _SLACK_TEXT_MAX)))
    blocks.append({"type": "context", "elements": context[:_SLACK_CONTEXT_MAX]})

    summaries = [a.annotations.get(ANNOTATION_SUMMARY) or a.name for a in firing]
    text = title
    if model:
        text += f" {model}"
    if summaries:
        text += ": " + ", ".join(summaries)
    if firing and resolved:
        text += f"; {len(resolved)} resolved"
    payload = {"text": _clip(slack_escape(text), _SLACK_TEXT_MAX), "blocks": blocks}
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "replace"
    )


# --- dispatch ---------------------------------------------------------------------------
_RENDERERS: dict[str, Callable[..., bytes]] = {
    FORMAT_GENERIC: render_generic,
    FORMAT_SLACK: render_slack,
    FORMAT_ALERTMANAGER: render_alertmanager_webhook,
}

FORMATS: Sequence[str] = (FORMAT_GENERIC, FORMAT_SLACK, FORMAT_ALERTMANAGER,
                          FORMAT_ALERTMANAGER_API)


def render(n: Notification, fmt: str, *, external_url: str = "") -> bytes:
    """Render ``n`` in route format ``fmt`` (``generic``, ``slack``, ``alertmanager``,
    ``alertmanager_api``); ``external_url`` is Vigil's dashboard (Alertmanager's
    ``externalURL``)."""
    if fmt == FORMAT_ALERTMANAGER_API:
        return render_alertmanager_api(n)
    try:
        renderer = _RENDERERS[fmt]
    except KeyError:
        raise ValueError(f"unknown alert format {fmt!r} (known: {', '.join(FORMATS)})") from None
    return renderer(n, external_url=external_url)
