#!/usr/bin/env python3
"""What one heartbeat costs the server: its CPU per report, per long-poll renewal, and idle.

bench_scale.py measures a whole hollow cluster, where heartbeats, long-poll renewals and the
server's own rounds share one CPU figure. Here they are taken apart. One server (SQLite, the
default heartbeat interval and timeout) and ``--nodes`` nodes registered through the agent's
own requests (``shoal.agent.wire``), then three windows, the server's process CPU time over
each:

1. idle: ``--idle-s`` seconds of nothing (the controllers' rounds, the timeout checks);
2. paced (``--paced-s``): every node heartbeating once per the default interval the server
   gives (20 s: 5,000 nodes, 250 a second), spread over it as the agents' own timers spread
   them, with the heartbeats' flushes: the server's share of a core over idle, the issue's
   "heartbeat handling" figure;
3. heartbeats: ``--reports`` reports as an idle agent sends them (no runs, its 8 GPUs' usage
   sample), round-robin over the nodes from ``--threads`` threads, as fast as the server
   answers: the server's CPU per heartbeat, less the idle rate;
4. renewals: ``--renewals`` work long-polls answered at once (``wait`` 0 with the node's last
   epoch and generation), the answer a long-poll renewal builds when its wait runs out;
5. the floor (``--paced-s``): the same paced heartbeats, from as many kept connections, sent to
   a bare ASGI app that answers ``{"ok": true}`` under the server's own uvicorn settings (its
   HTTP protocol, event loop, keep-alive and TLS): what one HTTP request per heartbeat costs
   any Python server on this machine, so that Shoal's own part is the difference.

Windows 2 to 4 run twice: with a connection per request (``Connection: close``, the
commands' way and the agents' before they kept theirs) and on kept connections (the
agents' ``keep_alive``). The per-request costs are also given as shares of a core at 1,000
and 5,000 nodes (heartbeats every interval, renewals every 55 s). ``--rounds`` rounds,
medians. ``--tls``: HTTPS, as a server not on loopback serves by default.

    .venv/bin/python bench/bench_heartbeat.py
    .venv/bin/python bench/bench_heartbeat.py --nodes 5000 --reports 20000 --profile /tmp/hb
    .venv/bin/python bench/bench_heartbeat.py --tls     # HTTPS, as agents on other machines use it
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_foundation import load_average, machine_facts  # noqa: E402
from shoal.agent import wire  # noqa: E402
from shoal.agent.hollow import NodeSpec, node_specs  # noqa: E402
from shoal.api_client import Client  # noqa: E402
from tests.integration.cluster import BIN, free_port, wait_until  # noqa: E402

GPUS = 8
JOIN = "join_heartbeat_benchmark_token"


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def loop_cpu_s(p: psutil.Process) -> float:
    """The CPU time of the server's main thread, its event loop's."""
    t = next(t for t in p.threads() if t.id == p.pid)
    return t.user_time + t.system_time


class Server:
    def __init__(self, root: Path, nodes: int, tls: bool, timeout_s: float | None = None) -> None:
        self.root, self.nodes, self.tls, self.timeout_s = root, nodes, tls, timeout_s
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{free_port()}"
        self.ca_file = str(root / "server" / "ca.crt") if tls else None

    def start(self) -> None:
        conf = {"cluster_name": "hb", "partitions": [{"name": "gpu", "nodes": f"hb[1-{self.nodes}]",
                                                      "default": True}]}
        if self.timeout_s is not None:  # the interval follows: a third of it (config.NodeLifecycleConfig)
            conf["nodes"] = {"heartbeat_timeout_s": self.timeout_s}
        (self.root / "cluster.yaml").write_text(json.dumps(conf))
        (self.root / "join.token").write_text(JOIN)
        self.proc = subprocess.Popen(
            [str(BIN / "python"), "-m", "shoal", "server", "--listen", self.url.partition("://")[2],
             "--config", str(self.root / "cluster.yaml"), "--state-dir", str(self.root / "server"),
             "--join-token-file", str(self.root / "join.token"), "--tls", "on" if self.tls else "off"],
            stdout=open(self.root / "server.log", "wb"), stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)
        wait_until(lambda: (self.root / "server" / "admin.token").exists() and self._healthy(), 60,
                   "the server to start")

    def _healthy(self) -> bool:
        try:
            Client(self.url, timeout=2, ca_file=self.ca_file).get("/healthz")
            return True
        except Exception:
            return False

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen) -> None:
    """TERM, then KILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


