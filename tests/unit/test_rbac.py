"""Who may read, create and change serving objects: cluster roles, RoleBindings, owners."""

from __future__ import annotations

import pytest

from shoal.server.auth import Principal
from shoal.server.kube.objects import KINDS
from shoal.server.kube.rbac import ADMIN, EDIT, VIEW, Access, bound_rank

ALICE = Principal("alice", "user", groups=("ml",))


def binding(role: str, *subjects: tuple[str, str]) -> dict:
    return {"subjects": [{"kind": k, "name": n} for k, n in subjects],
            "roleRef": {"kind": "ClusterRole", "name": role}}


def test_a_binding_grants_its_role_to_the_user_it_names_or_to_members_of_its_group():
    assert bound_rank(binding("edit", ("User", "alice")), ALICE) == EDIT
    assert bound_rank(binding("view", ("Group", "ml")), ALICE) == VIEW
    assert bound_rank(binding("admin", ("User", "bob"), ("Group", "ops")), ALICE) == 0


@pytest.mark.parametrize("ranks,ns,may_create", [
    ({}, "default", True),  # default is open to every user
    ({}, "team-a", False),  # not bound there
    ({"team-a": VIEW}, "team-a", False),  # view reads, does not create
    ({"team-a": EDIT}, "team-a", True),
])
def test_a_user_creates_serving_objects_only_where_bound_or_in_the_open_default(ranks, ns, may_create):
    assert Access(ALICE, True, ranks).may_create("Deployment", ns) is may_create


def test_an_admin_may_close_the_default_namespace():
    assert not Access(ALICE, False, {}).may_create("Deployment", "default")
    assert Access(ALICE, False, {"default": EDIT}).may_create("Deployment", "default")


def test_owners_editors_and_viewers():
    access = Access(ALICE, True, {"team-a": VIEW, "team-b": EDIT})
    assert access.may_change("Deployment", "team-c", "alice")  # her own, wherever it is
    assert not access.may_change("Deployment", "team-a", "bob") and access.may_read("team-a", "bob")
    assert access.may_change("Deployment", "team-b", "bob")
    assert not access.may_read("team-c", "bob")


def test_role_bindings_need_admin_in_their_namespace_and_cluster_kinds_need_a_cluster_admin():
    access = Access(ALICE, True, {"team-a": EDIT, "team-b": ADMIN})
    assert not access.may_create("RoleBinding", "team-a")
    assert access.may_create("RoleBinding", "team-b")
    assert not access.may_create("Namespace", "") and not access.may_create("PriorityClass", "")
    assert Access(Principal("root", "admin")).may_create("Namespace", "")


@pytest.mark.parametrize("role,reads_all,changes", [
    ("admin", True, True), ("operator", True, False), ("read-only", True, False), ("user", False, False),
])
def test_cluster_roles_over_someone_elses_object_in_an_unbound_namespace(role, reads_all, changes):
    access = Access(Principal("carol", role), True, {})
    assert access.may_read("team-a", "bob") is reads_all
    assert access.may_change("Deployment", "team-a", "bob") is changes


def test_a_read_only_token_changes_nothing_even_where_bound_or_its_own():
    access = Access(Principal("rita", "read-only"), True, {"team-a": ADMIN})
    assert not access.may_create("Deployment", "default")
    assert not access.may_change("Deployment", "team-a", "rita")
    refusal = access.forbidden("delete", KINDS["deployments"], "team-a", "web")
    assert refusal.status == 403 and "read-only" in refusal.message, refusal.message


def test_secrets_are_read_by_editors_and_their_owner_not_by_viewers_or_read_only_tokens():
    """Kubernetes' view ClusterRole holds no Secrets; Shoal's read-only tokens (Prometheus') neither."""
    assert not Access(ALICE, True, {"team-a": VIEW}).may_read("team-a", "bob", "Secret")
    assert Access(ALICE, True, {"team-a": VIEW}).may_read("team-a", "bob", "Deployment")
    assert Access(ALICE, True, {"team-a": EDIT}).may_read("team-a", "bob", "Secret")
    assert Access(ALICE, True, {}).may_read("team-a", "alice", "Secret")
    assert not Access(Principal("prom", "read-only"), True, {}).may_read("team-a", "bob", "Secret")
    refusal = Access(ALICE, True, {"team-a": VIEW}).forbidden("get", KINDS["secrets"], "team-a", "hf")
    assert 'cannot get resource "secrets" in API group ""' in refusal.message and "ClusterRole edit" in refusal.message
