"""Alert fingerprints and the four payload formats, checked against the fixtures."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from support.alerts import T0, alert
from support.loopback import FIXTURES

from alerts.formats import (
    API_ALERT_VALIDITY,
    GO_ZERO_TIME,
    SLACK_MAX_ALERTS,
    go_json,
    render,
    render_alertmanager_api,
    render_alertmanager_webhook,
    render_generic,
    render_slack,
    rfc3339,
    slack_escape,
)
from alerts.model import Alert, Notification, fingerprint, labelset_string

AM_FIXTURE = FIXTURES / "alertmanager_webhook_v4_example.json"
SLACK_FIXTURE = FIXTURES / "slack_incoming_webhook_example.json"


def _ts(text: str) -> float | None:
    if text == GO_ZERO_TIME:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _fixture_notification() -> tuple[dict[str, Any], Notification]:
    data = json.loads(AM_FIXTURE.read_text())
    alerts = [Alert(a["labels"], a["annotations"], _ts(a["startsAt"]), _ts(a["endsAt"]),
                    a["generatorURL"]) for a in data["alerts"]]
    n = Notification(route=data["receiver"], group_key=data["groupKey"],
                     group_labels=data["groupLabels"], alerts=tuple(reversed(alerts)),
                     created_at=T0, reason="new_alerts")
    return data, n


# --- fingerprints ---------------------------------------------------------------------------
def test_fingerprints_equal_alertmanagers() -> None:
    data = json.loads(AM_FIXTURE.read_text())
    for a in data["alerts"]:
        assert fingerprint(a["labels"]) == a["fingerprint"]
        assert Alert(a["labels"]).fingerprint == a["fingerprint"]


def test_fingerprint_of_escaped_characters_and_empty_set() -> None:
    # Seen from a real Alertmanager 0.25 (GET /api/v2/alerts) for this label set.
    labels = {"alertname": "SLOBurn", "severity": "page", "pool": "chat", "slo": "chat-ttft",
              "model": "m<&>"}
    assert fingerprint(labels) == "5305f83b567f43c0"
    # The empty label set is FNV-1a's offset basis, as in prometheus/common.
    assert fingerprint({}) == "cbf29ce484222325"


def test_alert_is_immutable_and_drops_empty_labels() -> None:
    labels = {"alertname": "X", "pool": "p", "empty": ""}
    a = Alert(labels)
    labels["pool"] = "changed"
    assert dict(a.labels) == {"alertname": "X", "pool": "p"}
    with pytest.raises(TypeError):
        a.labels["pool"] = "q"  # type: ignore[index]
    assert a.fingerprint == fingerprint({"alertname": "X", "pool": "p"})
    assert a.status == "firing" and a.resolved_at(T0).status == "resolved"
    assert Alert.from_dict(a.as_dict()) == a
    with pytest.raises(ValueError, match="invalid label name"):
        Alert({"bad-name": "x"})
    with pytest.raises(ValueError, match="at least one label"):
        Alert({})


def test_labelset_string_is_gos() -> None:
    assert labelset_string({"b": "2", "a": 'q"\\'}) == '{a="q\\"\\\\", b="2"}'


# --- timestamps -----------------------------------------------------------------------------
@pytest.mark.parametrize(("ts", "text"), [
    (1795000000.0, "2026-11-18T11:06:40Z"),
    (1795000000.21, "2026-11-18T11:06:40.21Z"),
    (1795000000.648, "2026-11-18T11:06:40.648Z"),
    (1795000000.000001, "2026-11-18T11:06:40.000001Z"),
    (None, "0001-01-01T00:00:00Z"),
])
def test_rfc3339_like_go(ts: float | None, text: str) -> None:
    assert rfc3339(ts) == text


# --- Alertmanager webhook v4 ----------------------------------------------------------------
def test_alertmanager_webhook_is_byte_exact_with_the_capture() -> None:
    data, n = _fixture_notification()
    body = render_alertmanager_webhook(n, external_url=data["externalURL"])
    # Alertmanager writes compact JSON with a final newline; the fixture is the same document
    # pretty-printed, which go_json(indent=2) reproduces byte for byte (Go's escapes included).
    assert body.endswith(b"}\n") and b"\n" not in body[:-1]
    assert json.loads(body) == data
    assert go_json(json.loads(body), indent=2) + b"\n" == AM_FIXTURE.read_bytes()
    assert b"\\u003c" in body and b"<" not in body and b"&" not in body


@dataclass(frozen=True)
class AmAlert:
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime | None
    generator_url: str
    fingerprint: str


@dataclass(frozen=True)
class AmMessage:
    version: str
    group_key: str
    truncated_alerts: int
    status: str
    receiver: str
    group_labels: dict[str, str]
    common_labels: dict[str, str]
    common_annotations: dict[str, str]
    external_url: str
    alerts: list[AmAlert]


_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z$")


def _str_map(v: Any) -> dict[str, str]:
    assert isinstance(v, dict) and all(isinstance(x, str) for x in (*v, *v.values()))
    return v


def _time(v: Any) -> datetime | None:
    assert isinstance(v, str) and _RFC3339.match(v), v
    return None if v == GO_ZERO_TIME else datetime.fromisoformat(v.replace("Z", "+00:00"))


def parse_alertmanager_webhook(body: bytes) -> AmMessage:
    """A receiver written against Alertmanager's payload: typed, strict on the fields it
    knows, ignoring the ones newer Alertmanagers add."""
    d = json.loads(body)
    assert d["version"] == "4"
    alerts = []
    for a in d["alerts"]:
        assert a["status"] in ("firing", "resolved")
        starts, ends = _time(a["startsAt"]), _time(a["endsAt"])
        assert starts is not None
        assert (ends is None) == (a["status"] == "firing")
        assert re.fullmatch(r"[0-9a-f]{16}", a["fingerprint"])
        alerts.append(AmAlert(a["status"], _str_map(a["labels"]), _str_map(a["annotations"]),
                              starts, ends, str(a["generatorURL"]), a["fingerprint"]))
    assert isinstance(d["truncatedAlerts"], int) and isinstance(d["groupKey"], str)
    return AmMessage(d["version"], d["groupKey"], d["truncatedAlerts"], d["status"],
                     d["receiver"], _str_map(d["groupLabels"]), _str_map(d["commonLabels"]),
                     _str_map(d["commonAnnotations"]), d["externalURL"], alerts)


def test_alertmanager_receiver_parses_fixture_and_ours() -> None:
    fixture = parse_alertmanager_webhook(AM_FIXTURE.read_bytes())
    assert [a.status for a in fixture.alerts] == ["firing", "firing", "resolved"]
    n = Notification(
        route="vigil-page", group_key='{}/{severity="page"}:{alertname="SLOBurnRate"}',
        group_labels={"alertname": "SLOBurnRate"},
        alerts=(alert(pool="chat", starts_at=T0 + 0.5),
                alert(pool="batch", starts_at=T0, ends_at=T0 + 90.25)),
        created_at=T0 + 100, reason="resolved")
    ours = parse_alertmanager_webhook(render_alertmanager_webhook(n, external_url="http://v"))
    assert ours.status == "firing" and ours.receiver == "vigil-page"
    # Alertmanager's order: label sets compared name by name (pool "batch" < "chat").
    assert [a.labels["pool"] for a in ours.alerts] == ["batch", "chat"]
    assert [a.fingerprint for a in ours.alerts] == [a.fingerprint for a in n.alerts]
    assert ours.common_labels == {"alertname": "SLOBurnRate", "model": "llama",
                                  "severity": "page", "slo": "chat-ttft"}
    assert set(ours.common_annotations) == {"description"}
    assert ours.alerts[0].ends_at is not None and ours.alerts[1].ends_at is None


# --- generic --------------------------------------------------------------------------------
def test_generic_schema() -> None:
    n = Notification(route="r", group_key="{}/{}:{}", group_labels={},
                     alerts=(alert(), alert(slo="chat-e2e", ends_at=T0 + 60)),
                     created_at=T0 + 61, reason="resolved")
    d = json.loads(render_generic(n, external_url="http://dash"))
    assert list(d) == ["version", "source", "receiver", "status", "reason", "groupKey",
                       "groupLabels", "commonLabels", "commonAnnotations", "externalURL",
                       "createdAt", "firing", "resolved", "alerts"]
    assert d["version"] == "1" and d["status"] == "firing"
    assert (d["firing"], d["resolved"]) == (1, 1)
    firing = next(a for a in d["alerts"] if a["status"] == "firing")
    resolved = next(a for a in d["alerts"] if a["status"] == "resolved")
    assert firing["endsAt"] is None and resolved["endsAt"] == rfc3339(T0 + 60)
    assert set(firing) == {"status", "fingerprint", "labels", "annotations", "startsAt",
                           "endsAt", "generatorURL"}
    assert d["createdAt"] == rfc3339(T0 + 61)


# --- Alertmanager API v2 --------------------------------------------------------------------
def test_alertmanager_api_body() -> None:
    bare = Alert({"alertname": "X"}, starts_at=T0)
    n = Notification(route="am", group_key="{}/{}", group_labels={},
                     alerts=(alert(), alert(slo="b", ends_at=T0 + 5), bare),
                     created_at=T0 + 10, reason="snapshot", snapshot=True)
    items = json.loads(render_alertmanager_api(n))
    assert isinstance(items, list) and len(items) == 3
    by_slo = {i["labels"].get("slo"): i for i in items}
    assert set(by_slo["chat-ttft"]) == {"labels", "annotations", "startsAt", "endsAt",
                                        "generatorURL"}
    assert by_slo["chat-ttft"]["endsAt"] == rfc3339(T0 + 10 + API_ALERT_VALIDITY)
    assert by_slo["b"]["endsAt"] == rfc3339(T0 + 5)
    assert "generatorURL" not in by_slo[None]  # an empty URL fails the API's validation
    assert render(n, "alertmanager_api") == render_alertmanager_api(n)


# --- Slack ----------------------------------------------------------------------------------
def check_slack_limits(payload: dict[str, Any]) -> None:
    """Slack's documented Block Kit limits, and escaped text everywhere."""
    assert isinstance(payload["text"], str) and payload["text"]
    blocks = payload["blocks"]
    assert 1 <= len(blocks) <= 50
    texts = [payload["text"]]
    for b in blocks:
        assert b["type"] in ("section", "divider", "context")
        if b["type"] == "section":
            assert b["text"]["type"] == "mrkdwn" and len(b["text"]["text"]) <= 3000
            texts.append(b["text"]["text"])
            fields = b.get("fields", [])
            assert len(fields) <= 10
            for f in fields:
                assert f["type"] == "mrkdwn" and len(f["text"]) <= 2000
                texts.append(f["text"])
        if b["type"] == "context":
            assert 1 <= len(b["elements"]) <= 10
            for e in b["elements"]:
                assert len(e["text"]) <= 3000
                texts.append(e["text"])
    for t in texts:
        # Outside <url|label> links, no raw < or >; every & starts an entity.
        bare = re.sub(r"<[^<>|]+\|[^<>]*>", "", t)
        assert "<" not in bare and ">" not in bare, t
        assert re.fullmatch(r"([^&]|&(amp|lt|gt);)*", t, re.S), t


