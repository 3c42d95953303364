"""The object store for Kubernetes-style kinds: apply, get, list, delete, events.

Objects are rows of ``objects`` (manifest + status + resourceVersion); pods are jobs (see
``shoal.server.kube.pods``). Every function here runs inside the caller's transaction.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.store.models import EventRow, ObjectRow


@dataclass(frozen=True)
class Kind:
    plural: str  # the API's resource name: deployments
    kind: str  # Deployment
    api_version: str  # apps/v1
    namespaced: bool = True

    @property
    def group_name(self) -> str:
        """kubectl's ``deployment.apps`` form (``service`` for the core group)."""
        group = self.api_version.rpartition("/")[0]
        return f"{self.kind.lower()}.{group}" if group else self.kind.lower()

    @property
    def group_plural(self) -> str:
        group = self.api_version.rpartition("/")[0]
        return f"{self.plural}.{group}" if group else self.plural


KINDS = {k.plural: k for k in (
    Kind("deployments", "Deployment", "apps/v1"),
    Kind("replicasets", "ReplicaSet", "apps/v1"),
    Kind("services", "Service", "v1"),
    Kind("horizontalpodautoscalers", "HorizontalPodAutoscaler", "autoscaling/v2"),
    Kind("namespaces", "Namespace", "v1", namespaced=False),
    Kind("priorityclasses", "PriorityClass", "scheduling.k8s.io/v1", namespaced=False),
    Kind("pods", "Pod", "v1"),
    Kind("events", "Event", "v1"),
    Kind("rolebindings", "RoleBinding", "rbac.authorization.k8s.io/v1"),
    Kind("jobs", "Job", "batch/v1"),
    Kind("secrets", "Secret", "v1"),
)}
BY_KIND = {k.kind: k for k in KINDS.values()}
STORED = frozenset({"Deployment", "ReplicaSet", "Service", "HorizontalPodAutoscaler", "Namespace", "PriorityClass",
                    "RoleBinding", "Job", "Secret"})
BUILTIN_NAMESPACES = ("default", "kube-system")
CLUSTER = ""  # the namespace column of cluster-scoped kinds


