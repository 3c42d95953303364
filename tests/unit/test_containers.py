"""What each container runtime runs for the vLLM pod of issue 4 on GPUs 4-7: exact argv lists."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from shoal.agent.containers import (CreateContainerConfigError, CreateContainerError, ContainerPaths,
                                    ImagePullError, container_env, expand, get_runtime, pull_policy)

IMAGE = "vllm/vllm-openai:v0.6.3"
NAME = "shoal-default-vllm-llama-70b-7d4b9c-x2k9q-vllm"
GPUS = [4, 5, 6, 7]
ARGS = ["--model", "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "4",
        "--served-model-name", "llama-70b-x2k9q", "--port", "8000"]

POD = {
    "namespace": "default", "name": "vllm-llama-70b-7d4b9c-x2k9q", "uid": "7c1e2f",
    "labels": {"app": "vllm"},
    "spec": {"containers": [{
        "name": "vllm", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
        "args": ["--model", "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "4",
                 "--served-model-name", "$(MODEL_ALIAS)", "--port", "$(PORT)"],
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "env": [{"name": "HF_HOME", "value": "/models/hf"},
                {"name": "MODEL_ALIAS", "value": "llama-70b-x2k9q"},
                {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"limits": {"nvidia.com/gpu": 4, "cpu": "16", "memory": "200Gi"}},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
    }], "restartPolicy": "Always", "terminationGracePeriodSeconds": 30},
    "runtime": "podman",
    "env": {"POD_NAME": "vllm-llama-70b-7d4b9c-x2k9q", "POD_NAMESPACE": "default",
            "POD_IP": "127.0.1.2", "NODE_NAME": "node1"},
}
CONTAINER = POD["spec"]["containers"][0]

POD_ENV = ["POD_NAME=vllm-llama-70b-7d4b9c-x2k9q", "POD_NAMESPACE=default", "POD_IP=127.0.1.2",
           "NODE_NAME=node1", "PORT=8000", "HF_HOME=/models/hf", "MODEL_ALIAS=llama-70b-x2k9q",
           "MY_POD=vllm-llama-70b-7d4b9c-x2k9q"]


def _flags(flag: str, values: list[str]) -> list[str]:
    return [x for v in values for x in (flag, v)]


CASES = {
    "podman": [
        "podman", "run", "--rm", "--name", NAME, "--network", "host", "--pull=missing",
        "--device", "nvidia.com/gpu=4", "--device", "nvidia.com/gpu=5",
        "--device", "nvidia.com/gpu=6", "--device", "nvidia.com/gpu=7",
        "--memory", "204800m", "--cpus", "16",
        *_flags("-e", [*POD_ENV, "CUDA_VISIBLE_DEVICES=0,1,2,3", "GPU_DEVICE_ORDINAL=0,1,2,3"]),
        IMAGE, *ARGS],
    "docker": [
        "docker", "run", "--rm", "--name", NAME, "--network", "host", "--pull=missing",
        "--gpus", '"device=4,5,6,7"', "--memory", "204800m", "--cpus", "16",
        *_flags("-e", [*POD_ENV, "CUDA_VISIBLE_DEVICES=0,1,2,3", "GPU_DEVICE_ORDINAL=0,1,2,3"]),
        IMAGE, *ARGS],
    "enroot": [
        "enroot", "start", "--rw",
        *_flags("-e", [*POD_ENV, "CUDA_VISIBLE_DEVICES=4,5,6,7", "GPU_DEVICE_ORDINAL=4,5,6,7",
                       "NVIDIA_VISIBLE_DEVICES=4,5,6,7", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]),
        NAME, *ARGS],
    "apptainer": [
        "apptainer", "run", "--nv", "--cleanenv", *_flags("--env", POD_ENV), f"docker://{IMAGE}", *ARGS],
    "process": ["python", "examples/serving/model_server.py", *ARGS],
}
IMAGES = {"vllm/vllm-openai:*": ["python", "examples/serving/model_server.py"]}


def _launch(runtime: str, tmp_path, container=CONTAINER, gpus=GPUS, pod=POD):
    rt = get_runtime(runtime, "node1", IMAGES, base_env={"PATH": "/usr/bin"})
    return rt.launch(pod, container, gpus, container_env(pod, container),
                     ContainerPaths(tmp_path / "c", tmp_path / "images"))


@pytest.mark.parametrize("runtime", list(CASES))
def test_the_vllm_pod_runs_as_this_exact_argv(runtime, tmp_path):
    launch = _launch(runtime, tmp_path)
    assert launch.argv == CASES[runtime]
    assert all(isinstance(a, str) for a in launch.argv)


@pytest.mark.parametrize("runtime", list(CASES))
def test_an_engines_container_is_made_inside_the_pods_cgroup(runtime, tmp_path):
    """podman and docker get --cgroup-parent right after ``run`` (docker's --config before it
    kept); the others' container is the supervised process, already in the cgroup."""
    launch = _launch(runtime, tmp_path, pod={**POD, "registry_auths": {"r.example": {"auth": "eA=="}}})
    contained = get_runtime(runtime, "node1", IMAGES, base_env={}).contained(launch, "/shoal/job_1.0/container_x")
    if runtime in ("podman", "docker"):
        at = launch.argv.index("run") + 1
        assert contained.argv == [*launch.argv[:at], "--cgroup-parent", "/shoal/job_1.0/container_x",
                                  *launch.argv[at:]]
        assert (runtime == "docker") == (launch.argv[1] == "--config")
    else:
        assert contained == launch
    assert get_runtime(runtime, "node1", IMAGES, base_env={}).contained(launch, None) == launch


