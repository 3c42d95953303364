"""Kubernetes manifests as ``shoal apply`` takes them: parse (multi-document YAML or JSON),
check the way ``kubectl apply --validate=strict`` and the API server would, and fill in
Kubernetes' defaults.

Checking runs in three steps: unknown fields (errors) and fields Kubernetes defines but
Shoal ignores (warnings) are sorted out on the raw document; pydantic checks shapes, types
and ranges against the models of ``shoal.kube.schema``; then the cross-field rules of the
API server (``shoal.kube.rules``) run on the typed objects. No pydantic message reaches the
user: every error is rewritten as ``FieldError(path, message)``.
"""

from __future__ import annotations

import base64
import json
import types
from decimal import Decimal
from typing import Annotated, Any, Mapping, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from shoal.kube.hpa import default_behavior
from shoal.kube.rollout import DEFAULT_MAX_SURGE, DEFAULT_MAX_UNAVAILABLE
from shoal.kube.rules import Report, check_object
from shoal.kube.schema import (
    CLUSTER_SCOPED,
    GPU,
    KINDS,
    FieldError,
    KubeObject,
    ManifestError,
    show,
    type_name,
    unique,
    unsupported,
)
from shoal.model.quantity import parse_decimal, parse_memory_mb

# -- public API ------------------------------------------------------------------------------

def load_documents(text: str) -> list[dict]:
    """Every object in a manifest file: YAML documents separated by ``---`` (JSON is taken
    too), empty documents skipped, ``kind: List`` unpacked. Syntax errors and duplicate keys
    raise ManifestError naming the line."""
    raw: list[Any]
    if text.lstrip().startswith("{"):
        try:
            raw = [json.loads(text)]
        except json.JSONDecodeError:
            raw = _load_yaml(text)
    else:
        raw = _load_yaml(text)
    docs: list[dict] = []
    for n, doc in enumerate(raw, 1):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ManifestError([FieldError("", f"document {n} is a {type_name(doc)}, not an object "
                                                "(expected apiVersion, kind, metadata, ...)")])
        if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            docs.extend(doc["items"])
        else:
            docs.append(doc)
    return docs


def validate(doc: Mapping) -> tuple[dict, list[str]]:
    """Check one object; return it with Kubernetes' defaults filled in, as a plain dict, and
    the warnings (fields Shoal ignores). Raises ManifestError with every problem found."""
    if not isinstance(doc, Mapping):
        raise ManifestError([FieldError("", f"must be an object, not a {type_name(doc)}")])
    cls = _kind_of(doc)
    errors: list[FieldError] = []
    warnings: list[str] = []
    cleaned = _prune(doc, cls, "", errors, warnings)
    try:
        obj = cls.model_validate(cleaned)
    except ValidationError as e:
        errors.extend(_field_errors(cls, e))
        raise ManifestError(unique(errors)) from None
    if errors:
        raise ManifestError(unique(errors))
    report = Report(errors, warnings)
    check_object(obj, report)
    if errors:
        raise ManifestError(unique(errors))
    out = obj.model_dump(exclude_none=True)
    _apply_defaults(out)
    return out, warnings


def pod_resources(pod_spec: Mapping) -> dict[str, Any]:
    """What a pod asks of its node: GPUs, CPUs, MiB of memory (each container's request,
    else its limit, summed over the containers) and the containerPorts it listens on."""
    gpus, cpus, memory_mb = 0, Decimal(0), 0
    ports: list[int] = []
    for c in pod_spec.get("containers") or ():
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        amount = {name: requests.get(name, limits.get(name)) for name in (GPU, "cpu", "memory")}
        if amount[GPU] is not None:
            gpus += int(parse_decimal(amount[GPU]))
        if amount["cpu"] is not None:
            cpus += parse_decimal(amount["cpu"])
        if amount["memory"] is not None:
            memory_mb += parse_memory_mb(amount["memory"])
        for p in c.get("ports") or ():
            if p.get("containerPort") not in ports:
                ports.append(p["containerPort"])
    return {"gpus": gpus, "cpus": float(cpus), "memory_mb": memory_mb, "ports": ports}


# -- loading ---------------------------------------------------------------------------------

