"""Kubernetes manifests as ``shoal apply`` takes them: parse (multi-document YAML or JSON),
check the way ``kubectl apply --validate=strict`` and the API server would, and fill in
Kubernetes' defaults.

Model fields carry Kubernetes' own camelCase names so an error's location maps one to one
onto the kubectl path users know (``spec.template.spec.containers[0].resources.limits``).
Checking runs in three steps: unknown fields (errors) and fields Kubernetes defines but
Shoal ignores (warnings) are sorted out on the raw document; pydantic checks shapes, types
and ranges; then the cross-field rules of the API server run on the typed objects. No
pydantic message reaches the user: every error is rewritten as ``FieldError(path, message)``.
"""

from __future__ import annotations

import json
import re
import types
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal, Mapping, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import PydanticCustomError

from shoal.kube.hpa import POD_METRICS, default_behavior
from shoal.kube.rollout import DEFAULT_MAX_SURGE, DEFAULT_MAX_UNAVAILABLE
from shoal.model.quantity import EXAMPLES, parse_decimal, parse_memory_mb
from shoal.model.selectors import (
    LabelSelector,
    Requirement,
    SelectorError,
    Toleration,
    check_labels,
    label_key_error,
)

GPU = "nvidia.com/gpu"
RESOURCES = ("cpu", "memory", GPU, "ephemeral-storage")
RUNTIMES = ("process", "podman", "docker", "enroot", "apptainer")
FIELD_REFS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "status.podIP", "status.hostIP")
TRAFFIC_SPLIT = "shoal.io/traffic-split"
SCALE_TO_ZERO = "shoal.io/scale-to-zero"
MAX_USER_PRIORITY = 1_000_000_000


@dataclass(frozen=True)
class FieldError:
    path: str  # kubectl-style: spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ManifestError(ValueError):
    """A manifest Shoal refuses, with every reason found."""

    def __init__(self, errors: list[FieldError]):
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = list(errors)


# -- values Kubernetes writes as int-or-string or quantities ---------------------------------

def _custom(message: str) -> PydanticCustomError:
    return PydanticCustomError("shoal", "{message}", {"message": message})


