#!/usr/bin/env python3
"""Gateway overhead: one backend called directly, through `shoal gateway`, and through nginx.

Starts a small backend process (aiohttp, a fixed 100-byte body), `shoal gateway` in front
of it (a routes file naming it as Service default/bench), and nginx in front of it (its
own configuration in a temporary dir: one worker, an upstream with keep-alive; installed
with apt-get when missing, needs root), measures, stops exactly the processes it started,
and writes the ``## Gateway`` section of BENCHMARKS.md (other sections are kept).

    .venv/bin/python bench/bench_gateway.py            # full: ~1 minute
    .venv/bin/python bench/bench_gateway.py --short    # ~20 s
    .venv/bin/python bench/bench_gateway.py --no-nginx --no-write

The client is this script: a minimal HTTP/1.1 keep-alive client on plain sockets, so that
its own cost per request stays small next to what it measures. Latency is sequential
requests on one connection, the paths interleaved in rounds; throughput is a fixed number
of connections kept busy for a fixed time, one path after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_foundation import load_average, machine_facts  # noqa: E402
from benchmarks_md import write_section  # noqa: E402  (bench/ is on sys.path as the script's folder)
from tests.integration.cluster import BIN, free_port  # noqa: E402

SECTION = "## Gateway"
BODY_BYTES = 100
SERVICE_HOST = "bench.default"

BACKEND = f"""
import sys
from aiohttp import web
BODY = b"x" * {BODY_BYTES - 1} + b"\\n"
async def handle(request):
    return web.Response(body=BODY, content_type="text/plain")
async def main():
    runner = web.ServerRunner(web.Server(handle, access_log=None))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(sys.argv[1]), backlog=1024).start()
    import asyncio
    await asyncio.Event().wait()
