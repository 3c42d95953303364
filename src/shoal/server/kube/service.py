"""What the object routes do: apply, delete, scale, undo, and the pod reports of agents.

Each function runs inside the caller's transaction and says which nodes' work changed (so
the route can wake their agents) where that matters.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.kube.manifest import validate
from shoal.kube.schema import ManifestError
from shoal.kube.rollout import rollback_template
from shoal.model.job import JobState
from shoal.server.auth import Principal
from shoal.server.kube import objects as objs
from shoal.server.kube import pods as podsvc
from shoal.server.kube.rbac import Access
from shoal.server.kube.objects import BY_KIND, CLUSTER, KINDS, Kind, ObjectError
from shoal.store.models import JobRow, ObjectRow

OWNER_ANNOTATION = "shoal.io/owner"  # the user who applied an object: its pods run as that user
READ_ONLY = frozenset({"ReplicaSet"})  # made by controllers, never applied


def kind_of(plural: str) -> Kind:
    kind = KINDS.get(plural)
    if kind is None:
        raise ObjectError(f'the server doesn\'t have a resource type "{plural}"', 404, "NotFound")
    return kind


def namespace_of(kind: Kind, namespace: str | None) -> str:
    return (namespace or "default") if kind.namespaced else CLUSTER


def owner_of(row: ObjectRow) -> str | None:
    return ((row.body.get("metadata") or {}).get("annotations") or {}).get(OWNER_ANNOTATION)


def apply(session: Session, server, p: Principal, documents: list[dict], now: float,
          dry_run: bool = False) -> dict:
    """Validate every document first (nothing is applied when one is bad), then create or
    update them in order, namespaces first."""
    if p.role in ("job", "agent", "join"):
        raise ObjectError("this credential cannot apply objects", 403, "Forbidden")
    access = Access.of(session, p, server.config.auth.default_namespace_open)
    errors, valid, warnings = [], [], []
    for i, doc in enumerate(documents):
        name = ((doc.get("metadata") or {}).get("name") if isinstance(doc, dict) else None) or ""
        kind = doc.get("kind") if isinstance(doc, dict) else None
        try:
            obj, warns = validate(doc)
        except ManifestError as e:
            errors.extend({"document": i, "kind": kind, "name": name, "path": fe.path, "message": fe.message}
                          for fe in e.errors)
            continue
        if obj["kind"] in READ_ONLY:
            errors.append({"document": i, "kind": obj["kind"], "name": name, "path": "kind",
                           "message": f"{obj['kind']} objects are made by their Deployment; apply the Deployment"})
            continue
        warnings.extend(f"{obj['kind']}/{name}: {w}" for w in warns)
        valid.append(obj)
    if errors:
        raise ManifestErrors(errors)
    order = sorted(range(len(valid)), key=lambda i: 0 if valid[i]["kind"] == "Namespace" else 1)
    results = []
    for i in order:
        obj = valid[i]
        meta = obj["metadata"]
        meta.setdefault("annotations", {})
        kind = BY_KIND[obj["kind"]]
        ns = namespace_of(kind, meta.get("namespace"))
        if obj["kind"] == "Pod":
            action = _apply_pod(session, server, access, obj, ns, now, dry_run)
        else:
            existing = objs.get(session, kind.kind, ns, meta["name"])
            if existing is not None:
                access.check_change("update", kind, ns, meta["name"], owner_of(existing))
                # Pods run as the owner: an editor who changes another's object takes it
                # over, so a binding never lets one user run code as another (admins keep it).
                keep = p.is_admin or owner_of(existing) is None
                meta["annotations"][OWNER_ANNOTATION] = (owner_of(existing) or p.user) if keep else p.user
            else:
                access.check_create(kind, ns, meta["name"])
                meta["annotations"][OWNER_ANNOTATION] = p.user
            managed = kind.kind == "Deployment" and _hpa_targets(session, ns, meta["name"])
            if dry_run:
                action = "created" if existing is None else "configured"
            else:
                _, action = objs.put(session, obj, now, keep_replicas=managed)
        results.append({"kind": obj["kind"], "namespace": ns or None, "name": meta["name"], "action": action})
    return {"results": results, "warnings": warnings}


class ManifestErrors(Exception):
    def __init__(self, errors: list[dict]):
        super().__init__(f"{len(errors)} invalid field(s)")
        self.errors = errors


def _hpa_targets(session: Session, namespace: str, deployment: str) -> bool:
    """Whether an HPA scales this Deployment: then apply leaves its replicas to the HPA
    (as server-side apply does when the manifest's replicas field is owned by the HPA)."""
    for h in objs.list_rows(session, "HorizontalPodAutoscaler", namespace):
        ref = (h.body.get("spec") or {}).get("scaleTargetRef") or {}
        if ref.get("kind") == "Deployment" and ref.get("name") == deployment:
            return True
    return False


def _apply_pod(session, server, access: Access, obj: dict, ns: str, now: float, dry_run: bool) -> str:
    if not objs.namespace_exists(session, ns):
        raise ObjectError(f'namespaces "{ns}" not found', 404, "NotFound")
    meta = obj["metadata"]
    existing = podsvc.find(session, ns, meta["name"])
    live = existing is not None and not JobState(existing.state).terminal
    if live:
        access.check_change("update", KINDS["pods"], ns, meta["name"], existing.user)
    else:
        access.check_create(KINDS["pods"], ns, meta["name"])
    if live:
        if existing.spec["pod"]["spec"] == obj["spec"]:
            return "unchanged"
        raise ObjectError(f'Pod "{meta["name"]}" is invalid: spec: Forbidden: pod updates may not change '
                          "fields other than `spec.containers[*].image`, `spec.activeDeadlineSeconds` or "
                          "`spec.tolerations`; delete the pod and apply it again", 422, "Invalid")
    if dry_run:
        return "created"
    labels = meta.get("labels") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()}
    podsvc.create(session, server, namespace=ns, name=meta["name"], labels=labels, annotations=annotations,
                  spec=obj["spec"], owner_uid=None, owner_name=None, user=access.principal.user, now=now,
                  uid=objs.new_uid())
    return "created"