def test_fixture_obeys_slack_limits() -> None:
    check_slack_limits(json.loads(SLACK_FIXTURE.read_text()))


def test_slack_has_the_fixtures_shape() -> None:
    fixture = json.loads(SLACK_FIXTURE.read_text())
    data, n = _fixture_notification()
    payload = json.loads(render_slack(n, external_url=data["externalURL"]))
    check_slack_limits(payload)
    assert set(payload) == set(fixture)
    assert [b["type"] for b in payload["blocks"]] == [b["type"] for b in fixture["blocks"]]
    assert payload["text"].startswith("[FIRING:2] VigilSLOViolation")
    assert "&lt; 0.5%" in payload["text"] and "1 resolved" in payload["text"]
    first, *alerts, _, ctx = payload["blocks"][:1] + payload["blocks"][2:]
    assert first["text"]["text"].startswith(":rotating_light: *[FIRING:2] VigilSLOViolation*")
    assert "1 resolved in this group" in first["text"]["text"]
    heads = [a["text"]["text"].split("\n")[0] for a in alerts]
    assert [h.split(" ")[0] for h in heads] == [":red_circle:", ":red_circle:",
                                                ":large_green_circle:"]
    assert "(SLO &lt; 0.5%)" in heads[0]
    # The generator link keeps its query string, with & escaped inside the link.
    assert "&amp;g0.tab=1|Query>" in alerts[0]["text"]["text"]
    assert "*SLO*\n`error_rate`" in [f["text"] for f in alerts[0]["fields"]]
    assert "|Dashboard>" in ctx["elements"][0]["text"]
    assert "|Runbook>" in ctx["elements"][0]["text"]


