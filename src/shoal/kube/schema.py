"""The Kubernetes objects ``shoal apply`` accepts, as pydantic models with Kubernetes' own
camelCase field names, so that an error's location maps one to one onto the kubectl path
users know (``spec.template.spec.containers[0].resources.limits``). Shapes, types and
ranges only: the API server's cross-field rules are in ``shoal.kube.rules``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, model_validator
from pydantic_core import PydanticCustomError

from shoal.kube.jobs import DEFAULT_BACKOFF_LIMIT, UNLIMITED_BACKOFF
from shoal.kube.rollout import DEFAULT_MAX_SURGE, DEFAULT_MAX_UNAVAILABLE
from shoal.model.quantity import EXAMPLES, parse_decimal

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

def custom_error(message: str) -> PydanticCustomError:
    return PydanticCustomError("shoal", "{message}", {"message": message})


def _check_quantity(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise custom_error(f"Invalid value: {show(value)}: must be a quantity (e.g. {EXAMPLES})")
    try:
        parse_decimal(value)
    except ValueError:
        raise custom_error(f"Invalid value: {show(value)}: must be a quantity (e.g. {EXAMPLES})") from None
    return value


def _check_int_or_string(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise custom_error(f"Invalid value: {show(value)}: must be an integer or a string")
    return value


Quantity = Annotated[Any, PlainValidator(_check_quantity)]
IntOrString = Annotated[Any, PlainValidator(_check_int_or_string)]


class Model(BaseModel):
    """Strict like the API server's decoder: ``replicas: "4"`` and a label value ``1`` are errors."""

    model_config = ConfigDict(extra="forbid", strict=True)
    IGNORED: ClassVar[frozenset[str]] = frozenset()  # Kubernetes fields Shoal accepts and ignores (warned)
    SERVER_SET: ClassVar[frozenset[str]] = frozenset()  # set by the server: dropped without a word


# -- metadata --------------------------------------------------------------------------------

class ObjectMeta(Model):
    IGNORED = frozenset({"ownerReferences", "finalizers"})
    SERVER_SET = frozenset({"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
                            "deletionGracePeriodSeconds", "managedFields", "selfLink"})
    name: str | None = None
    generateName: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


# -- pods ------------------------------------------------------------------------------------

class ObjectFieldSelector(Model):
    fieldPath: str
    apiVersion: str | None = None


class SecretKeySelector(Model):
    name: str
    key: str
    optional: bool | None = None


class LocalObjectReference(Model):
    name: str


class EnvVarSource(Model):
    fieldRef: ObjectFieldSelector | None = None
    secretKeyRef: SecretKeySelector | None = None
    # Defined by Kubernetes; refused below rather than ignored, or the variable would go missing.
    configMapKeyRef: Any = None
    resourceFieldRef: Any = None


class EnvVar(Model):
    name: str
    value: str | None = None
    valueFrom: EnvVarSource | None = None


class ContainerPort(Model):
    IGNORED = frozenset({"hostIP"})
    name: str | None = None
    containerPort: int = Field(ge=1, le=65535)
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    hostPort: int | None = Field(None, ge=1, le=65535)


class ResourceRequirements(Model):
    IGNORED = frozenset({"claims"})
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class HTTPHeader(Model):
    name: str
    value: str


class HTTPGetAction(Model):
    path: str = "/"
    port: IntOrString
    host: str | None = None
    scheme: Literal["HTTP", "HTTPS"] = "HTTP"
    httpHeaders: list[HTTPHeader] | None = None


class TCPSocketAction(Model):
    port: IntOrString
    host: str | None = None


class ExecAction(Model):
    command: list[str] | None = None


class GRPCAction(Model):
    port: int
    service: str | None = None


class Probe(Model):
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


class SecurityContext(Model):
    """The user a container runs as: the container runtimes honour ``runAsUser``/``runAsGroup``
    (``--user``); the rest is accepted and ignored."""
    IGNORED = frozenset({"runAsNonRoot", "privileged", "capabilities", "allowPrivilegeEscalation",
                         "readOnlyRootFilesystem", "seccompProfile", "seLinuxOptions", "procMount",
                         "appArmorProfile", "windowsOptions", "fsGroup", "fsGroupChangePolicy", "supplementalGroups",
                         "supplementalGroupsPolicy", "sysctls", "seLinuxChangePolicy"})
    runAsUser: int | None = Field(None, ge=0)
    runAsGroup: int | None = Field(None, ge=0)