def delete(session: Session, access: Access, kind: Kind, namespace: str, name: str, now: float) -> dict:
    ns = namespace_of(kind, namespace)
    if kind.kind == "Pod":
        row = podsvc.find(session, ns, name)
        if row is None:
            raise objs.not_found(kind, name)
        access.check_change("delete", kind, ns, name, row.user)
        podsvc.delete(session, row, now)
        return {"kind": "Pod", "namespace": ns, "name": name}
    row = objs.require(session, kind, ns, name)
    access.check_change("delete", kind, ns, name, owner_of(row))
    if kind.kind == "Namespace":
        for k in ("Deployment", "Job", "Service", "HorizontalPodAutoscaler", "RoleBinding", "Secret"):
            for child in objs.list_rows(session, k, name):
                delete(session, access, BY_KIND[k], name, child.name, now)
        for pod in podsvc.live(session, namespace=name):
            podsvc.delete(session, pod, now)
    if kind.kind == "Deployment":
        for rs in objs.owned(session, "ReplicaSet", row.uid):
            _delete_replicaset(session, rs, now)
    if kind.kind == "Job":  # its pods go with it, ended ones too (they are shown until deleted)
        for pod in podsvc.owned(session, row.uid):
            podsvc.delete(session, pod, now)
    if kind.kind == "ReplicaSet":
        _delete_replicaset(session, row, now)
        return {"kind": kind.kind, "namespace": ns or None, "name": name}
    session.delete(row)
    return {"kind": kind.kind, "namespace": ns or None, "name": name}


def _delete_replicaset(session: Session, rs: ObjectRow, now: float) -> None:
    for pod in podsvc.live(session, owner_uid=rs.uid):
        podsvc.delete(session, pod, now)
    session.delete(rs)


def scale(session: Session, access: Access, namespace: str, name: str, replicas: int) -> ObjectRow:
    row = objs.require(session, KINDS["deployments"], namespace, name)
    access.check_change("patch", KINDS["deployments"], namespace, name, owner_of(row))
    if replicas < 0:
        raise ObjectError("spec.replicas: Invalid value: must be greater than or equal to 0", 422, "Invalid")
    objs.set_spec_field(row, "replicas", replicas)
    return row


def history(session: Session, access: Access, namespace: str, name: str) -> list[dict]:
    row = objs.require(session, KINDS["deployments"], namespace, name)
    access.check_read(KINDS["deployments"], namespace, name, owner_of(row))
    return _revisions(session, row)


def _revisions(session: Session, row: ObjectRow) -> list[dict]:
    out = []
    for rs in objs.owned(session, "ReplicaSet", row.uid):
        ann = (rs.body.get("metadata") or {}).get("annotations") or {}
        out.append({"revision": int(ann.get("deployment.kubernetes.io/revision", 0)), "replicaset": rs.name,
                    "change_cause": ann.get("kubernetes.io/change-cause"),
                    "template": (rs.body.get("spec") or {}).get("template")})
    return sorted(out, key=lambda r: r["revision"])


def undo(session: Session, access: Access, namespace: str, name: str, to_revision: int = 0) -> ObjectRow:
    """``rollout undo``: the Deployment's template becomes that of a previous revision (the
    one before the current, or ``to_revision``); the controller then rolls out to the
    ReplicaSet that already has it, giving it the next revision number, as Kubernetes does."""
    row = objs.require(session, KINDS["deployments"], namespace, name)
    access.check_change("patch", KINDS["deployments"], namespace, name, owner_of(row))
    revs = _revisions(session, row)
    if not revs:
        raise ObjectError(f'deployment "{name}" has no rollout history', 400)
    if to_revision:
        target = next((r for r in revs if r["revision"] == to_revision), None)
        if target is None:
            raise ObjectError(f"unable to find specified revision {to_revision} in history", 400)
    else:
        if len(revs) < 2:
            raise ObjectError("no rollout history found for deployment \"%s\": no previous revision" % name, 400)
        target = revs[-2]
    objs.set_spec_field(row, "template", rollback_template(target["template"] or {}))
    return row


def pod_reports(session: Session, node: str, reports: list, now: float) -> bool:
    """Store the PodStatus each agent reports; record its events. True when a pod's
    readiness changed (the gateway's routes must follow within one probe period)."""
    changed = False
    if not reports:
        return False
    rows = {r.id: r for r in session.scalars(select(JobRow).where(JobRow.id.in_([rp.job_id for rp in reports])))}
    for rp in reports:
        row = rows.get(rp.job_id)
        if row is None or row.kind != podsvc.POD or row.restart_count != rp.run or row.batch_host != node:
            continue
        was_ready = podsvc.is_ready(row)
        status = dict(rp.status)
        old = row.pod_status or {}
        ready_now = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
        status["readySince"] = (old.get("readySince") or now) if ready_now else None
        if status != old:
            row.pod_status = status
        for ev in rp.events:
            objs.record_event(session, row.namespace or "default", "Pod", row.name, ev.get("type", "Normal"),
                              ev.get("reason", ""), ev.get("message", ""), ev.get("time") or now, source=f"kubelet {node}")
        if podsvc.is_ready(row) != was_ready:
            changed = True
    return changed
