"""The gateway in front of real HTTP pods: balancing, retries, streaming, readiness, scale-to-zero.

Each test starts the gateway's aiohttp server and its pods' HTTP servers on 127.0.0.1
in one event loop (the last tests run `shoal gateway` as a process, fed by a routes file
or by a stand-in for the Shoal server's routes API). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
from aiohttp import web

from shoal.gateway.proxy import Gateway, GatewayConfig, serve
from shoal.gateway.routing import RoutingTable
from shoal.gateway.sync import Backoff, ServerLink
from tests.integration.cluster import BIN, free_port

TEST_TIMEOUT_S = 20


def run(coro, timeout: float = TEST_TIMEOUT_S):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Pod:
    """A pod's HTTP server: answers JSON naming itself; /slow, /block, /sse and /stream behave as named."""

    def __init__(self, name: str, deployment: str = "llm", delay: float = 0.0):
        self.name, self.deployment, self.delay = name, deployment, delay
        self.hits = 0
        self.seen: list[dict] = []
        self.gate = asyncio.Event()  # /block waits for it; /sse waits for it between its events
        self.disconnected = asyncio.Event()
        self.port = 0
        self._runner: web.ServerRunner | None = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.hits += 1
        body = await request.content.read()  # unlimited, unlike request.read()
        self.seen.append({"headers": request.headers.copy(), "path": request.path_qs, "body": body})
        if request.path in ("/sse", "/stream"):
            return await self._stream(request)
        if request.path == "/block":
            await self.gate.wait()
        if request.path == "/gzip":
            return web.Response(body=gzip.compress(b"squeezed " * 100),
                                headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.json_response({"pod": self.name, "path": request.path_qs, "bytes": len(body),
                                  "sha256": hashlib.sha256(body).hexdigest()},
                                 headers={"Connection": "keep-alive, X-Internal", "X-Internal": "secret"})

    async def _stream(self, request: web.BaseRequest) -> web.StreamResponse:
        sse = request.path == "/sse"
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream" if sse else "application/x-ndjson"})
        await out.prepare(request)
        try:
            await out.write(b"data: first\n\n" if sse else b'{"n": 1}\n')
            # The last event is sent only once the client has the first: a proxy that
            # buffered the response would leave the client waiting here until the timeout.
            try:
                await asyncio.wait_for(self.gate.wait(), 5)
                last = b"data: last\n\n" if sse else b'{"n": 2}\n'
            except asyncio.TimeoutError:
                last = b"data: timed-out\n\n"
            await asyncio.sleep(0.05)
            await out.write(last)
            await out.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            self.disconnected.set()
            raise
        return out

    async def start(self) -> Pod:
        # Cancelled when its client leaves, as model servers notice a dropped request.
        self._runner = web.ServerRunner(web.Server(self.handle, handler_cancellation=True, access_log=None))
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()

    def backend(self, ready: bool = True, terminating: bool = False) -> dict:
        return {"pod": self.name, "deployment": self.deployment, "address": "127.0.0.1", "port": self.port,
                "ready": ready, "terminating": terminating}


def service(name: str, backends: list[dict], namespace: str = "default", **extra) -> dict:
    return {"namespace": namespace, "name": name, "ports": [{"name": "http", "port": 80, "targetPort": 8000}],
            "backends": backends, **extra}


def routes(*services: dict, version: int = 1) -> dict:
    return {"version": version, "services": list(services)}


def dead_backend(name: str = "dead") -> dict:
    return {"pod": name, "deployment": "llm", "address": "127.0.0.1", "port": free_port(), "ready": True}


@asynccontextmanager
async def cluster(*pods: Pod, **config):
    """The pods started, a gateway in front of them, and a client session: ``(gateway, url, session)``."""
    for p in pods:
        await p.start()
    gateway = Gateway(GatewayConfig(**config))
    runner, (_, port) = await serve(gateway, "127.0.0.1", 0)
    session = aiohttp.ClientSession(auto_decompress=False)
    try:
        yield gateway, f"http://127.0.0.1:{port}", session
    finally:
        await session.close()
        await runner.cleanup()
        await gateway.close()
        for p in pods:
            await p.stop()


async def call(session, url, host="llm.default", path="/", method="GET", **kw):
    async with session.request(method, url + path, headers={"Host": host, **kw.pop("headers", {})}, **kw) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


async def until(predicate, timeout: float = 3.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------ balancing


def test_a_slow_pod_gets_fewer_requests_than_a_fast_one_under_concurrent_load():
    async def story():
        fast, slow = Pod("fast"), Pod("slow", delay=0.2)
        async with cluster(fast, slow) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(service("llm", [fast.backend(), slow.backend()]))))

            async def client():
                end = time.monotonic() + 1.5
                while time.monotonic() < end:
                    status, _ = await call(session, url)
                    assert status == 200

            await asyncio.gather(*(client() for _ in range(8)))
            total = fast.hits + slow.hits
            # Round-robin would give the slow pod half; least-outstanding gives it few.
            assert total > 50 and slow.hits < 0.2 * total, (fast.hits, slow.hits)

    run(story())


