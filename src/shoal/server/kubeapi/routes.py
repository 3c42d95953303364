"""The Kubernetes REST API's routes, made from the resource registry: discovery, then for
each resource its collection, item and subresource paths. Handlers are thin: reads come
from the watch cache, writes go through the object service Shoal's own routes use
(``server.kube.service``), and every refusal is a ``Status`` object as kubectl expects.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import yaml
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from shoal.kube.patch import PatchError, json_patch, merge_patch, strategic_merge
from shoal.model.selectors import SelectorError, parse_selector_text
from shoal.server.auth import Principal
from shoal.server.kube import api as kubeapi_v1
from shoal.server.kube import objects as objs
from shoal.server.kube import service as svc
from shoal.server.kube.objects import ObjectError, random_suffix
from shoal.server.kube.rbac import VIEW, Access
from shoal.server.kubeapi import openapi, printing
from shoal.server.kubeapi.cache import POLL_S, Entry, WatchCache, with_rv
from shoal.server.kubeapi.registry import (
    RESOURCES, Resource, api_group, api_group_list, api_versions, resource_list, version_info,
)

WATCH_TIMEOUT_S = 1800  # a watch without timeoutSeconds ends after this, as the API server's min-request-timeout
PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


def status(message: str, code: int, reason: str, details: dict | None = None) -> dict:
    out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure" if code >= 300 else "Success",
           "message": message, "reason": reason, "code": code}
    if details:
        out["details"] = details
    return out


def is_kube_path(path: str) -> bool:
    return path.startswith(("/api/", "/apis", "/openapi/")) or path in ("/api", "/version")


def error_response(e: ObjectError) -> JSONResponse:
    return JSONResponse(status(e.message, e.status, e.reason), status_code=e.status)


def invalid(r: Resource, name: str, errors: list[dict]) -> JSONResponse:
    """``Invalid`` with one cause per bad field, worded as the API server words them."""
    kind = f"{r.kind}.{r.group}" if r.group else r.kind
    causes = [{"reason": "FieldValueInvalid", "message": e["message"], "field": e["path"]} for e in errors]
    text = ", ".join(f"{e['path']}: {e['message']}" if e["path"] else e["message"] for e in errors)
    body = status(f'{kind} "{name}" is invalid: {text}', 422, "Invalid",
                  {"name": name, "group": r.group, "kind": r.kind, "causes": causes})
    return JSONResponse(body, status_code=422)


# ---------------------------------------------------------------- selectors


def field_selector(text: str | None) -> list[tuple[str, str, bool]]:
    """``a=b,c!=d``: (path, value, equal) terms."""
    out = []
    for term in filter(None, (text or "").split(",")):
        if "!=" in term:
            path, value, eq = *term.split("!=", 1), False
        elif "=" in term:
            path, _, value = term.partition("==") if "==" in term else term.partition("=")
            eq = True
        else:
            raise ObjectError(f'invalid selector: \'{text}\'; can\'t understand \'{term}\'', 400)
        out.append((path.strip(), value.strip(), eq))
    return out


# Event fields kubectl describe selects on that Shoal's events do not carry.
UNKNOWN_FIELDS = frozenset({"involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                            "involvedObject.fieldPath"})


def field_value(obj: dict, path: str) -> str:
    value = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def selects(obj: dict, labels, fields: list[tuple[str, str, bool]]) -> bool:
    if labels is not None and not labels.matches((obj.get("metadata") or {}).get("labels") or {}):
        return False
    return all(p in UNKNOWN_FIELDS or (field_value(obj, p) == v) == eq for p, v, eq in fields)


def label_selector(text: str | None):
    try:
        return parse_selector_text(text) if text else None
    except (SelectorError, ValueError) as e:
        raise ObjectError(f"unable to parse requirement: {e}", 400) from None


# ---------------------------------------------------------------- the router


def router(server, principal, nodes_json, retry_on_conflict) -> APIRouter:
    """``retry_on_conflict``: runs a write again when the controllers changed its rows first."""
    r = APIRouter()
    server.nodes_json = nodes_json
    cache = server.kube_cache = WatchCache(server.sessions, server)

    def access(p: Principal) -> Access:
        with server.sessions() as s:
            return Access.of(s, p, server.config.auth.default_namespace_open)

    def check_list(a: Access, res: Resource, namespace: str | None, verb: str = "list") -> None:
        """A namespace the caller has no view of is Forbidden, as an RBAC refusal would be
        (``default`` while it is open, and everyone's cluster-scoped kinds, excepted)."""
        p = a.principal
        if not res.namespaced or not namespace or p.sees_everything or a.rank(namespace) >= VIEW:
            return
        if namespace == "default" and a.default_open:
            return
        group = res.group
        raise ObjectError(f'{res.qualified} is forbidden: User "{p.user}" cannot {verb} resource "{res.resource}" '
                          f'in API group "{group}" in the namespace "{namespace}"', 403, "Forbidden")

    def visible(a: Access, res: Resource, entries: list[Entry], namespace: str | None, labels, fields):
        for e in entries:
            md = e.obj.get("metadata") or {}
            if namespace and res.namespaced and md.get("namespace") != namespace:
                continue
            if not a.may_read(md.get("namespace") or "", e.owner):
                continue
            if selects(e.obj, labels, fields):
                yield e

    def changed() -> None:
        server.controller.wake()
        server.kube.wake()
        server.hub.bump([kubeapi_v1.ROUTES_KEY])

    # -- discovery

    @r.get("/version")
    async def version():
        return version_info()

    @r.get("/api")
    async def api(request: Request, p: Principal = Depends(principal)):
        return api_versions(request.url.netloc)

    @r.get("/apis")
    async def apis(p: Principal = Depends(principal)):
        return api_group_list()

    @r.get("/api/{version}")
    async def core_resources(version: str, p: Principal = Depends(principal)):
        return _found(resource_list("", version))

    @r.get("/apis/{group}")
    async def group_doc(group: str, p: Principal = Depends(principal)):
        return _found(api_group(group))

    @r.get("/apis/{group}/{version}")
    async def group_resources(group: str, version: str, p: Principal = Depends(principal)):
        return _found(resource_list(group, version))

    openapi.add_routes(r, principal)

    # -- each resource's routes

    for res in RESOURCES:
        _resource_routes(r, res, server, cache, principal, access, check_list, visible, changed, retry_on_conflict)
    return r


def _found(doc: dict | None):
    if doc is None:
        return JSONResponse(status("the server could not find the requested resource", 404, "NotFound"),
                            status_code=404)
    return doc


def _resource_routes(r: APIRouter, res: Resource, server, cache: WatchCache, principal, access, check_list,
                     visible, changed, retry_on_conflict) -> None:
    kind = res.shoal_kind
    root = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
    item_base = f"{root}/namespaces/{{namespace}}/{res.resource}" if res.namespaced else f"{root}/{res.resource}"

    def ns_key(namespace: str | None) -> str:
        return (namespace or "default") if res.namespaced else objs.CLUSTER

    # -- reads

    def list_objects(p: Principal, namespace: str | None, q: dict, accept: str | None) -> dict:
        a = access(p)
        check_list(a, res, namespace)
        labels, fields = label_selector(q.get("labelSelector")), field_selector(q.get("fieldSelector"))
        rv, entries = cache.items(res)
        items = [with_rv(e) for e in visible(a, res, entries, namespace, labels, fields)]
        meta: dict = {"resourceVersion": str(rv)}
        limit = int(q.get("limit") or 0)
        if q.get("continue"):
            start = int(base64.urlsafe_b64decode(q["continue"]).decode())
            items = items[start:]
        else:
            start = 0
        if limit and len(items) > limit:
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
            meta["continue"] = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
        if printing.wants_table(accept):
            return printing.table(res.resource, items, time.time(), str(rv), q.get("includeObject", "Metadata"))
        return {"kind": f"{res.kind}List", "apiVersion": res.group_version, "metadata": meta, "items": items}

    def get_object(p: Principal, namespace: str | None, name: str) -> dict:
        entry = cache.get(res, ns_key(namespace), name)
        if entry is None:
            raise objs.not_found(kind, name)
        a = access(p)
        if not a.may_read(ns_key(namespace), entry.owner):
            raise a.forbidden("get", kind, ns_key(namespace), name)
        return with_rv(entry)

    async def read(request: Request, namespace: str | None, name: str | None, p: Principal):
        q = dict(request.query_params)
        accept = request.headers.get("accept")
        try:
            if name is None and q.get("watch") in ("1", "true", "True"):
                return await watch(request, p, namespace, q, accept)
            if name is None:
                return await run_in_threadpool(list_objects, p, namespace, q, accept)
            obj = await run_in_threadpool(get_object, p, namespace, name)
            if printing.wants_table(accept):
                return printing.table(res.resource, [obj], time.time(), obj["metadata"]["resourceVersion"],
                                      q.get("includeObject", "Metadata"))
            return obj
        except ObjectError as e:
            return error_response(e)

    async def watch(request: Request, p: Principal, namespace: str | None, q: dict, accept: str | None):
        a = await run_in_threadpool(access, p)
        check_list(a, res, namespace, "watch")
        labels, fields = label_selector(q.get("labelSelector")), field_selector(q.get("fieldSelector"))
        table = printing.wants_table(accept)
        since = q.get("resourceVersion") or "0"
        if not since.isdigit():
            raise ObjectError(f"invalid resource version: {since}", 400)
        timeout = min(float(q.get("timeoutSeconds") or WATCH_TIMEOUT_S), WATCH_TIMEOUT_S)

        def line(type_: str, entry: Entry, first: list) -> bytes:
            obj = with_rv(entry)
            if table:
                obj = printing.table(res.resource, [obj], time.time(), str(entry.rv),
                                     q.get("includeObject", "Metadata"), headers=not first)
                first.append(True)
            return (json.dumps({"type": type_, "object": obj}) + "\n").encode()

        async def events():
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            first: list = []
            pos = int(since)
            if pos == 0:
                pos, entries = await run_in_threadpool(cache.items, res)
                for e in visible(a, res, entries, namespace, labels, fields):
                    yield line("ADDED", e, first)
            elif cache.too_old(pos):
                gone = status(f"too old resource version: {pos} ({cache.oldest})", 410, "Expired")
                yield (json.dumps({"type": "ERROR", "object": gone}) + "\n").encode()
                return
            while loop.time() < deadline:
                await run_in_threadpool(cache.sync, res)
                for ev in cache.since(res, pos):
                    pos = ev.rv
                    if next(visible(a, res, [ev.entry], namespace, labels, fields), None) is not None:
                        yield line(ev.type, ev.entry, first)
                if await request.is_disconnected():
                    return
                await asyncio.sleep(POLL_S)

        return StreamingResponse(events(), media_type="application/json")

    async def read_collection(request: Request, namespace: str, p: Principal = Depends(principal)):
        return await read(request, namespace, None, p)

    async def read_all(request: Request, p: Principal = Depends(principal)):
        return await read(request, None, None, p)

    async def read_item(request: Request, name: str, namespace: str | None = None,
                        p: Principal = Depends(principal)):
        return await read(request, namespace, name, p)

    if res.namespaced:
        r.add_api_route(f"{root}/namespaces/{{namespace}}/{res.resource}", read_collection, methods=["GET"])
    r.add_api_route(f"{root}/{res.resource}", read_all, methods=["GET"])
    r.add_api_route(f"{item_base}/{{name}}", read_item, methods=["GET"])

    # -- writes

    @retry_on_conflict
    def write(p: Principal, namespace: str | None, doc: dict, name: str | None, dry_run: bool,
              expect_rv: str | None = None):
        """Create (``name`` None) or replace one object through the object service."""
        verb = "create" if name is None else "update"
        if verb not in res.verbs:
            raise ObjectError(f'{res.qualified} "{name or ""}" is forbidden: {verb} is not supported here: '
                              f'{res.notes or "read-only"}', 405, "MethodNotAllowed")
        if not isinstance(doc, dict):
            raise ObjectError("the request body must be a JSON object", 400)
        meta = doc.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ObjectError("metadata: must be an object", 400)
        doc.setdefault("apiVersion", res.group_version)
        doc.setdefault("kind", res.kind)
        if doc["kind"] != res.kind:
            raise ObjectError(f"the kind {doc['kind']} does not match the path's {res.kind}", 400)
        if res.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise ObjectError("the namespace of the provided object does not match the namespace sent on "
                                  "the request", 400)
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        if name is None and not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + random_suffix()
        name = name or meta.get("name")
        if not name:
            return invalid(res, "", [{"path": "metadata.name", "message": "Required value: name or generateName "
                                                                         "is required"}])
        if meta.get("name") != name:
            raise ObjectError("the name of the object does not match the name on the URL", 400)
        existing = cache.get(res, ns_key(namespace), name)
        if verb == "create" and existing is not None:
            raise ObjectError(f'{res.qualified} "{name}" already exists', 409, "AlreadyExists")
        if verb == "update" and existing is None:
            raise objs.not_found(kind, name)
        expect_rv = expect_rv if expect_rv is not None else meta.get("resourceVersion")
        if verb == "update" and expect_rv and expect_rv != str(existing.rv):
            raise ObjectError(f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has been '
                              "modified; please apply your changes to the latest version and try again",
                              409, "Conflict")
        now = server.clock()
        try:
            with server.sessions() as s, s.begin():
                svc.apply(s, server, p, [doc], now, dry_run=dry_run)
                if dry_run:
                    s.rollback()
        except svc.ManifestErrors as e:
            return invalid(res, name, e.errors)
        if dry_run:
            return doc
        changed()
        entry = cache.get(res, ns_key(namespace), name)
        return with_rv(entry) if entry is not None else doc

    async def body_of(request: Request):
        raw = await request.body()
        ctype = request.headers.get("content-type", "")
        if "protobuf" in ctype or "cbor" in ctype:  # client-go then sends JSON again
            raise ObjectError(f"the body of the request was in an unknown format - accepted media types include: "
                              f"application/json, application/yaml", 415, "UnsupportedMediaType")
        try:
            if request.headers.get("content-type", "").startswith("application/apply-patch+yaml"):
                return yaml.safe_load(raw)
            return json.loads(raw or b"null")
        except (ValueError, yaml.YAMLError) as e:
            raise ObjectError(f"the request body is not valid JSON: {e}", 400) from None

    async def create(request: Request, namespace: str | None = None, p: Principal = Depends(principal)):
        try:
            doc = await body_of(request)
            out = await run_in_threadpool(write, p, namespace, doc, None, _dry_run(request))
        except ObjectError as e:
            return error_response(e)
        return out if isinstance(out, Response) else JSONResponse(out, status_code=201)

    async def replace(request: Request, name: str, namespace: str | None = None,
                      p: Principal = Depends(principal)):
        try:
            doc = await body_of(request)
            return await run_in_threadpool(write, p, namespace, doc, name, _dry_run(request))
        except ObjectError as e:
            return error_response(e)

    def patched(p: Principal, namespace: str | None, name: str, kind_: str, patch, dry_run: bool):
        current = cache.get(res, ns_key(namespace), name)
        if current is None:
            if kind_ == "apply":  # server-side apply creates
                return write(p, namespace, patch, None, dry_run)
            raise objs.not_found(kind, name)
        a = access(p)
        if not a.may_read(ns_key(namespace), current.owner):
            raise a.forbidden("patch", kind, ns_key(namespace), name)
        base = with_rv(current)
        try:
            if kind_ == "json":
                doc = json_patch(base, patch)
            elif kind_ == "merge":
                doc = merge_patch(base, patch)
            else:
                doc = strategic_merge(base, patch)
        except PatchError as e:
            raise ObjectError(str(e), 422, "Invalid") from None
        rv = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
        (doc.get("metadata") or {}).pop("resourceVersion", None)
        return write(p, namespace, doc, name, dry_run, expect_rv=rv or "")

    async def patch(request: Request, name: str, namespace: str | None = None, p: Principal = Depends(principal)):
        ctype = request.headers.get("content-type", "").split(";")[0].strip()
        kind_ = PATCH_TYPES.get(ctype)
        if kind_ is None:
            return JSONResponse(status(f"the body of the request was in an unknown format - accepted media types "
                                       f"include: {', '.join(PATCH_TYPES)}", 415, "UnsupportedMediaType"),
                                status_code=415)
        try:
            body = await body_of(request)
            return await run_in_threadpool(patched, p, namespace, name, kind_, body, _dry_run(request))
        except ObjectError as e:
            return error_response(e)

    @retry_on_conflict
    def remove(p: Principal, namespace: str | None, name: str) -> dict:
        if "delete" not in res.verbs:
            raise ObjectError(f'{res.qualified} "{name}" cannot be deleted: {res.notes}', 405, "MethodNotAllowed")
        if res.kind == "Namespace" and name in objs.BUILTIN_NAMESPACES:
            raise ObjectError(f'namespaces "{name}" is forbidden: this namespace may not be deleted', 403,
                              "Forbidden")
        entry = cache.get(res, ns_key(namespace), name)
        with server.sessions() as s, s.begin():
            a = Access.of(s, p, server.config.auth.default_namespace_open)
            svc.delete(s, a, kind, ns_key(namespace), name, server.clock())
        changed()
        uid = (entry.obj.get("metadata") or {}).get("uid") if entry else None
        return status("", 200, "", {"name": name, "group": res.group, "kind": res.resource, "uid": uid})

    async def delete(request: Request, name: str, namespace: str | None = None, p: Principal = Depends(principal)):
        try:
            return await run_in_threadpool(remove, p, namespace, name)
        except ObjectError as e:
            return error_response(e)

    writes = [m for m, v in (("PUT", "update"), ("PATCH", "patch"), ("DELETE", "delete")) if v in res.verbs]
    if res.namespaced:
        r.add_api_route(f"{root}/namespaces/{{namespace}}/{res.resource}", create, methods=["POST"])
    else:
        r.add_api_route(f"{root}/{res.resource}", create, methods=["POST"])
    for method, handler in (("PUT", replace), ("PATCH", patch), ("DELETE", delete)):
        if method in writes:
            r.add_api_route(f"{item_base}/{{name}}", handler, methods=[method])

    # -- subresources

    for sub in res.subresources:
        if sub.name == "scale":
            _scale_routes(r, res, item_base, server, cache, principal, changed, retry_on_conflict)
        elif sub.name == "log":
            _log_route(r, item_base, server, principal)


def _dry_run(request: Request) -> bool:
    return "All" in request.query_params.getlist("dryRun")


def _scale_routes(r, res: Resource, item_base: str, server, cache: WatchCache, principal, changed,
                  retry_on_conflict) -> None:
    """``deployments/{name}/scale``: an autoscaling/v1 Scale (``kubectl scale``)."""

    def scale_of(namespace: str, name: str) -> dict:
        entry = cache.get(res, namespace, name)
        if entry is None:
            raise objs.not_found(res.shoal_kind, name)
        obj = with_rv(entry)
        md = obj["metadata"]
        sel = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: md.get(k) for k in ("name", "namespace", "uid", "resourceVersion",
                                                     "creationTimestamp")},
                "spec": {"replicas": int((obj.get("spec") or {}).get("replicas", 1))},
                "status": {"replicas": int((obj.get("status") or {}).get("replicas", 0)),
                           "selector": ",".join(f"{k}={v}" for k, v in sorted(sel.items()))}}

    @retry_on_conflict
    def set_replicas(p: Principal, namespace: str, name: str, body) -> dict:
        current = scale_of(namespace, name)
        doc = merge_patch(current, body) if isinstance(body, dict) else current
        replicas = (doc.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise ObjectError("spec.replicas: Invalid value: must be an integer", 422, "Invalid")
        with server.sessions() as s, s.begin():
            a = Access.of(s, p, server.config.auth.default_namespace_open)
            svc.scale(s, a, namespace, name, replicas)
        changed()
        return scale_of(namespace, name)

    async def get_scale(namespace: str, name: str, p: Principal = Depends(principal)):
        try:
            return await run_in_threadpool(scale_of, namespace, name)
        except ObjectError as e:
            return error_response(e)

    async def put_scale(request: Request, namespace: str, name: str, p: Principal = Depends(principal)):
        try:
            body = json.loads(await request.body() or b"{}")
            return await run_in_threadpool(set_replicas, p, namespace, name, body)
        except ObjectError as e:
            return error_response(e)
        except ValueError:
            return error_response(ObjectError("the request body is not valid JSON", 400))

    path = f"{item_base}/{{name}}/scale"
    r.add_api_route(path, get_scale, methods=["GET"])
    r.add_api_route(path, put_scale, methods=["PUT", "PATCH"])


def _log_route(r, item_base: str, server, principal) -> None:
    """``pods/{name}/log`` (``kubectl logs``): the agent's log stream, as text."""

    async def pod_log(request: Request, namespace: str, name: str, p: Principal = Depends(principal)):
        q = request.query_params
        try:
            tail = int(q["tailLines"]) if q.get("tailLines") else None
            agent, key, cname = await run_in_threadpool(kubeapi_v1.locate, server, p, namespace, name,
                                                        q.get("container"), "get")
            chunks = server.logs.stream(agent, key=key, container=cname, previous=q.get("previous") == "true",
                                        follow=q.get("follow") == "true", tail=tail)
            first = await chunks.__anext__()
        except ObjectError as e:
            return error_response(e)
        return StreamingResponse(kubeapi_v1.prepend(first, chunks), media_type="text/plain")

    r.add_api_route(f"{item_base}/{{name}}/log", pod_log, methods=["GET"])
