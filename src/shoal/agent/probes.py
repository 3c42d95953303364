"""Container probes as kubelet runs them: httpGet, tcpSocket and exec, with their thresholds.

``run_probe`` performs one check and says why it failed in kubelet's words; ``ProbeState``
counts results against ``successThreshold`` / ``failureThreshold`` and knows when the next
check is due. Which probe gates which (startup before liveness and readiness) and what a
failure does (restart, not ready) is the pod supervisor's business (``shoal.agent.pods``).
"""

from __future__ import annotations

import http.client
import os
import shlex
import signal
import socket
import ssl
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shoal.agent.identity import Identity, LaunchError, spawn

KINDS = ("startup", "liveness", "readiness")
_OUTPUT_LIMIT = 10 * 1024  # kubelet keeps 10 KiB of an exec probe's output


class ProbeConfigError(ValueError):
    """A probe Shoal cannot run (a gRPC probe, a probe with no handler)."""


@dataclass(frozen=True)
class Probe:
    """A probe as the container spec writes it, with Kubernetes' defaults."""

    handler: str  # "httpGet" | "tcpSocket" | "exec"
    action: dict
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    termination_grace_s: float | None = None  # probe-level terminationGracePeriodSeconds

    @classmethod
    def from_spec(cls, spec: dict) -> Probe:
        if "grpc" in spec:
            raise ProbeConfigError("grpc probes are not supported on Shoal (use httpGet, tcpSocket or exec)")
        handler = next((h for h in ("httpGet", "tcpSocket", "exec") if h in spec), None)
        if handler is None:
            raise ProbeConfigError("a probe needs one of httpGet, tcpSocket or exec")
        grace = spec.get("terminationGracePeriodSeconds")
        return cls(handler, dict(spec[handler]),
                   initial_delay_s=float(spec.get("initialDelaySeconds", 0)),
                   period_s=float(spec.get("periodSeconds", 10)),
                   timeout_s=float(spec.get("timeoutSeconds", 1)),
                   success_threshold=int(spec.get("successThreshold", 1)),
                   failure_threshold=int(spec.get("failureThreshold", 3)),
                   termination_grace_s=None if grace is None else float(grace))


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    message: str = ""


@dataclass
class ProbeTarget:
    """What a probe is pointed at: the pod's address, the container's named ports, and a way
    to run a command inside the container (``exec(argv, timeout_s) -> (exit code or None
    on timeout, output)``)."""

    host: str
    ports: Mapping[str, int] = field(default_factory=dict)
    exec: Callable[[list[str], float], tuple[int | None, str]] | None = None


def run_probe(probe: Probe, target: ProbeTarget) -> ProbeResult:
    """Perform one check; never raises."""
    try:
        if probe.handler == "httpGet":
            return http_get(probe.action, target, probe.timeout_s)
        if probe.handler == "tcpSocket":
            return tcp_socket(probe.action, target, probe.timeout_s)
        return exec_probe(probe.action, target, probe.timeout_s)
    except _PortError as e:
        return ProbeResult(False, str(e))


class _PortError(Exception):
    pass


def resolve_port(port: int | str, ports: Mapping[str, int]) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    if str(port).isdigit():
        return int(port)
    if port in ports:
        return int(ports[port])
    raise _PortError(f'unable to find port "{port}" among the container\'s ports')


def http_get(action: dict, target: ProbeTarget, timeout_s: float) -> ProbeResult:
    """GET scheme://host:port/path; a status from 200 to 399 is a success (redirects are not followed)."""
    host = action.get("host") or target.host
    port = resolve_port(action["port"], target.ports)
    path = action.get("path") or "/"
    if not path.startswith("/"):
        path = "/" + path
    scheme = str(action.get("scheme", "HTTP")).upper()
    url = f"{scheme.lower()}://{host}:{port}{path}"
    if scheme == "HTTPS":  # kubelet does not verify the certificate either
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=timeout_s,
                                                                        context=context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    headers = {h["name"]: h.get("value", "") for h in action.get("httpHeaders") or []}
    names = {n.lower() for n in headers}
    try:
        try:
            conn.connect()
        except OSError as e:
            return ProbeResult(False, f'Get "{url}": {_dial_error(host, port, e)}')
        local_host, local_port = conn.sock.getsockname()[:2]
        local = f"{local_host}:{local_port}"
        conn.putrequest("GET", path, skip_host="host" in names, skip_accept_encoding=True)
        if "user-agent" not in names:
            conn.putheader("User-Agent", "kube-probe/shoal")
        if "accept" not in names:
            conn.putheader("Accept", "*/*")
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        resp = conn.getresponse()
        resp.read(_OUTPUT_LIMIT)
        status = resp.status
    except TimeoutError:
        return ProbeResult(False, f'Get "{url}": context deadline exceeded '
                                  f'(Client.Timeout exceeded while awaiting headers)')
    except http.client.RemoteDisconnected:  # closed before answering: Go's client says EOF
        return ProbeResult(False, f'Get "{url}": EOF')
    except ConnectionResetError:  # a server going away mid-request, as in a rolling update
        return ProbeResult(False, f'Get "{url}": read tcp {local}->{host}:{port}: read: connection reset by peer')
    except (OSError, http.client.HTTPException) as e:
        return ProbeResult(False, f'Get "{url}": {type(e).__name__}: {e}')
    finally:
        conn.close()
    if 200 <= status < 400:
        return ProbeResult(True)
    return ProbeResult(False, f"HTTP probe failed with statuscode: {status}")