class ObjectError(Exception):
    """A request about objects that cannot be carried out; ``status`` is the HTTP answer."""

    def __init__(self, message: str, status: int = 400, reason: str = "BadRequest"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason


def not_found(kind: Kind, name: str) -> ObjectError:
    return ObjectError(f'{kind.group_plural} "{name}" not found', 404, "NotFound")


def rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def new_uid() -> str:
    return str(uuid.uuid4())


_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' generateName alphabet (no vowels, no 0/1/3)


def random_suffix(n: int = 5) -> str:
    return "".join(secrets.choice(_SUFFIX) for _ in range(n))


# ---------------------------------------------------------------- rows <-> JSON


def to_json(row: ObjectRow) -> dict:
    body = row.body
    meta = dict(body.get("metadata") or {})
    meta.update(uid=row.uid, resourceVersion=str(row.version), generation=row.generation,
                creationTimestamp=rfc3339(row.created))
    if row.owner_uid:
        owner = meta.get("ownerReferences")
        if not owner:
            meta["ownerReferences"] = [{"uid": row.owner_uid, "controller": True}]
    out = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": meta}
    for k, v in body.items():
        if k not in ("apiVersion", "kind", "metadata"):
            out[k] = v
    if row.kind not in ("Namespace", "PriorityClass", "Secret") or row.status:
        out["status"] = row.status or {}
    if row.kind == "Namespace":
        out["status"] = {"phase": "Active"}
    return out


def get(session: Session, kind: str, namespace: str, name: str) -> ObjectRow | None:
    return session.scalar(select(ObjectRow).where(ObjectRow.kind == kind, ObjectRow.namespace == namespace,
                                                  ObjectRow.name == name))


def require(session: Session, kind: Kind, namespace: str, name: str) -> ObjectRow:
    row = get(session, kind.kind, namespace if kind.namespaced else CLUSTER, name)
    if row is None:
        raise not_found(kind, name)
    return row


def list_rows(session: Session, kind: str, namespace: str | None = None) -> list[ObjectRow]:
    q = select(ObjectRow).where(ObjectRow.kind == kind)
    if namespace is not None:
        q = q.where(ObjectRow.namespace == namespace)
    return list(session.scalars(q.order_by(ObjectRow.namespace, ObjectRow.name)))


def owned(session: Session, kind: str, owner_uid: str) -> list[ObjectRow]:
    return list(session.scalars(select(ObjectRow).where(ObjectRow.kind == kind, ObjectRow.owner_uid == owner_uid)
                                .order_by(ObjectRow.created)))


def namespace_exists(session: Session, name: str) -> bool:
    return name in BUILTIN_NAMESPACES or get(session, "Namespace", CLUSTER, name) is not None


# ---------------------------------------------------------------- writes


def _content(doc: dict) -> dict:
    """What apply compares: everything the user wrote (status and server fields excluded)."""
    meta = {k: v for k, v in (doc.get("metadata") or {}).items()
            if k not in ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")}
    return {**{k: v for k, v in doc.items() if k not in ("status", "metadata")}, "metadata": meta}


def put(session: Session, doc: dict, now: float, *, owner_uid: str | None = None,
        keep_replicas: bool = False) -> tuple[ObjectRow, str]:
    """Create or update one validated object. Returns the row and ``created``, ``configured``
    or ``unchanged``. ``keep_replicas``: an update leaves spec.replicas alone (HPA-managed)."""
    kind = BY_KIND[doc["kind"]]
    meta = doc["metadata"]
    ns = meta.get("namespace", "default") if kind.namespaced else CLUSTER
    if kind.namespaced and not namespace_exists(session, ns):
        raise ObjectError(f'namespaces "{ns}" not found', 404, "NotFound")
    content = _content(doc)
    if kind.namespaced:
        content["metadata"]["namespace"] = ns
    row = get(session, kind.kind, ns, meta["name"])
    if row is None:
        row = ObjectRow(uid=new_uid(), kind=kind.kind, namespace=ns, name=meta["name"], body=content,
                        status={}, owner_uid=owner_uid, generation=1, created=now)
        session.add(row)
        session.flush()
        return row, "created"
    if keep_replicas and "replicas" in (row.body.get("spec") or {}):
        content["spec"] = {**content.get("spec", {}), "replicas": row.body["spec"]["replicas"]}
    if content == row.body:
        return row, "unchanged"
    if content.get("spec") != row.body.get("spec"):
        row.generation += 1
    row.body = content
    return row, "configured"


def set_status(row: ObjectRow, status: dict) -> bool:
    """Write ``status`` when it differs (so an unchanged status does not bump resourceVersion)."""
    if row.status == status:
        return False
    row.status = status
    return True


def set_spec_field(row: ObjectRow, field: str, value) -> bool:
    spec = dict(row.body.get("spec") or {})
    if spec.get(field) == value:
        return False
    spec[field] = value
    row.body = {**row.body, "spec": spec}
    row.generation += 1
    return True


def record_event(session: Session, namespace: str, kind: str, name: str, type_: str, reason: str,
                 message: str, now: float, source: str = "shoal") -> None:
    """Add an event, or count a repeat of the last identical one (as the event recorder does)."""
    last = session.scalar(select(EventRow).where(
        EventRow.namespace == namespace, EventRow.kind == kind, EventRow.name == name,
        EventRow.reason == reason, EventRow.message == message).order_by(EventRow.id.desc()).limit(1))
    if last is not None:
        last.count += 1
        last.last_time = now
        return
    session.add(EventRow(namespace=namespace, kind=kind, name=name, type=type_, reason=reason,
                         message=message[:2000], source=source, count=1, first_time=now, last_time=now))


def event_json(e: EventRow) -> dict:
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{e.name}.{e.id:x}", "namespace": e.namespace,
                     "creationTimestamp": rfc3339(e.first_time)},
        "involvedObject": {"kind": e.kind, "name": e.name, "namespace": e.namespace},
        "type": e.type, "reason": e.reason, "message": e.message, "count": e.count,
        "source": {"component": e.source},
        "firstTimestamp": rfc3339(e.first_time), "lastTimestamp": rfc3339(e.last_time),
    }


def events_for(session: Session, namespace: str | None, kind: str | None = None,
               name: str | None = None, limit: int = 500) -> list[EventRow]:
    q = select(EventRow)
    if namespace is not None:
        q = q.where(EventRow.namespace == namespace)
    if kind is not None:
        q = q.where(EventRow.kind == kind)
    if name is not None:
        q = q.where(EventRow.name == name)
    rows = list(session.scalars(q.order_by(EventRow.id.desc()).limit(limit)))
    rows.reverse()
    return rows
