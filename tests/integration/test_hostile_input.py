"""Hostile input at the API's edge: a real ``shoal server`` fed what its OpenAPI allows and
what it does not (schemathesis), oversized bodies and malformed fields.

Whatever arrives, the answer is a 4xx naming the problem, never a 5xx or a hang.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.integration.cluster import free_port, wait_until

CONFIG = {"cluster_name": "hostile", "partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}]}


class ApiServer:
    """One ``shoal server`` process on 127.0.0.1 (no agents), and its admin token."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        config = root / "cluster.yaml"
        config.write_text(json.dumps(CONFIG))
        state = root / "state"
        self.log = open(root / "server.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "shoal", "server", "--listen", f"127.0.0.1:{self.port}",
                                      "--config", str(config), "--state-dir", str(state)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        token = state / "admin.token"
        wait_until(lambda: token.exists() and self.healthy(), 60, "the server to start")
        self.token = token.read_text().strip()
        self.url = f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        assert self.proc.poll() is None, "the server exited"
        try:
            return self.raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")[0] == 200
        except OSError:
            return False

    def raw(self, request: bytes, timeout: float = 10) -> tuple[int, bytes]:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(request)
            data = b""
            try:
                while chunk := s.recv(65536):
                    data += chunk
            except ConnectionResetError:
                pass
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), body

    def post(self, path: str, payload: bytes, token: str | None = None, headers: tuple[str, ...] = ()) -> tuple[int, dict]:
        head = [f"POST {path} HTTP/1.1", "Host: x", "Connection: close", "Content-Type: application/json",
                f"Authorization: Bearer {token or self.token}", *headers]
        if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
            head.append(f"Content-Length: {len(payload)}")
        status, body = self.raw(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, {"raw": body[:200]}

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.log.close()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    server = ApiServer(tmp_path_factory.mktemp("hostile"))
    yield server
    server.stop()


def test_no_request_the_schema_allows_or_forbids_gets_a_server_error(api):
    """schemathesis, every operation of the server's OpenAPI, valid and invalid requests made
    from its schema (a few each), with the admin token."""
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 30, "the server's OpenAPI lists too few operations"
    # The hang check is each request's own 15 s; this only bounds the whole run (about a
    # minute on a quiet machine, several on a loaded one).
    deadline = time.monotonic() + 600

    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if time.monotonic() > deadline:
                pytest.fail(f"fuzzing ran past its time budget at {op.label}")

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=5, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck), phases=[Phase.generate])
            def one(case):
                started = time.monotonic()
                try:
                    response = case.call(base_url=api.url, headers={"Authorization": f"Bearer {api.token}"},
                                         timeout=15)
                except Exception as e:  # a hang (timeout) or a dropped connection
                    failures.append(f"{case.method} {case.formatted_path}: {type(e).__name__}: {e}")
                    return
                if response.status_code >= 500 or time.monotonic() - started > 15:
                    failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                    f"{response.text[:300]}\n  {case.as_curl_command()}")

            try:
                one()
            except Unsatisfiable:
                pass  # nothing in this operation can be made invalid (no parameters, no body)
    assert api.healthy()
    assert not failures, f"{len(failures)} requests got a 5xx or no answer:\n" + "\n".join(failures[:20])


# ---------------------------------------------------------------- limits, one by one


SUBMIT = {"script": "#!/bin/sh\ntrue\n", "workdir": "/tmp", "hold": True}


def test_a_body_over_the_limit_is_413_before_it_is_read(api):
    from shoal.server.limits import MAX_BODY_BYTES

    status, doc = api.post("/shoal/v1/jobs", b"", headers=(f"Content-Length: {MAX_BODY_BYTES + 1}",))
    assert status == 413, doc
    assert doc["detail"] == f"request body too large: the API accepts at most {MAX_BODY_BYTES} bytes (16 MiB)"


