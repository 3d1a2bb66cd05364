"""The suite's own plumbing: the required-binary policy and the loopback HTTP server."""

from __future__ import annotations

import threading

import conftest
import httpx
import pytest
from conftest import in_ci, require_binary
from support.loopback import LoopbackServer, Request, by_path, serve_http, text

MISSING = "vigil-no-such-program"


@pytest.fixture
def no_record(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fresh record of missing programs, so that this module's made-up program does not
    show in the session summary."""
    missing: dict[str, str] = {}
    monkeypatch.setattr(conftest, "_MISSING", missing)
    return missing


@pytest.mark.parametrize(("value", "ci"), [("true", True), ("1", True), ("YES", True),
                                           ("", False), ("0", False), ("false", False)])
def test_ci_is_a_true_value(monkeypatch: pytest.MonkeyPatch, value: str, ci: bool) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci() is ci


def test_a_present_binary_is_found_on_path() -> None:
    assert require_binary("sh").endswith("/sh")


def test_a_missing_binary_skips_with_the_install_command(
        monkeypatch: pytest.MonkeyPatch, no_record: dict[str, str]) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install some-package"):
        require_binary(MISSING, apt="some-package")
    assert no_record == {MISSING: "apt-get install some-package"}


def test_a_missing_binary_fails_under_ci(monkeypatch: pytest.MonkeyPatch,
                                         no_record: dict[str, str]) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=rf"\(apt-get install {MISSING}\); CI must"):
        require_binary(MISSING)
    assert MISSING in no_record


def test_the_server_records_every_request_and_answers_with_respond(
        http_server: LoopbackServer) -> None:
    http_server.respond = lambda req: (201, "application/json", b'{"got": "%s"}' % req.body)
    r = httpx.post(http_server.url + "/x?y=1", content=b"hi", headers={"X-Token": "t"})
    assert (r.status_code, r.json()) == (201, {"got": "hi"})
    [req] = http_server.recorded()
    assert (req.method, req.path, req.body, req.status) == ("POST", "/x?y=1", b"hi", 201)
    assert req.headers["x-token"] == "t"
    http_server.clear()
    assert http_server.recorded() == []


def test_routes_by_path_and_404_elsewhere() -> None:
    with serve_http(by_path({"/metrics": text("up 1\n")})) as server:
        assert httpx.get(server.url + "/metrics").text == "up 1\n"
        assert httpx.get(server.url + "/other").status_code == 404


def test_closing_wakes_a_stalled_responder() -> None:
    woke = threading.Event()

    def stall(_: Request) -> tuple[int, str, bytes]:
        if server.closing.wait(30):
            woke.set()
        return 503, "text/plain", b""

    with serve_http(stall) as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(server.url, timeout=0.2)
        assert server.recorded()[0].status == 0  # recorded before it was answered
    assert woke.wait(5)
