"""A transport for uvicorn's HTTP protocol that sends an answer's writes together
(server/protocol.py serves over it).

uvicorn writes an answer's status line and headers when the app sends ``http.response.start``
and its body when it sends ``http.response.body``: two writes, so two TCP segments, and the
client is woken twice (on loopback the sender's ``send`` does the receiver's TCP work too).
For the small answers that make up most requests (a heartbeat's ``{"ok": true}``, a
long-poll's work) the second write cost as much as the first (py-spy of 5,000 nodes'
heartbeats, docs/SCALE.md). Here every write made in one turn of the event loop is held and
sent at the end of that turn with one ``writelines`` (one vectored write, no copy), so an
answer whose start and body are sent together, as every non-streaming answer's are, leaves
in one segment; a streaming answer's later chunks go as they come, one turn later at most.
"""

from __future__ import annotations

import asyncio


class CoalescingTransport:
    """A transport whose writes within one event-loop turn are sent together at its end.
    Everything else is the wrapped transport's; closing sends what is held first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if self._held:
            held, self._held = self._held, []
            if not self._transport.is_closing():
                self._transport.writelines(held)

    def send_now(self, data: bytes) -> None:
        """Write ``data`` now, after whatever is held: a whole answer, made in one piece."""
        self.flush()
        if not self._transport.is_closing():
            self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(d) for d in self._held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)

