"""`shoal exec`: a command runs inside a pod's running container (its environment, its GPUs),
its output and exit code come back as kubectl's do, and nobody but the pod's owner (or an
admin) may run one. Real server, agent and pod."""

from __future__ import annotations

import json

import pytest

from tests.integration.cluster import LocalCluster, wait_until

DEPLOYMENT = {
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shell"},
    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "shell"}},
             "template": {"metadata": {"labels": {"app": "shell"}},
                          "spec": {"terminationGracePeriodSeconds": 1,
                                   "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "600"],
                                                   "env": [{"name": "GREETING", "value": "hello from the pod"}],
                                                   "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("exec"), nodes=1, gpus_per_node=4).up()
    c.run(["shoal", "apply", "-f", "-"], input=json.dumps(DEPLOYMENT))

    def running_pod():
        items = json.loads(c.run(["shoal", "get", "pods", "-o", "json"]).stdout)["items"]
        return next((p["metadata"]["name"] for p in items if p["status"].get("phase") == "Running"), None)

    c.pod = wait_until(running_pod, 30, "the pod running")
    yield c
    c.down()


def test_exec_runs_in_the_containers_environment_and_returns_its_exit_code(cluster):
    out = cluster.run(["shoal", "exec", cluster.pod, "--", "sh", "-c",
                       'echo "$GREETING|$POD_NAME|$CUDA_VISIBLE_DEVICES"; echo oops >&2; exit 3'], check=False)
    assert out.returncode == 3, out
    gpus = out.stdout.strip().split("|")
    assert gpus[:2] == ["hello from the pod", cluster.pod], out.stdout
    assert len(gpus[2].split(",")) == 2, out.stdout  # the pod's two GPUs, as its container sees them
    assert "oops" in out.stderr and "command terminated with exit code 3" in out.stderr, out.stderr


def test_exec_by_deployment_with_stdin_and_flags_after_the_pod_name(cluster):
    out = cluster.run(["shoal", "exec", "deploy/shell", "-i", "-c", "main", "--", "tr", "a-z", "A-Z"],
                      input="shout\n")
    assert out.stdout == "SHOUT\n"


def test_exec_mistakes_are_one_clear_line(cluster):
    cases = [
        (["shoal", "exec", cluster.pod, "-t", "--", "sh"], "-t (a terminal) is not supported"),
        (["shoal", "exec", cluster.pod], "you must specify at least one command"),
        (["shoal", "exec", "nosuchpod", "--", "true"], 'pods "nosuchpod" not found'),
        (["shoal", "exec", cluster.pod, "-c", "other", "--", "true"], "container other is not valid"),
        (["shoal", "exec", cluster.pod, "--", "/no/such/program"], "/no/such/program"),
    ]
    for argv, message in cases:
        out = cluster.run(argv, check=False)
        assert out.returncode != 0 and message in out.stderr, (argv, out)
        assert "Traceback" not in out.stderr


def test_only_the_owner_or_an_admin_may_exec(cluster):
    alice = cluster.api("POST", "/shoal/v1/tokens", {"user": "alice", "role": "user"})["token"]
    out = cluster.run(["shoal", "exec", cluster.pod, "--", "true"], check=False,
                      env={"SHOAL_TOKEN": alice})
    assert out.returncode == 1 and "forbidden" in out.stderr, out
