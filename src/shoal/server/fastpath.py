"""The few requests made for every job, answered without FastAPI's layers.

Each batch job costs a handful of requests: the compiled front end's ``sbatch`` (and the
``squeue`` loops users' scripts run), the agent's long-poll for work and its report of the
job's end; and the listings squeue, sinfo and scontrol show job ask for, whose answers are
mostly kept ready (server/queueview.py, server/nodelist.py). FastAPI's routing, dependency
solving and exception middlewares cost more CPU than these requests' own work, and the
server is one Python process, so they bound the job rate and, with many clients at once,
each answer's wait. Here a plain ASGI layer in front of the app answers them directly, and hands
anything unusual (a body over the limit, input a handler does not accept) to the app
with the body replayed, so the app's answer (413, 422, ...) and its OpenAPI schema stay
the only ones.

A handler returns ``(status, headers, body)``, or None for "let the app answer".
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm.exc import StaleDataError

from shoal.server.auth import AuthError
from shoal.server.jobs import JobError
from shoal.server.limits import MAX_BODY_BYTES, out_of_range, store_failure

log = logging.getLogger("shoal.server")

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
Handler = Callable[[dict, "re.Match[str]", dict[str, str], bytes], Awaitable[Answer | None]]

JSON = [(b"content-type", b"application/json")]
QUICK_TRIED = "shoal.quick_tried"
"""In the scope of a request whose quick answer the protocol tried and found None for
(server/protocol.py): its fast route need not try it again."""
Quick = Callable[[dict[str, str], dict[str, str], bytes], "Answer | None"]
"""A quick answer: the path's parameters, the headers and the body to an answer or None."""
T = TypeVar("T")


_THREADS = ThreadPoolExecutor(max_workers=40, thread_name_prefix="fast")
"""As many threads as anyio's default limit for FastAPI's own routes: submitters waiting for
a shared commit (groupcommit) or for PostgreSQL each hold one."""


async def in_thread(fn: Callable[..., T], *args) -> T:
    """``fn(*args)`` in a worker thread, as the fast routes' blocking work (a commit waits for
    the disk) must not hold up the event loop: a plain executor hand-off, which costs about
    two-thirds of anyio's run_in_threadpool (~130 against ~190 us of CPU here)."""
    return await asyncio.get_running_loop().run_in_executor(_THREADS, fn, *args)


def json_answer(doc, status: int = 200) -> Answer:
    return status, JSON, json.dumps(doc).encode()


class Routes:
    """Method and path pattern to handler; the first match answers."""

    def __init__(self) -> None:
        self.table: list[tuple[str, re.Pattern[str], Handler]] = []
        self.templates: dict[Handler, str] = {}  # handler -> its path as FastAPI writes it, for metrics
        self.quick: list[tuple[str, re.Pattern[str], Quick, str]] = []  # answered by the protocol

    def add(self, method: str, pattern: str, handler: Handler, quick: Quick | None = None) -> None:
        """A route; with ``quick``, an answer the protocol tries first (server/protocol.py)."""
        compiled = re.compile(pattern)
        self.table.append((method, compiled, handler))
        self.templates[handler] = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern)
        if quick is not None:
            self.quick.append((method, compiled, quick, self.templates[handler]))

    def match_quick(self, method: str, path: str) -> tuple[Quick, dict[str, str], str] | None:
        """The quick answer for a request, with the path's parameters and the route's template."""
        for m, pattern, quick, template in self.quick:
            if m == method and (hit := pattern.fullmatch(path)) is not None:
                return quick, hit.groupdict(), template
        return None

    def match(self, method: str, path: str) -> tuple[Handler, re.Match[str]] | None:
        for m, pattern, handler in self.table:
            if m == method and (hit := pattern.fullmatch(path)) is not None:
                return handler, hit
        return None


Observer = Callable[[str, str, int, float], None]
"""Told of each request: method, route template, status code and seconds taken."""


class FastPaths:
    """The ASGI app uvicorn serves: the ``routes`` answered here, everything else by ``app``
    (FastAPI's, whose own middlewares these requests skip too)."""

    def __init__(self, app, routes: Routes, limit: int = MAX_BODY_BYTES, observe: Observer | None = None) -> None:
        self.app = app
        self.routes = routes
        self.limit = limit
        self.observe = observe

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.observe is None:
            return await self._serve(scope, receive, send)
        # Latency by route template and status: the status is read off the response as it
        # is sent, the template from the fast route or FastAPI's matched route.
        t0 = time.perf_counter()
        code = 500  # an exception escaping both is uvicorn's 500
        route: str | None = None  # stays None when the answer raised

        async def sending(message):
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            route = await self._serve(scope, receive, sending)
        finally:
            if (r := scope.get("route")) is not None:  # set by FastAPI when one of its routes matched
                route = getattr(r, "path", None)
            self.observe(scope["method"], route or "other", code, time.perf_counter() - t0)

    async def _serve(self, scope, receive, send) -> str | None:
        """Answer the request; the fast route's template when a fast route answered it."""
        if (found := self.routes.match(scope["method"], scope["path"])) is None:
            await self.app(scope, receive, send)
            return None
        handler, match = found
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length", "")
        if declared and (not declared.isdigit() or int(declared) > self.limit):
            return await self.app(scope, receive, send)  # the app's 400 or 413, before a byte is read
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                break
        body = b"".join(chunks)
        answer = None
        if size <= self.limit:
            try:
                answer = await handler(scope, match, headers, body)
            except (AuthError, JobError) as e:  # as the app's exception handlers answer them
                answer = json_answer({"detail": e.message}, e.status)
            except StaleDataError:
                answer = json_answer({"detail": "the object was changed concurrently; retry the request"}, 409)
            except OverflowError as e:
                answer = json_answer({"detail": out_of_range(e)}, 400)
            except OperationalError as e:
                answer = json_answer({"detail": store_failure(e)}, 503)
        if answer is None:
            await self.app(scope, _replay(body, more, receive), send)
            return None
        status, extra, content = answer
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(content)).encode()), *extra]})
        await send({"type": "http.response.body", "body": content})
        return self.routes.templates[handler]


def _replay(body: bytes, more: bool, receive):
    """A receive that gives ``body`` first, then whatever the client still sends."""
    given = False

    async def replayed():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replayed
