"""The routing table gateways follow (``GET /shoal/v1/kube/routes``, a long poll on the hub's
``ROUTES_KEY``): each Service's pods, ready or not, and its split. Traffic routes, not HTTP
ones: the server's HTTP routes are all listed in server/routers.TABLES.

Services select pods by label in their namespace (as the endpoints controller does); a pod
being deleted is listed as ``terminating`` from the moment its deletion begins, so gateways
stop sending it requests before its containers are told to stop.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.kube.rules import parse_traffic_split
from shoal.kube.schema import SCALE_TO_ZERO, TRAFFIC_SPLIT
from shoal.model.job import JobState
from shoal.server.kube import objects as objs
from shoal.server.kube import pods as podsvc
from shoal.store.models import JobRow, NodeRow

ROUTES_KEY = "@routes"  # the hub key gateways wait on: bumped when a Service's backends may change


def parse_split(text: str | None) -> dict[str, int] | None:
    """The traffic-split annotation's weights; None when absent or malformed (apply rejects
    a malformed one, so this only guards old rows)."""
    if not text:
        return None
    try:
        return parse_traffic_split(text)
    except ValueError:
        return None


def target_port(pod_spec: dict, target) -> int | None:
    """A Service's targetPort on one pod: a number, or the name of a container port."""
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for c in pod_spec.get("containers", ()):
        for p in c.get("ports") or ():
            if p.get("name") == target:
                return p.get("containerPort")
    return None


def routes_table(session: Session) -> list[dict]:
    services = objs.list_rows(session, "Service")
    if not services:
        return []
    pods = list(session.scalars(select(JobRow).where(JobRow.kind == podsvc.POD,
                                                     JobRow.state == JobState.RUNNING.value)))
    addresses = {n.name: n.address for n in session.scalars(select(NodeRow))}
    out = []
    for svc in services:
        spec = svc.body.get("spec") or {}
        ann = (svc.body.get("metadata") or {}).get("annotations") or {}
        selector = spec.get("selector") or {}
        ports = [{"name": p.get("name"), "port": p["port"], "targetPort": p.get("targetPort", p["port"])}
                 for p in spec.get("ports") or ()]
        backends = []
        if selector and ports:
            for row in pods:
                pod = row.spec["pod"]
                labels = pod.get("labels") or {}
                if row.namespace != svc.namespace or any(labels.get(k) != v for k, v in selector.items()):
                    continue
                port = target_port(pod["spec"], ports[0]["targetPort"])
                if port is None:
                    continue
                backends.append({
                    "pod": row.name, "deployment": pod.get("deployment"), "node": row.batch_host,
                    "address": addresses.get(row.batch_host, ""), "port": port,
                    "ports": {str(p["port"]): target_port(pod["spec"], p["targetPort"]) for p in ports},
                    "ready": podsvc.is_ready(row), "terminating": row.deleting_at is not None,
                })
        out.append({"namespace": svc.namespace, "name": svc.name, "ports": ports,
                    "split": parse_split(ann.get(TRAFFIC_SPLIT)),
                    "scale_to_zero": ann.get(SCALE_TO_ZERO, "").lower() == "true",
                    "backends": sorted(backends, key=lambda b: b["pod"])})
    return out
