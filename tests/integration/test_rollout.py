"""Rolling updates under load, end to end: a real cluster, `shoal gateway`, the example model
server. An administrator applies a new version while clients keep asking; nobody sees an
error, traffic moves to the new version, never fewer than replicas - maxUnavailable pods
serve, and `shoal rollout status|history|undo` say and do what kubectl's do. A rollout whose
new pods never become ready stalls at its progress deadline while the old pods keep serving."""

from __future__ import annotations

import threading
import time
from typing import Self

import pytest

from tests.integration.cluster import LocalCluster, free_port, wait_until
from tests.integration.traffic import Load, apply, ask, backends, model_deployment, pods, serving

REPLICAS, MAX_UNAVAILABLE = 3, 1
STRATEGY = {"strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": MAX_UNAVAILABLE}}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    gw = free_port()
    # Pods use the node's network: old and new pods on one port need a node each (3 + surge 1).
    c = LocalCluster(tmp_path_factory.mktemp("rollout"), nodes=4, gpus_per_node=1, extra=("--gateway", str(gw)))
    c.gateway = f"http://127.0.0.1:{gw}"
    c.up()
    yield c
    c.down()


class ReadySampler:
    """Counts, every few tens of milliseconds, the pods the gateway may send requests to."""

    def __init__(self, c: LocalCluster, service: str) -> None:
        self.c, self.service = c, service
        self.samples: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), serving(self.c, self.service)))
            self._stop.wait(0.05)

    def fewest(self) -> int:
        return min(len(pods) for _, pods in self.samples)


def rollout_status(c: LocalCluster, name: str, timeout: float = 120):
    return c.run(["shoal", "rollout", "status", f"deployment/{name}", "--timeout", f"{int(timeout)}s"],
                 check=False, timeout=timeout + 30)


def versions_after(answers, t: float) -> set[str]:
    return {a.version for a in answers if a.sent >= t}


def only_version_serving(c: LocalCluster, service: str, pod_prefix: str) -> float | None:
    """The time at which every backend of the Service belongs to one ReplicaSet, or None."""
    pods = backends(c, service)
    if pods and all(b["pod"].startswith(pod_prefix) for b in pods):
        return time.time()
    return None


def container_restarts(pod: dict) -> int:
    return sum(c["restartCount"] for c in pod["status"].get("containerStatuses") or ())


def replicaset_of(pod: str) -> str:
    return pod.rsplit("-", 1)[0]


def test_rolling_update_under_load_loses_no_request(cluster, tmp_path):
    manifest = tmp_path / "echo.yaml"
    out = apply(cluster, manifest, model_deployment("echo", replicas=REPLICAS, port=8000, version="v1",
                                                    spec=STRATEGY))
    assert "deployment.apps/echo created" in out and "service/echo created" in out
    assert rollout_status(cluster, "echo").returncode == 0
    wait_until(lambda: len(serving(cluster, "echo")) == REPLICAS, 30, "3 ready pods in the gateway's routes")
    v1_set = replicaset_of(serving(cluster, "echo")[0])

    # Short requests, and long ones (about 0.5 s) that are in flight when old pods are told to stop.
    with Load(cluster.gateway, "echo", workers=3) as load, Load(cluster.gateway, "echo", workers=2,
                                                                 max_tokens=250) as long, \
            ReadySampler(cluster, "echo") as sampler:
        wait_until(lambda: len(load.answers) >= 20, 30, "traffic on v1")
        applied_at = time.time()
        out = apply(cluster, manifest, model_deployment("echo", replicas=REPLICAS, port=8000, version="v2",
                                                        spec=STRATEGY))
        assert "deployment.apps/echo configured" in out
        status = rollout_status(cluster, "echo")
        assert status.returncode == 0, status.stderr
        assert status.stdout.strip().splitlines()[-1] == 'deployment "echo" successfully rolled out'
        v2_set = replicaset_of(serving(cluster, "echo")[0])
        assert v2_set != v1_set
        only_v2 = wait_until(lambda: only_version_serving(cluster, "echo", v2_set), 30,
                             "the old pods to leave the routes")
        wait_until(lambda: len([a for a in load.answers if a.sent > only_v2]) >= 20, 30, "traffic on v2")

    assert load.failures() == [] and long.failures() == [], (load.failures() + long.failures())[:5]
    assert {a.version for a in load.answers if a.sent < applied_at} == {"v1"}
    assert {a.version for a in long.answers} == {"v1", "v2"}
    assert versions_after(load.answers, only_v2) == {"v2"}
    assert REPLICAS - MAX_UNAVAILABLE <= sampler.fewest(), [
        (round(t - applied_at, 2), p) for t, p in sampler.samples if len(p) < REPLICAS - MAX_UNAVAILABLE]

    # A new pod placed where an old one was still draining on the same port would have crashed.
    assert {p["metadata"]["name"]: container_restarts(p) for p in pods(cluster, "app=echo")} == \
        {name: 0 for name in serving(cluster, "echo")}

    history = cluster.run(["shoal", "rollout", "history", "deployment/echo"]).stdout
    lines = history.strip().splitlines()
    assert lines[0].strip() == "deployment.apps/echo"
    assert lines[1].split() == ["REVISION", "CHANGE-CAUSE"]
    assert [line.split()[0] for line in lines[2:]] == ["1", "2"]

    with Load(cluster.gateway, "echo", workers=2) as load:
        wait_until(lambda: len(load.answers) >= 10, 30, "traffic on v2")
        out = cluster.run(["shoal", "rollout", "undo", "deployment/echo"]).stdout
        assert out.strip() == "deployment.apps/echo rolled back"
        assert rollout_status(cluster, "echo").returncode == 0
        back = replicaset_of(serving(cluster, "echo")[0])
        assert back == v1_set  # the revision-1 ReplicaSet is scaled up again, not a new one
        only_v1 = wait_until(lambda: only_version_serving(cluster, "echo", v1_set), 30,
                             "the v2 pods to leave the routes")
        wait_until(lambda: len([a for a in load.answers if a.sent > only_v1]) >= 10, 30, "traffic on v1")
    assert load.failures() == [], load.failures()[:5]
    assert versions_after(load.answers, only_v1) == {"v1"}
    history = cluster.run(["shoal", "rollout", "history", "deployment/echo"]).stdout
    assert [line.split()[0] for line in history.strip().splitlines()[2:]] == ["2", "3"]


