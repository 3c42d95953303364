"""The patch types of the Kubernetes API, checked against what the API server does with the
patches kubectl sends (kubectl apply, set image, scale, label, and JSON patches)."""

from __future__ import annotations

import pytest

from shoal.kube.patch import PatchError, json_patch, merge_patch, strategic_merge

LIVE = {
    "metadata": {"name": "web", "labels": {"app": "web", "team": "infer"}},
    "spec": {"replicas": 3, "template": {"spec": {
        "containers": [
            {"name": "app", "image": "app:v1", "ports": [{"containerPort": 8000}, {"containerPort": 9000}],
             "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
             "resources": {"limits": {"nvidia.com/gpu": "1"}},
             "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}}},
            {"name": "sidecar", "image": "proxy:v1"},
        ],
        "tolerations": [{"key": "a", "operator": "Exists"}],
        "finalizers": ["x"],
    }}},
}


def containers(obj):
    return obj["spec"]["template"]["spec"]["containers"]


def test_set_image_merges_the_container_by_name_and_keeps_the_rest():
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app:v2"}]}}}}
    out = strategic_merge(LIVE, patch)
    assert [c["image"] for c in containers(out)] == ["app:v2", "proxy:v1"]
    assert containers(out)[0]["readinessProbe"] == containers(LIVE)[0]["readinessProbe"]
    assert containers(out)[0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert containers(LIVE)[0]["image"] == "app:v1"  # the live object is not changed in place


def test_apply_directives_delete_an_element_and_set_the_order():
    patch = {"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}],
        "containers": [{"name": "app", "$setElementOrder/env": [{"name": "B"}],
                        "env": [{"name": "A", "$patch": "delete"}]}],
    }}}}
    out = strategic_merge(LIVE, patch)
    assert [c["name"] for c in containers(out)] == ["sidecar", "app"]
    assert containers(out)[1]["env"] == [{"name": "B", "value": "2"}]


def test_ports_merge_by_container_port_and_null_removes_a_field():
    patch = {"metadata": {"labels": {"team": None}},
             "spec": {"template": {"spec": {"containers": [
                 {"name": "app", "ports": [{"containerPort": 9000, "name": "metrics"}]}]}}}}
    out = strategic_merge(LIVE, patch)
    assert out["metadata"]["labels"] == {"app": "web"}
    assert containers(out)[0]["ports"] == [{"containerPort": 8000}, {"containerPort": 9000, "name": "metrics"}]


def test_lists_without_a_merge_key_are_replaced_and_sets_are_unioned():
    patch = {"spec": {"template": {"spec": {"tolerations": [{"key": "b", "operator": "Exists"}],
                                            "finalizers": ["y"]}}}}
    out = strategic_merge(LIVE, patch)
    assert out["spec"]["template"]["spec"]["tolerations"] == [{"key": "b", "operator": "Exists"}]
    assert out["spec"]["template"]["spec"]["finalizers"] == ["x", "y"]
    out = strategic_merge(out, {"spec": {"template": {"spec": {"$deleteFromPrimitiveList/finalizers": ["x"]}}}})
    assert out["spec"]["template"]["spec"]["finalizers"] == ["y"]


def test_patch_replace_and_a_missing_merge_key():
    out = strategic_merge(LIVE, {"spec": {"template": {"spec": {"$patch": "replace", "containers": [
        {"name": "only", "image": "x"}]}}}})
    assert out["spec"]["template"]["spec"] == {"containers": [{"name": "only", "image": "x"}]}
    with pytest.raises(PatchError, match="merge key 'name'"):
        strategic_merge(LIVE, {"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}})


def test_merge_patch_replaces_lists_whole():
    out = merge_patch(LIVE, {"spec": {"replicas": 5, "template": {"spec": {"containers": [{"name": "app"}]}}}})
    assert out["spec"]["replicas"] == 5 and containers(out) == [{"name": "app"}]
    assert out["metadata"] == LIVE["metadata"]


def test_json_patch_operations_in_order_and_a_failed_test():
    out = json_patch(LIVE, [
        {"op": "replace", "path": "/spec/replicas", "value": 1},
        {"op": "add", "path": "/metadata/labels/tier", "value": "gpu"},
        {"op": "remove", "path": "/spec/template/spec/containers/1"},
        {"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": "C", "value": "3"}},
        {"op": "copy", "from": "/metadata/labels/app", "path": "/metadata/labels/copied"},
    ])
    assert out["spec"]["replicas"] == 1 and len(containers(out)) == 1
    assert [e["name"] for e in containers(out)[0]["env"]] == ["A", "B", "C"]
    assert out["metadata"]["labels"] == {"app": "web", "team": "infer", "tier": "gpu", "copied": "web"}
    with pytest.raises(PatchError, match="test failed"):
        json_patch(LIVE, [{"op": "test", "path": "/spec/replicas", "value": 4}])
    with pytest.raises(PatchError, match="does not exist"):
        json_patch(LIVE, [{"op": "replace", "path": "/spec/nothing/here", "value": 1}])
