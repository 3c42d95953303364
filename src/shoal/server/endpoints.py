"""The one table of every route the server answers, from which its ways in are made.

A router module declares each endpoint once, as a FastAPI handler with typed dependencies,
on a ``Table`` (an APIRouter that also records it); ``server/routers.TABLES`` lists the
tables in the order they are matched: the native API's, the console's and the Kubernetes
API's (whose routes ``server/kubeapi/routes.py`` makes per resource of its registry). From
that one declaration come:

- the FastAPI route (OpenAPI, validation, the exception handlers), or its WebSocket route;
- with ``fast=True``, a route of the fast path (server/fastpath.py), which answers the
  requests every job costs without FastAPI's layers: the handler is called directly, its
  parameters read from the path, query, headers and body as FastAPI would read them, and
  anything it cannot take (a value that does not validate) left to the app to answer;
- with ``quick=f`` (fast only), ``f(server, path parameters, headers, body)`` tried first, on
  the event loop, by the server's HTTP protocol as the request is parsed (server/protocol.py;
  by the fast route for a request the protocol leaves to the app): an answer for the common
  case made without reading the declared parameters (an idle node's heartbeat:
  server/agents.quiet_report), or None for the handler to answer as declared;
- with ``local=True``, the in-process route the commands the server runs call
  (server/commands.py: ``LocalApi``), with no HTTP and no JSON.

An endpoint that answers with a stream (``streaming=True``: a watch, a log, server-sent
events) or over a WebSocket is HTTP-only: it can be neither ``fast`` nor ``local``.

A handler's dependencies are the aliases of server/deps.py; ``deps.DIRECT`` says how each is
had without FastAPI. A handler that answers with a ``Reply`` gives the local path its data
and the HTTP paths its encoding.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin
from urllib.parse import parse_qs, unquote

from fastapi import APIRouter, Request, params
from fastapi.responses import Response
from pydantic import BaseModel, TypeAdapter, ValidationError

from shoal.server import fastpath
from shoal.server.auth import Principal


class Reply:
    """An answer whose data the local path takes as it is and the HTTP paths encode
    themselves (``response``), as a listing whose JSON is kept ready."""

    def data(self) -> Any:
        raise NotImplementedError

    def response(self) -> Response:
        raise NotImplementedError


@dataclass
class Context:
    """What a direct call has in place of FastAPI's request: the server, the app's state,
    the request's headers (lower-case names) or the principal already resolved."""

    server: Any
    state: Any
    headers: dict[str, str] = field(default_factory=dict)
    principal: Principal | None = None

    def caller(self) -> Principal:
        if self.principal is None:
            h = self.headers
            authorization = h.get("authorization")
            if authorization is None and "x-shoal-job-token" not in h and "cookie" in h:
                authorization = _console_credential(h)  # the console's pages, as deps.principal takes them
            self.principal = self.server.auth.resolve(authorization, h.get("x-shoal-job-token"),
                                                      h.get("x-shoal-user"))
        return self.principal


def _console_credential(headers: dict[str, str]) -> str | None:
    from starlette.requests import cookie_parser

    from shoal.server import console

    return console.cookie_credential(None, cookie_parser(headers["cookie"]).get(console.COOKIE),
                                     headers.get(console.HEADER))


class Unanswerable(Exception):
    """A request a direct call cannot take as it is: the app answers it (its 422)."""


class _RawRequest:
    """What a direct call gives a handler that takes the Request: its body."""

    def __init__(self, raw: bytes | None) -> None:
        self.raw = raw or b""

    async def body(self) -> bytes:
        return self.raw


@dataclass
class Param:
    name: str
    source: str  # dep, session, path, query, header, body, request
    read: Callable[..., Any]


def _adapter(annotation, info) -> TypeAdapter:
    return TypeAdapter(typing.Annotated[annotation, info] if info is not None else annotation)


def _plan(handler: Callable, path: str) -> list[Param]:
    """How each of the handler's parameters is had without FastAPI."""
    from shoal.server.deps import DIRECT, SESSION

    hints = typing.get_type_hints(handler, include_extras=True)
    path_names = set(re.findall(r"{(\w+)}", path))
    plan = []
    for name, p in inspect.signature(handler).parameters.items():
        annotation = hints.get(name, Any)
        info = None
        if get_origin(annotation) is typing.Annotated:
            annotation, *extras = get_args(annotation)
            info = next((x for x in extras if isinstance(x, (params.Depends, params.Param, params.Body))), None)
        default = None if p.default is inspect.Parameter.empty else p.default
        if annotation is Request:  # read for its body alone (the commands' invocation)
            plan.append(Param(name, "request", _RawRequest))
        elif isinstance(info, params.Depends):
            if info.dependency is SESSION:
                plan.append(Param(name, "session", lambda: None))
            else:
                plan.append(Param(name, "dep", DIRECT[info.dependency]))  # type: ignore[index]
        elif isinstance(info, params.Header):
            header = (info.alias or name.replace("_", "-")).lower()
            plan.append(Param(name, "header", lambda h, header=header, default=default: h.get(header, default)))
        elif name in path_names:
            adapter = _adapter(annotation, info)
            plan.append(Param(name, "path", lambda v, adapter=adapter: adapter.validate_python(unquote(v))))
        elif isinstance(info, params.Body) or _is_model(annotation):
            plan.append(Param(name, "body", _body_reader(annotation, default, p.default is inspect.Parameter.empty)))
        else:
            plan.append(Param(name, "query", _query_reader(name, annotation, info, default)))
    return plan