def test_stalled_rollout_exceeds_its_progress_deadline_while_old_pods_serve(cluster, tmp_path):
    manifest = tmp_path / "stall.yaml"
    spec = {**STRATEGY, "progressDeadlineSeconds": 5}
    apply(cluster, manifest, model_deployment("stall", replicas=REPLICAS, port=8001, version="v1", spec=spec))
    assert rollout_status(cluster, "stall").returncode == 0
    wait_until(lambda: len(serving(cluster, "stall")) == REPLICAS, 30, "3 ready pods")

    with Load(cluster.gateway, "stall", workers=2) as load:
        # The new version's readiness probe asks a path the server does not have: never ready.
        apply(cluster, manifest, model_deployment("stall", replicas=REPLICAS, port=8001, version="v2",
                                                  readiness_path="/never", spec=spec))
        started = time.monotonic()
        status = rollout_status(cluster, "stall", timeout=60)
        waited = time.monotonic() - started
        assert status.returncode == 1, (status.stdout, status.stderr)
        assert status.stderr.strip() == 'error: deployment "stall" exceeded its progress deadline'
        assert waited < 30
        # Still stalled, still served by the old version.
        time.sleep(1)
    assert load.failures() == [], load.failures()[:5]
    assert {a.version for a in load.answers} == {"v1"}
    assert len(serving(cluster, "stall")) >= REPLICAS - MAX_UNAVAILABLE
    described = cluster.run(["shoal", "describe", "deployment", "stall"]).stdout
    assert "ProgressDeadlineExceeded" in described
    status, body = ask(cluster.gateway, "stall")
    assert status == 200 and body["version"] == "v1"


def test_a_replacement_waits_for_the_port_its_draining_predecessor_holds(cluster, tmp_path):
    # One pod per node and no surge: each new pod can only go where an old one is draining a
    # long answer (about 5 s) and still listens on the port.
    manifest = tmp_path / "drain.yaml"
    spec = {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}
    env = {"TOKEN_DELAY": 0.01}
    apply(cluster, manifest, model_deployment("drain", replicas=4, port=8002, env=env, spec=spec))
    assert rollout_status(cluster, "drain").returncode == 0
    with Load(cluster.gateway, "drain", workers=4, max_tokens=500) as load:
        wait_until(lambda: len(backends(cluster, "drain")) == 4 and len(load.answers) >= 4, 30, "long answers")
        apply(cluster, manifest, model_deployment("drain", replicas=4, port=8002, version="v2", env=env, spec=spec))
        assert rollout_status(cluster, "drain").returncode == 0
    assert load.failures() == [], load.failures()[:5]
    restarts = {p["metadata"]["name"]: container_restarts(p) for p in pods(cluster, "app=drain")}
    cluster.run(["shoal", "delete", "deployment", "drain"])
    assert set(restarts.values()) == {0}, restarts  # not one "Address already in use" crash
