"""Several servers in the client: the next is tried when one cannot be reached; scontrol ping's lines."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shoal.api_client import Client, ClientError
from shoal.cli.scontrol import render_ping
from tests.integration.cluster import free_port


class _Leader(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def live_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Leader)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_dead_first_server_is_skipped_and_the_live_one_kept(live_server):
    dead = f"http://127.0.0.1:{free_port()}"
    client = Client(f"{dead}, {live_server}", "token")
    assert client.get("/shoal/v1/leader") == {"path": "/shoal/v1/leader"}
    assert client.server == live_server  # stays with the one that answered


def test_no_server_answering_names_them_all():
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with pytest.raises(ClientError, match="at any of " + ", ".join(dead)):
        Client(",".join(dead), "token").get("/shoal/v1/leader")


LEADER = {"self": {"role": "leader", "term": 3}}
FOLLOWER = {"self": {"role": "follower", "term": None}}


def test_scontrol_ping_names_the_leader_primary_whatever_the_configured_order():
    out, code = render_ping([("http://h1:6817", FOLLOWER), ("http://h2:6817", LEADER)])
    assert (out, code) == ("Slurmctld(primary) at h2:6817 is UP\nSlurmctld(backup) at h1:6817 is UP\n", 0)


def test_scontrol_ping_numbers_backups_and_says_down():
    out, code = render_ping([("http://h1", None), ("http://h2", FOLLOWER), ("http://h3", LEADER)])
    assert out == ("Slurmctld(primary) at h3 is UP\nSlurmctld(backup1) at h1 is DOWN\n"
                   "Slurmctld(backup2) at h2 is UP\n")
    assert code == 0


def test_scontrol_ping_without_a_leader_fails():
    out, code = render_ping([("http://h1", None), ("http://h2", FOLLOWER)])
    assert (out, code) == ("Slurmctld(primary) at h1 is DOWN\nSlurmctld(backup) at h2 is UP\n", 1)


class _CutShort(BaseHTTPRequestHandler):
    """A server killed while answering: the status line and headers, then part of the body."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        if self.path.endswith("chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"20\r\n{\"job_id\": 1")
        else:
            self.send_header("Content-Length", "40")
            self.end_headers()
            self.wfile.write(b'{"job_id": 1')
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_an_answer_cut_short_is_an_error_not_an_empty_answer(framing):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _CutShort)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{httpd.server_address[1]}", "token")
        with pytest.raises(ClientError, match="before its answer was complete"):
            client.post(f"/shoal/v1/jobs/{framing}", {"name": "x"})
    finally:
        httpd.shutdown()
