"""Routes for Kubernetes-style objects, under /shoal/v1/kube (see docs/SERVING.md)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import TYPE_CHECKING, Annotated

from fastapi import Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import select

from shoal.model.selectors import parse_selector_text
from shoal.server.auth import Principal
from shoal.server.deps import Admin, Caller, ServerDep
from shoal.server.endpoints import Table
from shoal.server.kube import objects as objs
from shoal.server.kube import pods as podsvc
from shoal.server.kube import service as svc
from shoal.server.kube.logs import AgentEndpoint
from shoal.server.kube.objects import ObjectError
from shoal.server.kube.rbac import Access
from shoal.server.kube.backends import ROUTES_KEY, routes_table
from shoal.server.retry import retry_on_conflict
from shoal.server.schemas import ApplyRequest, ExecRequest, GatewayMetrics, ScaleRequest, UndoRequest
from shoal.store.models import NodeRow

if TYPE_CHECKING:
    from shoal.server.core import Server


def _status_body(e: ObjectError) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": e.message,
            "reason": e.reason, "code": e.status, "detail": e.message}


table = Table(prefix="/shoal/v1/kube")


def node_addresses(s) -> dict[str, str]:
    return {n.name: n.address for n in s.scalars(select(NodeRow))}


def access(server: Server, s, p: Principal) -> Access:
    return Access.of(s, p, server.config.auth.default_namespace_open)


def changed(server: Server, routes: bool = True) -> None:
    server.controller.wake()
    server.kube.wake()
    if routes:
        server.hub.bump([ROUTES_KEY])


@table.post("/apply")
@retry_on_conflict
def apply(body: ApplyRequest, p: Caller, server: ServerDep):
    now = server.clock()
    try:
        with server.sessions() as s, s.begin():
            out = svc.apply(s, server, p, body.documents, now, dry_run=body.dry_run)
            if body.dry_run:
                s.rollback()
    except svc.ManifestErrors as e:
        return JSONResponse({"detail": {"errors": e.errors}}, status_code=422)
    if not body.dry_run:
        changed(server)
    return out


@table.get("/objects/{plural}")
def list_objects(plural: str, p: Caller, server: ServerDep, namespace: str | None = None, name: str | None = None,
                 selector: Annotated[str | None, Query(max_length=1000)] = None):
    kind = svc.kind_of(plural)
    ns = None if namespace in (None, "", "all") or not kind.namespaced else namespace
    try:
        sel = parse_selector_text(selector) if selector else None
    except ValueError as e:
        raise ObjectError(f"unable to parse requirement: {e}", 400) from None
    with server.sessions() as s:
        items = _listed(s, access(server, s, p), kind, ns, name)
    if sel is not None:
        items = [i for i in items if sel.matches((i.get("metadata") or {}).get("labels") or {})]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _listed(s, a: Access, kind, ns: str | None, name: str | None) -> list[dict]:
    if kind.kind == "Pod":
        addrs = node_addresses(s)
        return [podsvc.to_json(row, addrs) for row in podsvc.visible(s, ns, name)
                if a.may_read(row.namespace, row.user)]
    if kind.kind == "Event":
        return [objs.event_json(e) for e in objs.events_for(s, ns)]
    rows = objs.list_rows(s, kind.kind, ns)
    items = [objs.to_json(row) for row in rows if (name is None or row.name == name)
             and a.may_read(row.namespace, svc.owner_of(row), kind.kind)]
    if kind.kind == "Namespace":
        have = {i["metadata"]["name"] for i in items}
        items = [_builtin_namespace(n) for n in objs.BUILTIN_NAMESPACES if n not in have] + items
    return items


@table.get("/objects/{plural}/{namespace}/{name}")
def get_object(plural: str, namespace: str, name: str, p: Caller, server: ServerDep):
    kind = svc.kind_of(plural)
    ns = svc.namespace_of(kind, None if namespace == "_" else namespace)
    with server.sessions() as s:
        if kind.kind == "Pod":
            row = podsvc.find(s, ns, name)
            if row is None:
                raise objs.not_found(kind, name)
            access(server, s, p).check_read(kind, ns, name, row.user)
            return podsvc.to_json(row, node_addresses(s))
        if kind.kind == "Namespace" and name in objs.BUILTIN_NAMESPACES and objs.get(s, "Namespace", "", name) is None:
            return _builtin_namespace(name)
        row = objs.require(s, kind, ns, name)
        access(server, s, p).check_read(kind, ns, name, svc.owner_of(row))
        return objs.to_json(row)


@table.delete("/objects/{plural}/{namespace}/{name}")
@retry_on_conflict
def delete_object(plural: str, namespace: str, name: str, p: Caller, server: ServerDep):
    kind = svc.kind_of(plural)
    if kind.kind == "Event":
        raise ObjectError("events cannot be deleted", 405, "MethodNotAllowed")
    if kind.kind == "Namespace" and name in objs.BUILTIN_NAMESPACES:
        raise ObjectError(f'namespaces "{name}" is forbidden: this namespace may not be deleted', 403, "Forbidden")
    with server.sessions() as s, s.begin():
        out = svc.delete(s, access(server, s, p), kind, None if namespace == "_" else namespace, name, server.clock())
    changed(server)
    return {"deleted": out}


@table.post("/objects/deployments/{namespace}/{name}/scale")
@retry_on_conflict
def scale(namespace: str, name: str, body: ScaleRequest, p: Caller, server: ServerDep):
    with server.sessions() as s, s.begin():
        out = objs.to_json(svc.scale(s, access(server, s, p), namespace, name, body.replicas))
    changed(server, routes=False)
    return out


@table.get("/objects/deployments/{namespace}/{name}/history")
def history(namespace: str, name: str, p: Caller, server: ServerDep):
    with server.sessions() as s:
        return {"revisions": svc.history(s, access(server, s, p), namespace, name)}


@table.post("/objects/deployments/{namespace}/{name}/undo")
@retry_on_conflict
def undo(namespace: str, name: str, p: Caller, server: ServerDep, body: UndoRequest | None = None):
    with server.sessions() as s, s.begin():
        out = objs.to_json(svc.undo(s, access(server, s, p), namespace, name, body.to_revision if body else 0))
    changed(server, routes=False)
    return out


@table.get("/pods/{namespace}/{name}/log")
async def pod_log(namespace: str, name: str, p: Caller, server: ServerDep, container: str | None = None,
                  previous: bool = False, follow: bool = False,
                  tail: Annotated[int | None, Query(ge=0)] = None):
    agent, key, cname = await run_in_threadpool(locate, server, p, namespace, name, container, "get")
    chunks = server.logs.stream(agent, key=key, container=cname, previous=previous,
                                follow=follow, tail=tail)
    first = await chunks.__anext__()  # errors (unreachable agent, no such log) before the 200
    return StreamingResponse(prepend(first, chunks), media_type="text/plain; charset=utf-8")


@table.post("/pods/{namespace}/{name}/exec")
async def pod_exec(namespace: str, name: str, body: ExecRequest, p: Caller, server: ServerDep):
    """Run a command in a running container; NDJSON output as srun's steps stream it."""
    agent, key, cname = await run_in_threadpool(locate, server, p, namespace, name, body.container, "create")
    chunks = server.logs.exec(agent, key=key, container=cname, argv=body.command,
                              stdin=body.stdin)
    first = await chunks.__anext__()  # errors (not running, no such command) before the 200
    return StreamingResponse(prepend(first, chunks), media_type="application/x-ndjson")


