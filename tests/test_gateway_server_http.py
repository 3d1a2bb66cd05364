"""The one-write protocol's transport (server_http) and the task-less disconnect watch
(client_io.DisconnectWatch), on a real event loop."""

from __future__ import annotations

import asyncio
from typing import Any

from serving.gateway.front.client import DisconnectWatch
from serving.gateway.front.uvicorn_protocol import HttpToolsOneWrite, _HeadHeld, protocol

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "sockname" else None


def test_head_and_body_go_in_one_write() -> None:
    async def main() -> list[bytes]:
        t = _Transport()
        held = _HeadHeld(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        held.write(HEAD)
        assert t.writes == []
        held.write(b"{}")
        await asyncio.sleep(0)
        return t.writes
    assert asyncio.run(main()) == [HEAD + b"{}"]


def test_a_head_alone_goes_out_at_the_end_of_the_turn() -> None:
    async def main() -> list[bytes]:
        t = _Transport()
        held = _HeadHeld(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        held.write(HEAD)
        await asyncio.sleep(0)
        held.write(b"5\r\nhello\r\n")
        return t.writes
    assert asyncio.run(main()) == [HEAD, b"5\r\nhello\r\n"]


def test_close_writes_what_is_held_first() -> None:
    async def main() -> _Transport:
        t = _Transport()
        held = _HeadHeld(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        held.write(b"body bytes")  # not a head: straight through
        held.write(HEAD)
        held.close()
        await asyncio.sleep(0)
        return t
    t = asyncio.run(main())
    assert t.writes == [b"body bytes", HEAD] and t.closed


def test_protocol_choice() -> None:
    assert protocol("httptools") is HttpToolsOneWrite
    assert protocol("h11") == "h11"


def test_watch_cancels_its_task_when_the_client_leaves() -> None:
    async def main() -> tuple[bool, bool]:
        left = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await left.wait()
            return {"type": "http.disconnect"}

        async def work() -> bool:
            watch = DisconnectWatch(receive)
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if not watch.claim():
                    raise
                return True
            finally:
                watch.stop()
            return False

        task = asyncio.create_task(work())
        await asyncio.sleep(0)
        left.set()
        claimed = await task
        return claimed, task.cancelling() == 0
    assert asyncio.run(main()) == (True, True)


def test_stop_ends_the_watch_and_its_wait() -> None:
    async def main() -> tuple[list[str], int]:
        steps: list[str] = []
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            try:
                await never.wait()
            finally:
                steps.append("cleaned up")
            return {"type": "http.disconnect"}

        watch = DisconnectWatch(receive)
        await asyncio.sleep(0)
        watch.stop()
        never.set()  # too late: nobody is cancelled
        await asyncio.sleep(0.01)
        return steps, len(never._waiters)  # the Event forgot the withdrawn wait
    assert asyncio.run(main()) == (["cleaned up"], 0)


def test_a_receive_that_yields_bare_gets_a_task() -> None:
    async def main() -> bool:
        turns = 0

        async def receive() -> dict[str, Any]:
            nonlocal turns
            while turns < 3:
                turns += 1
                await asyncio.sleep(0)  # a bare yield, not a future
            return {"type": "http.disconnect"}

        async def work() -> bool:
            watch = DisconnectWatch(receive)
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                return watch.claim()
            finally:
                watch.stop()
            return False

        return await asyncio.wait_for(work(), 5)
    assert asyncio.run(main())
