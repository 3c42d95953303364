"""server/coalesce.py: an answer's writes in one event-loop turn leave together, in order,
and nothing held is lost when the connection closes. On real sockets and a real event loop."""

from __future__ import annotations

import asyncio
import socket

from shoal.server.coalesce import CoalescingTransport


class _Recording:
    """The real transport, with its write calls counted."""

    def __init__(self, transport) -> None:
        self.transport = transport
        self.calls: list[list[bytes]] = []

    def writelines(self, lines) -> None:
        self.calls.append(list(lines))
        self.transport.writelines(lines)

    def __getattr__(self, name):
        return getattr(self.transport, name)


async def _serve(script) -> tuple[bytes, list[list[bytes]]]:
    """A server whose connection runs ``script(transport)``; what a client read, and the writes."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    class Proto(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            rec = _Recording(transport)
            wrapped = CoalescingTransport(rec, loop)  # type: ignore[arg-type]
            loop.create_task(script(wrapped)).add_done_callback(lambda _: done.set_result(rec.calls))

    server = await loop.create_server(Proto, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    calls = await done
    data = b""
    client.settimeout(5)
    while chunk := await loop.run_in_executor(None, client.recv, 65536):
        data += chunk
    client.close()
    server.close()
    return data, calls


def test_writes_in_one_turn_leave_together_and_later_ones_apart():
    async def script(t) -> None:
        t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
        t.write(b"")  # nothing to send: no write of its own
        t.write(b"body")
        await asyncio.sleep(0.05)  # a streaming answer's next chunk, turns later
        t.write(b"more")
        t.close()  # held bytes go first

    data, calls = asyncio.run(_serve(script))
    assert data == b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbodymore"
    assert calls == [[b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n", b"body"], [b"more"]]


def test_closing_in_the_same_turn_sends_what_is_held():
    async def script(t) -> None:
        t.write(b"one")
        t.write(b"two")
        t.close()

    data, calls = asyncio.run(_serve(script))
    assert data == b"onetwo"
    assert calls == [[b"one", b"two"]]
