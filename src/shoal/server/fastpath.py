"""The few requests made for every job, answered without FastAPI's layers.

Each batch job costs a handful of requests: the compiled front end's ``sbatch`` (and the
``squeue`` loops users' scripts run), the agent's long-poll for work and its report of the
job's end. FastAPI's routing, dependency solving and exception middlewares cost more CPU
than these requests' own work, and the server is one Python process, so they bound the
job rate. Here a plain ASGI layer in front of the app answers them directly, and hands
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
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy.orm.exc import StaleDataError

from shoal.server.auth import AuthError
from shoal.server.jobs import JobError
from shoal.server.limits import MAX_BODY_BYTES

log = logging.getLogger("shoal.server")

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
Handler = Callable[[dict, "re.Match[str]", dict[str, str], bytes], Awaitable[Answer | None]]

JSON = [(b"content-type", b"application/json")]
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

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        self.table.append((method, re.compile(pattern), handler))

    def match(self, method: str, path: str) -> tuple[Handler, re.Match[str]] | None:
        for m, pattern, handler in self.table:
            if m == method and (hit := pattern.fullmatch(path)) is not None:
                return handler, hit
        return None


class FastPaths:
    """The ASGI app uvicorn serves: the ``routes`` answered here, everything else by ``app``
    (FastAPI's, whose own middlewares these requests skip too)."""

    def __init__(self, app, routes: Routes, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.routes = routes
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or (found := self.routes.match(scope["method"], scope["path"])) is None:
            return await self.app(scope, receive, send)
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
                return
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
        if answer is None:
            return await self.app(scope, _replay(body, more, receive), send)
        status, extra, content = answer
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(content)).encode()), *extra]})
        await send({"type": "http.response.body", "body": content})


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