def test_a_chunked_body_over_the_limit_is_413(api):
    from shoal.server.limits import MAX_BODY_BYTES

    chunk = b"x" * (1024 * 1024)
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_BODY_BYTES // len(chunk) + 1))
    status, doc = api.post("/shoal/v1/jobs", body + b"0\r\n\r\n", headers=("Transfer-Encoding: chunked",))
    assert status == 413, doc
    assert doc["detail"].startswith("request body too large")


def field_error(doc: dict) -> tuple[tuple, str]:
    first = doc["detail"][0]
    return tuple(first["loc"]), first["msg"]


@pytest.mark.parametrize("field,value,loc,message", [
    ("script", "x" * (4 * 1024 * 1024 + 1), ("body", "script"), "String should have at most 4194304 characters"),
    ("name", "n" * 256, ("body", "name"), "String should have at most 255 characters"),
    ("argv", ["ok", "bad\x00arg"], ("body", "argv"), "Value error, argument 1 contains a NUL (\\x00) character"),
    ("argv", ["a" * 131073], ("body", "argv"), "Value error, argument 0 is longer than 131072 characters"),
    ("environment", {"A=B": "x"}, ("body", "environment"),
     "Value error, invalid variable name 'A=B': it must be non-empty UTF-8, without '=' or NUL"),
    ("environment", {"PATH": "/bin\x00/evil"}, ("body", "environment"),
     "Value error, variable PATH contains a NUL (\\x00) character"),
    ("environment", {f"V{i}": "x" * 100000 for i in range(25)}, ("body", "environment"),
     "Value error, the environment holds 2500115 bytes: at most 2097152 are accepted"),
    ("comment", "c" * 4097, ("body", "comment"), "String should have at most 4096 characters"),
])
def test_oversized_or_malformed_fields_are_refused_naming_the_field(api, field, value, loc, message):
    status, doc = api.post("/shoal/v1/jobs", json.dumps({**SUBMIT, field: value}).encode())
    assert status == 422, doc
    assert field_error(doc) == (loc, message)


def test_an_array_over_max_array_size_is_refused(api):
    status, doc = api.post("/shoal/v1/jobs", json.dumps({**SUBMIT, "array": "0-5000"}).encode())
    assert status == 400, doc
    assert doc["detail"].startswith("invalid --array"), doc
    assert "1001" in doc["detail"], doc


# ---------------------------------------------------------------- 5xx found by fuzzing, fixed


def get(api, path: str) -> tuple[int, dict]:
    status, body = api.raw(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                           f"Authorization: Bearer {api.token}\r\n\r\n".encode())
    return status, json.loads(body)


@pytest.mark.parametrize("raw,loc", [
    # A lone surrogate is valid JSON; FastAPI's own 422 handler failed to echo it back (500).
    (b'{"workdir": "/tmp", "hold": true, "name": "\\ud800"}', ["body", "name"]),
    # ... and inside the environment it reached the store and would have failed execve on the node.
    (b'{"workdir": "/tmp", "hold": true, "environment": {"A": "\\udfff"}}', ["body", "environment"]),
    (b'{"workdir": "/tmp", "hold": true, "argv": ["\\ud800"]}', ["body", "argv"]),
    # NaN and Infinity are not JSON: a job holding one made every later job listing a 500.
    (b'{"workdir": "/tmp", "hold": true, "begin_time": Infinity}', ["body", "begin_time"]),
    (b'{"workdir": "/tmp", "hold": true, "begin_time": NaN}', ["body", "begin_time"]),
    # A reservation at no real time failed the store's NOT NULL or int() of Infinity.
    (b'{"name": "nan", "start_time": NaN, "duration_s": 10, "node_count": 1, "users": ["a"]}', ["body", "start_time"]),
    (b'{"name": "inf", "end_time": Infinity, "node_count": 1, "users": ["a"]}', ["body", "end_time"]),
])
def test_text_and_numbers_json_cannot_carry_are_refused_not_crashed_on(api, raw, loc):
    path = "/shoal/v1/reservations" if b'"users"' in raw else "/shoal/v1/jobs"
    status, doc = api.post(path, raw)
    assert status == 422, doc
    assert doc["detail"][0]["loc"] == loc, doc
    assert get(api, "/shoal/v1/jobs?all=true")[0] == 200