def test_a_dead_pod_costs_no_failed_request_the_connection_is_retried_on_another():
    async def story():
        a, b = Pod("a"), Pod("b")
        async with cluster(a, b, eject_s=0.0) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(
                service("llm", [dead_backend("dead-1"), a.backend(), dead_backend("dead-2"), b.backend()]))))
            results = []
            for i in range(30):
                results.append(await call(session, url, path=f"/v1/models?i={i}"))
                body = os.urandom(2000)
                status, doc = await call(session, url, path="/v1/completions", method="POST", data=body)
                results.append((status, doc))
                assert doc["sha256"] == hashlib.sha256(body).hexdigest()  # the body reached the pod whole
            assert {s for s, _ in results} == {200}
            assert {d["pod"] for _, d in results} == {"a", "b"}
            errors = gw.stats.backend_errors
            assert errors[("default/llm", "default/dead-1", "connect")] > 0

            gw.set_table(RoutingTable.from_json(routes(service("llm", [dead_backend("d1"), dead_backend("d2")]))))
            status, text = await call(session, url)
            assert status == 502
            assert text.startswith("no pod of service default/llm answered: d")
            assert "d1" in text and "d2" in text and "connection refused" in text

    run(story())


def test_a_refusing_pod_is_skipped_for_a_while_instead_of_retried_on_every_request():
    async def story():
        a = Pod("a")
        async with cluster(a, eject_s=30.0) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(service("llm", [dead_backend(), a.backend()]))))
            for _ in range(20):
                assert (await call(session, url))[0] == 200
            assert gw.stats.backend_errors[("default/llm", "default/dead", "connect")] == 1

    run(story())


# ------------------------------------------------------------------ streaming and headers


def test_server_sent_events_reach_the_client_as_the_pod_sends_them():
    async def story():
        pod = Pod("llm-a")
        async with cluster(pod) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(service("llm", [pod.backend()]))))
            for path, first in (("/sse", b"data: first\n\n"), ("/stream", b'{"n": 1}\n')):
                pod.gate.clear()
                async with session.post(url + path, headers={"Host": "llm.default"}, json={"stream": True}) as r:
                    assert r.status == 200
                    assert r.headers["Content-Type"].startswith("text/event-stream" if path == "/sse"
                                                                else "application/x-ndjson")
                    got = await asyncio.wait_for(r.content.readuntil(b"\n"), 3)
                    while not got.endswith(first[-2:] if path == "/sse" else b"\n"):
                        got += await asyncio.wait_for(r.content.readuntil(b"\n"), 3)
                    assert got == first  # before the pod has sent the last event
                    pod.gate.set()
                    rest = await asyncio.wait_for(r.content.read(), 3)
                assert b"timed-out" not in rest and rest in (b"data: last\n\n", b'{"n": 2}\n')

    run(story())


def test_a_client_that_leaves_mid_stream_closes_the_pods_connection_and_frees_its_slot():
    async def story():
        pod = Pod("llm-a")
        async with cluster(pod) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(service("llm", [pod.backend()]))))
            async with session.get(url + "/sse", headers={"Host": "llm.default"}) as r:
                await asyncio.wait_for(r.content.readuntil(b"\n\n"), 3)
                assert gw.stats.inflight["default/llm-a"] == 1
                r.close()
            await asyncio.wait_for(pod.disconnected.wait(), 5)
            await until(lambda: gw.stats.inflight["default/llm-a"] == 0, what="the slot to be freed")

    run(story())


