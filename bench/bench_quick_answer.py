"""An idle node's heartbeat through the server's HTTP protocol, in one process: the CPU each
costs the server and a client sent back to back on one kept connection over loopback, with the
quick answer made by the protocol (``server/protocol.py``, as the server serves) against the
same answer made through uvicorn's ASGI cycle and the fast path (the protocol with no quick
routes of its own, the way before).

The HTTP benchmark (bench_heartbeat.py) times the same requests across processes, paced as
5,000 agents send them; its figures move by a third from run to run on a shared machine. Here
both ways run alternately in one process, each round the same requests, so the difference
between them is the protocol's and not the machine's.

    python bench/bench_quick_answer.py [--requests 5000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import uvicorn  # noqa: E402

from shoal.agent import wire  # noqa: E402
from shoal.server.app import create_app  # noqa: E402
from shoal.server.config import parse_cluster_config  # noqa: E402
from shoal.server.core import Server  # noqa: E402
from shoal.server.protocol import ServerProtocol, serving  # noqa: E402

JOIN = "join_" + "b" * 32
OK = b'{"ok": true}'


async def _asgi_post(app, path: str, body: bytes, authorization: str) -> bytes:
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": [(b"authorization", authorization.encode()),
                                              (b"content-type", b"application/json"),
                                              (b"content-length", str(len(body)).encode())],
             "http_version": "1.1", "scheme": "http", "server": ("bench", 80), "client": ("127.0.0.1", 1)}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return b"".join(m.get("body", b"") for m in sent[1:])


async def _serve(app, protocol: type, request: bytes, requests: int, rounds: int) -> list[float]:
    """CPU seconds per request, one figure a round, for ``requests`` copies of ``request`` (a
    heartbeat) sent back to back."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, http=protocol, log_level="warning",
                            access_log=False, lifespan="off")
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)  # as uvicorn.Server.serve sets it (off: a no-op)
    await server.startup()
    port = server.servers[0].sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(requests):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            body = await reader.readexactly(length)
            assert body == OK, (head, body)
        out.append((time.process_time() - t0) / requests)
    writer.close()
    server.should_exit = True
    await server.shutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    ap.add_argument("--requests", type=int, default=5000, help="heartbeats per round")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per way, the ways alternated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node01", "default": True}]})
        server = Server(f"sqlite:///{tmp}/shoal.db", config, tmp, join_token=JOIN)
        app = create_app(server)
        server.leader.start()
        deadline = time.monotonic() + 30
        while not server.leader.is_leader:
            assert time.monotonic() < deadline, "the server did not lead"
            time.sleep(0.05)
        try:
            body = wire.register_body(name="node01", address="127.0.0.1", port=1, cpus=8, memory_mb=1024, gpus=[],
                                      labels={}, features=[], boot_time=time.time(), alive=[], taints=[])
            reply = json.loads(asyncio.run(_asgi_post(app, wire.REGISTER, json.dumps(body).encode(), f"Bearer {JOIN}")))
            report = json.dumps(wire.report_body([], [], [], [], {"gpu_util": {str(i): 0.0 for i in range(8)}})).encode()
            path = wire.report_path("node01")
            # As the agents' client sends it (httpx's headers), on a kept connection.
            request = (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: */*\r\naccept-encoding: gzip, deflate\r\n"
                       f"connection: keep-alive\r\nuser-agent: shoal-agent\r\ncontent-type: application/json\r\n"
                       f"authorization: Bearer {reply['credential']}\r\ncontent-length: {len(report)}\r\n\r\n"
                       ).encode() + report
            ways = {"through uvicorn's ASGI cycle (before)": ServerProtocol, "made by the protocol (after)": serving(app)}
            per: dict[str, list[float]] = {w: [] for w in ways}
            asyncio.run(_serve(app, ways[next(iter(ways))], request, 500, 1))  # warm: the first answers build what is kept
            for _ in range(args.rounds):
                for way, protocol in ways.items():
                    per[way] += asyncio.run(_serve(app, protocol, request, args.requests, 1))
        finally:
            server.leader.stop()
            server.engine.dispose()
    print(f"{args.rounds} rounds of {args.requests} heartbeats back to back per way, alternated; "
          "CPU of the server and its client, one process, per heartbeat:")
    medians = {w: statistics.median(v) for w, v in per.items()}
    for way, values in per.items():
        print(f"  {way}: median {medians[way] * 1e6:.1f} us (rounds: {', '.join(f'{v * 1e6:.0f}' for v in values)})")
    before, after = medians.values()
    print(f"  saved per heartbeat: {(before - after) * 1e6:.1f} us ({1 - after / before:.0%});"
          f" at 250 heartbeats a second (5,000 nodes every 20 s): {(before - after) * 250:.1%} of a core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
