"""The Kubernetes REST API's routes, declared on one ``Table`` (server/endpoints.py) like the
native API's: discovery and the OpenAPI documents, then for each resource of the registry
(``kubeapi/registry.py``: add a resource there, not here) its collection, item and
subresource paths. Handlers only translate HTTP: the use cases are ``KubeService``'s, and
every refusal is a ``Status`` as kubectl expects.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated

import yaml
from fastapi import Depends, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from shoal.kube.jobs import seconds
from shoal.server.auth import Principal
from shoal.server.deps import Caller, ServerDep
from shoal.server.endpoints import Table
from shoal.server.kube import api as shoal_kube_api
from shoal.server.kube.objects import ObjectError
from shoal.server.kubeapi import openapi, printing, protobuf, streams
from shoal.server.kubeapi.cache import POLL_S, Entry, with_rv
from shoal.server.kubeapi.printing import status
from shoal.server.kubeapi.protobuf import ProtobufError
from shoal.server.kubeapi.registry import (
    RESOURCES, Resource, api_group, api_group_list, api_versions, group_versions, resource_list, version_info,
)
from shoal.server.kubeapi.service import Invalid, KubeService, Selection

BOOKMARK_S = 5.0  # a bookmark at most this often while a watcher's position moves without its events
WATCH_TIMEOUT_S = 1800  # a watch without timeoutSeconds ends after this, as the API server's min-request-timeout
PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


def error_response(e: Exception) -> JSONResponse:
    """An ObjectError as a Status; an Invalid with one cause per bad field."""
    if isinstance(e, Invalid):
        r = e.resource
        kind = f"{r.kind}.{r.group}" if r.group else r.kind
        causes = [{"reason": "FieldValueInvalid", "message": x["message"], "field": x["path"]} for x in e.errors]
        text = ", ".join(f"{x['path']}: {x['message']}" if x["path"] else x["message"] for x in e.errors)
        return JSONResponse(status(f'{kind} "{e.name}" is invalid: {text}', 422, "Invalid",
                                   {"name": e.name, "group": r.group, "kind": r.kind, "causes": causes}), 422)
    assert isinstance(e, ObjectError)
    return JSONResponse(status(e.message, e.status, e.reason), status_code=e.status)


async def call(fn, *args, code: int = 200):
    """Run a use case off the event loop; its refusal as a Status."""
    try:
        out = await run_in_threadpool(fn, *args)
    except (ObjectError, Invalid) as e:
        return error_response(e)
    return JSONResponse(out, status_code=code) if code != 200 else out


async def body_of(request: Request):
    raw = await request.body()
    ctype = request.headers.get("content-type", "")
    if "protobuf" in ctype:  # kubectl create namespace/secret: client-go's typed clients
        try:
            return protobuf.decode(raw)
        except ProtobufError:
            pass
    if "protobuf" in ctype or "cbor" in ctype:
        raise ObjectError("the body of the request was in an unknown format - accepted media types include: "
                          "application/json, application/yaml", 415, "UnsupportedMediaType")
    try:
        if ctype.startswith("application/apply-patch+yaml"):
            return yaml.safe_load(raw)
        return json.loads(raw or b"null")
    except (ValueError, yaml.YAMLError) as e:
        raise ObjectError(f"the request body is not valid JSON: {e}", 400) from None


def number(request: Request, name: str, default: float = 0) -> float:
    """A numeric query parameter (``limit``, ``timeoutSeconds``, ``tailLines``)."""
    text = request.query_params.get(name)
    try:
        return float(text) if text else default
    except ValueError:
        raise ObjectError(f"{name}: invalid value {text!r}: must be a number", 400) from None


def dry_run(request: Request) -> bool:
    return "All" in request.query_params.getlist("dryRun")


# ---------------------------------------------------------------- the routes

# Described by their own OpenAPI documents (/openapi/v3), not the native API's.
table = Table(include_in_schema=False)


async def kube_service(request: Request) -> KubeService:
    return request.app.state.kube_api


KubeApi = Annotated[KubeService, Depends(kube_service)]


@table.get("/version")
async def version():
    return version_info()


@table.get("/api")
async def api(request: Request, p: Caller):
    return api_versions(request.url.netloc)


@table.get("/apis")
async def apis(p: Caller):
    return api_group_list()


@table.get("/api/{version}")
async def core_resources(version: str, p: Caller):
    return _found(resource_list("", version))


@table.get("/apis/{group}")
async def group_doc(group: str, p: Caller):
    return _found(api_group(group))


@table.get("/apis/{group}/{version}")
async def group_resources(group: str, version: str, p: Caller):
    return _found(resource_list(group, version))


@table.get("/openapi/v2")
async def openapi_v2(request: Request, p: Caller):
    if "protobuf" in request.headers.get("accept", ""):
        return Response(openapi.V2_PROTOBUF, media_type=openapi.V2_MEDIA)
    return {"swagger": "2.0", "info": {"title": "Shoal", "version": "v2"}, "paths": {}}


@table.get("/openapi/v3")
async def openapi_index(p: Caller):
    return openapi.index()


@table.get("/openapi/v3/{path:path}")
async def openapi_doc(path: str, p: Caller):
    parts = path.split("/")
    missing = JSONResponse({"kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound"}, 404)
    if parts[0] == "api" and len(parts) == 2:
        group, version = "", parts[1]
    elif parts[0] == "apis" and len(parts) == 3:
        group, version = parts[1], parts[2]
    else:
        return missing
    if version not in group_versions().get(group, ()):
        return missing
    return Response(openapi.document(group, version), media_type="application/json")


def resource_routes(t: Table, res: Resource) -> None:
    """A resource's routes: read, write, then those of each of its subresources."""
    _read_routes(t, res)
    _write_routes(t, res)
    for sub in res.subresources:
        if sub.name == "scale":
            _scale_routes(t, res)
        elif sub.name == "log":
            _log_route(t, res)
        elif sub.name == "status":
            _status_routes(t, res)
        elif sub.name in ("exec", "attach", "portforward"):
            _stream_routes(t, res, sub.name)