def test_headers_host_kept_forwarded_for_added_hop_by_hop_dropped_encodings_untouched():
    async def story():
        pod = Pod("llm-a")
        async with cluster(pod) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(service("llm", [pod.backend()]))))
            async with session.get(url + "/v1/models?x=1", headers={
                "Host": "llm.default.svc.cluster.local", "X-Forwarded-For": "10.1.2.3",
                "Connection": "keep-alive, X-Hop", "X-Hop": "only-for-the-gateway", "TE": "trailers",
                "Authorization": "Bearer user-token",
            }) as r:
                assert r.status == 200
                assert "X-Internal" not in r.headers  # named in the pod's Connection header
            seen = pod.seen[-1]["headers"]
            assert seen["Host"] == "llm.default.svc.cluster.local"
            assert seen["X-Forwarded-For"] == "10.1.2.3, 127.0.0.1"
            assert seen["X-Forwarded-Proto"] == "http"
            assert seen["X-Forwarded-Host"] == "llm.default.svc.cluster.local"
            assert seen["Authorization"] == "Bearer user-token"
            assert "X-Hop" not in seen and "TE" not in seen
            assert pod.seen[-1]["path"] == "/v1/models?x=1"

            async with session.get(url + "/gzip", headers={"Host": "llm.default"}) as r:
                assert r.headers["Content-Encoding"] == "gzip"
                assert gzip.decompress(await r.read()) == b"squeezed " * 100

            big = os.urandom(3 * 1024 * 1024)

            async def chunks():
                for i in range(0, len(big), 256 * 1024):
                    yield big[i:i + 256 * 1024]

            status, doc = await call(session, url, path="/upload", method="POST", data=chunks())
            assert (status, doc["bytes"], doc["sha256"]) == (200, len(big), hashlib.sha256(big).hexdigest())

    run(story())


# ------------------------------------------------------------------ readiness, errors, scale-to-zero


def test_terminating_and_unready_pods_get_no_new_requests_while_in_flight_ones_finish():
    async def story():
        a, b, c = Pod("a"), Pod("b"), Pod("c")
        async with cluster(a, b, c) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(service("llm", [a.backend(ready=False), b.backend()]))))
            in_flight = asyncio.ensure_future(call(session, url, path="/block"))
            await until(lambda: b.hits == 1, what="the request to reach pod b")

            # b is being deleted: the server marks it terminating before its containers stop.
            gw.set_table(RoutingTable.from_json(routes(
                service("llm", [a.backend(), b.backend(terminating=True), c.backend(ready=False)]), version=2)))
            answers = [await call(session, url) for _ in range(20)]
            assert {d["pod"] for _, d in answers} == {"a"}
            assert (b.hits, c.hits) == (1, 0)

            b.gate.set()
            status, doc = await asyncio.wait_for(in_flight, 3)
            assert (status, doc["pod"]) == (200, "b")

    run(story())


def test_unknown_services_and_services_without_ready_pods_say_so():
    async def story():
        a = Pod("a")
        async with cluster(a) as (gw, url, session):
            status, text = await call(session, url)
            assert (status, text) == (503, "the gateway has no routes yet (the server has not answered)\n")
            gw.set_table(RoutingTable.from_json(routes(service("llm", [a.backend(ready=False)]))))
            assert await call(session, url) == (503, "no ready endpoints for service default/llm\n")
            assert await call(session, url, host="nope.default") == (404, "service default/nope not found\n")
            path = "/shoal/v1/namespaces/default/services/llm:grpc/proxy/"
            status, text = await call(session, url, host="127.0.0.1", path=path)
            assert status == 404 and "service default/llm has no port 'grpc'" in text

            status, health = await call(session, url, host="127.0.0.1", path="/gateway/healthz")
            assert status == 200 and health["routes_version"] == 1
            async with session.get(url + "/gateway/metrics") as r:
                text = await r.text()
            assert 'shoal_gateway_requests_total{service="default/llm",pod="",code="503"} 1' in text

    run(story())


def test_a_scale_to_zero_service_holds_requests_until_a_pod_is_ready():
    async def story():
        pod = Pod("zero-0", deployment="zero")
        async with cluster(pod, hold_s=10) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(service("zero", [], scale_to_zero=True))))
            held = [asyncio.ensure_future(call(session, url, host="zero.default", path=f"/v1/x?{i}"))
                    for i in range(3)]
            await until(lambda: gw.report()["held"] == {"default/zero": 3}, what="three held requests")
            async with session.get(url + "/gateway/metrics") as r:
                assert 'shoal_gateway_held_requests{service="default/zero"} 3' in await r.text()
            assert not any(h.done() for h in held)

            # The server scaled the Deployment to 1; its pod is starting, then ready.
            gw.set_table(RoutingTable.from_json(routes(
                service("zero", [pod.backend(ready=False)], scale_to_zero=True), version=2)))
            await asyncio.sleep(0.1)
            assert not any(h.done() for h in held)
            gw.set_table(RoutingTable.from_json(routes(
                service("zero", [pod.backend()], scale_to_zero=True), version=3)))
            answers = await asyncio.wait_for(asyncio.gather(*held), 3)
            assert [s for s, _ in answers] == [200, 200, 200]
            assert gw.report()["held"] == {}

    run(story())