@table.get("/routes")
async def routes(p: Admin, server: ServerDep, version: str | None = None,
                 wait: Annotated[float, Query(ge=0, le=60)] = 0):
    """The Services' backends for gateways: answers at once when they differ from
    ``version``, else when they change (or after ``wait`` seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        gen = server.hub.generation(ROUTES_KEY)
        current = await run_in_threadpool(_table, server)
        if current["version"] != version or loop.time() >= deadline:
            return current
        await server.hub.wait(ROUTES_KEY, server.hub.epoch, gen, min(1.0, max(0.0, deadline - loop.time())))


def _table(server: Server) -> dict:
    with server.sessions() as s:
        services = routes_table(s)
    text = json.dumps(services, sort_keys=True)
    return {"version": hashlib.sha1(text.encode()).hexdigest()[:16], "services": services}


@table.post("/metrics")
def metrics(body: GatewayMetrics, p: Admin, server: ServerDep):
    server.record_metrics({"gateway": True}, {"pods": body.pods, "held": body.held}, server.clock())
    return {"ok": True}


def locate(server, p: Principal, namespace: str, name: str, container: str | None, verb: str,
           any_container: bool = False, subresource: str | None = None):
    """The node's agent, run key and container of a pod the caller may
    read the log of (``get``) or exec into (``create``, as pods/exec in Kubernetes);
    ``any_container``: the first when none is named (port-forward reaches the pod's network)."""
    with server.sessions() as s:
        row = podsvc.find(s, namespace, name)
        if row is None:
            raise objs.not_found(objs.KINDS["pods"], name)
        a = Access.of(s, p, server.config.auth.default_namespace_open)
        if verb == "get":
            a.check_read(objs.KINDS["pods"], namespace, name, row.user)
        else:
            a.check_change(verb, objs.KINDS["pods"], namespace, name, row.user, subresource)
        node = s.get(NodeRow, row.batch_host) if row.batch_host else None
        if node is None:
            raise ObjectError(f'container "{container or row.spec["pod"]["spec"]["containers"][0]["name"]}" '
                              f'in pod "{name}" is waiting to start: the pod is not scheduled yet', 400)
        names = [c["name"] for c in row.spec["pod"]["spec"]["containers"]]
        if container is None and len(names) > 1 and not any_container:
            raise ObjectError(f"a container name must be specified for pod {name}, "
                              f"choose one of: [{' '.join(names)}]", 400)
        cname = container or names[0]
        if cname not in names:
            raise ObjectError(f"container {cname} is not valid for pod {name}", 400)
        return AgentEndpoint.of(node), podsvc.job_key(row), cname


async def prepend(first, rest):
    yield first
    async for chunk in rest:
        yield chunk


def _builtin_namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "status": {"phase": "Active"}}
