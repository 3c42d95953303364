"""server/protocol.py: a route's quick answer made by the protocol as the request is parsed,
under a real uvicorn on a real socket. The answer is the same bytes the app would have sent,
and the connection stays usable after it. Anything else goes to the app exactly once, as
uvicorn would have given it: a quick answer of None, a pipelined request, Connection: close,
Expect: 100-continue, or a body over the limit."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
import uvicorn

from shoal.server import fastpath
from shoal.server.auth import AuthError
from shoal.server.protocol import QUICK_BODY_LIMIT, serving


class _Served:
    """A FastPaths app with one fast route whose quick answer is recorded, served by uvicorn
    with the server's protocol in a thread."""

    def __init__(self) -> None:
        self.quick_calls: list[tuple[dict, str | None, bytes]] = []
        self.handled: list[bytes] = []  # bodies the fast route's handler answered
        self.app_paths: list[str] = []  # requests the app behind the fast path answered
        self.observed: list[tuple[str, str, int]] = []
        routes = fastpath.Routes()
        routes.add("POST", r"/n/(?P<node>[^/]+)/report", self._handler, self._quick)
        paths = fastpath.FastPaths(self._app, routes, observe=lambda m, r, c, s: self.observed.append((m, r, c)))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(paths, host="127.0.0.1", port=self.port, log_level="warning", access_log=False,
                                http=serving(paths), lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def _quick(self, params: dict, headers: dict, body: bytes) -> fastpath.Answer | None:
        self.quick_calls.append((params, headers.get("authorization"), body))
        if headers.get("authorization") == "bad":
            raise AuthError(401, "invalid agent credential")
        if body == b'{"quiet": true}':
            return fastpath.json_answer({"ok": True, "node": params["node"]})
        return None

    async def _handler(self, scope, match, headers, body) -> fastpath.Answer | None:
        if fastpath.QUICK_TRIED not in scope and (out := self._quick(match.groupdict(), headers, body)) is not None:
            return out
        self.handled.append(body)
        return fastpath.json_answer({"handled": len(body)})

    async def _app(self, scope, receive, send) -> None:
        self.app_paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 404,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served():
    s = _Served()
    try:
        yield s
    finally:
        s.stop()


def _post(conn: http.client.HTTPConnection, path: str, body: bytes, **headers: str) -> tuple[int, dict, dict]:
    conn.request("POST", path, body, headers)
    r = conn.getresponse()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())


def test_a_quick_answer_is_the_routes_answer_and_the_connection_stays_open(served):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    for k in range(3):  # one kept connection, several requests
        status, headers, doc = _post(conn, f"/n/node0{k}/report", b'{"quiet": true}', authorization="good")
        assert (status, doc) == (200, {"ok": True, "node": f"node0{k}"})
        assert headers["content-type"] == "application/json"
        assert headers["content-length"] == str(len(json.dumps(doc)))
        assert "date" in headers and headers["server"] == "uvicorn"  # uvicorn's default headers
    assert len(served.quick_calls) == 3 and served.handled == []
    assert served.quick_calls[0] == ({"node": "node00"}, "good", b'{"quiet": true}')
    assert served.observed == [("POST", "/n/{node}/report", 200)] * 3
    # Another route on the same connection still reaches the app.
    status, _, doc = _post(conn, "/elsewhere", b"{}")
    assert (status, doc, served.app_paths) == (404, {}, ["/elsewhere"])
    conn.close()


def test_no_quick_answer_goes_to_the_route_once(served):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    body = b'{"news": [1, 2, 3]}'
    status, _, doc = _post(conn, "/n/node01/report", body, authorization="good")
    assert (status, doc) == (200, {"handled": len(body)})
    assert len(served.quick_calls) == 1  # the fast route did not try it again
    assert served.handled == [body]
    # A quiet one after it on the same connection is answered quickly again.
    assert _post(conn, "/n/node01/report", b'{"quiet": true}')[2] == {"ok": True, "node": "node01"}
    assert served.handled == [body] and len(served.quick_calls) == 2
    conn.close()


def test_an_auth_error_is_answered_as_the_fast_path_answers_it(served):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    status, _, doc = _post(conn, "/n/node01/report", b'{"quiet": true}', authorization="bad")
    assert (status, doc) == (401, {"detail": "invalid agent credential"})
    assert served.observed == [("POST", "/n/{node}/report", 401)]
    conn.close()


@pytest.mark.parametrize("extra", [{"Connection": "close"}, {"Expect": "100-continue"}])
def test_unusual_requests_go_to_the_app(served, extra):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    status, _, doc = _post(conn, "/n/node01/report", b'{"quiet": true}', authorization="good", **extra)
    # The fast route's handler answered it (it tries the quick answer itself), not the protocol.
    assert (status, doc) == (200, {"ok": True, "node": "node01"})
    assert len(served.quick_calls) == 1 and served.observed == [("POST", "/n/{node}/report", 200)]
    conn.close()


def test_a_large_body_goes_to_the_app_whole(served):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    body = b'{"pad": "' + b"x" * (QUICK_BODY_LIMIT + 100_000) + b'"}'
    status, _, doc = _post(conn, "/n/node01/report", body, authorization="good")
    assert (status, doc) == (200, {"handled": len(body)})
    assert served.handled == [body]
    assert len(served.quick_calls) == 1  # by the fast route only, with the whole body
    conn.close()


def test_pipelined_requests_are_answered_in_order(served):
    one = (b"POST /n/node01/report HTTP/1.1\r\nhost: x\r\ncontent-length: 19\r\n\r\n"
           b'{"news": [1, 2, 3]}')
    two = b"POST /n/node02/report HTTP/1.1\r\nhost: x\r\ncontent-length: 15\r\n\r\n" b'{"quiet": true}'
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
        s.sendall(one + two + two)
        data = b""
        while data.count(b"HTTP/1.1 200") < 3 or not data.endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in data.split(b"HTTP/1.1 ")[1:]]
    assert [json.loads(b) for b in bodies] == [{"handled": 19}, {"ok": True, "node": "node02"},
                                               {"ok": True, "node": "node02"}]