def test_a_held_request_gets_503_when_no_pod_becomes_ready_in_time():
    async def story():
        async with cluster(hold_s=0.3) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(service("zero", [], scale_to_zero=True))))
            started = time.monotonic()
            status, text = await call(session, url, host="zero.default")
            assert 0.25 < time.monotonic() - started < 2
            assert status == 503
            assert text == "no ready endpoints for service default/zero (held 0.3 s for it to scale up from zero)\n"

    run(story())


def test_a_90_10_canary_split_gives_the_canary_10_percent_of_2000_requests():
    async def story():
        v1a, v1b, v2 = Pod("v1-a", "llm-v1"), Pod("v1-b", "llm-v1"), Pod("v2-a", "llm-v2")
        async with cluster(v1a, v1b, v2) as (gw, url, session):
            gw.set_table(RoutingTable.from_json(routes(service(
                "llm", [v1a.backend(), v1b.backend(), v2.backend()], split={"llm-v1": 90, "llm-v2": 10}))))
            counts: Counter = Counter()

            async def client(n):
                for _ in range(n):
                    status, doc = await call(session, url)
                    assert status == 200
                    counts[doc["pod"]] += 1

            await asyncio.gather(*(client(125) for _ in range(16)))
            assert sum(counts.values()) == 2000
            assert abs(counts["v2-a"] - 200) <= 60, counts
            assert counts["v1-a"] > 0 and counts["v1-b"] > 0

    run(story())


# ------------------------------------------------------------------ routes from the server


