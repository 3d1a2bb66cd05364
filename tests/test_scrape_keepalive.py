"""A kept-alive connection the server closes as it is reused: the scrape is retried once on a
new connection (as Go's http.Transport does for Prometheus), not reported as a down target."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from collector.scrape import fetch
from vigil.errors import ScrapeError

BODY = b"# TYPE up_total counter\nup_total 1\n"


async def _scrapes(answers_per_connection: int, times: int) -> tuple[list[bytes], int]:
    """Scrape ``times`` times over one client from a server on 127.0.0.1 that answers the
    first ``answers_per_connection`` requests of each connection, then closes it on the next
    request without a byte (a keep-alive timeout racing the client's reuse)."""
    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        n = 0
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                if n >= answers_per_connection:
                    break  # close without answering
                n += 1
                served += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                             b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            bodies = [(await fetch(client, url, timeout=5, max_body_bytes=10_000,
                                   target="t"))[0] for _ in range(times)]
    finally:
        server.close()
        await server.wait_closed()
    return bodies, served


def test_a_reused_connection_closed_by_the_server_is_retried_once() -> None:
    bodies, served = asyncio.run(_scrapes(answers_per_connection=1, times=3))
    assert bodies == [BODY] * 3
    assert served == 3  # each on a new connection after the server closed the last one


def test_a_server_that_never_answers_is_still_an_error() -> None:
    with pytest.raises(ScrapeError, match="Server disconnected without sending a response"):
        asyncio.run(_scrapes(answers_per_connection=0, times=1))