def _found(doc: dict | None):
    if doc is None:
        return JSONResponse(status("the server could not find the requested resource", 404, "NotFound"),
                            status_code=404)
    return doc


def _paths(res: Resource) -> tuple[str, str]:
    """(the collection path in a namespace or of a cluster-scoped kind, the item path)."""
    root = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
    collection = f"{root}/namespaces/{{namespace}}/{res.resource}" if res.namespaced else f"{root}/{res.resource}"
    return collection, f"{collection}/{{name}}"


def _read_routes(t: Table, res: Resource) -> None:
    collection, item = _paths(res)

    async def read(request: Request, namespace: str | None, p: Principal, svc: KubeService):
        q, accept = request.query_params, request.headers.get("accept")
        try:
            sel = Selection(namespace, q.get("labelSelector"), q.get("fieldSelector"))
            limit = int(number(request, "limit"))
            if q.get("watch") in ("1", "true", "True"):
                return await watch(request, res, svc, p, sel)
        except ObjectError as e:
            return error_response(e)
        return await call(svc.list, res, p, sel, limit, q.get("continue"),
                          printing.wants_table(accept), q.get("includeObject", "Metadata"))

    async def read_collection(request: Request, namespace: str, p: Caller, svc: KubeApi):
        return await read(request, namespace, p, svc)

    async def read_all(request: Request, p: Caller, svc: KubeApi):
        return await read(request, None, p, svc)

    async def read_item(request: Request, name: str, p: Caller, svc: KubeApi, namespace: str | None = None):
        out = await call(svc.get, res, p, namespace, name)
        if isinstance(out, Response) or not printing.wants_table(request.headers.get("accept")):
            return out
        return printing.table(res.resource, [out], time.time(), out["metadata"]["resourceVersion"],
                              request.query_params.get("includeObject", "Metadata"))

    if res.namespaced:  # a watch streams
        t.get(collection, streaming=True)(read_collection)
    t.get(_paths(res)[0].replace("/namespaces/{namespace}", ""), streaming=True)(read_all)
    t.get(item)(read_item)


