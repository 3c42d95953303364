"""What a pod needs of its namespace's Secrets, read when its node is told of it.

``imagePullSecrets`` become one registry -> login map (the ``auths`` of each Secret's
``.dockerconfigjson``, or a legacy ``.dockercfg``, as kubelet merges them: the first
Secret naming a registry wins); ``env[].valueFrom.secretKeyRef`` become the referenced
values alone. Only the agent of the pod's node gets them, in its work answer; nothing here
is shown by the API or logged. A missing Secret or key is left out: the agent then fails
the container with kubelet's CreateContainerConfigError, or pulls without that login.
"""

from __future__ import annotations

import base64
import binascii
import json

from sqlalchemy.orm import Session

from shoal.server.kube import objects as objs


def _values(row) -> dict[str, bytes]:
    out = {}
    for key, value in (row.body.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value)
        except (binascii.Error, ValueError):
            continue
    return out


def registry_auths(values: dict[str, bytes], type_: str) -> dict[str, dict]:
    """A docker-registry Secret's logins, registry -> ``{"auth": base64(user:password)}``."""
    try:
        if type_ == "kubernetes.io/dockerconfigjson":
            doc = json.loads(values.get(".dockerconfigjson", b"{}")).get("auths") or {}
        elif type_ == "kubernetes.io/dockercfg":
            doc = json.loads(values.get(".dockercfg", b"{}"))
        else:
            return {}
    except (ValueError, AttributeError):
        return {}
    out = {}
    for registry, login in doc.items() if isinstance(doc, dict) else ():
        if not isinstance(login, dict):
            continue
        auth = login.get("auth")
        if not auth and login.get("username") is not None:
            auth = base64.b64encode(f"{login['username']}:{login.get('password', '')}".encode()).decode()
        if auth:
            # Keys may be URLs (https://index.docker.io/v1/): the host is what a pull matches.
            host = registry.removeprefix("https://").removeprefix("http://").split("/", 1)[0]
            out.setdefault(host, {"auth": auth})
    return out


def pod_secrets(session: Session, namespace: str, spec: dict) -> dict:
    """``registry_auths`` and ``secrets`` (name -> key -> text, the referenced keys only)."""
    out: dict = {}
    rows: dict[str, object] = {}

    def row_of(name: str):
        if name not in rows:
            rows[name] = objs.get(session, "Secret", namespace, name)
        return rows[name]

    auths: dict[str, dict] = {}
    for ref in spec.get("imagePullSecrets") or ():
        row = row_of(ref.get("name", ""))
        if row is not None:
            for registry, login in registry_auths(_values(row), row.body.get("type") or "Opaque").items():
                auths.setdefault(registry, login)
    if auths:
        out["registry_auths"] = auths
    wanted: dict[str, dict[str, str]] = {}
    for c in spec.get("containers") or ():
        for item in c.get("env") or ():
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if not ref:
                continue
            row = row_of(ref["name"])
            if row is None:
                continue
            value = _values(row).get(ref["key"])
            if value is not None:
                wanted.setdefault(ref["name"], {})[ref["key"]] = value.decode(errors="replace")
            else:
                wanted.setdefault(ref["name"], {})
    if wanted:
        out["secrets"] = wanted
    return out