class Node:
    """One registered node: its keep-alive client, credential and last work generation."""

    def __init__(self, url: str, spec: NodeSpec, ca_file: str | None) -> None:
        self.name = name = spec.name
        self.client = Client(url, JOIN, timeout=30, ca_file=ca_file)
        self.client.job_token = None
        self.kept = Client(url, timeout=30, keep_alive=True, ca_file=ca_file)  # as the agents' own client (keep_alive)
        self.kept.job_token = None
        reply = self.client.post(wire.REGISTER, wire.register_body(
            name=name, address=spec.address, port=spec.port, cpus=spec.cpus, memory_mb=spec.memory_mb,
            gpus=spec.gpus, labels=spec.labels, features=spec.features, boot_time=time.time(), alive=[],
            taints=[]))
        self.client.token = self.kept.token = reply["credential"]
        self.interval_s = float(reply["heartbeat_interval_s"])
        work = self.client.get(wire.work_path(name), wire.work_params(None, None))
        self.epoch, self.gen = work["epoch"], work["gen"]
        self.body = wire.report_body([], [], [], [], {"gpu_util": {str(i): 0.0 for i in range(GPUS)}})

    def heartbeat(self, kept: bool) -> None:
        (self.kept if kept else self.client).post(wire.report_path(self.name), self.body)

    def renewal(self, kept: bool) -> None:
        (self.kept if kept else self.client).get(wire.work_path(self.name),
                                                 {"wait": 0, "epoch": self.epoch, "gen": self.gen})


def spread(nodes: list[Node], count: int, threads: int, call, kept: bool) -> float:
    """``count`` calls round-robin over the nodes from ``threads`` threads; seconds taken."""
    def worker(k: int) -> None:
        for i in range(k, count, threads):
            call(nodes[i % len(nodes)], kept)
    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - t0


def paced(nodes: list[Node], seconds: float, interval: float, threads: int, kept: bool) -> int:
    """Each node's heartbeat once per ``interval`` for ``seconds``, spread evenly over the
    interval, as the nodes' own agents send them (the default interval: 5,000 nodes, 250 a
    second); how many were sent."""
    sent = [0] * threads
    t0 = time.monotonic()

    def worker(k: int) -> None:
        mine = list(range(k, len(nodes), threads))
        due = sorted((interval * i / len(nodes) + j * interval, i) for i in mine
                     for j in range(int(seconds / interval) + 1) if interval * i / len(nodes) + j * interval < seconds)
        for at, i in due:
            if (wait := t0 + at - time.monotonic()) > 0:
                time.sleep(wait)
            nodes[i].heartbeat(kept)
            sent[k] += 1
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(sent)


async def bare_app(scope, receive, send) -> None:
    """The floor's server: reads the request's body and answers as a quiet heartbeat is answered."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")]})
    await send({"type": "http.response.body", "body": b'{"ok":true}'})


def serve_bare(listen: str, keep_alive_s: float, tls_dir: str | None) -> None:
    """``uvicorn.run`` as ``shoal server`` calls it (server/main.py), the app bare."""
    import uvicorn

    from shoal.server import interpreter, tls
    from shoal.server.protocol import ServerProtocol
    interpreter.set_for_server()
    ssl = ({"ssl_certfile": f"{tls_dir}/{tls.SERVER_CERT}", "ssl_keyfile": f"{tls_dir}/{tls.SERVER_KEY}"}
           if tls_dir else {})
    host, _, port = listen.rpartition(":")
    uvicorn.run(bare_app, host=host, port=int(port), log_level="warning", access_log=False,
                timeout_keep_alive=keep_alive_s, http=ServerProtocol, **ssl)


class BareNode:
    """A node's heartbeat, its body and path as a Node's, to the bare app on a kept connection."""

    def __init__(self, url: str, node: Node, ca_file: str | None) -> None:
        self.kept = Client(url, timeout=30, keep_alive=True, ca_file=ca_file)
        self.kept.job_token = None
        self.path, self.body = wire.report_path(node.name), node.body

    def heartbeat(self, kept: bool) -> None:
        self.kept.post(self.path, self.body)


def floor_share(args, root: Path, nodes: list[Node], ca_file: str | None) -> float:
    """The bare app's share of a core over its idle rate, every node heartbeating at the interval."""
    listen = f"127.0.0.1:{free_port()}"
    cmd = [str(BIN / "python"), str(Path(__file__).resolve()), "--bare-server", listen,
           "--bare-keep-alive-s", str(max(30.0, nodes[0].interval_s + 15))]
    if args.tls:
        cmd += ["--bare-tls-dir", str(root / "server")]
    proc = subprocess.Popen(cmd, stdout=open(root / "bare.log", "wb"), stderr=subprocess.STDOUT)
    try:
        url = f"{'https' if args.tls else 'http'}://{listen}"
        bare = [BareNode(url, n, ca_file) for n in nodes]
        wait_until(lambda: _answers(bare[0]), 30, "the bare app to start")
        ps = psutil.Process(proc.pid)
        spread(bare, len(bare), args.threads, BareNode.heartbeat, True)  # every connection open
        time.sleep(args.settle_s)
        c0 = cpu_s(ps)
        time.sleep(args.idle_s)
        idle_rate = (cpu_s(ps) - c0) / args.idle_s
        c0, w0 = cpu_s(ps), time.monotonic()
        paced(bare, args.paced_s, nodes[0].interval_s, args.threads, True)
        share = (cpu_s(ps) - c0) / (time.monotonic() - w0) - idle_rate
        for b in bare:
            b.kept.close()
        return share
    finally:
        stop_process(proc)