async def watch(request: Request, res: Resource, svc: KubeService, p: Principal, sel: Selection):
    """Chunked JSON watch events from ``resourceVersion`` (0 or none: the current objects as
    ADDED first); a position older than the cache keeps gets an ERROR event with 410. With
    ``allowWatchBookmarks``, a BOOKMARK (the object's kind and a resourceVersion only) moves
    the watcher's position on while nothing it watches changes (every ``BOOKMARK_S`` at most,
    and as the watch times out); ``sendInitialEvents`` sends the current objects first, then a
    bookmark marking their end (``k8s.io/initial-events-end``), as watch-list clients expect."""
    q = request.query_params
    a = await run_in_threadpool(svc.access, p)
    svc.check_list(a, res, sel.namespace, "watch")
    table = printing.wants_table(request.headers.get("accept"))
    since = q.get("resourceVersion") or "0"
    if not since.isdigit():
        raise ObjectError(f"invalid resource version: {since}", 400)
    bookmarks = q.get("allowWatchBookmarks") in ("1", "true", "True") and not table
    initial = q.get("sendInitialEvents") in ("1", "true", "True")
    if initial and not bookmarks:
        raise ObjectError("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless "
                          "allowWatchBookmarks=true", 422, "Invalid")
    if initial and q.get("resourceVersionMatch") != "NotOlderThan":
        raise ObjectError("resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
                          "resourceVersionMatch to NotOlderThan", 422, "Invalid")
    timeout = min(number(request, "timeoutSeconds", WATCH_TIMEOUT_S), WATCH_TIMEOUT_S)
    cache = svc.cache
    headers_sent: list = []

    def line(type_: str, entry: Entry) -> bytes:
        obj = with_rv(entry)
        if table:  # column definitions with the first event only
            obj = printing.table(res.resource, [obj], time.time(), str(entry.rv), q.get("includeObject", "Metadata"),
                                 headers=not headers_sent)
            headers_sent.append(True)
        return (json.dumps({"type": type_, "object": obj}) + "\n").encode()

    def bookmark(rv: int, initial_end: bool = False) -> bytes:
        meta: dict = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return (json.dumps({"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.group_version,
                                                            "metadata": meta}}) + "\n").encode()

    async def events():
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pos = int(since)
        if pos == 0 or initial:
            pos, entries = await run_in_threadpool(cache.items, res)
            for e in svc.visible(a, res, entries, sel):
                yield line("ADDED", e)
            if initial:
                yield bookmark(pos, initial_end=True)
        elif cache.too_old(pos):
            gone = status(f"too old resource version: {pos} ({cache.oldest})", 410, "Expired")
            yield (json.dumps({"type": "ERROR", "object": gone}) + "\n").encode()
            return
        told, told_at = pos, loop.time()  # the position the client last heard of, and when
        while loop.time() < deadline:
            await cache.poll(res)
            changes, head = cache.since_at(res, pos)
            for ev in changes:
                if next(svc.visible(a, res, [ev.entry], sel), None) is not None:
                    yield line(ev.type, ev.entry)
                    told, told_at = ev.rv, loop.time()
            pos = max(pos, head)
            if bookmarks and pos > told and (loop.time() - told_at >= BOOKMARK_S
                                             or loop.time() + POLL_S >= deadline):
                yield bookmark(pos)
                told, told_at = pos, loop.time()
            if await request.is_disconnected():
                return
            await asyncio.sleep(POLL_S)

    return StreamingResponse(events(), media_type="application/json")


def _write_routes(t: Table, res: Resource) -> None:
    collection, item = _paths(res)

    async def create(request: Request, p: Caller, svc: KubeApi, namespace: str | None = None):
        try:
            doc = await body_of(request)
        except ObjectError as e:
            return error_response(e)
        return await call(lambda: svc.write(res, p, namespace, doc, None, dry_run(request))[0], code=201)

    async def replace(request: Request, name: str, p: Caller, svc: KubeApi, namespace: str | None = None):
        try:
            doc = await body_of(request)
        except ObjectError as e:
            return error_response(e)
        return await call(lambda: svc.write(res, p, namespace, doc, name, dry_run(request))[0])

    async def patch(request: Request, name: str, p: Caller, svc: KubeApi, namespace: str | None = None):
        kind = PATCH_TYPES.get(request.headers.get("content-type", "").split(";")[0].strip())
        if kind is None:
            return JSONResponse(status(f"the body of the request was in an unknown format - accepted media types "
                                       f"include: {', '.join(PATCH_TYPES)}", 415, "UnsupportedMediaType"), 415)
        try:
            body = await body_of(request)
        except ObjectError as e:
            return error_response(e)
        return await call(lambda: svc.patch(res, p, namespace, name, kind, body, dry_run(request))[0])

    async def delete(request: Request, name: str, p: Caller, svc: KubeApi, namespace: str | None = None):
        def gone():
            uid = svc.delete(res, p, namespace, name)
            return status("", 200, "", {"name": name, "group": res.group, "kind": res.resource, "uid": uid})

        return await call(gone)

    if "create" in res.verbs:
        t.post(collection)(create)
    for verb, method, handler in (("update", "PUT", replace), ("patch", "PATCH", patch), ("delete", "DELETE", delete)):
        if verb in res.verbs:
            t.route(method, item)(handler)


