"""The proxy: an aiohttp server that forwards each request to a ready pod of its Service.

One pooled ``ClientSession`` (keep-alive) carries every request to the pods. Bodies stream
both ways: the request body is handed to the pod as it arrives, and the response is
written back chunk by chunk as the pod sends it (chunked and ``text/event-stream``
responses reach the client event by event). Only a response of at most 64 KiB with a
Content-Length is read whole and sent in one write, which saves a write per request.

Forwarding rules (docs/SERVING.md, "Gateway"):

- Hop-by-hop headers (RFC 9110 7.6.1, and any named in ``Connection``) are dropped both
  ways; the Host header is kept as the client sent it; ``X-Forwarded-For`` gets the
  client's address appended, ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` are set.
- A failed attempt is retried on another pod (at most ``retries`` times) only when nothing
  can have reached the pod: the connection was refused or timed out (any method), or was
  reset before any response byte on a request with no body and an idempotent method.
  Once a response has started nothing is retried. A pod that refused a connection gets
  no first attempts for ``eject_s`` (passive health checking, as Envoy's outlier detection).
- 404 for a Service the routes do not have, 503 when it has no ready pod (after holding
  the request up to ``hold_s`` for a scale-to-zero Service), 502 when no pod answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from shoal.gateway.routing import Backend, Balancer, Route, RoutingTable, ServiceNotFound
from shoal.gateway.stats import GatewayStats

log = logging.getLogger("shoal.gateway")

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade",
})  # fmt: skip
# Also not forwarded: the gateway answers Expect itself, and it sets the X-Forwarded-* it owns.
REQUEST_DROP = HOP_BY_HOP | {"expect", "x-forwarded-proto", "x-forwarded-host"}
RESPONSE_DROP = HOP_BY_HOP
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
WHOLE_BODY_MAX = 64 * 1024
HEALTHZ, METRICS = "/gateway/healthz", "/gateway/metrics"


@dataclass(frozen=True)
class GatewayConfig:
    hold_s: float = 60.0  # how long a request waits for a scale-to-zero Service to get a ready pod
    connect_timeout_s: float = 5.0
    retries: int = 2  # further pods tried after a connection that failed before anything was sent
    # Idle pooled connections are closed after this; under uvicorn's 5 s default so the
    # gateway never reuses a connection the pod is closing (that race would fail a POST).
    keepalive_s: float = 4.0
    # A pod that refused a connection gets no first attempts for this long (it is still
    # tried when nothing else is left), so one dead pod does not cost every request a retry.
    eject_s: float = 5.0


class Gateway:
    """Routing state plus the request handler; ``set_table`` swaps the routes atomically."""

    def __init__(self, config: GatewayConfig = GatewayConfig(), clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self.table = RoutingTable()
        self.table_loaded = False
        self.balancer = Balancer()
        self.stats = GatewayStats(clock)
        self._wake: dict[tuple[str, str], asyncio.Event] = {}
        self._ejected: dict[str, float] = {}  # pod key -> until when it gets no first attempts
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ state

    def set_table(self, table: RoutingTable) -> None:
        """Use ``table`` for every request from now on, and wake requests held for Services it serves."""
        self.table = table
        self.table_loaded = True
        for key in list(self._wake):
            svc = table.services.get(key)
            if svc is None or svc.serving:
                self._wake.pop(key).set()
        self.stats.forget({b.key for svc in table.services.values() for b in svc.backends})

    def report(self) -> dict:
        """The load figures the server's HPA reads (``POST /shoal/v1/kube/metrics``)."""
        return self.stats.report(b.key for svc in self.table.services.values() for b in svc.backends)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self.config.keepalive_s,
                                         ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s),
            skip_auto_headers=SKIP_AUTO_HEADERS,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ requests

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        started = self.clock()
        host = request.headers.get("Host")
        try:
            route = self.table.lookup(host, request.raw_path)
        except ServiceNotFound as e:
            own = self._own_endpoint(request)
            if own is not None:
                return own
            if not self.table_loaded:
                return self._answer("", 503, "the gateway has no routes yet (the server has not answered)", started)
            return self._answer("", 404, str(e), started)
        if not route.service.serving:
            if route.service.scale_to_zero:
                try:
                    route = await self._hold(route, host, request.raw_path)
                except ServiceNotFound as e:
                    return self._answer(route.service.key, 404, str(e), started)
            if not route.service.serving:
                waited = f" (held {self.config.hold_s:g} s for it to scale up from zero)" \
                    if route.service.scale_to_zero else ""
                return self._answer(route.service.key, 503,
                                    f"no ready endpoints for service {route.service.key}{waited}", started)
        return await self._forward(request, route, started)

    async def _hold(self, route: Route, host: str | None, target: str) -> Route:
        """Wait until the Service has a ready pod (or ``hold_s`` passes); the route to use then."""
        svc = route.service
        key = (svc.namespace, svc.name)
        self.stats.held[svc.key] += 1
        deadline = self.clock() + self.config.hold_s
        try:
            while not route.service.serving:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                event = self._wake.get(key)
                if event is None:
                    event = self._wake[key] = asyncio.Event()
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except asyncio.TimeoutError:
                    break
                route = self.table.lookup(host, target)
            return route
        finally:
            self.stats.held[svc.key] -= 1
            if self.stats.held[svc.key] <= 0:
                del self.stats.held[svc.key]

    async def _forward(self, request: web.BaseRequest, route: Route, started: float) -> web.StreamResponse:
        svc = route.service
        method = request.method
        headers = _request_headers(request)
        body = request.content if request.body_exists else None
        retry_reset = body is None and method in IDEMPOTENT
        tried: list[str] = []
        exclude: set[str] = set()
        for _ in range(self.config.retries + 1):
            backend = None
            if self._ejected:
                backend = self.balancer.pick(svc, self.stats.inflight, exclude | self._still_ejected())
            if backend is None:
                backend = self.balancer.pick(svc, self.stats.inflight, exclude)
            if backend is None:
                break
            exclude.add(backend.key)
            self.stats.begin(svc.key, backend.key)
            try:
                resp = await self._session.request(
                    method, _url(backend, route), headers=headers, data=body, allow_redirects=False)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                self._failed(svc.key, backend, route, "connect", e, tried)
                self._ejected[backend.key] = self.clock() + self.config.eject_s
                continue
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                self._failed(svc.key, backend, route, "reset", e, tried)
                if retry_reset:
                    continue
                break
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                self._failed(svc.key, backend, route, "error", e, tried)
                break
            except BaseException:
                self.stats.failed(svc.key, backend.key, "cancelled")
                raise
            return await self._relay(request, resp, svc.key, backend, started)
        if not tried:
            return self._answer(svc.key, 503, f"no ready endpoints for service {svc.key}", started)
        return self._answer(svc.key, 502, f"no pod of service {svc.key} answered: {'; '.join(tried)}", started)

    def _still_ejected(self) -> set[str]:
        now = self.clock()
        for key in [k for k, until in self._ejected.items() if until <= now]:
            del self._ejected[key]
        return set(self._ejected)

    def _failed(self, service: str, backend: Backend, route: Route, reason: str, error: BaseException,
                tried: list[str]) -> None:
        self.stats.failed(service, backend.key, reason)
        if isinstance(error, aiohttp.ClientConnectorError):
            refused = isinstance(error.os_error, ConnectionRefusedError)
            what = "connection refused" if refused else (error.os_error.strerror or str(error.os_error))
        else:
            what = str(error) or type(error).__name__
        address, port = backend.target(route.port)
        tried.append(f"{backend.pod} ({address}:{port}): {what}")
        log.warning("service %s: pod %s failed (%s): %s", service, backend.key, reason, what)

    async def _relay(self, request: web.BaseRequest, resp: aiohttp.ClientResponse, service: str,
                     backend: Backend, started: float) -> web.StreamResponse:
        """Send the pod's response to the client as it arrives; the pod's connection goes back to the pool."""
        complete = False
        try:
            headers = _response_headers(resp)
            length = resp.content_length
            has_body = request.method != "HEAD" and resp.status not in (204, 304) and resp.status >= 200
            if has_body and length is not None and length <= WHOLE_BODY_MAX:
                body = await resp.read()
                headers.popall("Content-Length", None)
                out = web.Response(status=resp.status, reason=resp.reason, headers=headers, body=body)
                complete = True
                return out
            out = web.StreamResponse(status=resp.status, reason=resp.reason, headers=headers)
            await out.prepare(request)
            while has_body:
                try:
                    chunk = await resp.content.readany()
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
                    # The pod broke off mid-response: close the client's connection too, so
                    # it sees a truncated response rather than a clean end.
                    log.warning("service %s: pod %s broke off its response: %s", service, backend.key, e)
                    if request.transport is not None:
                        request.transport.close()
                    return out
                if not chunk:
                    break
                try:
                    await out.write(chunk)
                except ConnectionResetError:  # the client went away: finally closes the pod's side
                    return out
            await out.write_eof()
            complete = True
            return out
        finally:
            if complete:
                resp.release()
            else:
                resp.close()  # the client went away or the pod broke off: the pod sees its connection close
            self.stats.end(service, backend.key, resp.status, started)

    # ------------------------------------------------------------------ the gateway's own answers

    def _own_endpoint(self, request: web.BaseRequest) -> web.StreamResponse | None:
        if request.path == HEALTHZ:
            doc = {"ok": True, "routes_loaded": self.table_loaded, "routes_version": self.table.version,
                   "services": len(self.table.services)}
            return web.Response(text=json.dumps(doc) + "\n", content_type="application/json")
        if request.path == METRICS:
            return web.Response(body=self.stats.prometheus(self.table.version).encode(),
                                headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
        return None

    def _answer(self, service: str, status: int, message: str, started: float) -> web.Response:
        self.stats.answered(service, status, started)
        return web.Response(status=status, text=message + "\n", headers={"X-Shoal-Gateway": "1"})


def _url(backend: Backend, route: Route) -> URL:
    address, port = backend.target(route.port)
    host = f"[{address}]" if ":" in address else address
    return URL(f"http://{host}:{port}{route.path}", encoded=True)


def _request_headers(request: web.BaseRequest) -> CIMultiDict:
    drop = REQUEST_DROP
    connection = request.headers.get("Connection")
    if connection:
        drop = drop | {t.strip().lower() for t in connection.split(",")}
    out = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in drop)
    peer = request.remote
    if peer:
        prior = out.getall("X-Forwarded-For", None)
        if prior:
            out.popall("X-Forwarded-For")
        out["X-Forwarded-For"] = ", ".join([*prior, peer]) if prior else peer
    out["X-Forwarded-Proto"] = request.scheme
    if request.host:
        out["X-Forwarded-Host"] = request.host
    return out


def _response_headers(resp: aiohttp.ClientResponse) -> CIMultiDict:
    drop = RESPONSE_DROP
    connection = resp.headers.get("Connection")
    if connection:
        drop = drop | {t.strip().lower() for t in connection.split(",")}
    return CIMultiDict((k, v) for k, v in resp.headers.items() if k.lower() not in drop)


async def serve(gateway: Gateway, host: str, port: int) -> tuple[web.ServerRunner, tuple[str, int]]:
    """Start serving ``gateway`` on host:port (0 picks a free port); the runner and the bound address."""
    await gateway.start()
    # handler_cancellation: a client that disconnects cancels its handler at once, which
    # closes the pod's connection, so a model server stops generating for nobody.
    server = web.Server(gateway.handle, handler_cancellation=True, auto_decompress=False, access_log=None)
    runner = web.ServerRunner(server, shutdown_timeout=10.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    bound = runner.addresses[0]
    return runner, (bound[0], bound[1])
