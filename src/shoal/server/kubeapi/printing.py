"""Server-side printing: objects as ``meta.k8s.io/v1`` Tables, which ``kubectl get`` asks for
and prints as they come. The columns and cells are those of ``shoal get`` (``kube.fmt``,
kubectl's own columns), so both print alike; wide columns have priority 1 (``-o wide``).
"""

from __future__ import annotations

from shoal.kube import fmt as kubefmt

# Shown without -o wide: a GPU cluster's nodes are read for their GPUs first.
ALWAYS = {("nodes", "GPUS")}
TABLE = "as=Table"


def wants_table(accept: str | None) -> bool:
    return bool(accept) and TABLE in accept.replace(" ", "")


def columns(resource: str) -> list[dict]:
    p = kubefmt.PRINTERS[resource]
    if resource == "events":
        names = p.columns[:-1] + p.wide_columns + ["NAME"]
        wide = set(p.wide_columns) - {"MESSAGE"} | {"NAME"}
    else:
        names = ["NAME", *p.columns, *p.wide_columns]
        wide = set(p.wide_columns)
    return [{"name": n, "type": "string", "format": "name" if n == "NAME" else "", "description": "",
             "priority": 1 if n in wide and (resource, n) not in ALWAYS else 0} for n in names]


def row(resource: str, obj: dict, now: float, include: str = "Metadata") -> dict:
    p = kubefmt.PRINTERS[resource]
    name = (obj.get("metadata") or {}).get("name", "")
    cells = p.row(obj, now, True)
    cells = cells + [name] if resource == "events" else [name, *cells]
    out: dict = {"cells": cells}
    if include == "Object":
        out["object"] = obj
    elif include != "None":
        out["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                         "metadata": obj.get("metadata") or {}}
    return out


def table(resource: str, objects: list[dict], now: float, rv: str, include: str = "Metadata",
          headers: bool = True) -> dict:
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
            "columnDefinitions": columns(resource) if headers else [],
            "rows": [row(resource, o, now, include) for o in objects]}


def status(message: str, code: int, reason: str, details: dict | None = None) -> dict:
    """A ``Status``: how the API server answers a refusal (kubectl prints its message)."""
    out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure" if code >= 300 else "Success",
           "message": message, "reason": reason, "code": code}
    if details:
        out["details"] = details
    return out
