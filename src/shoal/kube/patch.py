"""The three patch types of the Kubernetes API, as pure functions over JSON values:
JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch (lists of
named things merged by their key, with the ``$patch``, ``$setElementOrder`` and
``$deleteFromPrimitiveList`` directives ``kubectl apply`` sends).

The merge keys are those of the Kubernetes types Shoal serves (``patchMergeKey`` in their
Go structs): a list field not named here is replaced whole, as an atomic list is.
"""

from __future__ import annotations

import copy
from typing import Any

# field name -> merge key, for the lists of the served kinds; "" marks a list of scalars
# merged as a set (finalizers).
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "imagePullSecrets": "name", "hostAliases": "ip", "conditions": "type",
    "ownerReferences": "uid", "topologySpreadConstraints": "topologyKey", "resourceClaims": "name",
    "finalizers": "",
}
# "ports" merges by containerPort in a container and by port in a Service's spec.
PORT_KEYS = {"containers": "containerPort", "spec": "port"}


class PatchError(ValueError):
    """A patch that cannot be applied; the message says where."""


# ---------------------------------------------------------------- JSON merge patch


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# ---------------------------------------------------------------- JSON patch


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy, test, in order."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"operation {i}: needs op and path")
        kind, path = op["op"], _pointer(op["path"])
        if kind == "add":
            doc = _put(doc, path, copy.deepcopy(op.get("value")), insert=True)
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _put(doc, path, copy.deepcopy(op.get("value")), insert=False)
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _put(doc, path, value, insert=True)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"operation {i}: test failed at {op['path']}")
        else:
            raise PatchError(f"operation {i}: unknown op {kind!r}")
    return doc


def _pointer(text: str) -> list[str]:
    if text == "":
        return []
    if not text.startswith("/"):
        raise PatchError(f"bad JSON pointer {text!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in text[1:].split("/")]


def _get(doc: Any, path: list[str]) -> Any:
    for p in path:
        if isinstance(doc, dict) and p in doc:
            doc = doc[p]
        elif isinstance(doc, list) and p.isdigit() and int(p) < len(doc):
            doc = doc[int(p)]
        else:
            raise PatchError(f"path /{'/'.join(path)} does not exist")
    return doc


def _put(doc: Any, path: list[str], value: Any, insert: bool) -> Any:
    if not path:
        return value
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        index = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= index <= len(parent) or (not insert and index == len(parent)):
            raise PatchError(f"path /{'/'.join(path)}: index out of range")
        if insert:
            parent.insert(index, value)
        else:
            parent[index] = value
    else:
        raise PatchError(f"path /{'/'.join(path[:-1])} is not an object or list")
    return doc


def _remove(doc: Any, path: list[str]) -> Any:
    parent = _get(doc, path[:-1])
    _get(doc, path)
    if isinstance(parent, dict):
        del parent[path[-1]]
    else:
        del parent[int(path[-1])]
    return doc


# ---------------------------------------------------------------- strategic merge patch


def strategic_merge(target: Any, patch: Any, field: str = "") -> Any:
    """Apply a strategic merge patch: maps merge as in a merge patch; lists with a merge key
    merge element by element (``$patch: delete`` removes one, ``$setElementOrder/f`` orders
    them); other lists are replaced. ``field``: the name this map is found under."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    for k, v in patch.items():
        if k.startswith("$"):
            if k.startswith("$deleteFromPrimitiveList/"):
                name = k.split("/", 1)[1]
                out[name] = [x for x in out.get(name) or () if x not in v]
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list):
            out[k] = _merge_list(out.get(k), v, k, field)
        else:
            out[k] = strategic_merge(out.get(k), v, k)
    for name, order in orders.items():
        if isinstance(out.get(name), list):
            out[name] = _ordered(out[name], order, _merge_key(name, field))
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_key(name: str, parent: str) -> str | None:
    if name == "ports":
        return PORT_KEYS.get(parent, "containerPort")
    return MERGE_KEYS.get(name)


def _merge_list(current: Any, patch: list, name: str, parent: str) -> list:
    key = _merge_key(name, parent)
    if key is None or not isinstance(current, list):
        if key is not None:
            return [x for x in (_strip(i) for i in patch) if x is not None]
        return copy.deepcopy(patch)
    if key == "":  # a set of scalars
        return current + [x for x in patch if x not in current]
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [_strip(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    out = [copy.deepcopy(i) for i in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"{name}: each element needs its merge key {key!r}")
        at = next((n for n, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del out[at]
        elif at is None:
            out.append(_strip(item))
        else:
            out[at] = strategic_merge(out[at], item, name)
    return out


def _strip(item: Any) -> Any:
    """An element added whole: directives out, nulls meaning nothing."""
    if isinstance(item, dict):
        if item.get("$patch") == "delete":
            return None
        return strategic_merge({}, item)
    return item


def _ordered(items: list, order: list, key: str | None) -> list:
    """``$setElementOrder``: the listed elements in that order, others after in their order."""
    if not key:
        rank = {repr(v): i for i, v in enumerate(order)}
        return sorted(items, key=lambda x: rank.get(repr(x), len(order)))
    rank = {repr(o.get(key)): i for i, o in enumerate(order) if isinstance(o, dict)}
    return sorted(items, key=lambda x: rank.get(repr(x.get(key)) if isinstance(x, dict) else "", len(order)))