class Container(Model):
    IGNORED = frozenset({"volumeMounts", "volumeDevices", "lifecycle", "envFrom", "stdin",
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
    securityContext: SecurityContext | None = None


class NodeSelectorRequirement(Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] | None = None


class NodeSelectorTerm(Model):
    matchExpressions: list[NodeSelectorRequirement] | None = None
    matchFields: list[NodeSelectorRequirement] | None = None


class NodeSelector(Model):
    nodeSelectorTerms: list[NodeSelectorTerm]


class PreferredSchedulingTerm(Model):
    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(Model):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None
    preferredDuringSchedulingIgnoredDuringExecution: list[PreferredSchedulingTerm] | None = None


class LabelSelectorRequirement(Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelectorSpec(Model):
    matchLabels: dict[str, str] | None = None
    matchExpressions: list[LabelSelectorRequirement] | None = None


class PodAffinityTerm(Model):
    IGNORED = frozenset({"matchLabelKeys", "mismatchLabelKeys"})
    topologyKey: str
    labelSelector: LabelSelectorSpec | None = None
    namespaces: list[str] | None = None
    namespaceSelector: LabelSelectorSpec | None = None


class WeightedPodAffinityTerm(Model):
    weight: int = Field(ge=1, le=100)
    podAffinityTerm: PodAffinityTerm


class PodAffinity(Model):
    requiredDuringSchedulingIgnoredDuringExecution: list[PodAffinityTerm] | None = None
    preferredDuringSchedulingIgnoredDuringExecution: list[WeightedPodAffinityTerm] | None = None


class Affinity(Model):
    nodeAffinity: NodeAffinity | None = None
    podAffinity: PodAffinity | None = None
    podAntiAffinity: PodAffinity | None = None


class TolerationSpec(Model):
    key: str | None = None
    operator: Literal["Equal", "Exists"] | None = None
    value: str | None = None
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


class PodSpec(Model):
    IGNORED = frozenset({
        "initContainers", "ephemeralContainers", "volumes", "serviceAccountName", "serviceAccount",
        "automountServiceAccountToken", "hostNetwork", "hostPID",
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
    securityContext: SecurityContext | None = None
    imagePullSecrets: list[LocalObjectReference] | None = None


class PodTemplateSpec(Model):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec


# -- workloads -------------------------------------------------------------------------------

class RollingUpdateDeployment(Model):
    maxSurge: IntOrString = DEFAULT_MAX_SURGE
    maxUnavailable: IntOrString = DEFAULT_MAX_UNAVAILABLE


class DeploymentStrategy(Model):
    type: Literal["RollingUpdate", "Recreate"] = "RollingUpdate"
    rollingUpdate: RollingUpdateDeployment | None = None


class DeploymentSpec(Model):
    replicas: int = Field(1, ge=0)
    selector: LabelSelectorSpec
    template: PodTemplateSpec
    strategy: DeploymentStrategy = Field(default_factory=DeploymentStrategy)
    minReadySeconds: int = Field(0, ge=0)
    revisionHistoryLimit: int = Field(10, ge=0)
    progressDeadlineSeconds: int = Field(600, ge=1)
    paused: bool = False


class ReplicaSetSpec(Model):
    replicas: int = Field(1, ge=0)
    selector: LabelSelectorSpec
    template: PodTemplateSpec
    minReadySeconds: int = Field(0, ge=0)


class PodFailurePolicyOnExitCodes(Model):
    containerName: str | None = None
    operator: Literal["In", "NotIn"]
    values: list[int] = Field(min_length=1, max_length=255)


class PodFailurePolicyOnPodCondition(Model):
    type: str = Field(min_length=1)
    status: Literal["True", "False", "Unknown"] = "True"


class PodFailurePolicyRule(Model):
    action: Literal["FailJob", "FailIndex", "Ignore", "Count"]  # FailIndex: with backoffLimitPerIndex
    onExitCodes: PodFailurePolicyOnExitCodes | None = None
    onPodConditions: list[PodFailurePolicyOnPodCondition] | None = Field(None, max_length=20)


class PodFailurePolicy(Model):
    rules: list[PodFailurePolicyRule] = Field(max_length=20)


class JobSpec(Model):
    IGNORED = frozenset({"podReplacementPolicy", "successPolicy", "manualSelector", "managedBy"})
    template: PodTemplateSpec
    podFailurePolicy: PodFailurePolicy | None = None
    completions: int | None = Field(None, ge=0)
    parallelism: int = Field(1, ge=0)
    completionMode: Literal["NonIndexed", "Indexed"] = "NonIndexed"
    # Defaulted as the API server does: 6, or no limit (2^31-1) with backoffLimitPerIndex.
    backoffLimit: int | None = Field(None, ge=0)
    backoffLimitPerIndex: int | None = Field(None, ge=0)
    maxFailedIndexes: int | None = Field(None, ge=0)
    activeDeadlineSeconds: int | None = Field(None, ge=1)
    ttlSecondsAfterFinished: int | None = Field(None, ge=0)
    suspend: bool = False
    selector: LabelSelectorSpec | None = None

    @model_validator(mode="after")
    def _default_backoff_limit(self) -> "JobSpec":
        if self.backoffLimit is None:
            self.backoffLimit = DEFAULT_BACKOFF_LIMIT if self.backoffLimitPerIndex is None else UNLIMITED_BACKOFF
        return self


# -- services --------------------------------------------------------------------------------

class ServicePort(Model):
    IGNORED = frozenset({"appProtocol"})
    name: str | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    port: int = Field(ge=1, le=65535)
    targetPort: IntOrString | None = None
    nodePort: int | None = Field(None, ge=1, le=65535)


class ServiceSpec(Model):
    IGNORED = frozenset({
        "clusterIP", "clusterIPs", "externalIPs", "externalName", "sessionAffinity", "sessionAffinityConfig",
        "loadBalancerIP", "loadBalancerSourceRanges", "loadBalancerClass", "externalTrafficPolicy",
        "internalTrafficPolicy", "ipFamilies", "ipFamilyPolicy", "healthCheckNodePort",
        "publishNotReadyAddresses", "allocateLoadBalancerNodePorts", "trafficDistribution"})
    selector: dict[str, str] | None = None
    ports: list[ServicePort] | None = None
    type: Literal["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"] = "ClusterIP"


# -- autoscaling -----------------------------------------------------------------------------

class CrossVersionObjectReference(Model):
    apiVersion: str | None = None
    kind: str
    name: str


class MetricTarget(Model):
    type: Literal["Utilization", "Value", "AverageValue"]
    value: Quantity | None = None
    averageValue: Quantity | None = None
    averageUtilization: int | None = None


class MetricIdentifier(Model):
    name: str
    selector: LabelSelectorSpec | None = None


class ResourceMetricSource(Model):
    name: str
    target: MetricTarget


class ContainerResourceMetricSource(Model):
    name: str
    container: str
    target: MetricTarget


class PodsMetricSource(Model):
    metric: MetricIdentifier
    target: MetricTarget


class ObjectMetricSource(Model):
    describedObject: CrossVersionObjectReference
    metric: MetricIdentifier
    target: MetricTarget


class ExternalMetricSource(Model):
    metric: MetricIdentifier
    target: MetricTarget


class MetricSpec(Model):
    type: Literal["Resource", "Pods", "Object", "External", "ContainerResource"]
    resource: ResourceMetricSource | None = None
    pods: PodsMetricSource | None = None
    object: ObjectMetricSource | None = None
    external: ExternalMetricSource | None = None
    containerResource: ContainerResourceMetricSource | None = None


class HPAScalingPolicy(Model):
    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1)
    periodSeconds: int = Field(ge=1, le=1800)


class HPAScalingRules(Model):
    stabilizationWindowSeconds: int | None = Field(None, ge=0, le=3600)
    selectPolicy: Literal["Max", "Min", "Disabled"] | None = None
    policies: list[HPAScalingPolicy] | None = None
    tolerance: Quantity | None = None


class HPABehavior(Model):
    scaleUp: HPAScalingRules | None = None
    scaleDown: HPAScalingRules | None = None


class HPASpec(Model):
    scaleTargetRef: CrossVersionObjectReference
    minReplicas: int = Field(1, ge=0)  # 0: scale to zero (Kubernetes' HPAScaleToZero, opt-in here too)
    maxReplicas: int = Field(ge=1)
    metrics: list[MetricSpec] | None = None
    behavior: HPABehavior | None = None


# -- top-level objects -----------------------------------------------------------------------

class KubeObject(Model):
    SERVER_SET = frozenset({"status"})
    apiVersion: str
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


class NamespaceSpec(Model):
    IGNORED = frozenset({"finalizers"})


class Namespace(KubeObject):
    spec: NamespaceSpec | None = None


class Pod(KubeObject):
    spec: PodSpec


class Deployment(KubeObject):
    spec: DeploymentSpec


class ReplicaSet(KubeObject):
    spec: ReplicaSetSpec


class Service(KubeObject):
    spec: ServiceSpec


class Job(KubeObject):
    """A batch/v1 Job: pods run to completion (docs/KUBERNETES-API.md)."""

    spec: JobSpec


class HorizontalPodAutoscaler(KubeObject):
    spec: HPASpec


class PriorityClass(KubeObject):
    value: int
    globalDefault: bool = False
    preemptionPolicy: Literal["PreemptLowerPriority", "Never"] = "PreemptLowerPriority"
    description: str | None = None


SECRET_TYPES = ("Opaque", "kubernetes.io/dockerconfigjson", "kubernetes.io/dockercfg", "kubernetes.io/basic-auth",
                "kubernetes.io/ssh-auth", "kubernetes.io/tls", "kubernetes.io/service-account-token",
                "bootstrap.kubernetes.io/token")


class Secret(KubeObject):
    """A v1 Secret: ``data`` values base64, ``stringData`` merged into it on write (and not
    kept), as the API server does. No spec and no status."""

    type: str = "Opaque"
    data: dict[str, str] | None = None
    stringData: dict[str, str] | None = None
    immutable: bool | None = None


class Subject(Model):
    """Who a RoleBinding grants to: a user or a group (as on their Shoal token)."""

    kind: Literal["User", "Group"]
    name: str = Field(min_length=1, max_length=64)
    apiGroup: Literal["rbac.authorization.k8s.io"] = "rbac.authorization.k8s.io"


class RoleRef(Model):
    """Kubernetes' user-facing ClusterRoles: view (read), edit (read and change), admin (edit
    plus the namespace's RoleBindings)."""

    apiGroup: Literal["rbac.authorization.k8s.io"] = "rbac.authorization.k8s.io"
    kind: Literal["ClusterRole"]
    name: Literal["view", "edit", "admin"]


class RoleBinding(KubeObject):
    subjects: list[Subject] = Field(default_factory=list)
    roleRef: RoleRef


KINDS: dict[tuple[str, str], type[KubeObject]] = {
    ("v1", "Namespace"): Namespace,
    ("v1", "Pod"): Pod,
    ("v1", "Service"): Service,
    ("apps/v1", "Deployment"): Deployment,
    ("apps/v1", "ReplicaSet"): ReplicaSet,
    ("autoscaling/v2", "HorizontalPodAutoscaler"): HorizontalPodAutoscaler,
    ("scheduling.k8s.io/v1", "PriorityClass"): PriorityClass,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): RoleBinding,
    ("batch/v1", "Job"): Job,
    ("v1", "Secret"): Secret,
}
CLUSTER_SCOPED = frozenset({"Namespace", "PriorityClass"})



# -- small helpers ---------------------------------------------------------------------------

def show(value: Any) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return json.dumps(value)
    return f"<{type_name(value)}>"


def type_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def unsupported(value: Any, supported: Any) -> str:
    return f"Unsupported value: {show(value)}: supported values: " + ", ".join(show(s) for s in supported)


def unique(errors: list[FieldError]) -> list[FieldError]:
    return list(dict.fromkeys(errors))