def test_what_the_container_sees_as_its_gpus():
    # CDI and --gpus renumber the pod's GPUs from 0; enroot, apptainer and the process runtime do not.
    seen = {}
    for runtime in CASES:
        launch = _launch(runtime, Path("/nonexistent"))
        seen[runtime] = launch.container_env["CUDA_VISIBLE_DEVICES"]
    assert seen == {"podman": "0,1,2,3", "docker": "0,1,2,3", "enroot": "4,5,6,7",
                    "apptainer": "4,5,6,7", "process": "4,5,6,7"}


def test_apptainer_passes_comma_values_through_its_own_environment(tmp_path):
    launch = _launch("apptainer", tmp_path)
    assert launch.env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert launch.env["APPTAINERENV_GPU_DEVICE_ORDINAL"] == "4,5,6,7"
    assert not any(a.startswith("CUDA_VISIBLE_DEVICES") for a in launch.argv)


def test_the_process_runtime_runs_in_the_agents_environment_with_nvml_indices(tmp_path):
    launch = _launch("process", tmp_path)
    assert launch.env["PATH"] == "/usr/bin"
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert launch.env["PORT"] == "8000" and launch.env["MY_POD"] == POD["name"]
    assert launch.steps == [] and launch.cleanup is None


def test_command_replaces_the_entrypoint_and_args_the_cmd(tmp_path):
    c = dict(CONTAINER, command=["python3", "-m", "vllm.entrypoints.openai.api_server"], args=["--port", "8000"])
    argv = {rt: _launch(rt, tmp_path, container=c).argv for rt in CASES}
    assert argv["process"] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"]
    assert argv["podman"][-7:] == ["--entrypoint", "python3", IMAGE, "-m", "vllm.entrypoints.openai.api_server",
                                   "--port", "8000"]
    assert argv["docker"][-7:] == argv["podman"][-7:]
    assert argv["apptainer"][:2] == ["apptainer", "exec"]
    assert argv["apptainer"][-6:] == [f"docker://{IMAGE}", "python3", "-m", "vllm.entrypoints.openai.api_server",
                                      "--port", "8000"]
    assert argv["enroot"][-6:] == [NAME, "python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"]


@pytest.mark.parametrize("policy,flag", [("Always", "--pull=always"), ("Never", "--pull=never"),
                                         ("IfNotPresent", "--pull=missing")])
def test_image_pull_policy_becomes_podman_and_docker_pull_flags(policy, flag, tmp_path):
    c = dict(CONTAINER, imagePullPolicy=policy)
    assert flag in _launch("podman", tmp_path, container=c).argv
    assert flag in _launch("docker", tmp_path, container=c).argv


def test_pull_policy_defaults_as_kubernetes():
    assert pull_policy({"image": "vllm/vllm-openai"}) == "Always"
    assert pull_policy({"image": "vllm/vllm-openai:latest"}) == "Always"
    assert pull_policy({"image": "localhost:5000/vllm:v1"}) == "IfNotPresent"