def _is_model(annotation) -> bool:
    options = get_args(annotation) if get_origin(annotation) in (typing.Union, type(int | None)) else (annotation,)
    return any(isinstance(a, type) and issubclass(a, BaseModel) for a in options)


def _body_reader(annotation, default, required: bool):
    model = next(a for a in (get_args(annotation) or (annotation,)) if isinstance(a, type) and issubclass(a, BaseModel))

    def read(raw: bytes | None, parsed: dict | None):
        if raw is not None:  # from HTTP: an empty body is the default, when there is one
            return model.model_validate_json(raw) if raw or required else default
        return model.model_validate(parsed) if parsed is not None else default

    return read


def _query_reader(name: str, annotation, info, default):
    adapter = _adapter(annotation, info)
    many = get_origin(annotation) is list or (get_origin(annotation) is typing.Annotated
                                              and get_origin(get_args(annotation)[0]) is list)

    def read(query: dict[str, list[str]]):
        values = query.get(name)
        if not values:
            return default
        return adapter.validate_python(values if many else values[-1])

    return read


WEBSOCKET = "WEBSOCKET"  # an Endpoint's method when it is a WebSocket route


@dataclass
class Endpoint:
    """One endpoint as declared: method, path, handler and the ways in it is offered."""

    method: str  # GET, POST, ... or WEBSOCKET
    path: str
    handler: Callable
    status_code: int = 200
    fast: bool = False
    local: bool = False
    streaming: bool = False  # answers with a stream (HTTP only)
    in_schema: bool = True  # in the native OpenAPI document (/openapi.json)
    plan: list[Param] = field(default_factory=list)
    # fast only: tried first, on the event loop, with the server, the path's parameters, the
    # headers and the raw body; its answer, or None for the handler to answer as declared.
    quick: Callable[[Any, dict[str, str], dict[str, str], bytes], fastpath.Answer | None] | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.handler)

    @property
    def pattern(self) -> str:
        return "".join(f"(?P<{part[1:-1]}>[^/]+)" if part.startswith("{") else re.escape(part)
                       for part in re.split(r"({\w+})", self.path))

    def arguments(self, ctx: Context, match: dict[str, str], query: dict[str, list[str]],
                  raw: bytes | None, parsed: dict | None, session) -> dict:
        """The handler's keyword arguments; ValidationError for a value it cannot take."""
        out: dict[str, Any] = {}
        for p in self.plan:
            if p.source == "dep":
                out[p.name] = p.read(ctx)
            elif p.source == "session":
                out[p.name] = session
            elif p.source == "header":
                out[p.name] = p.read(ctx.headers)
            elif p.source == "path":
                out[p.name] = p.read(match[p.name])
            elif p.source == "body":
                out[p.name] = p.read(raw, parsed)
            elif p.source == "request":
                out[p.name] = p.read(raw)
            else:
                out[p.name] = p.read(query)
        return out

    @property
    def wants_session(self) -> bool:
        return any(p.source == "session" for p in self.plan)

    def call(self, ctx: Context, match: dict[str, str], query: dict[str, list[str]], raw: bytes | None = None,
             parsed: dict | None = None):
        """Call a synchronous handler (with a session of its own when it takes one)."""
        if not self.wants_session:
            return self.handler(**self.arguments(ctx, match, query, raw, parsed, None))
        with ctx.server.sessions() as s:
            return self.handler(**self.arguments(ctx, match, query, raw, parsed, s))


def _http(handler: Callable) -> Callable:
    """The handler as FastAPI calls it: a Reply answered with its own encoding."""
    if inspect.iscoroutinefunction(handler):
        async def answer_async(*args, **kwargs):
            out = await handler(*args, **kwargs)
            return out.response() if isinstance(out, Reply) else out
        wrapper: Callable = answer_async
    else:
        def answer(*args, **kwargs):
            out = handler(*args, **kwargs)
            return out.response() if isinstance(out, Reply) else out
        wrapper = answer
    wrapper.__wrapped__ = handler  # type: ignore[attr-defined]  # FastAPI reads the handler's signature
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(wrapper, attr, getattr(handler, attr))
    return wrapper