def _check_quantity(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _custom(f"Invalid value: {_show(value)}: must be a quantity (e.g. {EXAMPLES})")
    try:
        parse_decimal(value)
    except ValueError:
        raise _custom(f"Invalid value: {_show(value)}: must be a quantity (e.g. {EXAMPLES})") from None
    return value


def _check_int_or_string(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _custom(f"Invalid value: {_show(value)}: must be an integer or a string")
    return value


Quantity = Annotated[Any, PlainValidator(_check_quantity)]
IntOrString = Annotated[Any, PlainValidator(_check_int_or_string)]


class _Model(BaseModel):
    """Strict like the API server's decoder: ``replicas: "4"`` and a label value ``1`` are errors."""

    model_config = ConfigDict(extra="forbid", strict=True)
    IGNORED: ClassVar[frozenset[str]] = frozenset()  # Kubernetes fields Shoal accepts and ignores (warned)
    SERVER_SET: ClassVar[frozenset[str]] = frozenset()  # set by the server: dropped without a word


# -- metadata --------------------------------------------------------------------------------

class ObjectMeta(_Model):
    IGNORED = frozenset({"ownerReferences", "finalizers"})
    SERVER_SET = frozenset({"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
                            "deletionGracePeriodSeconds", "managedFields", "selfLink"})
    name: str | None = None
    generateName: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


# -- pods ------------------------------------------------------------------------------------

class ObjectFieldSelector(_Model):
    fieldPath: str
    apiVersion: str | None = None


class EnvVarSource(_Model):
    fieldRef: ObjectFieldSelector | None = None
    # Defined by Kubernetes; refused below rather than ignored, or the variable would go missing.
    secretKeyRef: Any = None
    configMapKeyRef: Any = None
    resourceFieldRef: Any = None


class EnvVar(_Model):
    name: str
    value: str | None = None
    valueFrom: EnvVarSource | None = None


class ContainerPort(_Model):
    IGNORED = frozenset({"hostIP"})
    name: str | None = None
    containerPort: int = Field(ge=1, le=65535)
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    hostPort: int | None = Field(None, ge=1, le=65535)


class ResourceRequirements(_Model):
    IGNORED = frozenset({"claims"})
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class HTTPHeader(_Model):
    name: str
    value: str


class HTTPGetAction(_Model):
    path: str = "/"
    port: IntOrString
    host: str | None = None
    scheme: Literal["HTTP", "HTTPS"] = "HTTP"
    httpHeaders: list[HTTPHeader] | None = None


class TCPSocketAction(_Model):
    port: IntOrString
    host: str | None = None


class ExecAction(_Model):
    command: list[str] | None = None


class GRPCAction(_Model):
    port: int
    service: str | None = None


class Probe(_Model):
    exec: ExecAction | None = None
    httpGet: HTTPGetAction | None = None
    tcpSocket: TCPSocketAction | None = None
    grpc: GRPCAction | None = None
    initialDelaySeconds: int = Field(0, ge=0)
    timeoutSeconds: int = Field(1, ge=1)
    periodSeconds: int = Field(10, ge=1)
    successThreshold: int = Field(1, ge=1)
    failureThreshold: int = Field(3, ge=1)
    terminationGracePeriodSeconds: int | None = Field(None, ge=1)


class Container(_Model):
    IGNORED = frozenset({"securityContext", "volumeMounts", "volumeDevices", "lifecycle", "envFrom", "stdin",
                         "stdinOnce", "tty", "terminationMessagePath", "terminationMessagePolicy",
                         "resizePolicy", "restartPolicy"})
    name: str
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    workingDir: str | None = None
    env: list[EnvVar] | None = None
    ports: list[ContainerPort] | None = None
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    livenessProbe: Probe | None = None
    readinessProbe: Probe | None = None
    startupProbe: Probe | None = None
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = None


class NodeSelectorRequirement(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] | None = None


class NodeSelectorTerm(_Model):
    matchExpressions: list[NodeSelectorRequirement] | None = None
    matchFields: list[NodeSelectorRequirement] | None = None


class NodeSelector(_Model):
    nodeSelectorTerms: list[NodeSelectorTerm]


class PreferredSchedulingTerm(_Model):
    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(_Model):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None
    preferredDuringSchedulingIgnoredDuringExecution: list[PreferredSchedulingTerm] | None = None


class LabelSelectorRequirement(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelectorSpec(_Model):
    matchLabels: dict[str, str] | None = None
    matchExpressions: list[LabelSelectorRequirement] | None = None


class PodAffinityTerm(_Model):
    IGNORED = frozenset({"matchLabelKeys", "mismatchLabelKeys"})
    topologyKey: str
    labelSelector: LabelSelectorSpec | None = None
    namespaces: list[str] | None = None
    namespaceSelector: LabelSelectorSpec | None = None


class WeightedPodAffinityTerm(_Model):
    weight: int = Field(ge=1, le=100)
    podAffinityTerm: PodAffinityTerm


class PodAffinity(_Model):
    requiredDuringSchedulingIgnoredDuringExecution: list[PodAffinityTerm] | None = None
    preferredDuringSchedulingIgnoredDuringExecution: list[WeightedPodAffinityTerm] | None = None


class Affinity(_Model):
    nodeAffinity: NodeAffinity | None = None
    podAffinity: PodAffinity | None = None
    podAntiAffinity: PodAffinity | None = None


class TolerationSpec(_Model):
    key: str | None = None
    operator: Literal["Equal", "Exists"] | None = None
    value: str | None = None
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


class PodSpec(_Model):
    IGNORED = frozenset({
        "initContainers", "ephemeralContainers", "volumes", "serviceAccountName", "serviceAccount",
        "automountServiceAccountToken", "imagePullSecrets", "securityContext", "hostNetwork", "hostPID",
        "hostIPC", "hostUsers", "shareProcessNamespace", "dnsPolicy", "dnsConfig", "hostAliases", "hostname",
        "subdomain", "setHostnameAsFQDN", "enableServiceLinks", "readinessGates", "topologySpreadConstraints",
        "activeDeadlineSeconds", "preemptionPolicy", "overhead", "os", "nodeName", "schedulingGates",
        "resourceClaims", "resources"})
    containers: list[Container]
    restartPolicy: Literal["Always", "OnFailure", "Never"] = "Always"
    terminationGracePeriodSeconds: int = Field(30, ge=0)
    nodeSelector: dict[str, str] | None = None
    affinity: Affinity | None = None
    tolerations: list[TolerationSpec] | None = None
    priorityClassName: str | None = None
    priority: int | None = None
    runtimeClassName: str | None = None
    schedulerName: str = "default-scheduler"


class PodTemplateSpec(_Model):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec


# -- workloads -------------------------------------------------------------------------------

class RollingUpdateDeployment(_Model):
    maxSurge: IntOrString = DEFAULT_MAX_SURGE
    maxUnavailable: IntOrString = DEFAULT_MAX_UNAVAILABLE


class DeploymentStrategy(_Model):
    type: Literal["RollingUpdate", "Recreate"] = "RollingUpdate"
    rollingUpdate: RollingUpdateDeployment | None = None


class DeploymentSpec(_Model):
    replicas: int = Field(1, ge=0)
    selector: LabelSelectorSpec
    template: PodTemplateSpec
    strategy: DeploymentStrategy = Field(default_factory=DeploymentStrategy)
    minReadySeconds: int = Field(0, ge=0)
    revisionHistoryLimit: int = Field(10, ge=0)
    progressDeadlineSeconds: int = Field(600, ge=1)
    paused: bool = False


class ReplicaSetSpec(_Model):
    replicas: int = Field(1, ge=0)
    selector: LabelSelectorSpec
    template: PodTemplateSpec
    minReadySeconds: int = Field(0, ge=0)


# -- services --------------------------------------------------------------------------------

class ServicePort(_Model):
    IGNORED = frozenset({"appProtocol"})
    name: str | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    port: int = Field(ge=1, le=65535)
    targetPort: IntOrString | None = None
    nodePort: int | None = Field(None, ge=1, le=65535)


class ServiceSpec(_Model):
    IGNORED = frozenset({
        "clusterIP", "clusterIPs", "externalIPs", "externalName", "sessionAffinity", "sessionAffinityConfig",
        "loadBalancerIP", "loadBalancerSourceRanges", "loadBalancerClass", "externalTrafficPolicy",
        "internalTrafficPolicy", "ipFamilies", "ipFamilyPolicy", "healthCheckNodePort",
        "publishNotReadyAddresses", "allocateLoadBalancerNodePorts", "trafficDistribution"})
    selector: dict[str, str] | None = None
    ports: list[ServicePort] | None = None
    type: Literal["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"] = "ClusterIP"


# -- autoscaling -----------------------------------------------------------------------------

class CrossVersionObjectReference(_Model):
    apiVersion: str | None = None
    kind: str
    name: str


class MetricTarget(_Model):
    type: Literal["Utilization", "Value", "AverageValue"]
    value: Quantity | None = None
    averageValue: Quantity | None = None
    averageUtilization: int | None = None


class MetricIdentifier(_Model):
    name: str
    selector: LabelSelectorSpec | None = None


class ResourceMetricSource(_Model):
    name: str
    target: MetricTarget


class ContainerResourceMetricSource(_Model):
    name: str
    container: str
    target: MetricTarget


class PodsMetricSource(_Model):
    metric: MetricIdentifier
    target: MetricTarget


class ObjectMetricSource(_Model):
    describedObject: CrossVersionObjectReference
    metric: MetricIdentifier
    target: MetricTarget


class ExternalMetricSource(_Model):
    metric: MetricIdentifier
    target: MetricTarget


class MetricSpec(_Model):
    type: Literal["Resource", "Pods", "Object", "External", "ContainerResource"]
    resource: ResourceMetricSource | None = None
    pods: PodsMetricSource | None = None
    object: ObjectMetricSource | None = None
    external: ExternalMetricSource | None = None
    containerResource: ContainerResourceMetricSource | None = None


class HPAScalingPolicy(_Model):
    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1)
    periodSeconds: int = Field(ge=1, le=1800)


class HPAScalingRules(_Model):
    stabilizationWindowSeconds: int | None = Field(None, ge=0, le=3600)
    selectPolicy: Literal["Max", "Min", "Disabled"] | None = None
    policies: list[HPAScalingPolicy] | None = None
    tolerance: Quantity | None = None


class HPABehavior(_Model):
    scaleUp: HPAScalingRules | None = None
    scaleDown: HPAScalingRules | None = None


class HPASpec(_Model):
    scaleTargetRef: CrossVersionObjectReference
    minReplicas: int = Field(1, ge=1)
    maxReplicas: int = Field(ge=1)
    metrics: list[MetricSpec] | None = None
    behavior: HPABehavior | None = None


# -- top-level objects -----------------------------------------------------------------------

class _Object(_Model):
    SERVER_SET = frozenset({"status"})
    apiVersion: str
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


class NamespaceSpec(_Model):
    IGNORED = frozenset({"finalizers"})


class Namespace(_Object):
    spec: NamespaceSpec | None = None


class Pod(_Object):
    spec: PodSpec


class Deployment(_Object):
    spec: DeploymentSpec


class ReplicaSet(_Object):
    spec: ReplicaSetSpec


class Service(_Object):
    spec: ServiceSpec


class HorizontalPodAutoscaler(_Object):
    spec: HPASpec


class PriorityClass(_Object):
    value: int
    globalDefault: bool = False
    preemptionPolicy: Literal["PreemptLowerPriority", "Never"] = "PreemptLowerPriority"
    description: str | None = None


KINDS: dict[tuple[str, str], type[_Object]] = {
    ("v1", "Namespace"): Namespace,
    ("v1", "Pod"): Pod,
    ("v1", "Service"): Service,
    ("apps/v1", "Deployment"): Deployment,
    ("apps/v1", "ReplicaSet"): ReplicaSet,
    ("autoscaling/v2", "HorizontalPodAutoscaler"): HorizontalPodAutoscaler,
    ("scheduling.k8s.io/v1", "PriorityClass"): PriorityClass,
}
CLUSTER_SCOPED = frozenset({"Namespace", "PriorityClass"})


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
            raise ManifestError([FieldError("", f"document {n} is a {_type_name(doc)}, not an object "
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
        raise ManifestError([FieldError("", f"must be an object, not a {_type_name(doc)}")])
    cls = _kind_of(doc)
    errors: list[FieldError] = []
    warnings: list[str] = []
    cleaned = _prune(doc, cls, "", errors, warnings)
    try:
        obj = cls.model_validate(cleaned)
    except ValidationError as e:
        errors.extend(_field_errors(cls, e))
        raise ManifestError(_unique(errors)) from None
    if errors:
        raise ManifestError(_unique(errors))
    report = _Report(errors, warnings)
    _check_object(obj, report)
    if errors:
        raise ManifestError(_unique(errors))
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


def _kind_of(doc: Mapping) -> type[_Object]:
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
        raise ManifestError([FieldError("apiVersion", f"Unsupported value: {_show(api)}: {kind} is served as "
                                                      f"{served[0]}")])
    supported = ", ".join(f"{a} {k}" for a, k in KINDS)
    raise ManifestError([FieldError("kind", f"Unsupported value: {_show(f'{api} {kind}')}: "
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

def _field_errors(cls: type[_Object], exc: ValidationError) -> list[FieldError]:
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
        return _unsupported(value, [a for a in get_args(lit)] or [ctx.get("expected", "")])
    simple = {
        "string_type": "must be a string", "int_type": "must be an integer", "int_from_float": "must be an integer",
        "bool_type": "must be true or false", "list_type": "must be a list", "dict_type": "must be a mapping",
        "model_type": "must be a mapping", "model_attributes_type": "must be a mapping",
    }
    if kind in simple:
        return f"Invalid value: {_show(value)}: {simple[kind]}"
    bounds = {"greater_than_equal": ("ge", "greater than or equal to"), "less_than_equal": ("le", "less than or equal to"),
              "greater_than": ("gt", "greater than"), "less_than": ("lt", "less than")}
    if kind in bounds:
        key, words = bounds[kind]
        return f"Invalid value: {_show(value)}: must be {words} {ctx.get(key)}"
    if kind == "value_error" and "error" in ctx:
        return str(ctx["error"])
    return f"Invalid value: {_show(value)}"


# -- step 3: the API server's cross-field rules ----------------------------------------------

class _Report:
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


def _check_object(obj: _Object, r: _Report) -> None:
    _check_meta(obj.metadata, "metadata", obj.kind, r)
    if isinstance(obj, Pod):
        _check_pod_spec(obj.spec, "spec", r)
    elif isinstance(obj, (Deployment, ReplicaSet)):
        _check_workload(obj, r)
    elif isinstance(obj, Service):
        _check_service(obj, r)
    elif isinstance(obj, HorizontalPodAutoscaler):
        _check_hpa(obj.spec, r)
    elif isinstance(obj, PriorityClass):
        if obj.value > MAX_USER_PRIORITY:
            r.error("value", f"Invalid value: {obj.value}: maximum allowed value of a user defined priority "
                             f"is {MAX_USER_PRIORITY}")
        if (obj.metadata.name or "").startswith("system-"):
            r.error("metadata.name", f"Invalid value: {_show(obj.metadata.name)}: priority class names with "
                                     "'system-' prefix are reserved for system use only")


def _check_meta(meta: ObjectMeta, path: str, kind: str, r: _Report, template: bool = False) -> None:
    rule = {"Namespace": dns_label_error, "Service": dns_1035_error}.get(kind, dns_subdomain_error)
    if not template:
        if meta.name is None and meta.generateName is None:
            r.error(f"{path}.name", "Required value: name or generateName is required")
        if meta.name is not None:
            why = rule(meta.name)
            if why:
                r.error(f"{path}.name", f"Invalid value: {_show(meta.name)}: {why}")
        if meta.generateName is not None:
            why = rule(meta.generateName.rstrip("-") or "x")
            if why:
                r.error(f"{path}.generateName", f"Invalid value: {_show(meta.generateName)}: {why}")
        if meta.namespace is not None:
            if kind in CLUSTER_SCOPED:
                r.warn(f"{path}.namespace", f"ignored: {kind} is cluster-scoped")
            else:
                why = dns_label_error(meta.namespace)
                if why:
                    r.error(f"{path}.namespace", f"Invalid value: {_show(meta.namespace)}: {why}")
    for sub, why in check_labels(meta.labels or {}):
        r.error(f"{path}.labels{sub}", why)
    annotations = meta.annotations or {}
    for key in annotations:
        why = label_key_error(key)
        if why:
            r.error(f"{path}.annotations[{key}]", f"Invalid value: {_show(key)}: {why}")
    if sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
        r.error(f"{path}.annotations", "Too long: must have at most 262144 bytes")


def _check_workload(obj: Deployment | ReplicaSet, r: _Report) -> None:
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
        r.error("spec.template.spec.restartPolicy", _unsupported(spec.template.spec.restartPolicy, ["Always"]))
    if isinstance(obj, Deployment):
        _check_strategy(obj.spec, r)
        if obj.spec.progressDeadlineSeconds <= obj.spec.minReadySeconds:
            r.error("spec.progressDeadlineSeconds", f"Invalid value: {obj.spec.progressDeadlineSeconds}: "
                                                    "must be greater than minReadySeconds")


def _check_strategy(spec: DeploymentSpec, r: _Report) -> None:
    strategy, path = spec.strategy, "spec.strategy.rollingUpdate"
    if strategy.type == "Recreate":
        if strategy.rollingUpdate is not None:
            r.error(path, "Forbidden: may not be specified when strategy `type` is 'Recreate'")
        return
    ru = strategy.rollingUpdate or RollingUpdateDeployment()
    surge = _int_or_percent(ru.maxSurge, f"{path}.maxSurge", r)
    unavailable = _int_or_percent(ru.maxUnavailable, f"{path}.maxUnavailable", r)
    if isinstance(ru.maxUnavailable, str) and unavailable is not None and unavailable > 100:
        r.error(f"{path}.maxUnavailable", f"Invalid value: {_show(ru.maxUnavailable)}: must not be greater than 100%")
    if surge == 0 and unavailable == 0:
        r.error(f"{path}.maxUnavailable", f"Invalid value: {_show(ru.maxUnavailable)}: may not be 0 when "
                                          "`maxSurge` is 0")


def _int_or_percent(value: int | str, path: str, r: _Report) -> int | None:
    if isinstance(value, int):
        if value < 0:
            r.error(path, f"Invalid value: {value}: must be greater than or equal to 0")
            return None
        return value
    if not _PERCENT.fullmatch(value):
        r.error(path, f"Invalid value: {_show(value)}: must be an integer or a percentage (e.g. '25%')")
        return None
    return int(value[:-1])


def _selector(spec: LabelSelectorSpec | None, path: str, r: _Report) -> LabelSelector | None:
    if spec is None:
        return None
    try:
        return LabelSelector.from_dict(spec.model_dump(exclude_none=True))
    except SelectorError as e:
        r.error(f"{path}.{e.field}" if e.field else path, e.message)
        return None


def _check_pod_spec(spec: PodSpec, path: str, r: _Report) -> None:
    if not spec.containers:
        r.error(f"{path}.containers", "Required value")
    names: set[str] = set()
    port_names: set[str] = set()
    ports: set[tuple[int, str]] = set()
    for i, c in enumerate(spec.containers):
        cpath = f"{path}.containers[{i}]"
        why = dns_label_error(c.name)
        if why:
            r.error(f"{cpath}.name", f"Invalid value: {_show(c.name)}: {why}")
        elif c.name in names:
            r.error(f"{cpath}.name", f"Duplicate value: {_show(c.name)}")
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
            r.error(f"{path}.priorityClassName", f"Invalid value: {_show(spec.priorityClassName)}: {why}")
    if spec.runtimeClassName is not None and spec.runtimeClassName not in RUNTIMES:
        r.error(f"{path}.runtimeClassName", _unsupported(spec.runtimeClassName, RUNTIMES))
    if spec.schedulerName != "default-scheduler":
        r.warn(f"{path}.schedulerName", "ignored by Shoal (its scheduler places every pod)")


def _check_container(c: Container, path: str, port_names: set[str], ports: set[tuple[int, str]], r: _Report) -> None:
    if not c.image:
        r.error(f"{path}.image", "Required value")
    own_ports: set[str] = set()
    for j, p in enumerate(c.ports or ()):
        ppath = f"{path}.ports[{j}]"
        if p.name is not None:
            why = _port_name_error(p.name)
            if why:
                r.error(f"{ppath}.name", f"Invalid value: {_show(p.name)}: {why}")
            elif p.name in port_names:
                r.error(f"{ppath}.name", f"Duplicate value: {_show(p.name)}")
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


def _check_env(env: EnvVar, path: str, r: _Report) -> None:
    if not _ENV_NAME.fullmatch(env.name):
        r.error(f"{path}.name", f"Invalid value: {_show(env.name)}: a valid environment variable name must "
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
    if given[0] != "fieldRef":
        r.error(f"{path}.valueFrom.{given[0]}", "not supported by Shoal (no Secrets, ConfigMaps or resource "
                                               f"fields); use `value` or a fieldRef to {', '.join(FIELD_REFS)}")
    elif src.fieldRef.fieldPath not in FIELD_REFS:
        r.error(f"{path}.valueFrom.fieldRef.fieldPath", _unsupported(src.fieldRef.fieldPath, FIELD_REFS))


def _check_resources(res: ResourceRequirements, path: str, r: _Report) -> None:
    amounts: dict[str, dict[str, Decimal]] = {}
    for part in ("limits", "requests"):
        amounts[part] = {}
        for name, value in (getattr(res, part) or {}).items():
            qpath = f"{path}.{part}[{name}]"
            if name not in RESOURCES:
                r.error(qpath, _unsupported(name, RESOURCES))
                continue
            amount = parse_decimal(value)
            if amount < 0:
                r.error(qpath, f"Invalid value: {_show(value)}: must be greater than or equal to 0")
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
                r.error(rpath, f"Invalid value: {_show(res.requests[name])}: must be equal to {name} limit "
                               f"of {res.limits[name]}")
        elif name in limits and request > limits[name]:
            r.error(rpath, f"Invalid value: {_show(res.requests[name])}: must be less than or equal to {name} "
                           f"limit of {res.limits[name]}")


def _check_probe(probe: Probe, kind: str, path: str, port_names: set[str], r: _Report) -> None:
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
            r.error(ppath, f"Invalid value: {_show(port)}: a port number is written without quotes")
        elif port not in port_names:
            r.error(ppath, f"Invalid value: {_show(port)}: must be the name of one of the container's ports")
    if kind in ("livenessProbe", "startupProbe") and probe.successThreshold != 1:
        r.error(f"{path}.successThreshold", f"Invalid value: {probe.successThreshold}: must be 1")


def _check_affinity(aff: Affinity, path: str, r: _Report) -> None:
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
                    r.error(f"{tpath}.topologyKey", f"Invalid value: {_show(term.topologyKey)}: {why}")
            _selector(term.labelSelector, f"{tpath}.labelSelector", r)
            _selector(term.namespaceSelector, f"{tpath}.namespaceSelector", r)
            for j, ns in enumerate(term.namespaces or ()):
                why = dns_label_error(ns)
                if why:
                    r.error(f"{tpath}.namespaces[{j}]", f"Invalid value: {_show(ns)}: {why}")


def _check_node_term(term: NodeSelectorTerm, path: str, r: _Report) -> None:
    for i, expr in enumerate(term.matchExpressions or ()):
        try:
            Requirement(expr.key, expr.operator, tuple(expr.values or ()))
        except SelectorError as e:
            r.error(f"{path}.matchExpressions[{i}].{e.field}", e.message)
    for i, expr in enumerate(term.matchFields or ()):
        fpath = f"{path}.matchFields[{i}]"
        if expr.key != "metadata.name":
            r.error(f"{fpath}.key", _unsupported(expr.key, ["metadata.name"]))
        if expr.operator not in ("In", "NotIn"):
            r.error(f"{fpath}.operator", _unsupported(expr.operator, ["In", "NotIn"]))
        elif len(expr.values or ()) != 1:
            r.error(f"{fpath}.values", "Required value: must be only one value when `operator` is 'In' or "
                                       "'NotIn' for node field selector")


def _check_service(svc: Service, r: _Report) -> None:
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
                r.error(f"{ppath}.name", f"Invalid value: {_show(p.name)}: {why}")
            elif p.name in names:
                r.error(f"{ppath}.name", f"Duplicate value: {_show(p.name)}")
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
                r.error(f"{ppath}.targetPort", f"Invalid value: {_show(target)}: {why}")
        if p.nodePort is not None:
            r.warn(f"{ppath}.nodePort", "ignored by Shoal (Services are reached through `shoal gateway`)")
    annotations = svc.metadata.annotations or {}
    if TRAFFIC_SPLIT in annotations:
        try:
            parse_traffic_split(annotations[TRAFFIC_SPLIT])
        except ValueError as e:
            r.error(f"metadata.annotations[{TRAFFIC_SPLIT}]", str(e))
    if annotations.get(SCALE_TO_ZERO, "false") not in ("true", "false"):
        r.error(f"metadata.annotations[{SCALE_TO_ZERO}]", _unsupported(annotations[SCALE_TO_ZERO], ["true", "false"]))


def _check_hpa(spec: HPASpec, r: _Report) -> None:
    ref = spec.scaleTargetRef
    if ref.kind != "Deployment":
        r.error("spec.scaleTargetRef.kind", _unsupported(ref.kind, ["Deployment"]))
    if ref.apiVersion is not None and ref.apiVersion != "apps/v1":
        r.error("spec.scaleTargetRef.apiVersion", _unsupported(ref.apiVersion, ["apps/v1"]))
    why = dns_subdomain_error(ref.name)
    if why:
        r.error("spec.scaleTargetRef.name", f"Invalid value: {_show(ref.name)}: {why}")
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
            r.error(f"{spath}.name", _unsupported(source.name, ["cpu", "memory"]))
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
                r.error(f"{rpath}.tolerance", f"Invalid value: {_show(rules.tolerance)}: must be greater than "
                                              "or equal to 0")


def _check_target(target: MetricTarget, path: str, allowed: tuple[str, ...], r: _Report) -> None:
    if target.type not in allowed:
        r.error(f"{path}.type", _unsupported(target.type, allowed))
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
        r.error(f"{path}.{field}", f"Invalid value: {_show(amount)}: must be positive")


# -- defaults that depend on other fields ----------------------------------------------------

def _apply_defaults(obj: dict) -> None:
    kind, meta = obj["kind"], obj["metadata"]
    if kind in CLUSTER_SCOPED:
        meta.pop("namespace", None)
    else:
        meta.setdefault("namespace", "default")
    spec = obj.get("spec")
    if kind == "Pod":
        _default_pod_spec(spec)
    elif kind in ("Deployment", "ReplicaSet"):
        _default_pod_spec(spec["template"]["spec"])
        if kind == "Deployment" and spec["strategy"]["type"] == "RollingUpdate":
            spec["strategy"].setdefault("rollingUpdate", {"maxSurge": DEFAULT_MAX_SURGE,
                                                          "maxUnavailable": DEFAULT_MAX_UNAVAILABLE})
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


# -- small helpers ---------------------------------------------------------------------------

def _show(value: Any) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return json.dumps(value)
    return f"<{_type_name(value)}>"


def _type_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _unsupported(value: Any, supported: Any) -> str:
    return f"Unsupported value: {_show(value)}: supported values: " + ", ".join(_show(s) for s in supported)


def _unique(errors: list[FieldError]) -> list[FieldError]:
    return list(dict.fromkeys(errors))