def _answers(node: BareNode) -> bool:
    try:
        node.heartbeat(True)
        return True
    except Exception:
        return False


def one_round(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="shoal-hb-") as tmp:
        server = Server(Path(tmp), args.nodes, args.tls, args.heartbeat_timeout)
        server.start()
        try:
            names = node_specs([f"hb{i}" for i in range(1, args.nodes + 1)], gpus=GPUS, gpu_model="H100-SXM-80GB",
                               cpus=128, memory_mb=2 * 2 ** 20, address="127.0.0.1", port=1, labels={},
                               features=[])
            nodes: list[Node] = []
            lock = threading.Lock()

            def register(part: list[NodeSpec]) -> None:
                made = [Node(server.url, n, server.ca_file) for n in part]
                with lock:
                    nodes.extend(made)
            parts = [names[k::8] for k in range(8)]
            regs = [threading.Thread(target=register, args=(p,)) for p in parts]
            for t in regs:
                t.start()
            for t in regs:
                t.join()
            time.sleep(args.settle_s)  # registration's wake-ups and passes done
            c0 = cpu_s(server.ps)
            time.sleep(args.idle_s)
            idle_rate = (cpu_s(server.ps) - c0) / args.idle_s
            out = {"nodes": args.nodes, "interval_s": nodes[0].interval_s, "idle_share": idle_rate}

            def profiled(name: str):
                """py-spy on the server while the block runs (with --profile)."""
                if not args.profile:
                    return None
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                spy = subprocess.Popen(
                    [str(BIN / "py-spy"), "record", "--pid", str(server.proc.pid), "--rate", "200", "--format",
                     "raw", "--nonblocking", "-o", f"{args.profile}/{name}.txt"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1)
                return spy

            def stop(spy) -> None:
                if spy is not None:
                    spy.send_signal(2)
                    spy.wait(30)

            def window(call, count: int, kept: bool, name: str) -> float:
                """The server's CPU per call, less its idle rate; py-spy'd with --profile."""
                spy = profiled(name)
                c0 = cpu_s(server.ps)
                took = spread(nodes, count, args.threads, call, kept)
                used = cpu_s(server.ps) - c0 - idle_rate * took
                stop(spy)
                return used / count

            for mode, kept in (("close", False), ("keep", True)):
                # Every node heard once this way first (kept: its connections open). The kept
                # connections are open only in their own mode's windows: idle through the other's,
                # the server would close them meanwhile and the agents open them again.
                spread(nodes, len(nodes), args.threads, Node.heartbeat, kept)
                if args.paced_s:
                    # The figure the issue asks for: every node heartbeating at the default interval
                    # for a while (heartbeats' flushes included), the server's share of a core.
                    spy = profiled(f"paced-{mode}")
                    c0, w0, k0 = cpu_s(server.ps), time.monotonic(), server.ps.cpu_times().system
                    m0 = loop_cpu_s(server.ps)
                    count = paced(nodes, args.paced_s, nodes[0].interval_s, args.threads, kept)
                    took = time.monotonic() - w0
                    out[f"paced_share_{mode}"] = (cpu_s(server.ps) - c0) / took - idle_rate
                    # The kernel's part (the server's system time): on loopback it includes
                    # delivering each answer to the benchmark's own client threads.
                    out[f"paced_system_share_{mode}"] = (server.ps.cpu_times().system - k0) / took
                    # The event loop's thread (uvicorn's: the HTTP requests) against the rest.
                    out[f"paced_loop_share_{mode}"] = (loop_cpu_s(server.ps) - m0) / took
                    out[f"paced_rate_{mode}"] = count / took
                    stop(spy)
                out[f"heartbeat_ms_{mode}"] = 1e3 * window(Node.heartbeat, args.reports, kept, f"heartbeats-{mode}")
                out[f"renewal_ms_{mode}"] = 1e3 * window(Node.renewal, args.renewals, kept, f"renewals-{mode}")
                for n in (1000, 5000):
                    out[f"share_{n}_{mode}"] = n / out["interval_s"] * out[f"heartbeat_ms_{mode}"] / 1e3
                    out[f"renewal_share_{n}_{mode}"] = n / wire.WORK_WAIT_S * out[f"renewal_ms_{mode}"] / 1e3
            for node in nodes:
                node.kept.close()
            if args.paced_s:
                out["paced_share_bare"] = floor_share(args, Path(tmp), nodes, server.ca_file)
            return out
        finally:
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--reports", type=int, default=10000)
    ap.add_argument("--renewals", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--idle-s", type=float, default=15)
    ap.add_argument("--settle-s", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paced-s", type=float, default=60,
                    help="seconds of every node heartbeating at the interval, per way (0: skip)")
    ap.add_argument("--heartbeat-timeout", type=float, metavar="S",
                    help="the server's nodes.heartbeat_timeout_s (default: the server's default, 60 s); the "
                         "heartbeat interval is a third of it")
    ap.add_argument("--tls", action="store_true", help="serve HTTPS, as a server not on loopback does by default")
    ap.add_argument("--profile", help="py-spy the server's heartbeat window into this folder (raw stacks)")
    ap.add_argument("--save", type=Path, help="keep the results as JSON")
    ap.add_argument("--bare-server", help=argparse.SUPPRESS)  # the floor's server process (LISTEN)
    ap.add_argument("--bare-keep-alive-s", type=float, default=35, help=argparse.SUPPRESS)
    ap.add_argument("--bare-tls-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_server:
        serve_bare(args.bare_server, args.bare_keep_alive_s, args.bare_tls_dir)
        return 0
    load0 = load_average()
    rounds = []
    for r in range(args.rounds):
        rounds.append(one_round(args))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in rounds[-1].items()), flush=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"\nmedians of {len(rounds)} rounds ({'HTTPS' if args.tls else 'HTTP'}, {args.nodes} nodes registered, "
          f"{args.reports} heartbeats, "
          f"{args.renewals} renewals, {args.threads} threads), load average {load0} -> {load_average()}")
    print(f"  idle: {med['idle_share']:.1%} of a core")
    for mode, how in (("close", "a connection per request (Connection: close)"),
                      ("keep", "kept connections (the agents' keep_alive)")):
        if args.paced_s:
            print(f"  {how}: every node heartbeating at the interval ({med[f'paced_rate_{mode}']:.0f} a "
                  f"second for {args.paced_s:g} s): {med[f'paced_share_{mode}']:.1%} of a core over idle "
                  f"(the kernel's part: {med[f'paced_system_share_{mode}']:.1%}; the event loop's thread: "
                  f"{med[f'paced_loop_share_{mode}']:.1%}, idle included)")
            if mode == "keep":
                print(f"  the floor: the same paced heartbeats on kept connections to a bare ASGI app under the "
                      f"server's uvicorn settings: {med['paced_share_bare']:.1%} of a core over idle (Shoal's own "
                      f"part: {med['paced_share_keep'] - med['paced_share_bare']:.1%})")
        print(f"  {how}: server CPU per heartbeat {med[f'heartbeat_ms_{mode}']:.3f} ms, per long-poll renewal "
              f"{med[f'renewal_ms_{mode}']:.3f} ms")
        for n in (1000, 5000):
            print(f"    {n} nodes at the interval ({med['interval_s']:g} s): heartbeats "
                  f"{med[f'share_{n}_{mode}']:.1%} of a core, long-poll renewals {med[f'renewal_share_{n}_{mode}']:.1%}")
    if args.save:
        args.save.write_text(json.dumps({"machine": machine_facts(), "args": vars(args) | {"save": str(args.save)},
                                         "rounds": rounds, "medians": med}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