def test_slack_escapes_and_clips() -> None:
    nasty = "a < b & c > d " * 500  # 7000 characters before escaping
    many_labels = {f"l{i}": "v" * 3000 for i in range(15)}
    big = Alert({"alertname": "Big", "pool": "p<", **many_labels},
                {"summary": "<!channel> & friends", "description": nasty,
                 "observed": "1.42 s", "objective": "< 0.8 s"},
                starts_at=T0, generator_url="http://x/?a=1&b=<2>|3")
    other = Alert({"alertname": "Big", "pool": "q", **{k: "w" for k in many_labels}},
                  starts_at=T0)
    n = Notification(route="r", group_key="k", group_labels={"alertname": "Big"},
                     alerts=(big, other), created_at=T0, reason="first")
    payload = json.loads(render_slack(n))
    check_slack_limits(payload)
    section = next(b for b in payload["blocks"]
                   if "&lt;!channel&gt;" in b.get("text", {}).get("text", ""))
    text = section["text"]["text"]
    assert "…" in text and len(text) <= 3000
    assert "<http://x/?a=1&amp;b=&lt;2&gt;%7C3|Query>" in text  # the link survives clipping
    assert len(section["fields"]) == 10
    assert slack_escape("<&>") == "&lt;&amp;&gt;"


def test_slack_caps_the_number_of_alerts() -> None:
    alerts = tuple(alert(slo=f"s{i:03d}") for i in range(SLACK_MAX_ALERTS + 30))
    n = Notification(route="r", group_key="k", group_labels={}, alerts=alerts,
                     created_at=T0, reason="first")
    payload = json.loads(render_slack(n))
    check_slack_limits(payload)
    assert any("…and 30 more alerts" in b.get("text", {}).get("text", "")
               for b in payload["blocks"])


def test_slack_all_resolved() -> None:
    n = Notification(route="r", group_key="k", group_labels={"alertname": "SLOBurnRate"},
                     alerts=(alert(ends_at=T0 + 1),), created_at=T0 + 2, reason="all_resolved")
    payload = json.loads(render(n, "slack"))
    assert payload["text"].startswith("[RESOLVED] SLOBurnRate")
    assert payload["blocks"][0]["text"]["text"].startswith(":white_check_mark:")


def test_unknown_format() -> None:
    n = Notification(route="r", group_key="k", group_labels={}, alerts=(alert(),),
                     created_at=T0, reason="first")
    with pytest.raises(ValueError, match="unknown alert format"):
        render(n, "xml")