def test_working_dir_and_no_gpus(tmp_path):
    c = dict(CONTAINER, workingDir="/workspace")
    c["resources"] = {}
    podman = _launch("podman", tmp_path, container=c, gpus=[]).argv
    assert podman[podman.index("-w") + 1] == "/workspace"
    assert "--device" not in podman and "--memory" not in podman
    assert "NVIDIA_VISIBLE_DEVICES=void" in podman  # an image saying "all" gets no GPU
    assert not any(a.startswith("CUDA_VISIBLE_DEVICES=") for a in podman)
    docker = _launch("docker", tmp_path, container=c, gpus=[]).argv
    assert "--gpus" not in docker
    apptainer = _launch("apptainer", tmp_path, container=c, gpus=[]).argv
    assert "--nv" not in apptainer and apptainer[apptainer.index("--pwd") + 1] == "/workspace"
    process = _launch("process", tmp_path, container=c, gpus=[])
    assert process.cwd == "/workspace" and "CUDA_VISIBLE_DEVICES" not in process.env


def test_run_as_user_and_group_become_the_user_flag_the_containers_over_the_pods(tmp_path):
    pod = copy.deepcopy(POD)
    pod["spec"]["securityContext"] = {"runAsUser": 1000, "runAsGroup": 100}
    c = dict(CONTAINER, securityContext={"runAsUser": 1234})
    for runtime in ("podman", "docker"):
        argv = _launch(runtime, tmp_path, container=c, pod=pod).argv
        assert argv[argv.index("--user") + 1] == "1234:100"
        argv = _launch(runtime, tmp_path, container=dict(CONTAINER, securityContext={"runAsGroup": 5})).argv
        assert "--user" not in argv  # a group alone keeps the image's user


def test_podman_and_docker_remove_a_stale_container_first_and_exec_probes_inside(tmp_path):
    podman = _launch("podman", tmp_path)
    assert [s.argv for s in podman.steps] == [["podman", "rm", "--force", "--ignore", NAME]]
    assert not podman.steps[0].check
    rt = get_runtime("podman", "node1", base_env={})
    assert rt.exec_argv(podman, ["cat", "/tmp/healthy"], 1234) == ["podman", "exec", NAME, "cat", "/tmp/healthy"]
    # kubectl exec -i / -it: podman passes standard input on, and makes a terminal, only when told.
    assert rt.exec_argv(podman, ["sh"], 1234, stdin=True, tty=True) == ["podman", "exec", "-i", "-t", NAME, "sh"]
    assert rt.exec_argv(podman, ["cat"], 1234, stdin=True) == ["podman", "exec", "-i", NAME, "cat"]
    docker = _launch("docker", tmp_path)
    assert docker.steps[0].argv == ["docker", "rm", "--force", NAME] and docker.cleanup == ["docker", "rm", "--force", NAME]


def test_enroot_imports_once_into_the_node_cache_then_creates_the_container(tmp_path):
    launch = _launch("enroot", tmp_path)
    sqsh = tmp_path / "images" / "vllm+vllm-openai+v0.6.3.sqsh"
    partial = tmp_path / "c" / "image.sqsh.partial"
    pull, create = launch.steps
    assert pull.argv == ["enroot", "import", "--output", str(partial), "docker://vllm/vllm-openai:v0.6.3"]
    assert pull.kind == "pull" and pull.output == sqsh and pull.partial == partial and not pull.always
    assert create.argv == ["enroot", "create", "--force", "--name", NAME, str(sqsh)]
    assert launch.cleanup == ["enroot", "remove", "--force", NAME]
    rt = get_runtime("enroot", "node1", base_env={})
    assert rt.exec_argv(launch, ["true"], 4321) == ["enroot", "exec", "4321", "true"]
    assert rt.uri("nvcr.io/nvidia/pytorch:24.01-py3") == "docker://nvcr.io#nvidia/pytorch:24.01-py3"


def test_enroot_never_pull_without_the_image_is_an_image_error(tmp_path):
    with pytest.raises(ImagePullError, match='Container image "vllm/vllm-openai:v0.6.3" is not present '
                                             'with pull policy of Never') as e:
        _launch("enroot", tmp_path, container=dict(CONTAINER, imagePullPolicy="Never"))
    assert e.value.reason == "ErrImagePull"


