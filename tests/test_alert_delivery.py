"""Delivery through the notifier to real HTTP receivers on 127.0.0.1, on an injected clock."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import random
import threading
from collections import defaultdict
from pathlib import Path

import httpx
from support.alerts import T0, Request, alert, config, receiver, route
from support.loopback import free_port

from alerts.delivery import verify
from alerts.notifier import DeliveryRound, Notifier, read_status, redact_url
from vigil.clock import ManualClock
from vigil.config import Config


def make(tmp_path: Path, cfg: Config, clock: ManualClock, **kw: object) -> Notifier:
    return Notifier(cfg, tmp_path / "outbox.db", clock=clock, rng=random.Random(1), **kw)


def deliver(n: Notifier, clock: ManualClock) -> DeliveryRound:
    return asyncio.run(n.deliver_due(clock.now))


def old_alert(**kw: object) -> object:
    # Started long before T0: its group is flushed at once (no group_wait), as Alertmanager.
    return alert(starts_at=T0 - 3600, **kw)  # type: ignore[arg-type]


def test_headers_signature_and_body(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        cfg = config(route(rec.url, secret_env="HOOK_SECRET"))
        n = make(tmp_path, cfg, clock, env={"HOOK_SECRET": "s3cr3t"})
        [item] = n.process(T0, [old_alert()])
        rnd = deliver(n, clock)
        assert (rnd.delivered, rnd.failed) == (1, 0)
        [req] = rec.requests
        assert req.path == "/hook" and req.body == item.body
        assert req.headers["content-type"] == "application/json"
        assert req.headers["idempotency-key"] == item.key
        assert req.headers["x-vigil-attempt"] == "1"
        assert req.headers["user-agent"].startswith("vigil-notifier/")
        signature = req.headers["x-vigil-signature"]
        expected = hmac.new(b"s3cr3t", req.body, hashlib.sha256).hexdigest()
        assert signature == f"sha256={expected}"
        assert verify(req.body, "s3cr3t", signature)
        assert not verify(req.body + b" ", "s3cr3t", signature)
        assert not verify(req.body, "other", signature)
        assert n.outbox.get(item.id).status == "done"
        n.close()


def test_unsigned_without_secret_env(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        n = make(tmp_path, config(route(rec.url)), clock)
        n.process(T0, [old_alert()])
        deliver(n, clock)
        assert "x-vigil-signature" not in rec.requests[0].headers
        n.close()


def test_missing_secret_is_a_visible_failure(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        n = make(tmp_path, config(route(rec.url, secret_env="NOPE")), clock, env={})
        [item] = n.process(T0, [old_alert()])
        rnd = deliver(n, clock)
        assert rec.requests == []  # never sent unsigned
        assert "NOPE" in rnd.failures[item.id]
        row = n.outbox.get(item.id)
        assert row.status == "pending" and "NOPE" in (row.last_error or "")
        assert n.counters().failed_attempts["hook"] == 1
        n.close()


def test_outage_of_ten_minutes_then_everything_in_order_once(tmp_path: Path) -> None:
    """The receiver answers 500 for the first 10 minutes; afterwards it gets every
    notification, in order within each group, each accepted exactly once; retries repeat the
    idempotency key, different notifications never share one."""
    clock = ManualClock(T0)

    def down_for_ten_minutes(_: Request) -> tuple[int, bytes]:
        return (500, b"maintenance") if clock.now < T0 + 600 else (200, b"ok")

    def active(t: float) -> list:  # type: ignore[type-arg]
        s = t - T0
        out = []
        if s < 900:
            out.append(alert(slo="s1", starts_at=T0))
        if 100 <= s < 400:
            out.append(alert(slo="s2", starts_at=T0 + 100))
        if 200 <= s < 700:
            out.append(alert(slo="s1", model="other", starts_at=T0 + 200))
        if s >= 650:
            out.append(alert(slo="s3", starts_at=T0 + 650))
        return out

    with receiver(down_for_ten_minutes) as rec:
        cfg = config(route(rec.url, group_wait=10, group_interval=60, repeat_interval=240))
        n = make(tmp_path, cfg, clock)
        while clock.now < T0 + 3000:
            n.process(clock.now, active(clock.now))
            deliver(n, clock)
            clock.advance(10)
        rows = n.outbox.items()
        assert len(rows) >= 10 and all(r.status == "done" for r in rows)
        by_key = {r.key: r for r in rows}
        assert len(by_key) == len(rows)  # one key per notification

        accepted = rec.accepted()
        assert sorted(r.key for r in accepted) == sorted(by_key)  # each exactly once
        assert rec.deduped() == accepted
        for group in {r.group_key for r in rows}:
            seqs = [by_key[r.key].seq for r in accepted if by_key[r.key].group_key == group]
            assert seqs == sorted(seqs) == list(range(1, len(seqs) + 1))

        failed = [r for r in rec.requests if r.status == 500]
        assert failed and {r.key for r in failed} <= set(by_key)
        attempts: dict[str, list[int]] = defaultdict(list)
        for r in rec.requests:
            attempts[r.key].append(r.attempt)
        for key, seen in attempts.items():
            assert seen == list(range(1, len(seen) + 1))  # same key, attempt 1, 2, 3...
            assert by_key[key].attempts == len(seen)
        resolved = [json.loads(r.body) for r in accepted if json.loads(r.body)["resolved"]]
        assert resolved  # the resolutions of s2 and of the second s1 alert got through
        c = n.counters()
        assert c.delivered["hook"] == len(rows) and c.failed_attempts["hook"] == len(failed)
        assert c.queue_depth == 0 and c.oldest_undelivered_age == 0.0
        n.close()


def test_timeout_is_a_failure_then_retried(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    release = threading.Event()
    calls = []

    def stall_first(_: Request) -> tuple[int, bytes]:
        calls.append(1)
        if len(calls) == 1:
            release.wait(5)
        return 200, b"ok"

    with receiver(stall_first) as rec:
        n = make(tmp_path, config(route(rec.url, timeout=0.3)), clock)
        [item] = n.process(T0, [old_alert()])
        rnd = deliver(n, clock)
        release.set()
        assert rnd.failures[item.id] == "timeout after 0.3 s"
        clock.advance(10)
        assert deliver(n, clock).delivered == 1
        assert [r.attempt for r in rec.requests] == [1, 2]
        assert {r.key for r in rec.requests} == {item.key}
        n.close()


def test_redirect_and_refused_connection_are_failures(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver(lambda _: (302, b"")) as rec:
        n = make(tmp_path, config(route(rec.url)), clock)
        [item] = n.process(T0, [old_alert()])
        reason = deliver(n, clock).failures[item.id]
        assert reason.startswith("HTTP 302") and "not followed" in reason
        n.close()
    dead = f"http://127.0.0.1:{free_port()}/hook"
    n = Notifier(config(route(dead)), tmp_path / "other.db", clock=clock)
    [item] = n.process(T0, [old_alert()])
    assert deliver(n, clock).failures[item.id].startswith("cannot connect")
    n.close()


def test_error_body_is_part_of_the_reason(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver(lambda _: (400, b"invalid_payload")) as rec:
        n = make(tmp_path, config(route(rec.url)), clock)
        [item] = n.process(T0, [old_alert()])
        assert deliver(n, clock).failures[item.id] == "HTTP 400: invalid_payload"
        n.close()


def test_max_age_gives_up_counts_and_moves_on(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    healthy = threading.Event()

    def flaky(_: Request) -> tuple[int, bytes]:
        return (200, b"ok") if healthy.is_set() else (500, b"boom")

    with receiver(flaky) as rec:
        cfg = config(route(rec.url, group_interval=60, repeat_interval=10_000), max_age=600)
        n = make(tmp_path, cfg, clock)
        [first] = n.process(T0, [old_alert()])
        while clock.now <= T0 + 660:
            deliver(n, clock)
            clock.advance(30)
        assert n.outbox.get(first.id).status == "given_up"
        assert n.counters().given_up["hook"] == 1
        status = n.status()
        assert status["outbox"]["given_up"] == 1
        [gone] = status["outbox"]["given_up_items"]
        assert gone["key"] == first.key and "boom" in gone["last_error"]
        # The group is not blocked: its next notification goes through.
        healthy.set()
        [second] = n.process(clock.now, [old_alert(), old_alert(model="x")])
        assert second.group_key == first.group_key and second.seq == 2
        assert deliver(n, clock).delivered == 1
        assert rec.accepted()[-1].key == second.key
        n.close()


def test_crash_after_enqueue_restart_delivers_and_never_resends(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        cfg = config(route(rec.url))
        first = make(tmp_path, cfg, clock)
        [queued] = first.process(T0, [old_alert()])
        first.close()  # "crash": enqueued, never delivered
        second = make(tmp_path, cfg, clock)
        assert deliver(second, clock).delivered == 1
        assert [r.key for r in rec.requests] == [queued.key]
        second.close()
        third = make(tmp_path, cfg, clock)
        clock.advance(86_400)
        assert deliver(third, clock).delivered == 0
        assert len(rec.requests) == 1  # an acknowledged notification is never sent again
        third.close()


def test_crash_during_an_attempt_resends_with_the_same_key(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        cfg = config(route(rec.url))
        first = make(tmp_path, cfg, clock)
        [queued] = first.process(T0, [old_alert()])
        assert first.outbox.begin_attempt(queued.id, T0) == 1  # ...and the process dies
        first.close()
        second = make(tmp_path, cfg, clock)
        deliver(second, clock)
        [req] = rec.requests
        assert req.key == queued.key and req.attempt == 2
        second.close()


def test_groups_are_concurrent_and_each_group_sequential(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    lock = threading.Lock()
    in_flight: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    other_group_seen = threading.Event()
    overlapped = []

    def track(req: Request) -> tuple[int, bytes]:
        group = req.json()["groupKey"]
        with lock:
            in_flight[group] += 1
            peak[group] = max(peak[group], in_flight[group])
        if "s1" in group:
            # Held until a request of the other group arrives: proves groups run in parallel.
            overlapped.append(other_group_seen.wait(5))
        else:
            other_group_seen.set()
        with lock:
            in_flight[group] -= 1
        return 200, b"ok"

    with receiver(track) as rec:
        cfg = config(route(rec.url, group_interval=60))
        n = make(tmp_path, cfg, clock)
        # Three notifications per group queued while nothing is delivered.
        n.process(T0, [old_alert(slo="s1"), old_alert(slo="s2")])
        n.process(T0 + 60, [old_alert(slo="s1", model="b"), old_alert(slo="s2", model="b")])
        n.process(T0 + 120, [old_alert(slo="s1"), old_alert(slo="s2")])
        clock.now = T0 + 120
        assert n.counters().queue_depth == 6
        assert deliver(n, clock).delivered == 6
        assert overlapped and overlapped[0] is True
        assert set(peak.values()) == {1}
        rows = {r.key: r for r in n.outbox.items()}
        for group in {r.group_key for r in rows.values()}:
            seqs = [rows[r.key].seq for r in rec.requests if rows[r.key].group_key == group]
            assert seqs == [1, 2, 3]
        n.close()


def test_current_route_settings_apply_to_queued_notifications(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    dead = f"http://127.0.0.1:{free_port()}/hook"
    first = make(tmp_path, config(route(dead)), clock)
    [queued] = first.process(T0, [old_alert()])
    deliver(first, clock)
    first.close()
    with receiver() as rec:  # the URL was fixed in the config and vigil restarted
        second = make(tmp_path, config(route(rec.url)), clock)
        clock.advance(60)
        assert deliver(second, clock).delivered == 1
        assert rec.requests[0].key == queued.key and rec.requests[0].attempt == 2
        second.close()


def test_status_counters_and_read_status(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with receiver() as rec:
        url = rec.url + "?token=SECRET"
        cfg = config(route(url), route(url, name="pages", match={"severity": "page"}))
        n = make(tmp_path, cfg, clock)
        n.process(T0, [old_alert(), old_alert(severity="ticket", slo="x")])
        status = n.status()
        text = json.dumps(status)
        assert "SECRET" not in text
        assert [a["labels"]["slo"] for a in status["firing"]] == ["chat-ttft", "x"]
        assert status["firing"][0]["routes"] == ["hook"]
        assert status["outbox"]["pending"] == 2 and len(status["outbox"]["pending_items"]) == 2
        assert status["routes"][0]["url"] == f"http://127.0.0.1:{rec.url.split(':')[2]}"[
            :-len("/hook")] + "/…"
        assert len(status["groups"]) == 2
        assert status["counters"]["enqueued"]["total"] == 2
        deliver(n, clock)
        c = n.counters().as_dict()
        assert c["delivered"]["total"] == 2 and c["queue_depth"] == 0
        other = read_status(tmp_path / "outbox.db", now=T0)
        assert other["outbox"]["done"] == 2 and len(other["firing"]) == 2
        assert json.dumps(other)
        n.close()
    missing = tmp_path / "none.db"
    assert read_status(missing)["outbox"]["pending"] == 0 and not missing.exists()


def test_redact_url() -> None:
    assert redact_url("https://hooks.slack.com/services/T0/B0/XXXX") == "https://hooks.slack.com/…"
    assert redact_url("http://user:pw@127.0.0.1:9093/") == "http://127.0.0.1:9093"
    assert redact_url("http://127.0.0.1:9093/api/v2/alerts") == "http://127.0.0.1:9093/…"


def test_the_docs_signature_snippet_verifies_real_requests(tmp_path: Path) -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "alerts.md").read_text()
    marker = docs.index("<!-- signature-snippet")
    code = docs[marker:].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/alerts.md", "exec"), namespace)
    verify_doc = namespace["verify_vigil_signature"]
    clock = ManualClock(T0)
    with receiver() as rec:
        n = make(tmp_path, config(route(rec.url, secret_env="K")), clock, env={"K": "k3y"})
        n.process(T0, [old_alert()])
        deliver(n, clock)
        [req] = rec.requests
        header = req.headers["x-vigil-signature"]
        assert verify_doc(req.body, header, "k3y")  # type: ignore[operator]
        assert not verify_doc(req.body, header, "wrong")  # type: ignore[operator]
        assert not verify_doc(req.body[:-1], header, "k3y")  # type: ignore[operator]
        assert not verify_doc(req.body, None, "k3y")  # type: ignore[operator]
        n.close()


def test_an_unexpected_transport_error_is_a_failed_attempt(tmp_path: Path) -> None:
    def explode(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("transport bug")

    clock = ManualClock(T0)
    n = make(tmp_path, config(route("http://127.0.0.1:9/hook")), clock,
             transport=httpx.MockTransport(explode))
    [item] = n.process(T0, [old_alert()])
    assert deliver(n, clock).failures[item.id] == "unexpected error (RuntimeError): transport bug"
    row = n.outbox.get(item.id)
    assert row.status == "pending" and row.inflight_since is None  # the group is not blocked
    n.close()
