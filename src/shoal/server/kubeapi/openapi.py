"""OpenAPI v3 documents of the served group versions, made from the manifest models
(``shoal.kube.schema``) and the resource registry: ``kubectl explain`` reads the schemas,
and ``kubectl apply`` finds ``fieldValidation`` on each PATCH, so it leaves validation to
the server (which rejects unknown fields with their path, as ``--validate=strict`` does).
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from shoal.kube.schema import KINDS
from shoal.server.kubeapi.registry import RESOURCES, Resource, group_versions

REF = "#/components/schemas/{model}"

# Kubernetes' own words for the fields people look up most (the rest say what Shoal checks).
DESCRIPTIONS = {
    ("DeploymentSpec", "replicas"): "Number of desired pods. This is a pointer to distinguish between explicit "
                                    "zero and not specified. Defaults to 1.",
    ("DeploymentSpec", "template"): "Template describes the pods that will be created. The only allowed "
                                    "template.spec.restartPolicy value is \"Always\".",
    ("DeploymentSpec", "selector"): "Label selector for pods. Existing ReplicaSets whose pods are selected by "
                                    "this will be the ones affected by this deployment. It must match the pod "
                                    "template's labels.",
    ("DeploymentSpec", "strategy"): "The deployment strategy to use to replace existing pods with new ones.",
    ("Container", "image"): "Container image name.",
    ("Container", "resources"): "Compute Resources required by this container (cpu, memory, nvidia.com/gpu).",
    ("PodSpec", "containers"): "List of containers belonging to the pod. There must be at least one container "
                               "in a Pod.",
    ("ServiceSpec", "ports"): "The list of ports that are exposed by this service.",
    ("ServiceSpec", "selector"): "Route service traffic to pods with label keys and values matching this "
                                 "selector.",
    ("HPASpec", "maxReplicas"): "maxReplicas is the upper limit for the number of replicas to which the "
                                "autoscaler can scale up. It cannot be less that minReplicas.",
}
TOP = {"apiVersion": "APIVersion defines the versioned schema of this representation of an object.",
       "kind": "Kind is a string value representing the REST resource this object represents.",
       "metadata": "Standard object's metadata.", "spec": "The desired behavior of the object.",
       "status": "The most recently observed status, set by Shoal."}


def _clean(node, model: str | None = None):
    """pydantic's JSON Schema as OpenAPI 3.0 wants it: ``X | None`` as X, no titles."""
    if isinstance(node, list):
        return [_clean(n) for n in node]
    if not isinstance(node, dict):
        return node
    any_of = node.get("anyOf")
    if any_of and len(any_of) == 2 and {"type": "null"} in any_of:
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return _clean({**next(a for a in any_of if a != {"type": "null"}), **rest}, model)
    out = {k: _clean(v) for k, v in node.items() if k not in ("title", "$defs", "default")}
    if "$ref" in out and len(out) > 1:  # OpenAPI 3.0 ignores a $ref's siblings
        out = {"allOf": [{"$ref": out.pop("$ref")}], **out}
    if model and isinstance(out.get("properties"), dict):
        for name, prop in out["properties"].items():
            text = DESCRIPTIONS.get((model, name)) or TOP.get(name)
            if text and isinstance(prop, dict):
                prop["description"] = text
    return out


def _schemas(api_version: str) -> dict:
    schemas: dict = {}
    for (api, kind), cls in KINDS.items():
        if api != api_version:
            continue
        doc = cls.model_json_schema(ref_template=REF)
        for name, sub in (doc.get("$defs") or {}).items():
            schemas[name] = _clean(sub, name)
        top = _clean(doc, cls.__name__)
        group, _, version = api.rpartition("/")
        top["x-kubernetes-group-version-kind"] = [{"group": group, "kind": kind, "version": version}]
        top["description"] = (cls.__doc__ or kind).strip()
        schemas[cls.__name__] = top
    return schemas


def _operation(res: Resource, verb: str, action: str) -> dict:
    params = [{"name": "dryRun", "in": "query", "schema": {"type": "string"}}]
    if action in ("post", "put", "patch"):
        params.append({"name": "fieldValidation", "in": "query", "schema": {"type": "string"},
                       "description": "Strict: unknown and duplicate fields are errors (Shoal is always strict)."})
    return {"operationId": f"{verb}{res.kind}", "parameters": params, "responses": {"200": {"description": "OK"}},
            "x-kubernetes-action": verb, "x-kubernetes-group-version-kind":
                {"group": res.group, "version": res.version, "kind": res.kind}}


def _paths(group: str, version: str) -> dict:
    paths: dict = {}
    for res in RESOURCES:
        if (res.group, res.version) != (group, version):
            continue
        collection = res.base_path("{namespace}")
        paths[collection] = {"get": _operation(res, "list", "get")}
        if "create" in res.verbs:
            paths[collection]["post"] = _operation(res, "post", "post")
        item = {"get": _operation(res, "get", "get")}
        for verb, action in (("update", "put"), ("patch", "patch"), ("delete", "delete")):
            if verb in res.verbs:
                item[action] = _operation(res, verb, action)
        paths[collection + "/{name}"] = item
    return paths


@lru_cache(maxsize=None)
def document(group: str, version: str) -> str:
    gv = f"{group}/{version}" if group else version
    doc = {"openapi": "3.0.0", "info": {"title": "Shoal", "version": gv}, "paths": _paths(group, version),
           "components": {"schemas": _schemas(gv)}}
    return json.dumps(doc)


def _key(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


@lru_cache(maxsize=1)
def index() -> dict:
    paths = {}
    for group, versions in group_versions().items():
        for version in versions:
            digest = hashlib.sha512(document(group, version).encode()).hexdigest()[:32].upper()
            paths[_key(group, version)] = {"serverRelativeURL": f"/openapi/v3/{_key(group, version)}?hash={digest}"}
    return {"paths": paths}


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (payloads here are all under 128 bytes)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


# OpenAPI v2 as kubectl fetches it (gnostic's openapi_v2.Document in protobuf): swagger and
# info, no definitions. kubectl validates on the client only what the v3 documents do not
# say the server validates (a ``kind: List`` file); with no definition it leaves that to the
# server too, which checks every item strictly.
V2_PROTOBUF = _field(1, b"2.0") + _field(2, _field(1, b"Shoal") + _field(2, b"v2"))
V2_MEDIA = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

