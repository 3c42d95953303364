"""Manifests as `shoal apply -f` reads them: what Kubernetes accepts, what it refuses (with the
path and words kubectl would use), and the defaults it fills in."""

import copy
import json

import pytest

from shoal.kube.manifest import load_documents, pod_resources, validate
from shoal.kube.rules import parse_traffic_split
from shoal.kube.schema import FieldError, ManifestError

VLLM = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm-llama-70b
spec:
  replicas: 4
  selector:
    matchLabels:
      app: vllm
  template:
    metadata:
      labels:
        app: vllm
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai:latest
        args: ["--model", "meta-llama/Llama-3.1-70B", "--tensor-parallel-size", "4"]
        resources:
          limits:
            nvidia.com/gpu: 4
            memory: "200Gi"
          requests:
            nvidia.com/gpu: 4
            memory: "200Gi"
        ports:
        - containerPort: 8000
      nodeSelector:
        nvidia.com/gpu.product: "NVIDIA-H100-SXM"
      tolerations:
      - key: "nvidia.com/gpu"
        operator: "Exists"
        effect: "NoSchedule"
"""


def vllm() -> dict:
    return load_documents(VLLM)[0]


def errors_of(doc) -> list[tuple[str, str]]:
    with pytest.raises(ManifestError) as e:
        validate(doc)
    return [(fe.path, fe.message) for fe in e.value.errors]


# -- the issue's vLLM Deployment -------------------------------------------------------------

def test_the_vllm_deployment_validates_with_kubernetes_defaults_filled_in():
    obj, warnings = validate(vllm())
    assert warnings == []
    assert obj == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vllm-llama-70b", "namespace": "default"},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "vllm"}},
            "template": {
                "metadata": {"labels": {"app": "vllm"}},
                "spec": {
                    "containers": [{
                        "name": "vllm",
                        "image": "vllm/vllm-openai:latest",
                        "args": ["--model", "meta-llama/Llama-3.1-70B", "--tensor-parallel-size", "4"],
                        "ports": [{"containerPort": 8000, "protocol": "TCP"}],
                        "resources": {"limits": {"nvidia.com/gpu": 4, "memory": "200Gi"},
                                      "requests": {"nvidia.com/gpu": 4, "memory": "200Gi"}},
                        "imagePullPolicy": "Always",
                    }],
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 30,
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-SXM"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "schedulerName": "default-scheduler",
                },
            },
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "minReadySeconds": 0,
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": 600,
            "paused": False,
        },
    }
    json.dumps(obj)  # plain data, ready for the store


def test_the_vllm_pod_needs_four_gpus_200gi_and_port_8000():
    obj, _ = validate(vllm())
    assert pod_resources(obj["spec"]["template"]["spec"]) == {"gpus": 4, "cpus": 0.0, "memory_mb": 204800,
                                                             "ports": [8000]}


def test_validate_leaves_its_input_alone():
    doc = vllm()
    before = copy.deepcopy(doc)
    validate(doc)
    assert doc == before


# -- refused manifests: path and message as kubectl would print them -------------------------

def _container(doc):
    return doc["spec"]["template"]["spec"]["containers"][0]


C0 = "spec.template.spec.containers[0]"
BAD = [
    ("fractional GPUs", lambda d: _container(d)["resources"]["limits"].update({"nvidia.com/gpu": 1.5}),
     [(f"{C0}.resources.limits[nvidia.com/gpu]", "must be a whole number of GPUs")]),
    ("GPU request differs from limit", lambda d: _container(d)["resources"]["requests"].update({"nvidia.com/gpu": 2}),
     [(f"{C0}.resources.requests[nvidia.com/gpu]", "Invalid value: 2: must be equal to nvidia.com/gpu limit of 4")]),
    ("GPU request without a limit", lambda d: _container(d)["resources"].pop("limits"),
     [(f"{C0}.resources.limits[nvidia.com/gpu]",
       "Required value: Limit must be set for non overcommitable resources")]),
    ("cpu request above limit", lambda d: _container(d)["resources"].update(
        {"limits": {"cpu": "1"}, "requests": {"cpu": "1500m"}}),
     [(f"{C0}.resources.requests[cpu]", 'Invalid value: "1500m": must be less than or equal to cpu limit of 1')]),
    ("not a quantity", lambda d: _container(d)["resources"]["limits"].update({"memory": "200Gx"}),
     [(f"{C0}.resources.limits[memory]", 'Invalid value: "200Gx": must be a quantity (e.g. 500m, 2, 200Gi)')]),
    ("a resource Shoal cannot give", lambda d: _container(d)["resources"]["limits"].update({"amd.com/gpu": 1}),
     [(f"{C0}.resources.limits[amd.com/gpu]", 'Unsupported value: "amd.com/gpu": supported values: "cpu", '
                                              '"memory", "nvidia.com/gpu", "ephemeral-storage"')]),
    ("selector does not match the template", lambda d: d["spec"]["template"]["metadata"].update(
        {"labels": {"app": "other"}}),
     [("spec.template.metadata.labels", "`selector` does not match template `labels`")]),
    ("empty selector", lambda d: d["spec"].update({"selector": {}}),
     [("spec.selector", "Invalid value: {}: empty selector is invalid for deployment")]),
    ("no selector", lambda d: d["spec"].pop("selector"), [("spec.selector", "Required value")]),
    ("replicas as a string", lambda d: d["spec"].update({"replicas": "4"}),
     [("spec.replicas", 'Invalid value: "4": must be an integer')]),
    ("negative replicas", lambda d: d["spec"].update({"replicas": -1}),
     [("spec.replicas", "Invalid value: -1: must be greater than or equal to 0")]),
    ("bad name", lambda d: d["metadata"].update({"name": "VLLM_70b"}),
     [("metadata.name", 'Invalid value: "VLLM_70b": a lowercase RFC 1123 subdomain must consist of lower case '
                        "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                        "character (e.g. 'example.com')")]),
    ("no name", lambda d: d["metadata"].pop("name"),
     [("metadata.name", "Required value: name or generateName is required")]),
    ("label value too long", lambda d: d["metadata"].update({"labels": {"team": "x" * 64}}),
     [("metadata.labels[team]", "must be no more than 63 characters")]),
    ("label value not a string", lambda d: d["metadata"].update({"labels": {"version": 2}}),
     [("metadata.labels[version]", "Invalid value: 2: must be a string")]),
    ("bad label key", lambda d: d["metadata"].update({"labels": {"-team": "x"}}),
     [("metadata.labels[-team]", "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                                 "start and end with an alphanumeric character (e.g. 'MyName', or 'my.name', "
                                 "or '123-abc')")]),
    ("both fenceposts zero", lambda d: d["spec"].update(
        {"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}}),
     [("spec.strategy.rollingUpdate.maxUnavailable", 'Invalid value: "0%": may not be 0 when `maxSurge` is 0')]),
    ("unavailable above 100%", lambda d: d["spec"].update(
        {"strategy": {"rollingUpdate": {"maxUnavailable": "150%"}}}),
     [("spec.strategy.rollingUpdate.maxUnavailable", 'Invalid value: "150%": must not be greater than 100%')]),
    ("surge not a percent", lambda d: d["spec"].update({"strategy": {"rollingUpdate": {"maxSurge": "two"}}}),
     [("spec.strategy.rollingUpdate.maxSurge",
       "Invalid value: \"two\": must be an integer or a percentage (e.g. '25%')")]),
    ("Recreate with rollingUpdate", lambda d: d["spec"].update(
        {"strategy": {"type": "Recreate", "rollingUpdate": {"maxSurge": 1}}}),
     [("spec.strategy.rollingUpdate", "Forbidden: may not be specified when strategy `type` is 'Recreate'")]),
    ("unknown strategy", lambda d: d["spec"].update({"strategy": {"type": "BlueGreen"}}),
     [("spec.strategy.type", 'Unsupported value: "BlueGreen": supported values: "RollingUpdate", "Recreate"')]),
    ("restartPolicy Never in a Deployment", lambda d: d["spec"]["template"]["spec"].update({"restartPolicy": "Never"}),
     [("spec.template.spec.restartPolicy", 'Unsupported value: "Never": supported values: "Always"')]),
    ("deadline within minReadySeconds", lambda d: d["spec"].update({"minReadySeconds": 600}),
     [("spec.progressDeadlineSeconds", "Invalid value: 600: must be greater than minReadySeconds")]),
    ("no containers", lambda d: d["spec"]["template"]["spec"].update({"containers": []}),
     [("spec.template.spec.containers", "Required value")]),
    ("no image", lambda d: _container(d).pop("image"), [(f"{C0}.image", "Required value")]),
    ("duplicate container", lambda d: d["spec"]["template"]["spec"]["containers"].append(
        {"name": "vllm", "image": "busybox"}),
     [("spec.template.spec.containers[1].name", 'Duplicate value: "vllm"')]),
    ("two pods' worth of one port", lambda d: _container(d)["ports"].append({"containerPort": 8000}),
     [(f"{C0}.ports[1].containerPort", "Duplicate value: 8000/TCP (Shoal pods use the node's network)")]),
    ("hostPort elsewhere", lambda d: _container(d)["ports"][0].update({"hostPort": 80}),
     [(f"{C0}.ports[0].hostPort", "Invalid value: 80: must match `containerPort` (Shoal pods use the node's "
                                  "network)")]),
    ("port out of range", lambda d: _container(d)["ports"][0].update({"containerPort": 70000}),
     [(f"{C0}.ports[0].containerPort", "Invalid value: 70000: must be less than or equal to 65535")]),
    ("probe on a port name the container lacks", lambda d: _container(d).update(
        {"readinessProbe": {"httpGet": {"path": "/health", "port": "http"}}}),
     [(f"{C0}.readinessProbe.httpGet.port",
       "Invalid value: \"http\": must be the name of one of the container's ports")]),
    ("probe with two handlers", lambda d: _container(d).update(
        {"livenessProbe": {"httpGet": {"port": 8000}, "tcpSocket": {"port": 8000}}}),
     [(f"{C0}.livenessProbe.tcpSocket", "Forbidden: may not specify more than 1 handler type")]),
    ("probe without a handler", lambda d: _container(d).update({"startupProbe": {"periodSeconds": 5}}),
     [(f"{C0}.startupProbe", "Required value: must specify a handler type")]),
    ("liveness successThreshold", lambda d: _container(d).update(
        {"livenessProbe": {"tcpSocket": {"port": 8000}, "successThreshold": 2}}),
     [(f"{C0}.livenessProbe.successThreshold", "Invalid value: 2: must be 1")]),
    ("probe period zero", lambda d: _container(d).update(
        {"readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 0}}),
     [(f"{C0}.readinessProbe.periodSeconds", "Invalid value: 0: must be greater than or equal to 1")]),
    ("grpc probe", lambda d: _container(d).update({"readinessProbe": {"grpc": {"port": 9000}}}),
     [(f"{C0}.readinessProbe.grpc", "not supported by Shoal: use httpGet, tcpSocket or exec")]),
    ("env value a number", lambda d: _container(d).update({"env": [{"name": "TP", "value": 4}]}),
     [(f"{C0}.env[0].value", "Invalid value: 4: must be a string")]),
    ("env from a ConfigMap", lambda d: _container(d).update(
        {"env": [{"name": "HF_TOKEN", "valueFrom": {"configMapKeyRef": {"name": "hf", "key": "token"}}}]}),
     [(f"{C0}.env[0].valueFrom.configMapKeyRef",
       "not supported by Shoal (no ConfigMaps or resource fields); use `value`, a secretKeyRef or a fieldRef to "
       "metadata.name, metadata.namespace, metadata.uid, spec.nodeName, status.podIP, status.hostIP")]),
    ("env from a Secret key no Secret may have", lambda d: _container(d).update(
        {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "to ken"}}}]}),
     [(f"{C0}.env[0].valueFrom.secretKeyRef.key",
       "Invalid value: \"to ken\": a valid config key must consist of alphanumeric characters, '-', '_' or '.'")]),
    ("env fieldRef Shoal cannot fill", lambda d: _container(d).update(
        {"env": [{"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}}]}),
     [(f"{C0}.env[0].valueFrom.fieldRef.fieldPath",
       'Unsupported value: "spec.serviceAccountName": supported values: "metadata.name", "metadata.namespace", '
       '"metadata.uid", "spec.nodeName", "status.podIP", "status.hostIP"')]),
    ("env name", lambda d: _container(d).update({"env": [{"name": "1X", "value": "y"}]}),
     [(f"{C0}.env[0].name", "Invalid value: \"1X\": a valid environment variable name must consist of alphabetic "
                            "characters, digits, '_', '-', or '.', and must not start with a digit")]),
    ("toleration without key must be Exists", lambda d: d["spec"]["template"]["spec"]["tolerations"].append(
        {"operator": "Equal", "value": "x"}),
     [("spec.template.spec.tolerations[1].operator",
       'Invalid value: "Equal": operator must be Exists when `key` is empty, which means "match all values and '
       'all keys"')]),
    ("toleration effect", lambda d: d["spec"]["template"]["spec"]["tolerations"][0].update({"effect": "NoRun"}),
     [("spec.template.spec.tolerations[0].effect", 'Unsupported value: "NoRun": supported values: "", '
                                                   '"NoSchedule", "PreferNoSchedule", "NoExecute"')]),
    ("node affinity Gt on a word", lambda d: d["spec"]["template"]["spec"].update({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["four"]}]}]}}}}),
     [("spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
       "nodeSelectorTerms[0].matchExpressions[0].values[0]", 'Invalid value: "four": must be an integer')]),
    ("no node selector terms", lambda d: d["spec"]["template"]["spec"].update({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}),
     [("spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
       "nodeSelectorTerms", "Required value: must have at least one node selector term")]),
    ("preferred weight", lambda d: d["spec"]["template"]["spec"].update({"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 101, "preference": {}}]}}}),
     [("spec.template.spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
       "Invalid value: 101: must be less than or equal to 100")]),
    ("anti-affinity without topologyKey", lambda d: d["spec"]["template"]["spec"].update({"affinity": {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "vllm"}}, "topologyKey": ""}]}}}),
     [("spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]."
       "topologyKey", "Required value: can not be empty")]),
    ("runtime Shoal lacks", lambda d: d["spec"]["template"]["spec"].update({"runtimeClassName": "gvisor"}),
     [("spec.template.spec.runtimeClassName", 'Unsupported value: "gvisor": supported values: "process", "podman", '
                                              '"docker", "enroot", "apptainer"')]),
    ("a mapping where a list goes", lambda d: d["spec"]["template"]["spec"].update({"containers": {"name": "x"}}),
     [("spec.template.spec.containers", "Invalid value: <mapping>: must be a list")]),
]


@pytest.mark.parametrize("change, expected", [(c, e) for _, c, e in BAD], ids=[n for n, _, _ in BAD])
def test_bad_deployments_are_refused_with_kubectl_paths(change, expected):
    doc = vllm()
    change(doc)
    assert errors_of(doc) == expected


def test_every_problem_is_reported_at_once():
    doc = vllm()
    doc["spec"]["replicas"] = "four"
    doc["spec"]["selector"]["matchLabels"]["app"] = 7
    _container(doc)["ports"][0]["protocol"] = "HTTP"
    assert errors_of(doc) == [
        ("spec.replicas", 'Invalid value: "four": must be an integer'),
        ("spec.selector.matchLabels[app]", "Invalid value: 7: must be a string"),
        (f"{C0}.ports[0].protocol", 'Unsupported value: "HTTP": supported values: "TCP", "UDP", "SCTP"'),
    ]


def test_no_pydantic_wording_ever_reaches_the_user():
    for _, change, _ in BAD:
        doc = vllm()
        change(doc)
        with pytest.raises(ManifestError) as e:
            validate(doc)
        text = str(e.value)
        for leak in ("Input should", "pydantic", "validation error", "type=", "For further information"):
            assert leak not in text


# -- unknown and ignored fields --------------------------------------------------------------

def test_a_misspelt_field_is_an_unknown_field_as_with_validate_strict():
    doc = vllm()
    doc["spec"]["replica"] = 3
    _container(doc)["imagePullPolcy"] = "Always"
    assert errors_of(doc) == [
        (f"{C0}.imagePullPolcy", f'unknown field "{C0}.imagePullPolcy"'),
        ("spec.replica", 'unknown field "spec.replica"'),
    ]


def test_kubernetes_fields_shoal_ignores_are_warnings_and_left_out():
    doc = vllm()
    _container(doc)["securityContext"] = {"runAsUser": 1000, "privileged": True}
    _container(doc)["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
    doc["spec"]["template"]["spec"]["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    doc["spec"]["template"]["spec"]["serviceAccountName"] = "vllm"
    doc["spec"]["template"]["spec"]["initContainers"] = [{"name": "download", "image": "busybox"}]
    obj, warnings = validate(doc)
    assert warnings == [
        f"{C0}.securityContext.privileged: ignored by Shoal",
        f"{C0}.volumeMounts: ignored by Shoal",
        "spec.template.spec.volumes: ignored by Shoal",
        "spec.template.spec.serviceAccountName: ignored by Shoal",
        "spec.template.spec.initContainers: ignored by Shoal",
    ]
    assert obj["spec"]["template"]["spec"]["containers"][0]["securityContext"] == {"runAsUser": 1000}
    assert "volumes" not in obj["spec"]["template"]["spec"]


def test_an_object_read_back_from_the_server_applies_again():
    obj, _ = validate(vllm())
    obj["metadata"].update({"uid": "1234", "resourceVersion": "7", "generation": 2,
                            "creationTimestamp": "2026-12-02T19:00:00Z"})
    obj["status"] = {"replicas": 4, "conditions": []}
    again, warnings = validate(obj)
    assert warnings == []
    assert again == validate(vllm())[0]


# -- loading files ---------------------------------------------------------------------------

def test_multi_document_file_with_empty_documents_json_and_a_list():
    text = VLLM + """\