def tcp_socket(action: dict, target: ProbeTarget, timeout_s: float) -> ProbeResult:
    """Open a TCP connection within the timeout, then close it."""
    host = action.get("host") or target.host
    port = resolve_port(action["port"], target.ports)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return ProbeResult(False, _dial_error(host, port, e))
    return ProbeResult(True)


def exec_probe(action: dict, target: ProbeTarget, timeout_s: float) -> ProbeResult:
    """Run the command in the container; exit status 0 is a success. The failure message is
    the command's output, as kubelet reports it."""
    argv = [str(a) for a in action.get("command") or []]
    if not argv or target.exec is None:
        return ProbeResult(False, "exec probe has no command")
    code, output = target.exec(argv, timeout_s)
    if code is None:
        return ProbeResult(False, f"command {shlex.join(argv)!r} timed out after {timeout_s:g}s")
    if code == 0:
        return ProbeResult(True, output)
    return ProbeResult(False, output.strip() or f"command {shlex.join(argv)!r} exited with {code}")


def _dial_error(host: str, port: int, e: OSError) -> str:
    if isinstance(e, ConnectionRefusedError):
        return f"dial tcp {host}:{port}: connect: connection refused"
    if isinstance(e, TimeoutError):
        return f"dial tcp {host}:{port}: i/o timeout"
    return f"dial tcp {host}:{port}: {e.strerror or e}"


def run_command(argv: list[str], timeout_s: float, *, env: Mapping[str, str] | None = None,
                cwd: str | None = None, procs: set | None = None,
                identity: Identity | None = None) -> tuple[int | None, str]:
    """Run argv in its own session (as ``identity``, else as the agent) with stdout and stderr
    together; on timeout kill its whole process group and answer (None, output so far).
    ``procs`` holds the Popen while it runs, so a supervisor can kill a probe that outlives
    its container."""
    try:
        p = spawn(argv, identity=identity, env=os.environ if env is None else env, cwd=cwd,
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as e:
        return 126, f"{e.filename if isinstance(e, LaunchError) else argv[0]}: {e.strerror}"
    if procs is not None:
        procs.add(p)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        code: int | None = p.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        out, _ = p.communicate()
        code = None
    finally:
        if procs is not None:
            procs.discard(p)
    return code, out[:_OUTPUT_LIMIT].decode(errors="replace")


@dataclass
class ProbeState:
    """One probe's counters, as kubelet's prober worker keeps them.

    ``result`` starts unknown (None) for startup, True for liveness and False for readiness,
    and flips only after ``successThreshold`` consecutive successes or ``failureThreshold``
    consecutive failures. Times are the caller's clock (monotonic seconds).
    """

    probe: Probe
    kind: str
    started_at: float  # when the container started: initialDelaySeconds counts from here
    result: bool | None = None
    successes: int = 0
    failures: int = 0
    last_run: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown probe kind {self.kind!r} (one of {', '.join(KINDS)})")
        self.result = {"startup": None, "liveness": True, "readiness": False}[self.kind]

    def next_due(self) -> float:
        """When the next check should run."""
        first = self.started_at + self.probe.initial_delay_s
        return first if self.last_run is None else max(first, self.last_run + self.probe.period_s)

    def record(self, ok: bool, now: float) -> bool | None:
        """Count one check; return the new result when it flips, else None."""
        self.last_run = now
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.result is not True and self.successes >= self.probe.success_threshold:
                self.result = True
                return True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.result is not False and self.failures >= self.probe.failure_threshold:
                self.result = False
                return False
        return None