def test_the_process_runtime_needs_a_command_or_an_image_mapping(tmp_path):
    rt = get_runtime("process", "node1", images={}, base_env={})
    with pytest.raises(CreateContainerError) as e:
        rt.launch(POD, CONTAINER, GPUS, {}, ContainerPaths(tmp_path, tmp_path))
    assert str(e.value) == ("the process runtime needs a command for image vllm/vllm-openai:v0.6.3 "
                            "(set command, or map the image in the agent's images:)")
    assert e.value.reason == "CreateContainerError"


def test_image_map_globs_match_the_whole_image_name(tmp_path):
    rt = get_runtime("process", "node1", images={"vllm/*:v0.5*": ["old"], "vllm/vllm-openai:v0.6*": ["new"]},
                     base_env={})
    assert rt.launch(POD, CONTAINER, [], {}, ContainerPaths(tmp_path, tmp_path)).argv[:1] == ["new"]


def test_a_missing_runtime_binary_is_a_create_container_error():
    rt = get_runtime("podman", "node7", base_env={"PATH": "/nonexistent"})
    with pytest.raises(CreateContainerError, match="^podman not found on node node7$"):
        rt.check_available()
    get_runtime("process", "node7", base_env={"PATH": "/nonexistent"}).check_available()


def test_an_unknown_runtime_is_refused():
    with pytest.raises(CreateContainerError, match='unknown container runtime "kata"'):
        get_runtime("kata", "node1")


def test_env_resolves_field_refs_and_dependent_variables():
    c = {"name": "x", "image": "i", "ports": [{"containerPort": 9000}, {"containerPort": 9001}], "env": [
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "URL", "value": "http://$(IP):$(PORT)/$(NOPE)"},
        {"name": "LITERAL", "value": "$$(IP)"},
        {"name": "POD_NAME", "value": "overridden"},
    ]}
    env = container_env(POD, c)
    assert env["NS"] == "default" and env["IP"] == "127.0.1.2" and env["NODE"] == "node1" and env["APP"] == "vllm"
    assert env["PORT"] == "9000"  # the first containerPort
    assert env["URL"] == "http://127.0.1.2:9000/$(NOPE)"
    assert env["LITERAL"] == "$(IP)"
    assert env["POD_NAME"] == "overridden"  # the container's own env wins
    assert list(env)[:4] == ["POD_NAME", "POD_NAMESPACE", "POD_IP", "NODE_NAME"]


def test_env_sources_shoal_lacks_are_config_errors():
    c = {"name": "x", "image": "i", "env": [{"name": "T", "valueFrom": {"configMapKeyRef": {"name": "s", "key": "k"}}}]}
    with pytest.raises(CreateContainerConfigError, match="env T: configMapKeyRef is not supported"):
        container_env(POD, c)
    c = {"name": "x", "image": "i", "env": [{"name": "T", "valueFrom": {"fieldRef": {"fieldPath": "spec.x"}}}]}
    with pytest.raises(CreateContainerConfigError, match='unsupported fieldRef fieldPath "spec.x"'):
        container_env(POD, c)


def test_expand_leaves_unknown_references():
    assert expand("$(A)-$(B)-$$-$(", {"A": "1"}) == "1-$(B)-$-$("


@pytest.mark.parametrize("runtime,code,output,expected", [
    ("podman", 125, "Trying to pull docker.io/vllm/nope:v1...\nError: initializing source docker://vllm/nope:v1: "
                    "reading manifest v1 in docker.io/vllm/nope: requested access to the resource is denied\n",
     "Error: initializing source docker://vllm/nope:v1: reading manifest v1 in docker.io/vllm/nope: "
     "requested access to the resource is denied"),
    ("podman", 125, "Error: vllm/nope:v1: image not known\n", "Error: vllm/nope:v1: image not known"),
    ("podman", 1, "Error: initializing source docker://x\n", None),
    ("podman", 125, "Error: crun: executable file not found\n", None),
    ("docker", 125, "Unable to find image 'vllm/nope:v1' locally\ndocker: Error response from daemon: pull access "
                    "denied for vllm/nope, repository does not exist or may require 'docker login'.\n",
     "docker: Error response from daemon: pull access denied for vllm/nope, repository does not exist or may "
     "require 'docker login'."),
    ("docker", 0, "Unable to find image 'x' locally\n", None),
    ("apptainer", 255, "FATAL:   Unable to handle docker://vllm/nope:v1 uri: failed to get checksum\n",
     "FATAL:   Unable to handle docker://vllm/nope:v1 uri: failed to get checksum"),
    ("process", 125, "Error: initializing source\n", None),
])
def test_pull_failures_are_recognised_by_exit_code_and_message(runtime, code, output, expected):
    assert get_runtime(runtime, "node1", base_env={}).pull_failure(code, output) == expected


