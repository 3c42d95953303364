"""The agents' keep-alive client (api_client ``keep_alive``): one connection for many requests,
a connection the server closed replaced, a request the server never answered sent again
once, and the commands' one connection per request unchanged. Against a real socket server
that counts its connections and does what each case needs."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from shoal.api_client import Client, ClientError


class _Server:
    """An HTTP/1.1 server on a socket: answers each request by ``behave(n, request)``, where
    ``n`` counts requests over all connections; it may return bytes to send, or ``None`` to
    close the connection without answering."""

    def __init__(self, behave) -> None:
        self.behave = behave
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.requests: list[bytes] = []
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                self.requests.append(head)
                answer = self.behave(len(self.requests), head + b"\r\n\r\n" + body)
                if answer is None:
                    return  # closed without a byte of answer
                conn.sendall(answer)
                if b"connection: close" in answer.lower():
                    return

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _json(doc, *extra: bytes) -> bytes:
    body = json.dumps(doc).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n" % (
        len(body), b"".join(h + b"\r\n" for h in extra)) + body


def _chunked(doc) -> bytes:
    body = json.dumps(doc).encode()
    half = len(body) // 2
    return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n" % (half, body[:half]) + b"%x\r\n%s\r\n" % (len(body) - half, body[half:]) + b"0\r\n\r\n")


@pytest.fixture
def serve():
    made: list[_Server] = []

    def start(behave) -> _Server:
        made.append(_Server(behave))
        return made[-1]

    yield start
    for s in made:
        s.close()


def test_a_keep_alive_client_sends_every_request_on_one_connection(serve):
    server = serve(lambda n, req: _json({"n": n}) if n % 2 else _chunked({"n": n, "pad": "x" * 200_000}))
    client = Client(server.url, "t", keep_alive=True)
    answers = [client.post("/report", {"i": i})["n"] for i in range(1, 7)]
    assert answers == [1, 2, 3, 4, 5, 6]  # each answer read whole, none taken for the next
    assert server.connections == 1
    assert all(b"connection: keep-alive" in h.lower() for h in server.requests)
    client.close()


def test_a_connection_whose_descriptor_is_past_1024_is_kept_too(serve):
    """A process holding many connections (the hollow agents: two a node) has descriptors past
    select()'s 1,024: the check of an idle kept connection must not take those for closed
    (it did, and every heartbeat of the hollow nodes and the benchmarks opened a new one)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1200:
        pytest.skip(f"the open-files hard limit ({hard}) leaves no descriptor past 1,024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        server = serve(lambda n, req: _json({"n": n}))
        client = Client(server.url, "t", keep_alive=True)
        assert [client.get("/x")["n"] for _ in range(3)] == [1, 2, 3]
        assert client._idle[0][1].fileno() > 1024
        assert server.connections == 1
        client.close()
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_commands_client_still_opens_a_connection_per_request(serve):
    server = serve(lambda n, req: _json({"n": n}, b"connection: close"))
    client = Client(server.url, "t")
    assert [client.get("/x")["n"] for _ in range(3)] == [1, 2, 3]
    assert server.connections == 3
    assert all(b"connection: close" in h.lower() for h in server.requests)


def test_a_connection_the_server_closed_while_idle_is_replaced(serve):
    server = serve(lambda n, req: _json({"n": n}))
    client = Client(server.url, "t", keep_alive=True)
    assert client.get("/x")["n"] == 1
    for c in server.conns:  # the server's keep-alive timeout: it closes the idle connection
        c.shutdown(socket.SHUT_RDWR)
    assert client.get("/x")["n"] == 2
    assert server.connections == 2


def test_a_request_a_kept_connection_never_answered_is_sent_once_more(serve):
    # The server closes the kept connection as the request arrives, before answering (its idle
    # timeout racing the request): the request goes again, on a new connection, once.
    server = serve(lambda n, req: None if n == 2 else _json({"n": n}))
    client = Client(server.url, "t", keep_alive=True)
    assert client.post("/report", {})["n"] == 1
    assert client.post("/report", {})["n"] == 3
    assert server.connections == 2


def test_a_new_connection_that_is_not_answered_is_an_error_not_a_retry(serve):
    server = serve(lambda n, req: None)
    client = Client(server.url, "t", keep_alive=True)
    with pytest.raises(ClientError, match="closed the connection without answering"):
        client.post("/report", {})
    assert len(server.requests) == 1  # not sent twice


def test_an_answer_cut_short_on_a_kept_connection_is_an_error(serve):
    def behave(n, req):
        return _json({"n": n}) if n == 1 else b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"n\""

    server = serve(behave)
    client = Client(server.url, "t", keep_alive=True)
    client.get("/x")

    def cut() -> None:
        import time
        time.sleep(0.3)
        for c in server.conns:
            c.shutdown(socket.SHUT_RDWR)
    threading.Thread(target=cut, daemon=True).start()
    with pytest.raises(ClientError, match="before its answer was complete"):
        client.get("/x")
    assert len(server.requests) == 2  # a half answer is never a reason to send it again


def test_an_answer_saying_connection_close_is_not_kept(serve):
    server = serve(lambda n, req: _json({"n": n}, b"connection: close"))
    client = Client(server.url, "t", keep_alive=True)
    assert [client.get("/x")["n"] for _ in range(2)] == [1, 2]
    assert server.connections == 2


def test_a_gzipped_answer_on_a_kept_connection_is_decoded(serve):
    import gzip

    def behave(n, req):
        if b"accept-encoding: gzip" not in req.lower():
            return _json({"plain": n})
        body = gzip.compress(json.dumps({"n": n, "rows": list(range(1000))}).encode())
        return b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(body) + body

    server = serve(behave)
    client = Client(server.url, "t", keep_alive=True)
    assert [client.get("/jobs")["n"] for _ in range(2)] == [1, 2]
    assert client.get("/jobs")["rows"][-1] == 999
    assert server.connections == 1