import asyncio
asyncio.run(main())
"""


@dataclass(frozen=True)
class Mode:
    name: str
    sequential: int  # requests per path
    rounds: int  # the sequential requests are split into this many interleaved rounds
    load_s: float  # seconds of concurrent load per path
    connections: int = 32


FULL = Mode("full", sequential=2000, rounds=20, load_s=10.0)
SHORT = Mode("short", sequential=500, rounds=5, load_s=3.0)


@dataclass
class Target:
    """One way to reach the backend."""

    label: str
    port: int
    host: str
    pid: int | None = None  # the proxy's process, for its CPU time
    latencies: list[float] = field(default_factory=list)
    rps: float = 0.0
    load_latencies: list[float] = field(default_factory=list)
    errors: int = 0
    cpu_us_per_request: float | None = None

    def request(self) -> bytes:
        return f"GET /bench HTTP/1.1\r\nHost: {self.host}\r\nUser-Agent: bench\r\n\r\n".encode()


# ---------------------------------------------------------------------- client


class Connection:
    """A blocking keep-alive HTTP/1.1 connection that reads Content-Length responses."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def roundtrip(self, raw: bytes) -> tuple[int, bytes]:
        self.sock.sendall(raw)
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        status, length = _parse_head(head)
        while len(self.buf) < length:
            self._recv()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, body

    def _recv(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def _parse_head(head: bytes) -> tuple[int, int]:
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return status, int(v)
    raise ValueError(f"response without Content-Length: {head!r}")


def measure_latency(paths: list[Target], mode: Mode) -> None:
    conns = {p.label: Connection(p.port) for p in paths}
    try:
        for p in paths:  # warm-up: connections, the proxies' upstream pools
            for _ in range(100):
                conns[p.label].roundtrip(p.request())
        per_round = mode.sequential // mode.rounds
        for _ in range(mode.rounds):
            for p in paths:
                c, raw = conns[p.label], p.request()
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    status, _ = c.roundtrip(raw)
                    p.latencies.append(time.perf_counter() - t0)
                    if status != 200:
                        p.errors += 1
    finally:
        for c in conns.values():
            c.close()


async def _load(path: Target, connections: int, seconds: float) -> None:
    raw = path.request()
    done = 0
    stop_at = time.perf_counter() + seconds

    async def connect():
        reader, writer = await asyncio.open_connection("127.0.0.1", path.port)
        writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def worker():
        nonlocal done
        reader, writer = await connect()
        try:
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                writer.write(raw)
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    path.errors += 1  # the server dropped the connection: count it, reconnect
                    writer.close()
                    reader, writer = await connect()
                    continue
                status, length = _parse_head(head[:-4])
                await reader.readexactly(length)
                path.load_latencies.append(time.perf_counter() - t0)
                done += 1
                if status != 200:
                    path.errors += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    path.rps = done / (time.perf_counter() - started)


def measure_throughput(paths: list[Target], mode: Mode) -> None:
    for p in paths:
        asyncio.run(_load(p, mode.connections, 0.5))  # warm-up
        p.load_latencies.clear()
        cpu_before = _cpu_s(p.pid)
        asyncio.run(_load(p, mode.connections, mode.load_s))
        if p.pid is not None:
            p.cpu_us_per_request = (_cpu_s(p.pid) - cpu_before) / (p.rps * mode.load_s) * 1e6


def _cpu_s(pid: int | None) -> float:
    """CPU seconds of a process and its children (nginx's workers)."""
    if pid is None:
        return 0.0
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        t = p.cpu_times()
        total += t.user + t.system
    return total


# ---------------------------------------------------------------------- processes


def wait_serving(port: int, host: str, proc: subprocess.Popen, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    raw = Target("probe", port, host).request()
    while True:
        try:
            c = Connection(port)
            try:
                status, body = c.roundtrip(raw)
            finally:
                c.close()
            if status == 200 and len(body) == BODY_BYTES:
                return
            raise RuntimeError(f"{what} answered HTTP {status} with {len(body)} bytes")
        except (OSError, ValueError):
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer within {timeout:g}s") from None
            time.sleep(0.05)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def find_nginx(install: bool) -> tuple[str | None, str]:
    """The nginx binary and how it got here, or (None, why not)."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
    if found:
        return found, "already installed"
    if not install:
        return None, "not installed (--no-install)"
    if os.geteuid() != 0:
        return None, "not installed, and installing it needs root"
    print("installing nginx with apt-get...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for pkg in ("nginx-light", "nginx"):
        r = subprocess.run(["apt-get", "install", "-y", "-q", pkg], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
            r = subprocess.run(["apt-get", "install", "-y", "-q", pkg], capture_output=True, text=True, env=env)
        if r.returncode == 0 and (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
            return shutil.which("nginx") or "/usr/sbin/nginx", f"installed now (Debian package {pkg})"
    return None, "apt-get could not install it"


def nginx_version(binary: str) -> str:
    r = subprocess.run([binary, "-v"], capture_output=True, text=True)
    return (r.stderr or r.stdout).strip().replace("nginx version: ", "")


def nginx_config(root: Path, listen: int, backend: int) -> Path:
    """One worker (as the gateway is one process), HTTP/1.1 keep-alive to the upstream, no access log."""
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = "\n".join(f"    {kind}_temp_path {root / kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                             "uwsgi", "scgi"))
    conf = root / "nginx.conf"
    conf.write_text(f"""{user}worker_processes 1;
pid {root / 'nginx.pid'};
error_log {root / 'error.log'} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
{temp}
    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive 64;
        keepalive_requests 1000000;
    }}
    keepalive_requests 1000000;  # the default (1000) would close the client's connections mid-run
    server {{
        listen 127.0.0.1:{listen} backlog=1024;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
    }}
}}
""")
    return conf


# ---------------------------------------------------------------------- report


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def ms(x: float) -> str:
    return f"{x * 1000:.3f}"


def render(facts: dict, command: str, mode: Mode, paths: list[Target], nginx_note: str, seconds: float) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    direct = paths[0]
    nginx = next((p for p in paths if p.label.startswith("nginx")), None)
    out = [SECTION, ""]
    out.append(f"Produced by `{command}` ({mode.name} mode, {seconds:.0f} s, {when}). One backend process "
               f"(aiohttp, a fixed {BODY_BYTES}-byte body) on 127.0.0.1, called directly, through `shoal gateway` "
               f"(one process, routes from a file) and through nginx (one worker, upstream keep-alive), all on "
               f"this one machine with the client (this script: a minimal HTTP/1.1 keep-alive client on plain "
               f"sockets).")
    out.append("")
    out.append("| Machine | |")
    out.append("|---|---|")
    for k, v in facts.items():
        out.append(f"| {k} | {v} |")
    out.append(f"| nginx | {nginx_note} |")
    out.append("")
    n = len(direct.latencies)
    out.append(f"### Latency: {n:,} sequential requests per path on one connection "
               f"(interleaved in {mode.rounds} rounds)")
    out.append("")
    out.append("Added = the path's percentile minus the direct call's.")
    out.append("")
    out.append("| Path | p50 ms | p99 ms | p50 added ms | p99 added ms | errors |")
    out.append("|---|---:|---:|---:|---:|---:|")
    d50, d99 = pct(direct.latencies, 0.5), pct(direct.latencies, 0.99)
    for p in paths:
        p50, p99 = pct(p.latencies, 0.5), pct(p.latencies, 0.99)
        added = ("", "") if p is direct else (ms(p50 - d50), ms(p99 - d99))
        out.append(f"| {p.label} | {ms(p50)} | {ms(p99)} | {added[0]} | {added[1]} | {p.errors} |")
    if nginx is not None:
        gw = paths[1]
        a_gw = pct(gw.latencies, 0.5) - d50
        a_ng = pct(nginx.latencies, 0.5) - d50
        if a_ng > 0:
            out.append("")
            out.append(f"`shoal gateway` adds {a_gw / a_ng:.1f}x the median latency nginx adds "
                       f"({ms(a_gw)} ms against {ms(a_ng)} ms).")
    out.append("")
    out.append(f"### Throughput: {mode.connections} connections kept busy for {mode.load_s:g} s per path")
    out.append("")
    out.append("| Path | requests/s | of direct | of nginx | p50 ms | p99 ms | proxy CPU µs per request | errors |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for p in paths:
        of_nginx = f"{p.rps / nginx.rps:.2f}x" if nginx is not None and p is not direct else ""
        cpu = f"{p.cpu_us_per_request:.0f}" if p.cpu_us_per_request is not None else ""
        out.append(f"| {p.label} | {p.rps:,.0f} | {p.rps / direct.rps:.2f}x | {of_nginx} "
                   f"| {ms(pct(p.load_latencies, 0.5))} | {ms(pct(p.load_latencies, 0.99))} | {cpu} | {p.errors} |")
    out.append("")
    cores = os.cpu_count() or 0
    gw = paths[1]
    out.append("How to read it:")
    out.append("")
    out.append(f"- Everything shares this machine's {cores} cores: the client, the backend and the proxy, and "
               "whatever else ran at the time (see the load average), so requests/s are lower bounds. The proxy's "
               "CPU time per request (its process, and nginx's worker, from psutil) is the figure that carries "
               "over to other machines.")
    if gw.cpu_us_per_request:
        out.append(f"- `shoal gateway` is one Python process (asyncio, aiohttp server and client): at "
                   f"{gw.cpu_us_per_request:.0f} µs of CPU per request it tops out near "
                   f"{1e6 / gw.cpu_us_per_request:,.0f} requests/s per core, and half of that cost is the two socket "
                   "writes and aiohttp's client. For model serving, where a request takes 50 ms to minutes, the median "
                   "latency it adds is well under 1% of a request's time.")
    out.append("- Per request the gateway also routes by Host header (`bench.default`) through the routing table, "
               "counts the request per pod (in-flight, rate, Prometheus counters, latency histogram), drops "
               "hop-by-hop headers and adds X-Forwarded-*; nginx here only proxies to one upstream, with its "
               "default buffering.")
    out.append("- Responses of at most 64 KiB with a Content-Length are relayed by the gateway in one write; "
               "larger and chunked ones (streams, server-sent events) chunk by chunk as they arrive.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="fewer requests and 3 s of load per path (< 1 minute)")
    ap.add_argument("--no-nginx", action="store_true", help="leave nginx out")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install nginx when missing")
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"), help="file to write (default %(default)s)")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write the file")
    args = ap.parse_args(argv)
    mode = SHORT if args.short else FULL
    command = shlex.join([".venv/bin/python", "bench/bench_gateway.py", *(sys.argv[1:] if argv is None else argv)])
    started = time.time()
    facts = machine_facts()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-gateway-"))
    procs: list[subprocess.Popen] = []
    try:
        backend_port = free_port()
        backend = subprocess.Popen([sys.executable, "-c", BACKEND, str(backend_port)])
        procs.append(backend)
        wait_serving(backend_port, "127.0.0.1", backend, "the backend")
        paths = [Target("direct", backend_port, "127.0.0.1")]

        routes = root / "routes.json"
        routes.write_text(json.dumps({"version": 1, "services": [{
            "namespace": "default", "name": "bench", "ports": [{"name": "http", "port": 80}],
            "backends": [{"pod": "bench-0", "deployment": "bench", "address": "127.0.0.1",
                          "port": backend_port, "ready": True, "terminating": False}]}]}))
        gw_port = free_port()
        gateway = subprocess.Popen([str(BIN / "shoal"), "gateway", "--routes", str(routes),
                                    "--listen", f"127.0.0.1:{gw_port}", "--log-level", "warning"])
        procs.append(gateway)
        wait_serving(gw_port, SERVICE_HOST, gateway, "shoal gateway")
        paths.append(Target("`shoal gateway`", gw_port, SERVICE_HOST, pid=gateway.pid))

        nginx_note = "left out (--no-nginx)"
        if not args.no_nginx:
            binary, how = find_nginx(not args.no_install)
            if binary is None:
                nginx_note = f"left out: {how}"
                print(f"nginx {nginx_note}", flush=True)
            else:
                ng_port = free_port()
                conf = nginx_config(root, ng_port, backend_port)
                nginx = subprocess.Popen([binary, "-p", str(root), "-e", str(root / "error.log"),
                                          "-c", str(conf), "-g", "daemon off;"])
                procs.append(nginx)
                wait_serving(ng_port, "127.0.0.1", nginx, "nginx")
                version = nginx_version(binary)
                nginx_note = f"{version} ({how})"
                paths.append(Target(f"nginx {version.split('/')[-1].split()[0]}", ng_port, "127.0.0.1",
                                   pid=nginx.pid))

        print(f"latency: {mode.sequential} sequential requests per path...", flush=True)
        measure_latency(paths, mode)
        for p in paths:
            print(f"  {p.label}: p50 {ms(pct(p.latencies, 0.5))} ms, p99 {ms(pct(p.latencies, 0.99))} ms", flush=True)
        print(f"throughput: {mode.connections} connections, {mode.load_s:g} s per path...", flush=True)
        measure_throughput(paths, mode)
        for p in paths:
            print(f"  {p.label}: {p.rps:,.0f} requests/s, {p.errors} errors", flush=True)
    finally:
        for proc in reversed(procs):
            stop(proc, signal.SIGQUIT if proc.args[0].endswith("nginx") else signal.SIGTERM)
    facts["Load average (1/5/15 min) at end"] = load_average()
    text = render(facts, command, mode, paths, nginx_note, time.time() - started)
    if args.no_write:
        print(text)
    else:
        write_section(SECTION, text, Path(args.output))
        print(f"wrote the {SECTION!r} section of {args.output}")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