@pytest.mark.parametrize("runtime,code,output,expected", [
    ("docker", 125, "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
                    "daemon running?\n\nRun 'docker run --help' for more information\n",
     "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"),
    ("podman", 125, "Error: Cannot connect to Podman. Please verify your connection to the Linux system\n",
     "podman: Cannot connect to Podman. Please verify your connection to the Linux system"),
    ("podman", 125, "Error: vllm/nope:v1: image not known\n", None),  # a pull error, not the engine's
    ("podman", 125, "Error: crun: executable file not found\n", None),
    ("docker", 1, "Cannot connect to the Docker daemon\n", None),  # the container's own exit and output
    ("process", 125, "Cannot connect to the Docker daemon\n", None),
])
def test_a_container_engine_that_cannot_create_the_container_is_told_apart(runtime, code, output, expected):
    assert get_runtime(runtime, "node1", base_env={}).engine_failure(code, output) == expected


def test_launch_does_not_mutate_the_pod(tmp_path):
    before = copy.deepcopy(POD)
    for runtime in CASES:
        _launch(runtime, tmp_path)
    assert POD == before


def test_secret_env_and_pull_secrets_stay_off_the_command_line(tmp_path):
    """A secretKeyRef's value reaches podman by name in its environment; the pod's
    imagePullSecrets become an --authfile only root reads; kubelet's messages for a
    missing Secret or key."""
    from shoal.agent.containers import ContainerPaths, PodmanRuntime

    pod = {**POD, "secrets": {"hf": {"token": "hf_s3cret"}, "empty": {}},
           "registry_auths": {"r:5000": {"auth": "YTpi"}}}
    c = {"name": "x", "image": "r:5000/i:1", "env": [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": True}}}]}
    env = container_env(pod, c)
    assert env["HF_TOKEN"] == "hf_s3cret" and "OPT" not in env
    launch = PodmanRuntime("n1").launch(pod, c, [], env, ContainerPaths(tmp_path / "c", tmp_path / "images"))
    assert "hf_s3cret" not in " ".join(launch.argv) and "YTpi" not in " ".join(launch.argv)
    assert launch.argv[launch.argv.index("HF_TOKEN") - 1] == "-e" and launch.env["HF_TOKEN"] == "hf_s3cret"
    authfile = launch.argv[launch.argv.index("--authfile") + 1]
    assert json.loads(open(authfile).read()) == {"auths": {"r:5000": {"auth": "YTpi"}}}
    assert os.stat(authfile).st_mode & 0o777 == 0o600
    missing = {"name": "x", "image": "i", "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    with pytest.raises(CreateContainerConfigError, match='secret "s" not found'):
        container_env(pod, missing)
    missing["env"][0]["valueFrom"]["secretKeyRef"]["name"] = "empty"
    with pytest.raises(CreateContainerConfigError, match="couldn't find key k in Secret default/empty"):
        container_env(pod, missing)


def test_docker_takes_the_pull_secrets_in_its_config_folder(tmp_path):
    from shoal.agent.containers import DockerRuntime

    pod = {**POD, "registry_auths": {"r:5000": {"auth": "YTpi"}}}
    c = {"name": "x", "image": "r:5000/i:1"}
    launch = DockerRuntime("n1").launch(pod, c, [], {}, ContainerPaths(tmp_path / "c", tmp_path / "images"))
    assert launch.argv[:4] == ["docker", "--config", str(tmp_path / "c" / "docker-config"), "run"]
    assert json.loads((tmp_path / "c" / "docker-config" / "config.json").read_text()) == {
        "auths": {"r:5000": {"auth": "YTpi"}}}
    assert DockerRuntime("n1").launch(POD, c, [], {}, ContainerPaths(tmp_path / "d", tmp_path / "images")).argv[1] == "run"
