"""Serve one exposition file to many concurrent scrapers (for the collector benchmark).

``python bench/fixture_server.py FILE PORT``: an asyncio server in its own process with a deep
listen backlog (``http.server``'s backlog of 5 drops connections when 200 scrapers arrive at
once, which would measure the test server, not the collector).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path


async def main(path: Path, port: int) -> None:
    body = path.read_bytes()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                if not request:
                    break
                writer.write(head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