class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps timestamps as strings (as Kubernetes' JSON does) and refuses
    duplicate keys (as ``--validate=strict`` does)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    mark = key_node.start_mark
                    raise ManifestError([FieldError("", f"line {mark.line + 1}: duplicate field "
                                                        f"{key_node.value!r}")])
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _load_yaml(text: str) -> list[Any]:
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown line"
        raise ManifestError([FieldError("", f"YAML syntax error at {where}: {e.problem or e.context}")]) from None
    except yaml.YAMLError as e:  # pragma: no cover - PyYAML marks every parse error it raises
        raise ManifestError([FieldError("", f"YAML syntax error: {e}")]) from None


def _kind_of(doc: Mapping) -> type[KubeObject]:
    api, kind = doc.get("apiVersion"), doc.get("kind")
    errors = []
    if not api:
        errors.append(FieldError("apiVersion", "Required value"))
    if not kind:
        errors.append(FieldError("kind", "Required value"))
    if errors:
        raise ManifestError(errors)
    if (api, kind) in KINDS:
        return KINDS[(api, kind)]
    served = [a for a, k in KINDS if k == kind]
    if served:
        raise ManifestError([FieldError("apiVersion", f"Unsupported value: {show(api)}: {kind} is served as "
                                                      f"{served[0]}")])
    supported = ", ".join(f"{a} {k}" for a, k in KINDS)
    raise ManifestError([FieldError("kind", f"Unsupported value: {show(f'{api} {kind}')}: "
                                            f"supported kinds: {supported}")])


# -- step 1: unknown and ignored fields on the raw document ----------------------------------

def _prune(value: Any, tp: Any, path: str, errors: list[FieldError], warnings: list[str]) -> Any:
    """A copy of ``value`` holding only the fields the models declare."""
    shape, inner = _shape(tp)
    if shape == "model" and isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key in inner.model_fields:
                out[key] = _prune(item, inner.model_fields[key].annotation, sub, errors, warnings)
            elif key in inner.SERVER_SET:
                continue
            elif key in inner.IGNORED:
                warnings.append(f"{sub}: ignored by Shoal")
            else:
                errors.append(FieldError(sub, f'unknown field "{sub}"'))
        return out
    if shape == "list" and isinstance(value, list):
        return [_prune(item, inner, f"{path}[{i}]", errors, warnings) for i, item in enumerate(value)]
    if shape == "dict" and isinstance(value, Mapping):
        return {k: _prune(v, inner, f"{path}[{k}]", errors, warnings) for k, v in value.items()}
    return value


def _shape(tp: Any) -> tuple[str, Any]:
    """("model", cls), ("list", item type), ("dict", value type) or ("leaf", type)."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return "leaf", tp
            tp = args[0]
        else:
            break
    if origin is list:
        return "list", get_args(tp)[0]
    if origin is dict:
        return "dict", get_args(tp)[1]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "model", tp
    return "leaf", tp


# -- step 2: pydantic's errors as kubectl paths and messages ---------------------------------

def _field_errors(cls: type[KubeObject], exc: ValidationError) -> list[FieldError]:
    out = []
    for err in exc.errors():
        path, leaf = _loc_path(cls, err["loc"])
        out.append(FieldError(path, _message(err, leaf)))
    return out


def _loc_path(cls: type[BaseModel], loc: tuple) -> tuple[str, Any]:
    path, tp = "", cls
    for item in loc:
        shape, inner = _shape(tp)
        if shape == "model" and item in inner.model_fields:
            path, tp = (f"{path}.{item}" if path else item), inner.model_fields[item].annotation
        elif shape == "list" and isinstance(item, int):
            path, tp = f"{path}[{item}]", inner
        elif shape == "dict" and item != "[key]":
            path, tp = f"{path}[{item}]", inner
        elif item != "[key]":
            path, tp = (f"{path}.{item}" if path else str(item)), Any
    return path, tp


def _message(err: Mapping, leaf: Any) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == "shoal":
        return ctx["message"]
    if kind == "missing":
        return "Required value"
    if kind == "literal_error":
        _, lit = _shape(leaf)
        return unsupported(value, [a for a in get_args(lit)] or [ctx.get("expected", "")])
    simple = {
        "string_type": "must be a string", "int_type": "must be an integer", "int_from_float": "must be an integer",
        "bool_type": "must be true or false", "list_type": "must be a list", "dict_type": "must be a mapping",
        "model_type": "must be a mapping", "model_attributes_type": "must be a mapping",
    }
    if kind in simple:
        return f"Invalid value: {show(value)}: {simple[kind]}"
    bounds = {"greater_than_equal": ("ge", "greater than or equal to"), "less_than_equal": ("le", "less than or equal to"),
              "greater_than": ("gt", "greater than"), "less_than": ("lt", "less than")}
    if kind in bounds:
        key, words = bounds[kind]
        return f"Invalid value: {show(value)}: must be {words} {ctx.get(key)}"
    if kind == "value_error" and "error" in ctx:
        return str(ctx["error"])
    return f"Invalid value: {show(value)}"



# -- defaults that depend on other fields ----------------------------------------------------

def _apply_defaults(obj: dict) -> None:
    kind, meta = obj["kind"], obj["metadata"]
    if kind in CLUSTER_SCOPED:
        meta.pop("namespace", None)
    else:
        meta.setdefault("namespace", "default")
    if kind == "Secret":
        # stringData is write-only: merged into data, base64, and not kept (as the API server).
        obj["type"] = obj.get("type") or "Opaque"  # the API server's default for an empty type
        data = obj.setdefault("data", {})
        for key, text in (obj.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(text.encode()).decode()
    spec = obj.get("spec")
    if kind == "Pod":
        _default_pod_spec(spec)
    elif kind in ("Deployment", "ReplicaSet"):
        _default_pod_spec(spec["template"]["spec"])
        if kind == "Deployment" and spec["strategy"]["type"] == "RollingUpdate":
            spec["strategy"].setdefault("rollingUpdate", {"maxSurge": DEFAULT_MAX_SURGE,
                                                          "maxUnavailable": DEFAULT_MAX_UNAVAILABLE})
    elif kind == "Job":
        _default_pod_spec(spec["template"]["spec"])
        # Shoal has no work-queue Jobs: without completions, each of the parallel pods must succeed.
        spec.setdefault("completions", spec["parallelism"])
    elif kind == "Service":
        for p in spec.get("ports") or ():
            p.setdefault("targetPort", p["port"])
    elif kind == "HorizontalPodAutoscaler":
        if not spec.get("metrics"):
            spec["metrics"] = [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
        spec["behavior"] = default_behavior(spec.get("behavior"))


def _default_pod_spec(spec: dict) -> None:
    for c in spec["containers"]:
        c.setdefault("imagePullPolicy", _default_pull_policy(c.get("image", "")))
        res = c["resources"]
        if res.get("limits"):
            requests = res.setdefault("requests", {})
            for name, value in res["limits"].items():
                requests.setdefault(name, value)


def _default_pull_policy(image: str) -> str:
    """Always for ``:latest`` or an untagged image, else IfNotPresent (as Kubernetes)."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"