---
# a comment-only document is skipped
---
apiVersion: v1
kind: Service
metadata:
  name: llm
  annotations:
    shoal.io/traffic-split: "vllm-llama-70b=100"
spec:
  selector: {app: vllm}
  ports:
  - name: http
    port: 80
    targetPort: 8000
---
{"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "llm"},
 "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-llama-70b"},
          "minReplicas": 1, "maxReplicas": 8}}
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Namespace, metadata: {name: team-a}}
- {apiVersion: scheduling.k8s.io/v1, kind: PriorityClass, metadata: {name: serving}, value: 1000}
"""
    docs = load_documents(text)
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "HorizontalPodAutoscaler", "Namespace",
                                         "PriorityClass"]
    for doc in docs:
        validate(doc)


def test_a_json_file():
    doc = json.dumps(vllm())
    assert load_documents(doc) == [vllm()]


def test_yaml_syntax_error_names_the_line():
    text = VLLM.replace("  replicas: 4\n", "  replicas: 4\n   bad: [\n")
    with pytest.raises(ManifestError) as e:
        load_documents(text)
    [err] = e.value.errors
    assert err.path == ""
    assert err.message.startswith("YAML syntax error at line 7, column ")


def test_a_tab_indent_is_a_syntax_error_with_its_line():
    with pytest.raises(ManifestError, match=r"^YAML syntax error at line 3, column \d+: "):
        load_documents("apiVersion: v1\nkind: Namespace\n\tmetadata: {}\n")


def test_a_duplicate_key_is_refused_with_its_line():
    text = VLLM.replace("  replicas: 4\n", "  replicas: 4\n  replicas: 5\n")
    with pytest.raises(ManifestError) as e:
        load_documents(text)
    assert e.value.errors == [FieldError("", "line 7: duplicate field 'replicas'")]


def test_a_document_that_is_not_an_object():
    with pytest.raises(ManifestError, match="document 2 is a list, not an object"):
        load_documents("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n- 1\n- 2\n")


def test_timestamps_stay_strings():
    [doc] = load_documents("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n"
                           "  creationTimestamp: 2026-12-02T19:00:00Z\n")
    assert doc["metadata"]["creationTimestamp"] == "2026-12-02T19:00:00Z"


# -- kinds -----------------------------------------------------------------------------------

def test_unsupported_kind_lists_what_is_supported():
    assert errors_of({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "x"}}) == [
        ("kind", 'Unsupported value: "apps/v1 StatefulSet": supported kinds: v1 Namespace, v1 Pod, v1 Service, '
                 "apps/v1 Deployment, apps/v1 ReplicaSet, autoscaling/v2 HorizontalPodAutoscaler, "
                 "scheduling.k8s.io/v1 PriorityClass, rbac.authorization.k8s.io/v1 RoleBinding, batch/v1 Job, "
                 "v1 Secret"),
    ]
    assert errors_of({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler"}) == [
        ("apiVersion", 'Unsupported value: "autoscaling/v1": HorizontalPodAutoscaler is served as autoscaling/v2'),
    ]
    assert errors_of({"metadata": {"name": "x"}}) == [("apiVersion", "Required value"), ("kind", "Required value")]


def test_a_bare_pod_gets_pod_defaults_and_probe_defaults():
    obj, _ = validate({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe-me", "namespace": "team-a"},
        "spec": {"restartPolicy": "OnFailure", "containers": [{
            "name": "server", "image": "python:3.12", "command": ["python", "-m", "http.server"],
            "ports": [{"name": "http", "containerPort": 8000}],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "500m"}},
            "readinessProbe": {"httpGet": {"port": "http"}},
            "livenessProbe": {"exec": {"command": ["true"]}, "initialDelaySeconds": 5},
        }]},
    })
    c = obj["spec"]["containers"][0]
    assert obj["metadata"]["namespace"] == "team-a"
    assert obj["spec"]["restartPolicy"] == "OnFailure"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["resources"] == {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "500m", "memory": "4Gi"}}
    assert c["readinessProbe"] == {"httpGet": {"path": "/", "port": "http", "scheme": "HTTP"},
                                   "initialDelaySeconds": 0, "timeoutSeconds": 1, "periodSeconds": 10,
                                   "successThreshold": 1, "failureThreshold": 3}
    assert c["livenessProbe"]["initialDelaySeconds"] == 5
    assert pod_resources(obj["spec"]) == {"gpus": 0, "cpus": 0.5, "memory_mb": 4096, "ports": [8000]}


@pytest.mark.parametrize("image, policy", [
    ("vllm/vllm-openai", "Always"), ("vllm/vllm-openai:latest", "Always"), ("vllm/vllm-openai:v0.6.3", "IfNotPresent"),
    ("localhost:5000/model", "Always"), ("localhost:5000/model:1", "IfNotPresent"),
    ("nvcr.io/nvidia/tritonserver@sha256:abc", "IfNotPresent"),
])
def test_image_pull_policy_defaults_by_tag(image, policy):
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": image}]}}
    assert validate(doc)[0]["spec"]["containers"][0]["imagePullPolicy"] == policy


def test_pod_resources_sums_containers_and_falls_back_to_limits():
    spec = {"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": 2, "cpu": "4", "memory": "1G"}},
         "ports": [{"containerPort": 8000}]},
        {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "1"}},
         "ports": [{"containerPort": 9000}, {"containerPort": 8000}]},
        {"name": "c"},
    ]}
    assert pod_resources(spec) == {"gpus": 2, "cpus": 4.25, "memory_mb": 954 + 512, "ports": [8000, 9000]}


def test_a_service_gets_target_port_from_port_and_warns_about_node_ports():
    obj, warnings = validate({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "llm"},
        "spec": {"type": "NodePort", "selector": {"app": "vllm"},
                 "ports": [{"name": "http", "port": 8000, "nodePort": 30080}, {"name": "metrics", "port": 9090,
                                                                              "targetPort": "metrics"}]},
    })
    assert obj["spec"]["ports"] == [
        {"name": "http", "protocol": "TCP", "port": 8000, "targetPort": 8000, "nodePort": 30080},
        {"name": "metrics", "protocol": "TCP", "port": 9090, "targetPort": "metrics"},
    ]
    assert warnings == ["spec.type: NodePort is served like ClusterIP, through `shoal gateway`",
                        "spec.ports[0].nodePort: ignored by Shoal (Services are reached through `shoal gateway`)"]


@pytest.mark.parametrize("spec, meta, expected", [
    ({"selector": {"app": "x"}}, {}, [("spec.ports", "Required value")]),
    ({"selector": {"app": "x"}, "ports": [{"port": 80}, {"port": 81}]}, {},
     [("spec.ports[0].name", "Required value"), ("spec.ports[1].name", "Required value")]),
    ({"selector": {"app": "x"}, "ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}, {},
     [("spec.ports[1].name", 'Duplicate value: "a"')]),
    ({"selector": {"app": "x"}, "ports": [{"port": 80, "targetPort": "Web_Port"}]}, {},
     [("spec.ports[0].targetPort", "Invalid value: \"Web_Port\": must contain only lower case alphanumeric "
                                   "characters and '-', must not start or end with '-' nor contain '--'")]),
    ({"type": "ExternalName", "selector": {"app": "x"}, "ports": [{"port": 80}]}, {},
     [("spec.type", "not supported by Shoal: a Service routes to its pods through `shoal gateway`")]),
    ({"selector": {"app": "x"}, "ports": [{"port": 80}]}, {"annotations": {"shoal.io/traffic-split": "v1=90,v2"}},
     [("metadata.annotations[shoal.io/traffic-split]",
       "Invalid value: 'v1=90,v2': expected DEPLOYMENT=WEIGHT,... (e.g. llm-v1=90,llm-v2=10)")]),
    ({"selector": {"app": "x"}, "ports": [{"port": 80}]}, {"annotations": {"shoal.io/scale-to-zero": "yes"}},
     [("metadata.annotations[shoal.io/scale-to-zero]", 'Unsupported value: "yes": supported values: "true", '
                                                       '"false"')]),
])
def test_bad_services(spec, meta, expected):
    assert errors_of({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llm", **meta}, "spec": spec}) \
        == expected


def test_a_service_name_is_a_dns_1035_label():
    doc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "7llm"},
           "spec": {"selector": {"app": "x"}, "ports": [{"port": 80}]}}
    [(path, message)] = errors_of(doc)
    assert path == "metadata.name" and "a DNS-1035 label" in message


def test_traffic_split_weights():
    assert parse_traffic_split("llm-v1=90,llm-v2=10") == {"llm-v1": 90, "llm-v2": 10}
    with pytest.raises(ValueError, match="at least one weight"):
        parse_traffic_split("a=0,b=0")


def test_an_hpa_gets_the_cpu_default_and_kubernetes_default_behavior():
    obj, _ = validate({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                       "metadata": {"name": "llm"},
                       "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
                                "maxReplicas": 10}})
    assert obj["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
        "minReplicas": 1, "maxReplicas": 10,
        "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                               "averageUtilization": 80}}}],
        "behavior": {
            "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                        "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                                     {"type": "Percent", "value": 100, "periodSeconds": 15}]},
            "scaleDown": {"stabilizationWindowSeconds": 300, "selectPolicy": "Max",
                          "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]},
        },
    }


def test_an_hpa_keeps_what_it_was_given_and_defaults_the_rest():
    obj, warnings = validate({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                              "metadata": {"name": "llm"},
                              "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "llm"}, "maxReplicas": 10,
                                       "metrics": [{"type": "Pods", "pods": {
                                           "metric": {"name": "requests_per_second"},
                                           "target": {"type": "AverageValue", "averageValue": "10"}}}],
                                       "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}})
    assert warnings == []
    assert obj["spec"]["behavior"]["scaleDown"] == {"stabilizationWindowSeconds": 60, "selectPolicy": "Max",
                                                    "policies": [{"type": "Percent", "value": 100,
                                                                  "periodSeconds": 15}]}
    assert obj["spec"]["behavior"]["scaleUp"]["policies"][0] == {"type": "Pods", "value": 4, "periodSeconds": 15}


HPA = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "llm"}}
REF = {"kind": "Deployment", "name": "llm"}


@pytest.mark.parametrize("spec, expected", [
    ({"scaleTargetRef": REF, "minReplicas": 5, "maxReplicas": 2},
     [("spec.maxReplicas", "Invalid value: 2: must be greater than or equal to `minReplicas`")]),
    ({"scaleTargetRef": {"kind": "StatefulSet", "name": "x"}, "maxReplicas": 2},
     [("spec.scaleTargetRef.kind", 'Unsupported value: "StatefulSet": supported values: "Deployment"')]),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "minReplicas": -1},
     [("spec.minReplicas", "Invalid value: -1: must be greater than or equal to 0")]),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "metrics": [{"type": "Pods", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]},
     [("spec.metrics[0].resource", "Forbidden: must populate the given metric source only"),
      ("spec.metrics[0].pods", "Required value: must populate information for the given metric source")]),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "metrics": [{"type": "Pods", "pods": {
        "metric": {"name": "requests_per_second"}, "target": {"type": "Utilization", "averageUtilization": 50}}}]},
     [("spec.metrics[0].pods.target.type", 'Unsupported value: "Utilization": supported values: "AverageValue"')]),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "metrics": [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization"}}}]},
     [("spec.metrics[0].resource.target.averageUtilization",
       "Required value: must set either a target value or averageValue")]),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "metrics": [{"type": "External", "external": {
        "metric": {"name": "queue"}, "target": {"type": "Value", "value": "-1"}}}]},
     [("spec.metrics[0].external.target.value", 'Invalid value: "-1": must be positive')]),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "behavior": {"scaleUp": {"policies": []}}},
     [("spec.behavior.scaleUp.policies", "Required value: must specify at least one Policy")]),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "behavior": {"scaleUp": {"selectPolicy": "Fastest"}}},
     [("spec.behavior.scaleUp.selectPolicy", 'Unsupported value: "Fastest": supported values: "Max", "Min", '
                                             '"Disabled"')]),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 7200}}},
     [("spec.behavior.scaleDown.stabilizationWindowSeconds", "Invalid value: 7200: must be less than or equal "
                                                             "to 3600")]),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "behavior": {"scaleDown": {"policies": [
        {"type": "Percent", "value": 10, "periodSeconds": 3600}]}}},
     [("spec.behavior.scaleDown.policies[0].periodSeconds", "Invalid value: 3600: must be less than or equal to "
                                                            "1800")]),
])
def test_bad_hpas(spec, expected):
    assert errors_of({**HPA, "spec": spec}) == expected


def test_a_pods_metric_shoal_does_not_measure_is_a_warning():
    _, warnings = validate({**HPA, "spec": {"scaleTargetRef": REF, "maxReplicas": 3, "metrics": [
        {"type": "Pods", "pods": {"metric": {"name": "tokens_per_second"},
                                  "target": {"type": "AverageValue", "averageValue": "100"}}}]}})
    assert warnings == ["spec.metrics[0].pods.metric.name: Shoal has no Pods metric 'tokens_per_second' (it has "
                        "requests_per_second, inflight_requests, http_requests_per_second, queue_depth, "
                        "DCGM_FI_DEV_GPU_UTIL): the HPA will find it missing"]


def test_priority_class_and_namespace_are_cluster_scoped():
    pc, warnings = validate({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                             "metadata": {"name": "serving", "namespace": "default"}, "value": 100000,
                             "description": "online inference"})
    assert pc == {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "serving"},
                  "value": 100000, "globalDefault": False, "preemptionPolicy": "PreemptLowerPriority",
                  "description": "online inference"}
    assert warnings == ["metadata.namespace: ignored: PriorityClass is cluster-scoped"]
    ns, _ = validate({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    assert ns == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    assert errors_of({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team.a"}})[0][0] == "metadata.name"


def test_priority_class_limits():
    assert errors_of({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                      "metadata": {"name": "system-top"}, "value": 2_000_000_000}) == [
        ("value", "Invalid value: 2000000000: maximum allowed value of a user defined priority is 1000000000"),
        ("metadata.name", "Invalid value: \"system-top\": priority class names with 'system-' prefix are "
                          "reserved for system use only"),
    ]
    assert errors_of({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "p"}}) \
        == [("value", "Required value")]


def test_a_replicaset_checks_its_selector_like_a_deployment():
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "vllm-abc"},
          "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "vllm", "pod-template-hash": "abc"}},
                   "template": {"metadata": {"labels": {"app": "vllm", "pod-template-hash": "abc"}},
                                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v1"}]}}}}
    obj, _ = validate(rs)
    assert obj["spec"]["minReadySeconds"] == 0
    rs["spec"]["template"]["metadata"]["labels"]["pod-template-hash"] = "xyz"
    assert errors_of(rs) == [("spec.template.metadata.labels", "`selector` does not match template `labels`")]


def test_a_rolebinding_names_users_or_groups_and_one_of_the_user_facing_cluster_roles():
    ok = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
          "metadata": {"name": "team-a-edit", "namespace": "team-a"},
          "subjects": [{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "ml"}],
          "roleRef": {"kind": "ClusterRole", "name": "edit", "apiGroup": "rbac.authorization.k8s.io"}}
    obj, warnings = validate(ok)
    assert obj["roleRef"]["name"] == "edit" and [s["kind"] for s in obj["subjects"]] == ["User", "Group"]
    bad = {**ok, "subjects": [{"kind": "ServiceAccount", "name": "x"}],
           "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"}}
    assert errors_of(bad) == [
        ("subjects[0].kind", 'Unsupported value: "ServiceAccount": supported values: "User", "Group"'),
        ("roleRef.name", 'Unsupported value: "cluster-admin": supported values: "view", "edit", "admin"'),
    ]


# -- Secrets ---------------------------------------------------------------------------------

def secret(**fields) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"}, **fields}


def test_a_secrets_string_data_is_merged_into_its_data_in_base64():
    obj, _ = validate(secret(data={"a": "eA=="}, stringData={"token": "hf_123"}))
    assert obj["data"] == {"a": "eA==", "token": "aGZfMTIz"} and "stringData" not in obj
    assert obj["type"] == "Opaque" and obj["metadata"]["namespace"] == "default"


def test_secrets_are_checked_as_the_api_server_checks_them():
    assert errors_of(secret(data={"a": "not base64!"})) == [("data[a]", 'Invalid value: "not base64!": illegal base64 data')]
    assert errors_of(secret(type="kubernetes.io/dockerconfigjson", data={})) == [("data[.dockerconfigjson]",
                                                                                   "Required value")]
    assert errors_of(secret(type="kubernetes.io/dockerconfigjson", stringData={".dockerconfigjson": "[1]"})) == [
        ("data[.dockerconfigjson]", 'Invalid value: "<secret contents redacted>": not an object')]
    assert errors_of(secret(stringData={"bad key": "x"}))[0][0] == "stringData[bad key]"
    pulls, _ = validate(secret(type="kubernetes.io/dockerconfigjson",
                               stringData={".dockerconfigjson": '{"auths": {"r:5000": {"auth": "YTpi"}}}'}))
    assert list(pulls["data"]) == [".dockerconfigjson"]


def test_a_pods_image_pull_secrets_are_kept():
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "r:5000/x:1"}], "imagePullSecrets": [{"name": "regcred"}]}}
    obj, warnings = validate(doc)
    assert obj["spec"]["imagePullSecrets"] == [{"name": "regcred"}] and warnings == []


def test_per_index_backoff_is_checked_as_the_api_server_checks_it():
    def job(**spec) -> dict:
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                "spec": {**spec, "template": {"spec": {"restartPolicy": "Never",
                                                       "containers": [{"name": "m", "image": "busybox"}]}}}}
    assert errors_of(job(completions=2, backoffLimitPerIndex=1)) == [
        ("spec.backoffLimitPerIndex", "Forbidden: requires indexed completion mode")]
    assert errors_of(job(completions=2, completionMode="Indexed", maxFailedIndexes=3)) == [
        ("spec.backoffLimitPerIndex", "Required value: when maxFailedIndexes is specified"),
        ("spec.maxFailedIndexes", "Invalid value: 3: must be less than or equal to completions")]
    fail_index = {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [1]}}]}
    assert errors_of(job(completions=2, completionMode="Indexed", podFailurePolicy=fail_index)) == [
        ("spec.podFailurePolicy.rules[0].action", "Forbidden: requires the backoffLimitPerIndex to be set")]
    spec = validate(job(completions=2, completionMode="Indexed", backoffLimitPerIndex=1))[0]["spec"]
    assert (spec["backoffLimit"], spec["backoffLimitPerIndex"]) == (2**31 - 1, 1)
    assert validate(job(completions=2))[0]["spec"]["backoffLimit"] == 6