def _scale_routes(t: Table, res: Resource) -> None:
    """``deployments/{name}/scale``: an autoscaling/v1 Scale (``kubectl scale``)."""

    async def get_scale(namespace: str, name: str, p: Caller, svc: KubeApi):
        return await call(svc.scale_of, res, namespace, name)

    async def set_scale(request: Request, namespace: str, name: str, p: Caller, svc: KubeApi):
        try:
            body = await body_of(request)
        except ObjectError as e:
            return error_response(e)
        return await call(svc.scale, res, p, namespace, name, body)

    path = f"{_paths(res)[1]}/scale"
    t.get(path)(get_scale)
    t.route(("PUT", "PATCH"), path)(set_scale)


def _status_routes(t: Table, res: Resource) -> None:
    """``{name}/status``: the object; PUT and PATCH change only its status (controllers' writes)."""

    async def get_status(name: str, p: Caller, svc: KubeApi, namespace: str | None = None):
        return await call(svc.get, res, p, namespace, name)

    async def set_status(request: Request, name: str, p: Caller, svc: KubeApi, namespace: str | None = None):
        kind = "replace" if request.method == "PUT" else PATCH_TYPES.get(
            request.headers.get("content-type", "").split(";")[0].strip(), "merge")
        try:
            body = await body_of(request)
        except ObjectError as e:
            return error_response(e)
        return await call(svc.write_status, res, p, namespace, name, kind, body, dry_run(request))

    path = f"{_paths(res)[1]}/status"
    t.get(path)(get_status)
    t.route(("PUT", "PATCH"), path)(set_status)


def _log_route(t: Table, res: Resource) -> None:
    """``pods/{name}/log`` (``kubectl logs``): the agent's log stream, as text."""

    async def pod_log(request: Request, namespace: str, name: str, p: Caller, server: ServerDep, svc: KubeApi):
        q = request.query_params
        try:
            tail = int(number(request, "tailLines")) if q.get("tailLines") else None
            since = log_since(request)
            agent, key, cname = await run_in_threadpool(shoal_kube_api.locate, server, p, namespace, name,
                                                        q.get("container"), "get")
            if since is not None:
                await run_in_threadpool(svc.check_log_window, res, p, namespace, name, cname,
                                        q.get("previous") == "true", since)
            chunks = server.logs.stream(agent, key=key, container=cname, previous=q.get("previous") == "true",
                                        follow=q.get("follow") == "true", tail=tail)
            first = await chunks.__anext__()
        except ObjectError as e:
            return error_response(e)
        return StreamingResponse(shoal_kube_api.prepend(first, chunks), media_type="text/plain")

    t.get(f"{_paths(res)[1]}/log", streaming=True)(pod_log)


def log_since(request: Request) -> float | None:
    """The start of ``sinceSeconds``/``sinceTime``'s window (None: the whole log); the
    lines carry no times, so ``timestamps`` is refused."""
    q = request.query_params
    if q.get("timestamps") == "true":
        raise ObjectError("the lines of Shoal's container logs carry no times: --timestamps cannot be served",
                          400, "BadRequest")
    if q.get("sinceSeconds"):
        return time.time() - number(request, "sinceSeconds")
    if q.get("sinceTime"):
        try:
            return seconds(q["sinceTime"])
        except ValueError:
            raise ObjectError(f"sinceTime: invalid value {q['sinceTime']!r}: not an RFC 3339 time", 400,
                              "BadRequest") from None
    return None


def _stream_routes(t: Table, res: Resource, mode: str) -> None:
    """``pods/{name}/exec`` and ``/attach``: kubectl's WebSocket (server/kubeapi/streams.py);
    its SPDY fallback (POST) gets the reason the upgrade was refused."""
    path = f"{_paths(res)[1]}/{mode}"

    async def stream(ws: WebSocket, namespace: str, name: str):
        await streams.serve(ws, ws.app.state.server, namespace, name, mode)

    async def spdy(request: Request, namespace: str, name: str, server: ServerDep):
        return await streams.spdy_refusal(server, request, namespace, name, mode)

    t.websocket(path)(stream)
    t.route(("GET", "POST"), path)(spdy)


for _resource in RESOURCES:
    resource_routes(table, _resource)
