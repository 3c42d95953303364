"""The API's edge against hostile input: the request body limit, and answers for input that
would otherwise surface as a 500.

A body over the limit is answered 413 with a message naming the limit: at once when its
Content-Length says so, else as soon as the bytes received pass it (chunked uploads), so
the server never buffers more than the limit for one request.
"""

from __future__ import annotations

import json

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError

MAX_BODY_BYTES = 16 * 1024 * 1024  # a 4 MiB script JSON-escaped, with room to spare


class BodyTooLarge(Exception):
    """Raised into the app's body read once the bytes received pass the limit."""


def _message(limit: int) -> bytes:
    return json.dumps({"detail": f"request body too large: the API accepts at most {limit} bytes "
                                 f"({limit // (1024 * 1024)} MiB)"}).encode()


class BodyLimit:
    """ASGI middleware: refuse HTTP request bodies larger than ``limit`` bytes with 413."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers") or ():
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await self._refuse(send, 400, b'{"detail": "invalid Content-Length header"}')
                if declared > self.limit:
                    return await self._refuse(send, 413, _message(self.limit))
        seen = 0
        too_large = started = False

        async def counted_receive():
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    too_large = True
                    raise BodyTooLarge
            return message

        async def tracked_send(message):
            nonlocal started
            if too_large:  # whatever the app makes of the aborted read, the answer is 413
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            pass
        if too_large and not started:
            await self._refuse(send, 413, _message(self.limit))

    @staticmethod
    async def _refuse(send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


# What the databases say when the state store cannot be written, and the cause in words an
# administrator acts on: (text in the driver's message, cause).
_STORE_FAILURES = (
    ("database or disk is full", "the disk under its state store is full"),  # SQLite
    ("no space left on device", "the disk under its state store is full"),  # PostgreSQL, SQLite's journal
    ("could not extend file", "the disk under its state store is full"),
    ("readonly database", "its state store is read-only"),  # SQLite
    ("read-only", "its state store is read-only"),  # PostgreSQL: a read-only transaction or standby
    ("disk i/o error", "its state store's disk failed"),
)


def out_of_range(exc: OverflowError) -> str:
    """A number past what the store's 64-bit integer columns hold (an id or a count): it
    matches nothing, so the request is the client's mistake (400)."""
    return f"a number in the request is out of range: {exc}"


def store_failure(exc: Exception) -> str | None:
    """Why the server could not write its state, naming the cause and quoting the database's
    own words (``... (database or disk is full)``); None for other errors."""
    if not isinstance(exc, OperationalError):
        return None
    said = str(getattr(exc, "orig", None) or exc).strip().partition("\n")[0]
    low = said.lower()
    for text, cause in _STORE_FAILURES:
        if text in low:
            return f"the Shoal server cannot save its state: {cause} ({said})"
    return f"the Shoal server cannot use its state store ({said})"


def guard(app: FastAPI) -> None:
    """Install the body limit and the handlers below on the app."""
    app.add_middleware(BodyLimit)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        # FastAPI's own handler echoes each bad input back, and fails (500) on input JSON
        # cannot carry, such as a lone surrogate; the field path and the message suffice.
        errors = [{"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))}
                  for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(OperationalError)
    async def _store(request, exc: OperationalError):
        # 503: the server is up, but cannot keep what it is asked to; nothing was stored.
        return JSONResponse({"detail": store_failure(exc)}, status_code=503)

    @app.exception_handler(OverflowError)
    async def _overflow(request, exc: OverflowError):
        # An id or count past what the store's 64-bit integer columns hold matches nothing.
        return JSONResponse({"detail": out_of_range(exc)}, status_code=400)
