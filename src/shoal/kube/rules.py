"""The API server's cross-field rules over the typed objects of ``shoal.kube.schema``: names,
selectors, strategies, containers, probes, affinity, Services and HPAs, each problem a
``FieldError`` with its kubectl path (``Report`` collects errors and warnings).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from decimal import Decimal

from shoal.kube.hpa import POD_METRICS
from shoal.kube.schema import (
    CLUSTER_SCOPED,
    Job,
    FIELD_REFS,
    GPU,
    MAX_USER_PRIORITY,
    RESOURCES,
    RUNTIMES,
    SCALE_TO_ZERO,
    TRAFFIC_SPLIT,
    Affinity,
    Container,
    Deployment,
    DeploymentSpec,
    EnvVar,
    FieldError,
    HorizontalPodAutoscaler,
    HPASpec,
    KubeObject,
    LabelSelectorSpec,
    MetricTarget,
    NodeSelectorTerm,
    ObjectMeta,
    Pod,
    PodSpec,
    PriorityClass,
    Probe,
    ReplicaSet,
    ResourceRequirements,
    RollingUpdateDeployment,
    Secret,
    Service,
    show,
    unsupported,
)
from shoal.model.quantity import parse_decimal
from shoal.model.selectors import (
    LabelSelector,
    Requirement,
    SelectorError,
    Toleration,
    check_labels,
    label_key_error,
)


class Report:
    def __init__(self, errors: list[FieldError], warnings: list[str]):
        self.errors, self.warnings = errors, warnings

    def error(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(f"{path}: {message}")


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_IANA_SVC_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_PERCENT = re.compile(r"[0-9]+%")

DNS_LABEL_RULE = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                  "and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc')")
DNS_1035_RULE = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                 "alphabetic character, and end with an alphanumeric character (e.g. 'my-name', or 'abc-123')")
DNS_SUBDOMAIN_RULE = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                      "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com')")


def dns_label_error(name: str) -> str | None:
    if len(name) > 63:
        return "must be no more than 63 characters"
    return None if _DNS_LABEL.fullmatch(name) else DNS_LABEL_RULE


def dns_1035_error(name: str) -> str | None:
    if len(name) > 63:
        return "must be no more than 63 characters"
    return None if _DNS_1035.fullmatch(name) else DNS_1035_RULE


def dns_subdomain_error(name: str) -> str | None:
    if len(name) > 253:
        return "must be no more than 253 characters"
    return None if _DNS_SUBDOMAIN.fullmatch(name) else DNS_SUBDOMAIN_RULE


def _port_name_error(name: str) -> str | None:
    if len(name) > 15:
        return "must be no more than 15 characters"
    if not _IANA_SVC_NAME.fullmatch(name) or "--" in name:
        return ("must contain only lower case alphanumeric characters and '-', must not start or end with "
                "'-' nor contain '--'")
    if not any(ch.isalpha() for ch in name):
        return "must contain at least one letter (a-z)"
    return None


def check_object(obj: KubeObject, r: Report) -> None:
    _check_meta(obj.metadata, "metadata", obj.kind, r)
    if isinstance(obj, Pod):
        _check_pod_spec(obj.spec, "spec", r)
    elif isinstance(obj, (Deployment, ReplicaSet)):
        _check_workload(obj, r)
    elif isinstance(obj, Job):
        _check_job(obj, r)
    elif isinstance(obj, Service):
        _check_service(obj, r)
    elif isinstance(obj, HorizontalPodAutoscaler):
        _check_hpa(obj.spec, r)
    elif isinstance(obj, Secret):
        _check_secret(obj, r)
    elif isinstance(obj, PriorityClass):
        if obj.value > MAX_USER_PRIORITY:
            r.error("value", f"Invalid value: {obj.value}: maximum allowed value of a user defined priority "
                             f"is {MAX_USER_PRIORITY}")
        if (obj.metadata.name or "").startswith("system-"):
            r.error("metadata.name", f"Invalid value: {show(obj.metadata.name)}: priority class names with "
                                     "'system-' prefix are reserved for system use only")


_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
MAX_SECRET_BYTES = 1024 * 1024
# The key each typed Secret must hold (the API server's ValidateSecret).
SECRET_REQUIRED_KEYS = {"kubernetes.io/dockerconfigjson": ".dockerconfigjson", "kubernetes.io/dockercfg": ".dockercfg",
                        "kubernetes.io/tls": "tls.crt", "kubernetes.io/ssh-auth": "ssh-privatekey"}


def secret_values(obj: Secret) -> dict[str, bytes]:
    """A Secret's data decoded, with stringData over it (as the API server merges them);
    keys whose value is not base64 are left out (the check reports them)."""
    out: dict[str, bytes] = {}
    for key, value in (obj.data or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
    for key, text in (obj.stringData or {}).items():
        out[key] = text.encode()
    return out


def _check_secret(obj: Secret, r: Report) -> None:
    for part in ("data", "stringData"):
        for key in getattr(obj, part) or {}:
            if len(key) > 253 or not _SECRET_KEY.fullmatch(key) or key in (".", ".."):
                r.error(f"{part}[{key}]", f"Invalid value: {show(key)}: a valid config key must consist of "
                                          "alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or "
                                          "'KEY_NAME',  or 'key-name', regex used for validation is "
                                          "'[-._a-zA-Z0-9]+')")
    for key, value in (obj.data or {}).items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            r.error(f"data[{key}]", f"Invalid value: {show(value)}: illegal base64 data")
    values = secret_values(obj)
    if sum(len(v) for v in values.values()) > MAX_SECRET_BYTES:
        r.error("data", f"Too long: must have at most {MAX_SECRET_BYTES} bytes")
    if len(obj.type) > 253:
        r.error("type", f"Invalid value: {show(obj.type)}: must be no more than 253 characters")
    need = SECRET_REQUIRED_KEYS.get(obj.type)
    if need is not None and need not in values:
        r.error(f"data[{need}]", "Required value")
    elif need in (".dockerconfigjson", ".dockercfg"):
        try:
            doc = json.loads(values[need])
            if not isinstance(doc, dict):
                raise ValueError("not an object")
        except ValueError as e:
            r.error(f"data[{need}]", f"Invalid value: \"<secret contents redacted>\": {e}")


def _check_meta(meta: ObjectMeta, path: str, kind: str, r: Report, template: bool = False) -> None:
    rule = {"Namespace": dns_label_error, "Service": dns_1035_error}.get(kind, dns_subdomain_error)
    if not template:
        if meta.name is None and meta.generateName is None:
            r.error(f"{path}.name", "Required value: name or generateName is required")
        if meta.name is not None:
            why = rule(meta.name)
            if why:
                r.error(f"{path}.name", f"Invalid value: {show(meta.name)}: {why}")
        if meta.generateName is not None:
            why = rule(meta.generateName.rstrip("-") or "x")
            if why:
                r.error(f"{path}.generateName", f"Invalid value: {show(meta.generateName)}: {why}")
        if meta.namespace is not None:
            if kind in CLUSTER_SCOPED:
                r.warn(f"{path}.namespace", f"ignored: {kind} is cluster-scoped")
            else:
                why = dns_label_error(meta.namespace)
                if why:
                    r.error(f"{path}.namespace", f"Invalid value: {show(meta.namespace)}: {why}")
    for sub, why in check_labels(meta.labels or {}):
        r.error(f"{path}.labels{sub}", why)
    annotations = meta.annotations or {}
    for key in annotations:
        why = label_key_error(key)
        if why:
            r.error(f"{path}.annotations[{key}]", f"Invalid value: {show(key)}: {why}")
    if sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
        r.error(f"{path}.annotations", "Too long: must have at most 262144 bytes")


def _check_workload(obj: Deployment | ReplicaSet, r: Report) -> None:
    spec, kind = obj.spec, obj.kind.lower()
    selector = _selector(spec.selector, "spec.selector", r)
    if selector is not None and not selector.requirements:
        r.error("spec.selector", f"Invalid value: {{}}: empty selector is invalid for {kind}")
    _check_meta(spec.template.metadata, "spec.template.metadata", "Pod", r, template=True)
    labels = spec.template.metadata.labels or {}
    if selector is not None and selector.requirements and not selector.matches(labels):
        r.error("spec.template.metadata.labels", "`selector` does not match template `labels`")
    _check_pod_spec(spec.template.spec, "spec.template.spec", r)
    if spec.template.spec.restartPolicy != "Always":
        r.error("spec.template.spec.restartPolicy", unsupported(spec.template.spec.restartPolicy, ["Always"]))
    if isinstance(obj, Deployment):
        _check_strategy(obj.spec, r)
        if obj.spec.progressDeadlineSeconds <= obj.spec.minReadySeconds:
            r.error("spec.progressDeadlineSeconds", f"Invalid value: {obj.spec.progressDeadlineSeconds}: "
                                                    "must be greater than minReadySeconds")


def _check_job(obj: Job, r: Report) -> None:
    spec = obj.spec
    _check_meta(spec.template.metadata, "spec.template.metadata", "Pod", r, template=True)
    _check_pod_spec(spec.template.spec, "spec.template.spec", r)
    if spec.template.spec.restartPolicy not in ("OnFailure", "Never"):
        r.error("spec.template.spec.restartPolicy", unsupported(spec.template.spec.restartPolicy,
                                                                ["OnFailure", "Never"]))
    if spec.completionMode == "Indexed" and spec.completions is None:
        r.error("spec.completions", "Required value: when completion mode is Indexed")
    if spec.backoffLimitPerIndex is not None and spec.completionMode != "Indexed":
        r.error("spec.backoffLimitPerIndex", "Forbidden: requires indexed completion mode")
    if spec.maxFailedIndexes is not None:
        if spec.backoffLimitPerIndex is None:
            r.error("spec.backoffLimitPerIndex", "Required value: when maxFailedIndexes is specified")
        if spec.completions is not None and spec.maxFailedIndexes > spec.completions:
            r.error("spec.maxFailedIndexes", f"Invalid value: {spec.maxFailedIndexes}: must be less than or equal "
                                             "to completions")
    if spec.podFailurePolicy is not None:
        if spec.template.spec.restartPolicy != "Never":
            r.error("spec.template.spec.restartPolicy", f"Invalid value: {show(spec.template.spec.restartPolicy)}: "
                                                        'only "Never" is supported when podFailurePolicy is specified')
        for i, rule in enumerate(spec.podFailurePolicy.rules):
            if rule.action == "FailIndex" and spec.backoffLimitPerIndex is None:
                r.error(f"spec.podFailurePolicy.rules[{i}].action", 'Forbidden: requires the backoffLimitPerIndex '
                                                                    'to be set')
            if (rule.onExitCodes is None) == (rule.onPodConditions is None):
                r.error(f"spec.podFailurePolicy.rules[{i}]", "Invalid value: specifying one of onExitCodes and "
                                                              "onPodConditions is required")


def _check_strategy(spec: DeploymentSpec, r: Report) -> None:
    strategy, path = spec.strategy, "spec.strategy.rollingUpdate"
    if strategy.type == "Recreate":
        if strategy.rollingUpdate is not None:
            r.error(path, "Forbidden: may not be specified when strategy `type` is 'Recreate'")
        return
    ru = strategy.rollingUpdate or RollingUpdateDeployment()
    surge = _int_or_percent(ru.maxSurge, f"{path}.maxSurge", r)
    unavailable = _int_or_percent(ru.maxUnavailable, f"{path}.maxUnavailable", r)
    if isinstance(ru.maxUnavailable, str) and unavailable is not None and unavailable > 100:
        r.error(f"{path}.maxUnavailable", f"Invalid value: {show(ru.maxUnavailable)}: must not be greater than 100%")
    if surge == 0 and unavailable == 0:
        r.error(f"{path}.maxUnavailable", f"Invalid value: {show(ru.maxUnavailable)}: may not be 0 when "
                                          "`maxSurge` is 0")


def _int_or_percent(value: int | str, path: str, r: Report) -> int | None:
    if isinstance(value, int):
        if value < 0:
            r.error(path, f"Invalid value: {value}: must be greater than or equal to 0")
            return None
        return value
    if not _PERCENT.fullmatch(value):
        r.error(path, f"Invalid value: {show(value)}: must be an integer or a percentage (e.g. '25%')")
        return None
    return int(value[:-1])


def _selector(spec: LabelSelectorSpec | None, path: str, r: Report) -> LabelSelector | None:
    if spec is None:
        return None
    try:
        return LabelSelector.from_dict(spec.model_dump(exclude_none=True))
    except SelectorError as e:
        r.error(f"{path}.{e.field}" if e.field else path, e.message)
        return None


def _check_pod_spec(spec: PodSpec, path: str, r: Report) -> None:
    if not spec.containers:
        r.error(f"{path}.containers", "Required value")
    names: set[str] = set()
    port_names: set[str] = set()
    ports: set[tuple[int, str]] = set()
    for i, c in enumerate(spec.containers):
        cpath = f"{path}.containers[{i}]"
        why = dns_label_error(c.name)
        if why:
            r.error(f"{cpath}.name", f"Invalid value: {show(c.name)}: {why}")
        elif c.name in names:
            r.error(f"{cpath}.name", f"Duplicate value: {show(c.name)}")
        names.add(c.name)
        _check_container(c, cpath, port_names, ports, r)
    for sub, why in check_labels(spec.nodeSelector or {}):
        r.error(f"{path}.nodeSelector{sub}", why)
    if spec.affinity is not None:
        _check_affinity(spec.affinity, f"{path}.affinity", r)
    for i, t in enumerate(spec.tolerations or ()):
        try:
            Toleration.from_dict(t.model_dump(exclude_none=True))
        except SelectorError as e:
            r.error(f"{path}.tolerations[{i}].{e.field}", e.message)
    if spec.priorityClassName is not None:
        why = dns_subdomain_error(spec.priorityClassName)
        if why:
            r.error(f"{path}.priorityClassName", f"Invalid value: {show(spec.priorityClassName)}: {why}")
    if spec.runtimeClassName is not None and spec.runtimeClassName not in RUNTIMES:
        r.error(f"{path}.runtimeClassName", unsupported(spec.runtimeClassName, RUNTIMES))
    if spec.schedulerName != "default-scheduler":
        r.warn(f"{path}.schedulerName", "ignored by Shoal (its scheduler places every pod)")


def _check_container(c: Container, path: str, port_names: set[str], ports: set[tuple[int, str]], r: Report) -> None:
    if not c.image:
        r.error(f"{path}.image", "Required value")
    own_ports: set[str] = set()
    for j, p in enumerate(c.ports or ()):
        ppath = f"{path}.ports[{j}]"
        if p.name is not None:
            why = _port_name_error(p.name)
            if why:
                r.error(f"{ppath}.name", f"Invalid value: {show(p.name)}: {why}")
            elif p.name in port_names:
                r.error(f"{ppath}.name", f"Duplicate value: {show(p.name)}")
            port_names.add(p.name)
            own_ports.add(p.name)
        if (p.containerPort, p.protocol) in ports:
            r.error(f"{ppath}.containerPort", f"Duplicate value: {p.containerPort}/{p.protocol} (Shoal pods use "
                                              "the node's network)")
        ports.add((p.containerPort, p.protocol))
        if p.hostPort is not None and p.hostPort != p.containerPort:
            r.error(f"{ppath}.hostPort", f"Invalid value: {p.hostPort}: must match `containerPort` (Shoal pods "
                                         "use the node's network)")
    for j, env in enumerate(c.env or ()):
        _check_env(env, f"{path}.env[{j}]", r)
    _check_resources(c.resources, f"{path}.resources", r)
    for name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = getattr(c, name)
        if probe is not None:
            _check_probe(probe, name, f"{path}.{name}", own_ports, r)


def _check_env(env: EnvVar, path: str, r: Report) -> None:
    if not _ENV_NAME.fullmatch(env.name):
        r.error(f"{path}.name", f"Invalid value: {show(env.name)}: a valid environment variable name must "
                                "consist of alphabetic characters, digits, '_', '-', or '.', and must not "
                                "start with a digit")
    src = env.valueFrom
    if src is None:
        return
    if env.value:
        r.error(f"{path}.valueFrom", "Invalid value: may not be specified when `value` is not empty")
    given = [k for k in ("fieldRef", "secretKeyRef", "configMapKeyRef", "resourceFieldRef")
             if getattr(src, k) is not None]
    if len(given) != 1:
        r.error(f"{path}.valueFrom", "Invalid value: must specify exactly one of `fieldRef`, `resourceFieldRef`, "
                                     "`configMapKeyRef` or `secretKeyRef`")
        return
    if given[0] == "secretKeyRef":
        ref = src.secretKeyRef
        if dns_subdomain_error(ref.name):
            r.error(f"{path}.valueFrom.secretKeyRef.name", f"Invalid value: {show(ref.name)}: {DNS_SUBDOMAIN_RULE}")
        if not _SECRET_KEY.fullmatch(ref.key):
            r.error(f"{path}.valueFrom.secretKeyRef.key", f"Invalid value: {show(ref.key)}: a valid config key "
                                                          "must consist of alphanumeric characters, '-', '_' or '.'")
    elif given[0] != "fieldRef":
        r.error(f"{path}.valueFrom.{given[0]}", "not supported by Shoal (no ConfigMaps or resource fields); use "
                                               f"`value`, a secretKeyRef or a fieldRef to {', '.join(FIELD_REFS)}")
    elif src.fieldRef.fieldPath not in FIELD_REFS:
        r.error(f"{path}.valueFrom.fieldRef.fieldPath", unsupported(src.fieldRef.fieldPath, FIELD_REFS))


def _check_resources(res: ResourceRequirements, path: str, r: Report) -> None:
    amounts: dict[str, dict[str, Decimal]] = {}
    for part in ("limits", "requests"):
        amounts[part] = {}
        for name, value in (getattr(res, part) or {}).items():
            qpath = f"{path}.{part}[{name}]"
            if name not in RESOURCES:
                r.error(qpath, unsupported(name, RESOURCES))
                continue
            amount = parse_decimal(value)
            if amount < 0:
                r.error(qpath, f"Invalid value: {show(value)}: must be greater than or equal to 0")
            elif name == GPU and amount != amount.to_integral_value():
                r.error(qpath, "must be a whole number of GPUs")
            else:
                amounts[part][name] = amount
    limits, requests = amounts["limits"], amounts["requests"]
    for name, request in requests.items():
        rpath = f"{path}.requests[{name}]"
        if name == GPU:
            if name not in limits:
                if (res.limits or {}).get(name) is None:
                    r.error(f"{path}.limits[{name}]", "Required value: Limit must be set for non overcommitable "
                                                      "resources")
            elif request != limits[name]:
                r.error(rpath, f"Invalid value: {show(res.requests[name])}: must be equal to {name} limit "
                               f"of {res.limits[name]}")
        elif name in limits and request > limits[name]:
            r.error(rpath, f"Invalid value: {show(res.requests[name])}: must be less than or equal to {name} "
                           f"limit of {res.limits[name]}")


def _check_probe(probe: Probe, kind: str, path: str, port_names: set[str], r: Report) -> None:
    handlers = [k for k in ("exec", "httpGet", "tcpSocket", "grpc") if getattr(probe, k) is not None]
    if not handlers:
        r.error(path, "Required value: must specify a handler type")
    elif len(handlers) > 1:
        r.error(f"{path}.{handlers[1]}", "Forbidden: may not specify more than 1 handler type")
    if probe.grpc is not None:
        r.error(f"{path}.grpc", "not supported by Shoal: use httpGet, tcpSocket or exec")
    if probe.exec is not None and not probe.exec.command:
        r.error(f"{path}.exec.command", "Required value")
    for action in ("httpGet", "tcpSocket"):
        handler = getattr(probe, action)
        if handler is None:
            continue
        port, ppath = handler.port, f"{path}.{action}.port"
        if isinstance(port, int):
            if not 1 <= port <= 65535:
                r.error(ppath, f"Invalid value: {port}: must be between 1 and 65535, inclusive")
        elif port.isdigit():
            r.error(ppath, f"Invalid value: {show(port)}: a port number is written without quotes")
        elif port not in port_names:
            r.error(ppath, f"Invalid value: {show(port)}: must be the name of one of the container's ports")
    if kind in ("livenessProbe", "startupProbe") and probe.successThreshold != 1:
        r.error(f"{path}.successThreshold", f"Invalid value: {probe.successThreshold}: must be 1")


def _check_affinity(aff: Affinity, path: str, r: Report) -> None:
    node = aff.nodeAffinity
    if node is not None:
        npath = f"{path}.nodeAffinity"
        req = node.requiredDuringSchedulingIgnoredDuringExecution
        if req is not None:
            rpath = f"{npath}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
            if not req.nodeSelectorTerms:
                r.error(rpath, "Required value: must have at least one node selector term")
            for i, term in enumerate(req.nodeSelectorTerms):
                _check_node_term(term, f"{rpath}[{i}]", r)
        for i, pref in enumerate(node.preferredDuringSchedulingIgnoredDuringExecution or ()):
            _check_node_term(pref.preference,
                             f"{npath}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference", r)
    for name in ("podAffinity", "podAntiAffinity"):
        pa = getattr(aff, name)
        if pa is None:
            continue
        ppath = f"{path}.{name}"
        terms = [(f"{ppath}.requiredDuringSchedulingIgnoredDuringExecution[{i}]", t)
                 for i, t in enumerate(pa.requiredDuringSchedulingIgnoredDuringExecution or ())]
        terms += [(f"{ppath}.preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm", w.podAffinityTerm)
                  for i, w in enumerate(pa.preferredDuringSchedulingIgnoredDuringExecution or ())]
        for tpath, term in terms:
            if not term.topologyKey:
                r.error(f"{tpath}.topologyKey", "Required value: can not be empty")
            else:
                why = label_key_error(term.topologyKey)
                if why:
                    r.error(f"{tpath}.topologyKey", f"Invalid value: {show(term.topologyKey)}: {why}")
            _selector(term.labelSelector, f"{tpath}.labelSelector", r)
            _selector(term.namespaceSelector, f"{tpath}.namespaceSelector", r)
            for j, ns in enumerate(term.namespaces or ()):
                why = dns_label_error(ns)
                if why:
                    r.error(f"{tpath}.namespaces[{j}]", f"Invalid value: {show(ns)}: {why}")


def _check_node_term(term: NodeSelectorTerm, path: str, r: Report) -> None:
    for i, expr in enumerate(term.matchExpressions or ()):
        try:
            Requirement(expr.key, expr.operator, tuple(expr.values or ()))
        except SelectorError as e:
            r.error(f"{path}.matchExpressions[{i}].{e.field}", e.message)
    for i, expr in enumerate(term.matchFields or ()):
        fpath = f"{path}.matchFields[{i}]"
        if expr.key != "metadata.name":
            r.error(f"{fpath}.key", unsupported(expr.key, ["metadata.name"]))
        if expr.operator not in ("In", "NotIn"):
            r.error(f"{fpath}.operator", unsupported(expr.operator, ["In", "NotIn"]))
        elif len(expr.values or ()) != 1:
            r.error(f"{fpath}.values", "Required value: must be only one value when `operator` is 'In' or "
                                       "'NotIn' for node field selector")


def _check_service(svc: Service, r: Report) -> None:
    spec = svc.spec
    if spec.type == "ExternalName":
        r.error("spec.type", "not supported by Shoal: a Service routes to its pods through `shoal gateway`")
    elif spec.type != "ClusterIP":
        r.warn("spec.type", f"{spec.type} is served like ClusterIP, through `shoal gateway`")
    if spec.selector is None:
        r.warn("spec.selector", "not set: the Service has no pods to route to (Shoal has no manual Endpoints)")
    for sub, why in check_labels(spec.selector or {}):
        r.error(f"spec.selector{sub}", why)
    ports = spec.ports or []
    if not ports:
        r.error("spec.ports", "Required value")
    names: set[str] = set()
    seen: set[tuple[int, str]] = set()
    for i, p in enumerate(ports):
        ppath = f"spec.ports[{i}]"
        if p.name is None:
            if len(ports) > 1:
                r.error(f"{ppath}.name", "Required value")
        else:
            why = dns_label_error(p.name)
            if why:
                r.error(f"{ppath}.name", f"Invalid value: {show(p.name)}: {why}")
            elif p.name in names:
                r.error(f"{ppath}.name", f"Duplicate value: {show(p.name)}")
            names.add(p.name)
        if (p.port, p.protocol) in seen:
            r.error(f"{ppath}.port", f"Duplicate value: {p.port}/{p.protocol}")
        seen.add((p.port, p.protocol))
        target = p.targetPort
        if isinstance(target, int) and not 1 <= target <= 65535:
            r.error(f"{ppath}.targetPort", f"Invalid value: {target}: must be between 1 and 65535, inclusive")
        elif isinstance(target, str):
            why = _port_name_error(target)
            if why:
                r.error(f"{ppath}.targetPort", f"Invalid value: {show(target)}: {why}")
        if p.nodePort is not None:
            r.warn(f"{ppath}.nodePort", "ignored by Shoal (Services are reached through `shoal gateway`)")
    annotations = svc.metadata.annotations or {}
    if TRAFFIC_SPLIT in annotations:
        try:
            parse_traffic_split(annotations[TRAFFIC_SPLIT])
        except ValueError as e:
            r.error(f"metadata.annotations[{TRAFFIC_SPLIT}]", str(e))
    if annotations.get(SCALE_TO_ZERO, "false") not in ("true", "false"):
        r.error(f"metadata.annotations[{SCALE_TO_ZERO}]", unsupported(annotations[SCALE_TO_ZERO], ["true", "false"]))


def _check_hpa(spec: HPASpec, r: Report) -> None:
    ref = spec.scaleTargetRef
    if ref.kind != "Deployment":
        r.error("spec.scaleTargetRef.kind", unsupported(ref.kind, ["Deployment"]))
    if ref.apiVersion is not None and ref.apiVersion != "apps/v1":
        r.error("spec.scaleTargetRef.apiVersion", unsupported(ref.apiVersion, ["apps/v1"]))
    why = dns_subdomain_error(ref.name)
    if why:
        r.error("spec.scaleTargetRef.name", f"Invalid value: {show(ref.name)}: {why}")
    if spec.maxReplicas < spec.minReplicas:
        r.error("spec.maxReplicas", f"Invalid value: {spec.maxReplicas}: must be greater than or equal to "
                                    "`minReplicas`")
    members = {"Resource": "resource", "Pods": "pods", "Object": "object", "External": "external",
               "ContainerResource": "containerResource"}
    for i, m in enumerate(spec.metrics or ()):
        mpath = f"spec.metrics[{i}]"
        member = members[m.type]
        for other in members.values():
            if other != member and getattr(m, other) is not None:
                r.error(f"{mpath}.{other}", "Forbidden: must populate the given metric source only")
        source = getattr(m, member)
        if source is None:
            r.error(f"{mpath}.{member}", "Required value: must populate information for the given metric source")
            continue
        spath = f"{mpath}.{member}"
        if m.type == "ContainerResource":
            r.error(spath, "not supported by Shoal: use a Resource metric (the whole pod's usage)")
            continue
        allowed = {"Resource": ("Utilization",), "Pods": ("AverageValue",),
                   "Object": ("Value", "AverageValue"), "External": ("Value", "AverageValue")}[m.type]
        _check_target(source.target, f"{spath}.target", allowed, r)
        if m.type == "Resource" and source.name not in ("cpu", "memory"):
            r.error(f"{spath}.name", unsupported(source.name, ["cpu", "memory"]))
        if m.type == "Pods" and source.metric.name not in POD_METRICS:
            r.warn(f"{spath}.metric.name", f"Shoal has no Pods metric {source.metric.name!r} (it has "
                                           f"{', '.join(POD_METRICS)}): the HPA will find it missing")
        if m.type in ("Pods", "Object", "External"):
            _selector(source.metric.selector, f"{spath}.metric.selector", r)
    if spec.behavior is not None:
        for direction in ("scaleUp", "scaleDown"):
            rules = getattr(spec.behavior, direction)
            rpath = f"spec.behavior.{direction}"
            if rules is not None and rules.policies is not None and not rules.policies:
                r.error(f"{rpath}.policies", "Required value: must specify at least one Policy")
            if rules is not None and rules.tolerance is not None and parse_decimal(rules.tolerance) < 0:
                r.error(f"{rpath}.tolerance", f"Invalid value: {show(rules.tolerance)}: must be greater than "
                                              "or equal to 0")


def _check_target(target: MetricTarget, path: str, allowed: tuple[str, ...], r: Report) -> None:
    if target.type not in allowed:
        r.error(f"{path}.type", unsupported(target.type, allowed))
        return
    if target.type == "Utilization":
        if target.averageUtilization is None:
            r.error(f"{path}.averageUtilization", "Required value: must set either a target value or "
                                                  "averageValue")
        elif target.averageUtilization < 1:
            r.error(f"{path}.averageUtilization", f"Invalid value: {target.averageUtilization}: must be "
                                                  "greater than 0")
        return
    field = "value" if target.type == "Value" else "averageValue"
    amount = getattr(target, field)
    if amount is None:
        r.error(f"{path}.{field}", "Required value: must set either a target value or averageValue")
    elif parse_decimal(amount) <= 0:
        r.error(f"{path}.{field}", f"Invalid value: {show(amount)}: must be positive")


def parse_traffic_split(text: str) -> dict[str, int]:
    """The ``shoal.io/traffic-split`` annotation, ``llm-v1=90,llm-v2=10`` -> weights by
    Deployment name."""
    weights: dict[str, int] = {}
    for part in text.split(","):
        name, eq, weight = part.strip().partition("=")
        if not eq or not _DNS_SUBDOMAIN.fullmatch(name) or not weight.strip().isdigit():
            raise ValueError(f"Invalid value: {text!r}: expected DEPLOYMENT=WEIGHT,... (e.g. llm-v1=90,llm-v2=10)")
        if name in weights:
            raise ValueError(f"Invalid value: {text!r}: {name} is named twice")
        weights[name] = int(weight)
    if not any(weights.values()):
        raise ValueError(f"Invalid value: {text!r}: at least one weight must be above 0")
    return weights
