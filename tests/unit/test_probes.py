"""Probes against real listeners on 127.0.0.1, and their thresholds as kubelet counts them."""

from __future__ import annotations

import http.server
import re
import socket
import struct
import threading
import time

import pytest

from shoal.agent.probes import (Probe, ProbeConfigError, ProbeState, ProbeTarget, run_command, run_probe)


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_GET(self):  # noqa: N802 - the http.server name
        type(self).seen.append({"path": self.path, "headers": dict(self.headers)})
        if self.path == "/slow":
            time.sleep(1.0)
        code = {"/health": 200, "/moved": 302, "/broken": 500, "/slow": 200}.get(self.path, 404)
        try:
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        except OSError:  # the slow request's prober gave up and hung up
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def http_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    _Handler.seen = []
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _http(path, port, **extra):
    return Probe.from_spec({"httpGet": {"path": path, "port": port, **extra}, "timeoutSeconds": 0.3})


def test_http_get_succeeds_from_200_to_399(http_port):
    target = ProbeTarget("127.0.0.1")
    assert run_probe(_http("/health", http_port), target).ok
    assert run_probe(_http("/moved", http_port), target).ok
    broken = run_probe(_http("/broken", http_port), target)
    assert not broken.ok and broken.message == "HTTP probe failed with statuscode: 500"
    assert run_probe(_http("/nothing", http_port), target).message == "HTTP probe failed with statuscode: 404"


def test_http_get_resolves_a_named_port_and_sends_the_headers(http_port):
    probe = _http("/health", "http", httpHeaders=[{"name": "X-Probe", "value": "ready"}])
    assert run_probe(probe, ProbeTarget("127.0.0.1", ports={"http": http_port})).ok
    headers = _Handler.seen[-1]["headers"]
    assert headers["X-Probe"] == "ready" and headers["User-Agent"].startswith("kube-probe/")
    unknown = run_probe(_http("/health", "metrics"), ProbeTarget("127.0.0.1", ports={"http": http_port}))
    assert not unknown.ok and 'unable to find port "metrics"' in unknown.message


def test_http_get_to_a_closed_port_or_a_slow_server_fails_in_kubelets_words(http_port, free_port):
    refused = run_probe(_http("/health", free_port), ProbeTarget("127.0.0.1"))
    assert refused.message == (f'Get "http://127.0.0.1:{free_port}/health": '
                               f"dial tcp 127.0.0.1:{free_port}: connect: connection refused")
    t0 = time.monotonic()
    slow = run_probe(_http("/slow", http_port), ProbeTarget("127.0.0.1"))
    assert time.monotonic() - t0 < 0.9  # timeoutSeconds bounds it
    assert not slow.ok and "context deadline exceeded" in slow.message


@pytest.mark.parametrize("reset", [False, True])
def test_http_get_to_a_server_that_hangs_up_fails_in_kubelets_words(reset):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def hang_up():
        conn, _ = listener.accept()
        conn.recv(1024)
        if reset:  # linger 0: the close sends RST
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        result = run_probe(_http("/health", port), ProbeTarget("127.0.0.1"))
    finally:
        listener.close()
    url = f"http://127.0.0.1:{port}/health"
    if reset:
        assert re.fullmatch(rf'Get "{url}": read tcp 127\.0\.0\.1:\d+->127\.0\.0\.1:{port}: read: '
                            r"connection reset by peer", result.message), result.message
    else:
        assert result.message == f'Get "{url}": EOF'


def test_http_get_uses_the_probes_host_over_the_pod_ip(http_port):
    probe = _http("/health", http_port, host="127.0.0.1")
    assert run_probe(probe, ProbeTarget("192.0.2.1")).ok


def test_tcp_socket_connects_within_the_timeout(free_port):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        port = listener.getsockname()[1]
        probe = Probe.from_spec({"tcpSocket": {"port": port}, "timeoutSeconds": 0.5})
        assert run_probe(probe, ProbeTarget("127.0.0.1")).ok
    finally:
        listener.close()
    closed = run_probe(Probe.from_spec({"tcpSocket": {"port": free_port}}), ProbeTarget("127.0.0.1"))
    assert closed.message == f"dial tcp 127.0.0.1:{free_port}: connect: connection refused"