@pytest.mark.parametrize("method,path", [
    ("GET", "/shoal/v1/jobs/99999999999999999999"),
    ("GET", "/shoal/v1/jobs?job_id=99999999999999999999"),
    ("GET", "/shoal/v1/jobs?job_id=1_99999999999999999999"),
    ("POST", "/shoal/v1/jobs/99999999999999999999/cancel"),
])
def test_an_id_past_64_bits_is_a_client_error(api, method, path):
    if method == "GET":
        status, doc = get(api, path)
    else:
        status, doc = api.post(path, b"{}")
    assert status in (400, 404), doc
    assert isinstance(doc["detail"], str) and doc["detail"], doc


@pytest.mark.parametrize("since", ["nan", "inf", "-inf"])
def test_a_listing_since_no_real_time_is_refused(api, since):
    status, doc = get(api, f"/shoal/v1/jobs?since={since}")
    assert status == 422, doc
    assert doc["detail"][0]["loc"] == ["query", "since"]


@pytest.mark.parametrize("labels,message", [
    ({"bad key!": "x"}, "Value error, label [bad key!]: name part must consist of alphanumeric characters"),
    ({"gpu": "v" * 64}, "Value error, label [gpu]: must be no more than 63 characters"),
])
def test_node_labels_are_refused_as_kubernetes_refuses_them(api, labels, message):
    payload = json.dumps({"labels": labels}).encode()
    status, body = api.raw(f"PATCH /shoal/v1/nodes/node01 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                           f"Authorization: Bearer {api.token}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    doc = json.loads(body)
    assert status == 422, doc
    assert doc["detail"][0]["loc"] == ["body", "labels"]
    assert doc["detail"][0]["msg"].startswith(message), doc


# ---------------------------------------------------------------- the fast path (server/fastpath.py)
# The requests every job costs skip FastAPI's layers; what they do not take as is must get
# the app's own answers all the same.

FAST_POSTS = ("/shoal/v1/commands/sbatch", "/shoal/v1/agents/node01/report")


@pytest.mark.parametrize("path", FAST_POSTS)
def test_the_fast_paths_refuse_a_body_over_the_limit_as_the_app_does(api, path):
    from shoal.server.limits import MAX_BODY_BYTES

    status, doc = api.post(path, b"", headers=(f"Content-Length: {MAX_BODY_BYTES + 1}",))
    assert (status, doc["detail"]) == (413, f"request body too large: the API accepts at most {MAX_BODY_BYTES} "
                                            f"bytes (16 MiB)")
    chunk = b"x" * (1024 * 1024)
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_BODY_BYTES // len(chunk) + 1))
    status, doc = api.post(path, body + b"0\r\n\r\n", headers=("Transfer-Encoding: chunked",))
    assert status == 413 and doc["detail"].startswith("request body too large"), doc


def test_the_agents_fast_paths_check_the_node_credential_then_the_input(api):
    status, doc = api.post("/shoal/v1/agents/node01/report", b"{}")  # the admin token is no node credential
    assert (status, doc["detail"]) == (403, "this credential does not belong to node node01"), doc
    status, doc = api.post("/shoal/v1/agents/node01/report", b'{"events": "none"}')
    assert status == 422 and doc["detail"][0]["loc"] == ["body", "events"], doc
    status, doc = get(api, "/shoal/v1/agents/node01/work?wait=99")
    assert status == 422 and doc["detail"][0]["loc"] == ["query", "wait"], doc
    status, doc = get(api, "/shoal/v1/agents/node01/work?wait=nan")
    assert status == 422, doc