class Table:
    """An APIRouter whose routes are also recorded as Endpoints."""

    def __init__(self, prefix: str = "", include_in_schema: bool = True) -> None:
        self.router = APIRouter(prefix=prefix, include_in_schema=include_in_schema)
        self.endpoints: list[Endpoint] = []

    def route(self, method: str | tuple[str, ...], path: str, *, fast: bool = False, local: bool = False,
              streaming: bool = False, status_code: int = 200, quick: Callable | None = None,
              **fastapi: Any) -> Callable[[Callable], Callable]:
        """Declare a handler for ``path``: one route, however many methods it answers."""
        methods = (method,) if isinstance(method, str) else method
        if streaming and (fast or local):
            raise ValueError(f"{path}: a streaming endpoint is HTTP-only (neither fast nor local)")
        if quick is not None and not fast:
            raise ValueError(f"{path}: a quick answer is the fast path's (fast=True)")

        def register(handler: Callable) -> Callable:
            self.router.add_api_route(path, _http(handler), methods=list(methods), status_code=status_code,
                                      **fastapi)
            full = self.router.prefix + path
            for m in methods:
                endpoint = Endpoint(m, full, handler, status_code, fast, local, streaming,
                                    self.router.include_in_schema and fastapi.get("include_in_schema", True))
                if fast or local:
                    endpoint.plan = _plan(handler, full)
                endpoint.quick = quick
                self.endpoints.append(endpoint)
            return handler
        return register

    def websocket(self, path: str) -> Callable[[Callable], Callable]:
        """Declare a WebSocket handler for ``path`` (HTTP-only, never in the OpenAPI document)."""
        def register(handler: Callable) -> Callable:
            self.router.add_api_websocket_route(path, handler)
            self.endpoints.append(Endpoint(WEBSOCKET, self.router.prefix + path, handler, streaming=True,
                                           in_schema=False))
            return handler
        return register

    def get(self, path: str, **kw: Any):
        return self.route("GET", path, **kw)

    def post(self, path: str, **kw: Any):
        return self.route("POST", path, **kw)

    def put(self, path: str, **kw: Any):
        return self.route("PUT", path, **kw)

    def patch(self, path: str, **kw: Any):
        return self.route("PATCH", path, **kw)

    def delete(self, path: str, **kw: Any):
        return self.route("DELETE", path, **kw)


# ---------------------------------------------------------------------- the two direct paths

def _answer(out, status_code: int) -> fastpath.Answer:
    if isinstance(out, Reply):
        out = out.response()
    if isinstance(out, Response):
        headers = [(k, v) for k, v in out.raw_headers if k != b"content-length"]
        return out.status_code, headers, bytes(out.body)
    return fastpath.json_answer(out, status_code)


def fast_routes(endpoints: list[Endpoint], server, state) -> fastpath.Routes:
    """The fast path's routes: the endpoints declared ``fast``."""
    routes = fastpath.Routes()
    for endpoint in endpoints:
        if endpoint.fast:
            quick = endpoint.quick
            routes.add(endpoint.method, endpoint.pattern, _fast_handler(endpoint, server, state),
                       None if quick is None else functools.partial(quick, server))
    return routes


def _fast_handler(endpoint: Endpoint, server, state) -> fastpath.Handler:
    is_async = endpoint.is_async
    quick = endpoint.quick

    async def handle(scope, match, headers, body):
        if quick is not None and fastpath.QUICK_TRIED not in scope \
                and (answer := quick(server, match.groupdict(), headers, body)) is not None:
            return answer
        ctx = Context(server, state, headers)
        query = parse_qs(scope["query_string"].decode("latin-1"))
        path = match.groupdict()
        try:
            if is_async:
                out = await endpoint.handler(**endpoint.arguments(ctx, path, query, body, None, None))
            else:
                out = await fastpath.in_thread(endpoint.call, ctx, path, query, body)
        except ValidationError:
            return None  # the app's 422
        return _answer(out, endpoint.status_code)

    return handle


class LocalApi:
    """The endpoints declared ``local``, called in this process by the commands the server runs
    (``get``/``post`` as the client library's, with the caller's principal): no HTTP, no JSON."""

    def __init__(self, endpoints: list[Endpoint], server, state) -> None:
        self.server, self.state = server, state
        self.table = [(e.method, re.compile(e.pattern), e) for e in endpoints if e.local]

    def find(self, method: str, path: str) -> tuple[Endpoint, dict[str, str]] | None:
        for m, pattern, endpoint in self.table:
            if m == method and (hit := pattern.fullmatch(path)) is not None:
                return endpoint, hit.groupdict()
        return None

    def call(self, method: str, path: str, principal: Principal, query: dict | None = None,
             body: dict | None = None):
        """The endpoint's answer as data; LookupError when no local endpoint has this path."""
        found = self.find(method, path)
        if found is None:
            raise LookupError(f"{method} {path}")
        endpoint, match = found
        values = {k: v if isinstance(v, list) else [str(v)] for k, v in (query or {}).items() if v is not None}
        out = endpoint.call(Context(self.server, self.state, principal=principal), match, values,
                            parsed=body if body is not None else ({} if endpoint.method != "GET" else None))
        if isinstance(out, Reply):
            return out.data()
        if isinstance(out, Response):
            return json.loads(bytes(out.body))
        return out
