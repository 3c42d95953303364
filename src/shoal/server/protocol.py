"""The server's HTTP protocol: uvicorn's, with an answer's writes sent together and the quick
answers made as the request is parsed.

- Writes: every answer goes over a CoalescingTransport (server/coalesce.py), so an answer's
  status line, headers and body leave in one segment.
- Quick answers: a fast route may name a quick answer (``endpoints``: ``quick=``, an idle
  node's heartbeat: server/agents.quiet_report), a plain function of the path's parameters,
  the headers and the body. uvicorn makes every request an ASGI cycle: a scope, an event, a
  task, the app's coroutines and two ``send`` messages, several times the quick answer's own
  work. At 5,000 nodes the heartbeats are 250 requests a second, each arriving alone to a
  sleeping event loop, and that cycle was most of their cost (docs/SCALE.md, "Heartbeat
  handling"). Here a request whose method and path have a quick answer is kept by the protocol
  until its body is complete, and the answer is written straight away: no cycle, no task. When
  the quick answer gives None (a report with news), or the request is anything but a plain
  HTTP/1.1 keep-alive request with a body of bounded size and none queued before it, the request
  goes to the app as uvicorn would have given it, and the app's fast route does not try the
  quick answer again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from shoal.server import fastpath
from shoal.server.auth import AuthError
from shoal.server.coalesce import CoalescingTransport
from shoal.server.jobs import JobError

log = logging.getLogger("shoal.server")

QUICK_BODY_LIMIT = 64 * 1024
"""A body over this goes to the app: quick answers are for small requests (a heartbeat's is
under a kilobyte)."""


@dataclass(slots=True)
class _Held:
    """A request the protocol keeps until its body is complete, to answer it itself."""

    answer: fastpath.Quick
    params: dict[str, str]
    method: str
    template: str
    t0: float
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0


class ServerProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a CoalescingTransport, answering the quick routes of
    ``paths`` itself (none by default: the class ``serving`` makes sets them)."""

    paths: fastpath.FastPaths | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._held: _Held | None = None

    def on_headers_complete(self) -> None:
        if self.paths is not None and (held := self._quick_route()) is not None:
            self._held = held
            return
        super().on_headers_complete()

    def _quick_route(self) -> _Held | None:
        """The quick answer for this request, if it is one the protocol may answer itself."""
        parser = self.parser
        if self.pipeline or (self.cycle is not None and not self.cycle.response_complete) \
                or self.expect_100_continue or parser.get_http_version() != "1.1" \
                or not parser.should_keep_alive() or parser.should_upgrade():
            return None
        path = httptools.parse_url(self.url).path
        if b"%" in path:
            return None
        method = parser.get_method().decode("ascii")
        found = self.paths.routes.match_quick(method, path.decode("ascii"))  # type: ignore[union-attr]
        if found is None:
            return None
        answer, params, template = found
        return _Held(answer, params, method, template, time.perf_counter())

    def on_body(self, body: bytes) -> None:
        if self._held is None:
            return super().on_body(body)
        held = self._held
        held.chunks.append(body)
        held.size += len(body)
        if held.size > QUICK_BODY_LIMIT:
            self._to_app(b"".join(held.chunks), more_body=True)

    def on_message_complete(self) -> None:
        if self._held is None:
            return super().on_message_complete()
        held = self._held
        body = b"".join(held.chunks)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.headers}
        try:
            out = held.answer(held.params, headers, body)
        except (AuthError, JobError) as e:  # as the fast path and the app's handlers answer them
            out = fastpath.json_answer({"detail": e.message}, e.status)
        except Exception:  # said here, and the route answers as it would have
            log.exception("the quick answer to %s %s failed", held.method, held.template)
            out = None
        if out is None:
            self.scope[fastpath.QUICK_TRIED] = True  # type: ignore[literal-required]
            self._to_app(body, more_body=False)
            return
        self._held = None
        status, extra, content = out
        head = [STATUS_LINE[status]]
        for name, value in [*self.server_state.default_headers, (b"content-length", b"%d" % len(content)), *extra]:
            head += (name, b": ", value, b"\r\n")
        head += (b"\r\n", content)
        self.transport.send_now(b"".join(head))  # type: ignore[attr-defined]
        self.on_response_complete()  # the keep-alive timer armed, as after any answer
        if (observe := self.paths.observe) is not None:  # type: ignore[union-attr]
            observe(held.method, held.template, status, time.perf_counter() - held.t0)

    def _to_app(self, body: bytes, more_body: bool) -> None:
        """Hand the held request to the app as uvicorn would have, its body so far given."""
        self._held = None
        super().on_headers_complete()
        self.cycle.body = bytearray(body)
        self.cycle.more_body = more_body
        self.cycle.message_event.set()


def serving(paths: fastpath.FastPaths) -> type[ServerProtocol]:
    """The protocol class uvicorn serves ``paths`` with (``uvicorn.run(http=...)``), answering
    its routes' quick answers itself."""
    return type("ServingProtocol", (ServerProtocol,), {"paths": paths})