class RoutesServer:
    """A stand-in for the Shoal server's routes and metrics API (docs/SERVING.md, "Gateway")."""

    TOKEN = "gateway-token"

    def __init__(self, port: int = 0):
        self.port = port
        self.doc = routes()
        self.changed = asyncio.Event()
        self.reports: list[dict] = []
        self._runner = None

    def publish(self, doc: dict) -> None:
        self.doc = doc
        self.changed.set()
        self.changed = asyncio.Event()

    async def handle(self, request: web.BaseRequest) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.TOKEN}":
            return web.json_response({"detail": "invalid token"}, status=401)
        if request.path == "/shoal/v1/kube/routes":
            wait = float(request.query.get("wait", 0))
            if request.query.get("version") == str(self.doc["version"]):
                try:
                    await asyncio.wait_for(self.changed.wait(), wait)
                except asyncio.TimeoutError:
                    pass
            return web.json_response(self.doc)
        if request.path == "/shoal/v1/kube/metrics" and request.method == "POST":
            self.reports.append(await request.json())
            return web.json_response({"ok": True})
        return web.json_response({"detail": "Not Found"}, status=404)

    async def start(self) -> str:
        # Stopping does not wait for a pending long-poll: the server "goes away".
        self._runner = web.ServerRunner(web.Server(self.handle, access_log=None), shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()
        self.port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self._runner.cleanup()


def test_routes_follow_the_server_by_long_poll_and_survive_the_server_going_away():
    async def story():
        a, b = Pod("a"), Pod("b")
        async with cluster(a, b) as (gw, url, session):
            api = RoutesServer()
            server_url = await api.start()
            api.doc = routes(service("llm", [a.backend()]), version=1)
            link = ServerLink(gw, server_url, RoutesServer.TOKEN, wait_s=5, report_every_s=0.2,
                              backoff=Backoff(first_s=0.05, max_s=0.2))
            task = asyncio.ensure_future(link.run())
            try:
                await until(lambda: gw.table.version == 1, what="routes version 1")
                assert (await call(session, url))[1]["pod"] == "a"

                asked = link.polls
                api.publish(routes(service("llm", [b.backend()]), version=2))  # wakes the pending long-poll
                await until(lambda: gw.table.version == 2, timeout=1.0, what="routes version 2")
                assert link.polls == asked + 1
                for _ in range(5):
                    assert (await call(session, url))[1]["pod"] == "b"
                await until(lambda: any(r["pods"].get("default/b", {}).get("rps", 0) > 0 for r in api.reports),
                            what="a load report with pod b's rate")
                assert set(api.reports[-1]) == {"pods", "held"}
                assert api.reports[-1]["pods"]["default/b"]["inflight"] == 0

                await api.stop()  # the server goes away: the last table stays in use
                await asyncio.sleep(0.5)
                assert (await call(session, url))[1]["pod"] == "b"

                api2 = RoutesServer(port=api.port)
                api2.doc = routes(service("llm", [a.backend(), b.backend()]), version=3)
                await api2.start()
                await until(lambda: gw.table.version == 3, timeout=3.0, what="routes version 3 after the restart")
                await api2.stop()
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    run(story())


def test_with_several_servers_routes_come_from_one_that_answers_and_load_goes_to_all():
    """Servers sharing one store (high availability): the first listed is down, so the routes
    come from the second; the load figures reach every server that is up, so whichever
    leads has them for its HPAs."""
    async def story():
        a = Pod("a")
        async with cluster(a) as (gw, url, session):
            down_port = free_port()  # nothing listens here: a server that is down
            up1, up2 = RoutesServer(), RoutesServer()
            up1.doc = up2.doc = routes(service("llm", [a.backend()]), version=7)
            servers = f"http://127.0.0.1:{down_port},{await up1.start()},{await up2.start()}"
            link = ServerLink(gw, servers, RoutesServer.TOKEN, wait_s=5, report_every_s=0.2,
                              backoff=Backoff(first_s=0.05, max_s=0.2))
            task = asyncio.ensure_future(link.run())
            try:
                await until(lambda: gw.table.version == 7, what="routes from a server that answers")
                assert link.server == servers.split(",")[1]
                assert (await call(session, url))[1]["pod"] == "a"
                await until(lambda: up1.reports and up2.reports, what="load reports at both live servers")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await up1.stop()
                await up2.stop()

    run(story())


def test_a_wrong_token_leaves_the_gateway_without_routes_and_says_why(caplog):
    async def story():
        async with cluster() as (gw, url, session):
            api = RoutesServer()
            link = ServerLink(gw, await api.start(), "wrong", wait_s=1, backoff=Backoff(first_s=0.05, max_s=0.1))
            task = asyncio.ensure_future(link.run())
            await asyncio.sleep(0.3)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.stop()
            assert not gw.table_loaded

    run(story())
    assert "the server refused the gateway's token" in caplog.text


# ------------------------------------------------------------------ the `shoal gateway` command


class ThreadPod(BaseHTTPRequestHandler):
    """A plain http.server pod for the command's test (the test itself is not async)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = json.dumps({"pod": self.server.pod_name, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def start_thread_pod(name: str) -> ThreadingHTTPServer:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ThreadPod)
    httpd.daemon_threads = True
    httpd.pod_name = name
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def http_get(port: int, path: str, host: str) -> tuple[int, str]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": host})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def test_shoal_gateway_serves_a_routes_file_and_follows_its_changes(tmp_path):
    pods = [start_thread_pod("one"), start_thread_pod("two")]
    routes_file = tmp_path / "routes.json"

    def write(pod, version):
        tmp = tmp_path / "routes.tmp"
        tmp.write_text(json.dumps(routes(service("web", [
            {"pod": pod.pod_name, "address": "127.0.0.1", "port": pod.server_address[1], "ready": True}],
            namespace="team"), version=version)))
        os.replace(tmp, routes_file)

    write(pods[0], 1)
    port = free_port()
    proc = subprocess.Popen([str(BIN / "shoal"), "gateway", "--routes", str(routes_file),
                             "--listen", f"127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                status, text = http_get(port, "/gateway/healthz", "127.0.0.1")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.05)
        assert status == 200 and json.loads(text)["routes_version"] == 1
        status, text = http_get(port, "/shoal/v1/namespaces/team/services/web/proxy/hello?x=1", "127.0.0.1")
        assert status == 200 and json.loads(text) == {"pod": "one", "path": "/hello?x=1"}

        write(pods[1], 2)
        deadline = time.monotonic() + 5
        while json.loads(http_get(port, "/", "web.team.svc.cluster.local")[1])["pod"] != "two":
            assert time.monotonic() < deadline, "the gateway did not reload the routes file"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert f"listening on http://127.0.0.1:{port}" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in pods:
            p.shutdown()


def test_shoal_gateway_refuses_to_start_on_a_routes_file_it_cannot_read(tmp_path):
    out = subprocess.run([str(BIN / "shoal"), "gateway", "--routes", str(tmp_path / "missing.json"),
                          "--listen", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=20)
    assert out.returncode == 1
    assert f"cannot read routes file {tmp_path / 'missing.json'}" in out.stderr
