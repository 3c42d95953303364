"""Where the routes come from and where the load figures go.

``ServerLink`` long-polls ``GET /shoal/v1/kube/routes`` and posts ``/shoal/v1/kube/metrics``
every second (docs/SERVING.md, "Gateway"); ``RoutesFile`` reads the same routes JSON from
a file and reloads it when it changes, so a gateway runs without a server. Neither ever
stops the proxy: on any failure the last good table stays in use and the link backs off.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import ssl
import time
from pathlib import Path

import aiohttp

from shoal.gateway.proxy import Gateway
from shoal.gateway.routing import RoutesError, RoutingTable

log = logging.getLogger("shoal.gateway")

ROUTES_PATH = "/shoal/v1/kube/routes"
METRICS_PATH = "/shoal/v1/kube/metrics"


class Backoff:
    """Exponential back-off with jitter, from ``first_s`` to ``max_s``; the randomness is passed in."""

    def __init__(self, first_s: float = 0.5, max_s: float = 10.0, rng: random.Random | None = None):
        self.first_s, self.max_s = first_s, max_s
        self.rng = rng or random.Random()
        self.failures = 0

    def next(self) -> float:
        delay = min(self.max_s, self.first_s * 2 ** self.failures)
        self.failures += 1
        return delay * (0.75 + 0.5 * self.rng.random())

    def reset(self) -> None:
        self.failures = 0


class ServerLink:
    """The gateway's two conversations with the Shoal server: routes in, load figures out."""

    def __init__(self, gateway: Gateway, server: str, token: str | None = None, *, wait_s: float = 25.0,
                 report_every_s: float = 1.0, backoff: Backoff | None = None,
                 ssl_context: ssl.SSLContext | None = None):
        self.gateway = gateway
        # Several servers sharing one store (comma-separated): routes come from the one that
        # answers, the next is tried when it cannot be reached; load figures go to all of
        # them, so whichever leads has them for its HPAs.
        self.servers = [u.strip().rstrip("/") for u in server.split(",") if u.strip()]
        self._current = 0
        self.ssl_context = ssl_context
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.wait_s = wait_s
        self.report_every_s = report_every_s
        self.backoff = backoff or Backoff()
        self.version = None
        self.polls = 0
        self.reports = 0
        self._session: aiohttp.ClientSession | None = None
        self._reporting_failed = False

    @property
    def server(self) -> str:
        return self.servers[self._current]

    async def run(self) -> None:
        """Poll and report until cancelled."""
        connector = aiohttp.TCPConnector(ssl=self.ssl_context) if self.ssl_context is not None else None
        self._session = aiohttp.ClientSession(headers=self.headers, connector=connector)
        try:
            await asyncio.gather(self.poll_routes(), self.report_metrics())
        finally:
            await self._session.close()

    async def poll_routes(self) -> None:
        failing = False
        while True:
            params = {"wait": f"{self.wait_s:g}"}
            if self.version is not None:
                params["version"] = str(self.version)
            asked = time.monotonic()
            try:
                async with self._session.get(self.server + ROUTES_PATH, params=params,
                                             timeout=aiohttp.ClientTimeout(total=self.wait_s + 15)) as r:
                    if r.status != 200:
                        text = (await r.text())[:300]
                        raise RoutesError(f"HTTP {r.status}: {text}" + (
                            " (the server refused the gateway's token)" if r.status in (401, 403) else ""))
                    doc = await r.json(content_type=None)
                table = RoutingTable.from_json(doc)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                if isinstance(e, aiohttp.ClientConnectionError) and len(self.servers) > 1:
                    self._current = (self._current + 1) % len(self.servers)
                delay = self.backoff.next()
                if not failing or self.backoff.failures % 10 == 0:
                    log.warning("routes from %s: %s; keeping routes version %s, retrying in %.1fs",
                                self.server, str(e) or type(e).__name__, self.version, delay)
                failing = True
                await asyncio.sleep(delay)
                continue
            if failing:
                log.info("routes from %s: reachable again", self.server)
            failing = False
            self.backoff.reset()
            self.polls += 1
            if table.version != self.version or not self.gateway.table_loaded:
                for problem in table.problems:
                    log.warning("routes version %s: %s (left out)", table.version, problem)
                self.gateway.set_table(table)
                log.info("routes version %s: %d services", table.version, len(table.services))
            elif time.monotonic() - asked < 0.5:
                await asyncio.sleep(1.0)  # a server that answers at once without a change: do not spin
            self.version = table.version

    async def report_metrics(self) -> None:
        while True:
            await asyncio.sleep(self.report_every_s)
            if not self.gateway.table_loaded:
                continue
            report = self.gateway.report()
            results = await asyncio.gather(*(self._report_to(url, report) for url in self.servers))
            errors = [(url, e) for url, e in zip(self.servers, results) if e is not None]
            if len(errors) == len(self.servers):
                if not self._reporting_failed:
                    url, e = errors[0]
                    log.warning("metrics to %s: %s (will keep trying every %gs)",
                                url, str(e) or type(e).__name__, self.report_every_s)
                self._reporting_failed = True
                continue
            self.reports += 1
            self._reporting_failed = False

    async def _report_to(self, url: str, report: dict) -> Exception | None:
        try:
            async with self._session.post(url + METRICS_PATH, json=report,
                                          timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status >= 300:
                    raise RoutesError(f"HTTP {r.status}: {(await r.text())[:300]}")
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            return e
        return None


class RoutesFile:
    """Routes from a JSON file in the shape the server sends; re-read whenever the file changes."""

    def __init__(self, gateway: Gateway, path: str | os.PathLike, poll_s: float = 0.5):
        self.gateway = gateway
        self.path = Path(path)
        self.poll_s = poll_s
        self.loads = 0
        self._seen: tuple | None = None

    def load(self) -> None:
        """Read the file and use it; RoutesError (the last table stays) when it cannot be used."""
        try:
            st = self.path.stat()
            self._seen = (st.st_mtime_ns, st.st_size, st.st_ino)
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except OSError as e:
            raise RoutesError(f"cannot read routes file {self.path}: {e.strerror}") from None
        except ValueError as e:
            raise RoutesError(f"routes file {self.path} is not valid JSON: {e}") from None
        if isinstance(doc, dict) and "version" not in doc:
            doc = {**doc, "version": self.loads + 1}
        table = RoutingTable.from_json(doc)
        for problem in table.problems:
            log.warning("routes file %s: %s (left out)", self.path, problem)
        self.gateway.set_table(table)
        self.loads += 1
        log.info("routes file %s: version %s, %d services", self.path, table.version, len(table.services))

    async def run(self) -> None:
        """Watch the file until cancelled (by its mtime, size and inode: no inotify needed)."""
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                st = self.path.stat()
            except OSError:
                continue
            if (st.st_mtime_ns, st.st_size, st.st_ino) == self._seen:
                continue
            try:
                self.load()
            except RoutesError as e:
                log.warning("%s; keeping routes version %s", e, self.gateway.table.version)
