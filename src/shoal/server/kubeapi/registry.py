"""The Kubernetes resources Shoal serves, each declared once: the routes, the discovery
documents and the OpenAPI documents are all made from this table (as the API server's
``registry/`` packages are the one place a resource is defined).

A resource's ``source`` reads every object of it as Kubernetes JSON from Shoal's own store
(objects, pods as jobs, nodes, events); the watch cache (``cache.py``) keeps the last read
and turns differences into watch events.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal import __version__
from shoal.server.kube.objects import BY_KIND, Kind

READ = ("get", "list", "watch")
WRITE = ("create", "update", "patch", "delete")
ALL_VERBS = READ + WRITE

KUBERNETES_VERSION = ("1", "32")  # the minor version whose kubectl Shoal is tested with


@dataclass(frozen=True)
class Subresource:
    name: str  # log, scale
    kind: str  # Pod (log's answer is text), Scale
    verbs: tuple[str, ...]
    group: str = ""
    version: str = ""


@dataclass(frozen=True)
class Resource:
    """One Kubernetes resource as Shoal serves it."""

    group: str  # "" for the core group
    version: str
    resource: str  # the plural in URLs: deployments
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    subresources: tuple[Subresource, ...] = ()
    categories: tuple[str, ...] = ()
    source: str = "objects"  # objects | pods | nodes | events: where its objects are read from
    notes: str = ""  # how Shoal's differs (docs/KUBERNETES-API.md)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def shoal_kind(self) -> Kind:
        """The kind Shoal's object service and RBAC know it by."""
        return BY_KIND.get(self.kind) or Kind(self.resource, self.kind, self.group_version, self.namespaced)

    @property
    def qualified(self) -> str:
        """``deployments.apps``: how Kubernetes names it in messages."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def base_path(self, namespace: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{namespace}/{self.resource}"
        return f"{root}/{self.resource}"


SCALE = Subresource("scale", "Scale", ("get", "update", "patch"), "autoscaling", "v1")
STATUS_VERBS = ("get", "update", "patch")
ALL = ("all",)

RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",),
             verbs=("get", "list", "watch", "create", "update", "patch", "delete")),
    Resource("", "v1", "pods", "Pod", short_names=("po",), categories=ALL, source="pods",
             verbs=("get", "list", "watch", "create", "update", "patch", "delete"),
             subresources=(Subresource("log", "Pod", ("get",)), Subresource("exec", "PodExecOptions", ("create", "get")),
                           Subresource("attach", "PodAttachOptions", ("create", "get")),
                           Subresource("portforward", "PodPortForwardOptions", ("create", "get")),
                           Subresource("status", "Pod", STATUS_VERBS)),
             notes="a pod is a Shoal job of kind pod; updates may change nothing but what apply leaves alone"),
    Resource("", "v1", "services", "Service", short_names=("svc",), categories=ALL),
    Resource("", "v1", "nodes", "Node", namespaced=False, short_names=("no",), verbs=READ, source="nodes",
             notes="read-only: nodes join with `shoal agent`; drain with scontrol"),
    Resource("", "v1", "events", "Event", short_names=("ev",), verbs=READ, source="events"),
    Resource("", "v1", "secrets", "Secret",
             notes="read by the view ClusterRole's holders only where they own the Secret, as Kubernetes' view "
                   "has no secrets"),
    Resource("apps", "v1", "deployments", "Deployment", short_names=("deploy",), categories=ALL,
             subresources=(SCALE, Subresource("status", "Deployment", STATUS_VERBS))),
    Resource("apps", "v1", "replicasets", "ReplicaSet", short_names=("rs",), categories=ALL,
             verbs=("get", "list", "watch", "delete"), notes="made by their Deployment; not created by users"),
    Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", short_names=("hpa",),
             categories=ALL),
    Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False, short_names=("pc",)),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Resource("batch", "v1", "jobs", "Job", categories=ALL, subresources=(Subresource("status", "Job", STATUS_VERBS),),
             notes="pods run to completion; no work queues, pod failure policies or suspension yet"),
)


def is_kube_path(path: str) -> bool:
    """Whether a request path is the Kubernetes API's (its errors are answered as a Status)."""
    return path.startswith(("/api/", "/apis", "/openapi/")) or path in ("/api", "/version")


def group_versions() -> dict[str, list[str]]:
    """Each served group (``""`` the core one) and its versions, in the order declared."""
    out: dict[str, list[str]] = {}
    for r in RESOURCES:
        versions = out.setdefault(r.group, [])
        if r.version not in versions:
            versions.append(r.version)
    return out


# ---------------------------------------------------------------- discovery documents


def version_info() -> dict:
    major, minor = KUBERNETES_VERSION
    return {"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0-shoal.{__version__}",
            "gitCommit": "", "gitTreeState": "clean", "buildDate": "", "goVersion": "", "compiler": "shoal",
            "platform": "linux/amd64"}


def api_versions(address: str) -> dict:
    return {"kind": "APIVersions", "versions": group_versions()[""],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}


def _group(name: str, versions: list[str]) -> dict:
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list() -> dict:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group(g, vs) for g, vs in group_versions().items() if g]}


def api_group(name: str) -> dict | None:
    versions = group_versions().get(name)
    if not name or versions is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def resource_list(group: str, version: str) -> dict | None:
    """The APIResourceList of one group version (None when Shoal serves none of it)."""
    served = [r for r in RESOURCES if r.group == group and r.version == version]
    if not served:
        return None
    out = []
    for r in served:
        entry = {"name": r.resource, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                 "verbs": list(r.verbs)}
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        out.append(entry)
        for sub in r.subresources:
            s = {"name": f"{r.resource}/{sub.name}", "singularName": "", "namespaced": r.namespaced,
                 "kind": sub.kind, "verbs": list(sub.verbs)}
            if sub.group:
                s.update(group=sub.group, version=sub.version)
            out.append(s)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": r.group_version, "resources": out}
