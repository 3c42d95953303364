"""What the Kubernetes API's routes do, for any resource of the registry: list, get, create,
replace, patch, delete, scale. Reads come from the watch cache; writes go through the
object service Shoal's own routes use (``server.kube.service``), each in its own transaction,
run again when a controller changed the same rows first.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

from shoal.kube.jobs import seconds
from shoal.kube.patch import PatchError, json_patch, merge_patch, strategic_merge
from shoal.model.selectors import SelectorError, parse_selector_text
from shoal.server.auth import Principal
from shoal.server.kube.backends import ROUTES_KEY
from shoal.server.kube import objects as objs
from shoal.server.kube import pods as podsvc
from shoal.server.kube import service as objsvc
from shoal.server.kube.objects import ObjectError, random_suffix
from shoal.server.kube.rbac import VIEW, Access
from shoal.server.kubeapi import printing
from shoal.server.kubeapi.cache import Entry, WatchCache, with_rv
from shoal.server.kubeapi.registry import Resource

# Event fields kubectl describe selects on that Shoal's events do not carry.
UNKNOWN_FIELDS = frozenset({"involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                            "involvedObject.fieldPath"})


class Invalid(Exception):
    """A write whose object fails validation: one error per field (kubectl's ``Invalid``)."""

    def __init__(self, resource: Resource, name: str, errors: list[dict]):
        super().__init__(f"{len(errors)} invalid field(s)")
        self.resource, self.name, self.errors = resource, name, errors


# ---------------------------------------------------------------- selectors


class Selection:
    """Which objects a request names: a namespace (None: all), label and field selectors."""

    def __init__(self, namespace: str | None, labels: str | None = None, fields: str | None = None):
        self.namespace = namespace
        try:
            self.labels = parse_selector_text(labels) if labels else None
        except (SelectorError, ValueError) as e:
            raise ObjectError(f"unable to parse requirement: {e}", 400) from None
        self.fields = field_selector(fields)

    def matches(self, res: Resource, obj: dict) -> bool:
        md = obj.get("metadata") or {}
        if self.namespace and res.namespaced and md.get("namespace") != self.namespace:
            return False
        if self.labels is not None and not self.labels.matches(md.get("labels") or {}):
            return False
        return all(p in UNKNOWN_FIELDS or (field_value(obj, p) == v) == eq for p, v, eq in self.fields)


def field_selector(text: str | None) -> list[tuple[str, str, bool]]:
    """``a=b,c!=d``: (path, value, equal) terms."""
    out = []
    for term in filter(None, (text or "").split(",")):
        if "!=" in term:
            path, value = term.split("!=", 1)
            eq = False
        elif "=" in term:
            path, _, value = term.partition("==") if "==" in term else term.partition("=")
            eq = True
        else:
            raise ObjectError(f"invalid selector: '{text}'; can't understand '{term}'", 400)
        out.append((path.strip(), value.strip(), eq))
    return out


def field_value(obj: dict, path: str) -> str:
    value = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


# ---------------------------------------------------------------- the use cases


class KubeService:
    def __init__(self, server, retry_on_conflict) -> None:
        self.server = server
        self.cache = WatchCache(server.sessions, server)
        self.write = retry_on_conflict(self._write)
        self.delete = retry_on_conflict(self._delete)
        self.scale = retry_on_conflict(self._scale)

    # -- who may see what

    def access(self, p: Principal) -> Access:
        with self.server.sessions() as s:
            return Access.of(s, p, self.server.config.auth.default_namespace_open)

    def check_list(self, a: Access, res: Resource, namespace: str | None, verb: str = "list") -> None:
        """A namespace the caller has no view of is Forbidden, as an RBAC refusal would be
        (``default`` while it is open, and everyone's cluster-scoped kinds, excepted)."""
        p = a.principal
        if not res.namespaced or not namespace or p.sees_everything or a.rank(namespace) >= VIEW:
            return
        if namespace == "default" and a.default_open:
            return
        raise ObjectError(f'{res.qualified} is forbidden: User "{p.user}" cannot {verb} resource "{res.resource}" '
                          f'in API group "{res.group}" in the namespace "{namespace}"', 403, "Forbidden")

    def visible(self, a: Access, res: Resource, entries: list[Entry], sel: Selection) -> Iterator[Entry]:
        for e in entries:
            ns = (e.obj.get("metadata") or {}).get("namespace") or ""
            if a.may_read(ns, e.owner, res.kind) and sel.matches(res, e.obj):
                yield e

    def changed(self) -> None:
        """After a write: the controllers and the gateways' routes look again at once."""
        self.server.controller.wake()
        self.server.kube.wake()
        self.server.hub.bump([ROUTES_KEY])

    # -- reads

    def list(self, res: Resource, p: Principal, sel: Selection, limit: int = 0, resume: str | None = None,
             table: bool = False, include: str = "Metadata") -> dict:
        a = self.access(p)
        self.check_list(a, res, sel.namespace)
        rv, entries = self.cache.items(res)
        items = [with_rv(e) for e in self.visible(a, res, entries, sel)]
        meta: dict = {"resourceVersion": str(rv)}
        try:
            start = int(base64.urlsafe_b64decode(resume).decode()) if resume else 0
        except ValueError:
            raise ObjectError("the continue token is not valid (list again without it)", 410, "Expired") from None
        items = items[start:]
        if limit and len(items) > limit:
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
            meta["continue"] = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
        if table:
            return printing.table(res.resource, items, time.time(), str(rv), include)
        return {"kind": f"{res.kind}List", "apiVersion": res.group_version, "metadata": meta, "items": items}

    def get(self, res: Resource, p: Principal, namespace: str | None, name: str) -> dict:
        entry = self.cache.get(res, key_namespace(res, namespace), name)
        if entry is None:
            raise objs.not_found(res.shoal_kind, name)
        a = self.access(p)
        if not a.may_read(key_namespace(res, namespace), entry.owner, res.kind):
            raise a.forbidden("get", res.shoal_kind, key_namespace(res, namespace), name)
        return with_rv(entry)

    def check_log_window(self, res: Resource, p: Principal, namespace: str, name: str, container: str,
                         previous: bool, since: float) -> None:
        """``kubectl logs --since/--since-time``: a container's log lines carry no times, so the
        log is served whole when the run began within the window, and refused otherwise."""
        pod = self.get(res, p, namespace, name)
        started = log_start(pod, container, previous)
        if started is None or started < since:
            began = f" (it started at {started_text(started)})" if started is not None else ""
            raise ObjectError(f'the log of container "{container}" in pod "{name}" has no times on its lines: '
                              f"--since and --since-time may reach back only to the container's start{began}; "
                              f"use --tail", 400, "BadRequest")

    # -- writes

    def _write(self, res: Resource, p: Principal, namespace: str | None, doc, name: str | None, dry_run: bool,
               expect_rv: str | None = None) -> tuple[dict, bool]:
        """Create (``name`` None) or replace one object; (the object, whether it was created)."""
        verb = "create" if name is None else "update"
        if verb not in res.verbs:
            raise ObjectError(f'{res.qualified} "{name or ""}" is forbidden: {verb} is not supported here: '
                              f'{res.notes or "read-only"}', 405, "MethodNotAllowed")
        name = _prepare(res, doc, namespace, name)
        ns = key_namespace(res, namespace or doc["metadata"].get("namespace"))
        existing = self.cache.get(res, ns, name)
        if verb == "create" and existing is not None:
            raise ObjectError(f'{res.qualified} "{name}" already exists', 409, "AlreadyExists")
        if verb == "update" and existing is None:
            raise objs.not_found(res.shoal_kind, name)
        expect_rv = expect_rv if expect_rv is not None else doc["metadata"].get("resourceVersion")
        if verb == "update" and expect_rv and expect_rv != str(existing.rv):
            raise ObjectError(f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has been '
                              "modified; please apply your changes to the latest version and try again",
                              409, "Conflict")
        try:
            with self.server.sessions() as s, s.begin():
                objsvc.apply(s, self.server, p, [doc], self.server.clock(), dry_run=dry_run)
                if dry_run:
                    s.rollback()
        except objsvc.ManifestErrors as e:
            raise Invalid(res, name, e.errors) from None
        if dry_run:
            return doc, verb == "create"
        self.changed()
        entry = self.cache.get(res, ns, name)
        return (with_rv(entry) if entry is not None else doc), verb == "create"

    def patch(self, res: Resource, p: Principal, namespace: str | None, name: str, patch_type: str, patch,
              dry_run: bool) -> tuple[dict, bool]:
        """JSON, merge or strategic merge patch, or server-side apply (which creates)."""
        current = self.cache.get(res, key_namespace(res, namespace), name)
        if current is None:
            if patch_type == "apply":
                return self.write(res, p, namespace, patch, None, dry_run)
            raise objs.not_found(res.shoal_kind, name)
        a = self.access(p)
        if not a.may_read(key_namespace(res, namespace), current.owner, res.kind):
            raise a.forbidden("patch", res.shoal_kind, key_namespace(res, namespace), name)
        doc, rv = patched(with_rv(current), patch_type, patch)
        return self.write(res, p, namespace, doc, name, dry_run, expect_rv=rv or "")

    def _delete(self, res: Resource, p: Principal, namespace: str | None, name: str) -> str | None:
        """Delete one object (its dependents with it); its uid."""
        if "delete" not in res.verbs:
            raise ObjectError(f'{res.qualified} "{name}" cannot be deleted: {res.notes}', 405, "MethodNotAllowed")
        if res.kind == "Namespace" and name in objs.BUILTIN_NAMESPACES:
            raise ObjectError(f'namespaces "{name}" is forbidden: this namespace may not be deleted', 403,
                              "Forbidden")
        entry = self.cache.get(res, key_namespace(res, namespace), name)
        with self.server.sessions() as s, s.begin():
            a = Access.of(s, p, self.server.config.auth.default_namespace_open)
            objsvc.delete(s, a, res.shoal_kind, key_namespace(res, namespace), name, self.server.clock())
        self.changed()
        return (entry.obj.get("metadata") or {}).get("uid") if entry else None

    # -- the status subresource

    def write_status(self, res: Resource, p: Principal, namespace: str | None, name: str, patch_type: str,
                     body, dry_run: bool) -> dict:
        """PUT (``patch_type`` "replace") or PATCH ``.../status``: only the object's status
        changes, whatever else the body says, as the API server's status strategy does. A pod's
        status is its node's: only conditions of types the kubelet does not own are kept
        (readiness gates' conditions, written by controllers)."""
        ns = key_namespace(res, namespace)
        current = self.cache.get(res, ns, name)
        if current is None:
            raise objs.not_found(res.shoal_kind, name)
        if patch_type == "replace":
            if not isinstance(body, dict):
                raise ObjectError("the request body must be a JSON object", 400)
            doc, rv = body, (body.get("metadata") or {}).get("resourceVersion")
        else:
            doc, rv = patched(with_rv(current), patch_type, body)
        if rv and rv != str(current.rv):
            raise ObjectError(f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has been '
                              "modified; please apply your changes to the latest version and try again",
                              409, "Conflict")
        status = doc.get("status") or {}
        if not isinstance(status, dict):
            raise Invalid(res, name, [{"path": "status", "message": "Invalid value: must be an object"}])
        with self.server.sessions() as s, s.begin():
            a = Access.of(s, p, self.server.config.auth.default_namespace_open)
            a.check_change("update" if patch_type == "replace" else "patch", res.shoal_kind, ns, name, current.owner)
            if res.source == "pods":
                podsvc.set_extra_conditions(s, ns, name, status.get("conditions") or [])
            else:
                objs.set_status(objs.require(s, res.shoal_kind, ns, name), status)  # its controller may write over it
            if dry_run:
                s.rollback()
        if not dry_run:
            self.changed()
        return self.get(res, p, namespace, name)

    # -- the scale subresource

    def scale_of(self, res: Resource, namespace: str, name: str) -> dict:
        """An autoscaling/v1 Scale of a Deployment (``kubectl scale``)."""
        entry = self.cache.get(res, namespace, name)
        if entry is None:
            raise objs.not_found(res.shoal_kind, name)
        obj = with_rv(entry)
        md, spec = obj["metadata"], obj.get("spec") or {}
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: md.get(k) for k in ("name", "namespace", "uid", "resourceVersion",
                                                     "creationTimestamp")},
                "spec": {"replicas": int(spec.get("replicas", 1))},
                "status": {"replicas": int((obj.get("status") or {}).get("replicas", 0)),
                           "selector": ",".join(f"{k}={v}" for k, v in sorted(sel.items()))}}

    def _scale(self, res: Resource, p: Principal, namespace: str, name: str, body) -> dict:
        doc = merge_patch(self.scale_of(res, namespace, name), body) if isinstance(body, dict) else {}
        replicas = (doc.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise ObjectError("spec.replicas: Invalid value: must be an integer", 422, "Invalid")
        with self.server.sessions() as s, s.begin():
            a = Access.of(s, p, self.server.config.auth.default_namespace_open)
            objsvc.scale(s, a, namespace, name, replicas)
        self.changed()
        return self.scale_of(res, namespace, name)


def key_namespace(res: Resource, namespace: str | None) -> str:
    """The namespace an object is stored under (``""`` for cluster-scoped kinds)."""
    return (namespace or "default") if res.namespaced else objs.CLUSTER


def _prepare(res: Resource, doc, namespace: str | None, name: str | None) -> str:
    """Fill what the URL says into a written object (kind, namespace, a generated name); its name."""
    if not isinstance(doc, dict) or not isinstance(doc.setdefault("metadata", {}), dict):
        raise ObjectError("the request body must be a JSON object with a metadata object", 400)
    meta = doc["metadata"]
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
        raise Invalid(res, "", [{"path": "metadata.name", "message": "Required value: name or generateName is "
                                                                     "required"}])
    if meta.get("name") != name:
        raise ObjectError("the name of the object does not match the name on the URL", 400)
    return name


def log_start(pod: dict, container: str, previous: bool) -> float | None:
    """When the run whose log ``kubectl logs`` reads began (``previous``: the one before)."""
    st = next((c for c in pod.get("status", {}).get("containerStatuses", []) if c.get("name") == container), {})
    state = st.get("lastState" if previous else "state") or {}
    when = next((v.get("startedAt") for v in state.values() if isinstance(v, dict) and v.get("startedAt")), None)
    return seconds(when) if when else None


def started_text(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def patched(base: dict, patch_type: str, patch) -> tuple[dict, str | None]:
    """``base`` with a JSON, merge or strategic merge patch (or an applied object) laid on it,
    less its resourceVersion; and the resourceVersion the patch expects (None: any)."""
    try:
        doc = (json_patch(base, patch) if patch_type == "json" else merge_patch(base, patch)
               if patch_type == "merge" else strategic_merge(base, patch))
    except PatchError as e:
        raise ObjectError(str(e), 422, "Invalid") from None
    if not isinstance(doc, dict):
        raise ObjectError("the patched object is not a JSON object", 400)
    rv = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
    (doc.get("metadata") or {}).pop("resourceVersion", None)
    return doc, rv