def _exec_target():
    return ProbeTarget("127.0.0.1", exec=lambda argv, timeout: run_command(argv, timeout))


def test_exec_exit_zero_is_success_and_the_output_is_the_failure_message():
    ok = Probe.from_spec({"exec": {"command": ["sh", "-c", "exit 0"]}})
    assert run_probe(ok, _exec_target()).ok
    fail = Probe.from_spec({"exec": {"command": ["sh", "-c", "exit 1"]}})
    assert not run_probe(fail, _exec_target()).ok
    said = Probe.from_spec({"exec": {"command": ["sh", "-c", "echo model not loaded >&2; exit 3"]}})
    assert run_probe(said, _exec_target()).message == "model not loaded"


def test_exec_past_its_timeout_fails_and_leaves_no_process():
    probe = Probe.from_spec({"exec": {"command": ["sh", "-c", "sleep 30 & sleep 30"]}, "timeoutSeconds": 0.3})
    procs: set = set()
    target = ProbeTarget("127.0.0.1", exec=lambda argv, timeout: run_command(argv, timeout, procs=procs))
    t0 = time.monotonic()
    result = run_probe(probe, target)
    assert time.monotonic() - t0 < 3
    assert not result.ok and "timed out after 0.3s" in result.message
    assert not procs


def test_probe_defaults_and_unsupported_handlers():
    p = Probe.from_spec({"tcpSocket": {"port": 80}})
    assert (p.initial_delay_s, p.period_s, p.timeout_s, p.success_threshold, p.failure_threshold) == (0, 10, 1, 1, 3)
    with pytest.raises(ProbeConfigError, match="grpc probes are not supported"):
        Probe.from_spec({"grpc": {"port": 9000}})
    with pytest.raises(ProbeConfigError):
        Probe.from_spec({"periodSeconds": 3})


def _state(kind, **spec):
    return ProbeState(Probe.from_spec({"tcpSocket": {"port": 1}, **spec}), kind, started_at=100.0)


def test_initial_delay_then_every_period():
    s = _state("readiness", initialDelaySeconds=5, periodSeconds=2)
    assert s.next_due() == 105.0
    s.record(False, 105.1)
    assert s.next_due() == pytest.approx(107.1)


def test_readiness_starts_not_ready_and_needs_success_threshold_to_flip():
    s = _state("readiness", successThreshold=2, failureThreshold=3)
    assert s.result is False
    assert s.record(True, 1) is None
    assert s.record(True, 2) is True
    assert s.record(False, 3) is None and s.record(False, 4) is None
    assert s.record(True, 5) is None  # a success resets the failure count
    assert [s.record(False, t) for t in (6, 7, 8)] == [None, None, False]
    assert s.record(False, 9) is None  # already not ready


def test_liveness_starts_healthy_and_fails_after_failure_threshold():
    s = _state("liveness", failureThreshold=2)
    assert s.result is True
    assert s.record(False, 1) is None
    assert s.record(False, 2) is False


def test_startup_is_unknown_until_it_succeeds_or_fails_out():
    s = _state("startup", failureThreshold=3)
    assert s.result is None
    assert s.record(True, 1) is True
    s = _state("startup", failureThreshold=3)
    assert [s.record(False, t) for t in (1, 2, 3)] == [None, None, False]


def test_a_probe_state_loop_on_a_real_listener_with_small_periods():
    """Readiness against a port that starts listening after a while: not ready, then ready."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    probe = Probe.from_spec({"tcpSocket": {"port": port}, "periodSeconds": 0.05, "timeoutSeconds": 0.2,
                             "initialDelaySeconds": 0.1})
    state = ProbeState(probe, "readiness", started_at=time.monotonic())
    flips, checks = [], 0
    deadline = time.monotonic() + 3
    try:
        while time.monotonic() < deadline and not flips:
            time.sleep(max(0.0, state.next_due() - time.monotonic()))
            checks += 1
            if checks == 3:
                listener.listen()
            flip = state.record(run_probe(probe, ProbeTarget("127.0.0.1")).ok, time.monotonic())
            if flip is not None:
                flips.append((checks, flip))
    finally:
        listener.close()
    assert flips == [(3, True)]
