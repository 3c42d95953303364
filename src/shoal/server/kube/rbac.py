"""Who may read, create and change serving objects: namespaces, RoleBindings and owners.

Kubernetes' RBAC, cut down to what a GPU cluster's tenants need. A RoleBinding in a
namespace grants one of Kubernetes' user-facing ClusterRoles to users and groups (the groups
on their Shoal token):

| ClusterRole | in its namespace |
|---|---|
| view | read every object but Secrets (as Kubernetes' view), pod logs |
| edit | view, plus create, change, delete, scale, undo, exec |
| admin | edit, plus the namespace's RoleBindings |

Besides bindings: an object's owner (who applied it) reads and changes it; every user may
create in ``default`` unless the cluster configuration closes it (``auth.default_namespace_open``);
cluster admins may do anything, and operators and read-only tokens read everything. Cluster-
scoped kinds (Namespace, PriorityClass) are the admins'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from shoal.server.auth import Principal
from shoal.server.kube import objects as objs
from shoal.server.kube.objects import ObjectError

VIEW, EDIT, ADMIN = 1, 2, 3
RANKS = {"view": VIEW, "edit": EDIT, "admin": ADMIN}
DEFAULT_NAMESPACE = "default"
CLUSTER_KINDS = frozenset({"Namespace", "PriorityClass"})  # cluster-scoped: the admins'


def bound_rank(binding: Mapping, p: Principal) -> int:
    """What one RoleBinding grants this caller (0: nothing)."""
    for subject in binding.get("subjects") or ():
        kind, name = subject.get("kind"), subject.get("name")
        if (kind == "User" and name == p.user) or (kind == "Group" and name in p.groups):
            return RANKS.get((binding.get("roleRef") or {}).get("name"), 0)
    return 0


@dataclass(frozen=True)
class Access:
    """One caller's rights over serving objects, read once per request."""

    principal: Principal
    default_open: bool = True
    ranks: Mapping[str, int] = field(default_factory=dict)  # namespace -> best bound ClusterRole

    @classmethod
    def of(cls, session: Session, p: Principal, default_open: bool = True) -> "Access":
        ranks: dict[str, int] = {}
        if p.role in ("operator", "user", "read-only"):  # admins need no binding; daemons get none
            for row in objs.list_rows(session, "RoleBinding"):
                rank = bound_rank(row.body, p)
                if rank > ranks.get(row.namespace, 0):
                    ranks[row.namespace] = rank
        return cls(p, default_open, ranks)

    def rank(self, namespace: str) -> int:
        return self.ranks.get(namespace, 0)

    def may_read(self, namespace: str, owner: str | None, kind: str = "") -> bool:
        p = self.principal
        if kind == "Secret":  # Kubernetes' view role reads no Secrets; nor do read-only tokens
            return p.is_admin or owner == p.user or self.rank(namespace) >= EDIT
        return p.sees_everything or owner is None or owner == p.user or self.rank(namespace) >= VIEW

    def may_change(self, kind: str, namespace: str, owner: str | None) -> bool:
        if (decided := self._by_role(kind)) is not None:
            return decided
        if kind == "RoleBinding":
            return self.rank(namespace) >= ADMIN
        return owner == self.principal.user or self.rank(namespace) >= EDIT

    def may_create(self, kind: str, namespace: str) -> bool:
        if (decided := self._by_role(kind)) is not None:
            return decided
        if kind == "RoleBinding":
            return self.rank(namespace) >= ADMIN
        return self.rank(namespace) >= EDIT or (namespace == DEFAULT_NAMESPACE and self.default_open)

    def _by_role(self, kind: str) -> bool | None:
        """A change the cluster role alone decides (None: the namespace's bindings decide)."""
        p = self.principal
        if not p.may_change:
            return False
        if p.is_admin:
            return True
        if kind in CLUSTER_KINDS:
            return False
        return None

    # -- refusals, worded as the Kubernetes API server words them

    def check_read(self, kind: objs.Kind, namespace: str, name: str, owner: str | None) -> None:
        if not self.may_read(namespace, owner, kind.kind):
            raise self.forbidden("get", kind, namespace, name)

    def check_change(self, verb: str, kind: objs.Kind, namespace: str, name: str, owner: str | None,
                     resource: str | None = None) -> None:
        """``resource``: what the refusal names when it is a subresource (``pods/exec``)."""
        if not self.may_change(kind.kind, namespace, owner):
            raise self.forbidden(verb, kind, namespace, name, resource)

    def check_create(self, kind: objs.Kind, namespace: str, name: str) -> None:
        if not self.may_create(kind.kind, namespace):
            raise self.forbidden("create", kind, namespace, name)

    def forbidden(self, verb: str, kind: objs.Kind, namespace: str, name: str,
                  resource: str | None = None) -> ObjectError:
        p = self.principal
        group = kind.api_version.rpartition("/")[0]
        where = f' in the namespace "{namespace}"' if kind.namespaced and namespace else ""
        why = ("a read-only token changes nothing" if p.role == "read-only" and verb != "get"
               else "this credential cannot use serving objects" if not p.may_change and p.role != "read-only"
               else f"no RoleBinding there grants it (ask an admin: ClusterRole "
                    f"{'view' if verb == 'get' and kind.kind != 'Secret' else 'admin' if kind.kind == 'RoleBinding' else 'edit'})"
               if kind.namespaced else "cluster-scoped objects are the admins'")
        return ObjectError(f'{kind.group_plural} "{name}" is forbidden: User "{p.user}" cannot {verb} '
                           f'resource "{resource or kind.plural}" in API group "{group}"{where}: {why}', 403, "Forbidden")
