"""Probes and logs end to end on a real cluster, behind `shoal gateway`, with the example
model server: a pod that turns unready leaves the gateway within one probe period and comes
back when ready again; a pod that fails its liveness probe is restarted with kubelet's
growing back-off, and says so in its status, events and logs; `shoal logs -f` follows until the
container ends."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests.integration.cluster import LocalCluster, free_port, wait_until
from tests.integration.traffic import Load, apply, backends, model_deployment, pods, serving

PERIOD_S = 1
# What a readiness change takes on top of the probe period: the agent reports the pod's
# status at once (one HTTP call), the server commits it and wakes the gateway's long-poll,
# which swaps its table; on this shared 2-core machine that is tens of milliseconds, seldom
# a few hundred. The probe itself may take up to its 1 s timeout, but /health answers at once.
PROPAGATION_MARGIN_S = 0.75


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    gw = free_port()
    c = LocalCluster(tmp_path_factory.mktemp("probes"), nodes=2, gpus_per_node=1, extra=("--gateway", str(gw)))
    c.gateway = f"http://127.0.0.1:{gw}"
    c.up()
    yield c
    c.down()


def set_unhealthy(backend: dict, unhealthy: bool) -> None:
    """Flip the model server's /health, as an overloaded or wedged replica would."""
    req = urllib.request.Request(f"http://{backend['address']}:{backend['port']}/admin/unhealthy", method="POST",
                                 data=json.dumps({"unhealthy": unhealthy}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert json.loads(r.read())["unhealthy"] is unhealthy


def test_an_unready_pod_leaves_the_gateway_within_one_probe_period(cluster, tmp_path):
    apply(cluster, tmp_path / "ready.yaml", model_deployment("ready", replicas=2, port=8100, period_s=PERIOD_S))
    wait_until(lambda: len(serving(cluster, "ready")) == 2, 60, "2 ready pods in the routes")
    victim = backends(cluster, "ready")[0]

    with Load(cluster.gateway, "ready", workers=3) as load:
        wait_until(lambda: {a.pod for a in load.answers} == {b["pod"] for b in backends(cluster, "ready")}, 30,
                   "both pods answering")
        flipped = time.time()
        set_unhealthy(victim, True)
        wait_until(lambda: victim["pod"] not in serving(cluster, "ready"), 10, "the pod to leave the routes")
        time.sleep(2 * PERIOD_S)  # traffic goes on to the other pod only
        last_sent = max(a.sent for a in load.answers if a.pod == victim["pod"])
        recovered = time.time()
        set_unhealthy(victim, False)
        back = wait_until(lambda: next((a.sent for a in load.answers
                                        if a.pod == victim["pod"] and a.sent > recovered), None), 10,
                          "traffic to the pod once ready again")

    assert load.failures() == [], load.failures()[:5]
    left_after = last_sent - flipped
    returned_after = back - recovered
    print(f"unready pod's last request {left_after:.3f} s after the flip; first again {returned_after:.3f} s "
          f"after recovery (period {PERIOD_S} s)")
    assert left_after <= PERIOD_S + PROPAGATION_MARGIN_S
    assert returned_after <= PERIOD_S + PROPAGATION_MARGIN_S
    others = {a.pod for a in load.answers if flipped + PERIOD_S + PROPAGATION_MARGIN_S < a.sent < recovered}
    assert others == {b["pod"] for b in backends(cluster, "ready")} - {victim["pod"]}
    events = cluster.run(["shoal", "get", "events"]).stdout
    assert "Readiness probe failed: HTTP probe failed with statuscode: 503" in events
    cluster.run(["shoal", "delete", "deployment", "ready"])


def container(pod: dict) -> dict:
    return pod["status"]["containerStatuses"][0]


def seconds(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def test_a_failing_liveness_probe_restarts_the_container_with_growing_back_off(cluster, tmp_path):
    # /health answers 200 for 2 s after each start, then 503: each run is killed after ~2-3 s.
    liveness = {"httpGet": {"path": "/health", "port": 8200}, "initialDelaySeconds": 1, "periodSeconds": 1,
                "failureThreshold": 1}
    apply(cluster, tmp_path / "flaky.yaml",
          model_deployment("flaky", replicas=1, port=8200, env={"HEALTHY_SECONDS": 2, "LOAD_SECONDS": 0.1},
                           readiness_path=None, liveness=liveness))
    seen: dict[int, dict] = {}  # restartCount -> the container's status while that run was current
    waiting: list[str] = []

    def restarted(n: int):
        for pod in pods(cluster, "app=flaky"):
            st = container(pod)
            seen.setdefault(st["restartCount"], st)
            if "running" in st["state"]:
                seen[st["restartCount"]] = st
            message = st["state"].get("waiting", {}).get("message", "")
            if message and message not in waiting:
                waiting.append(message)
            if st["restartCount"] >= n and "running" in st["state"]:
                return pod
        return None

    # kubelet's back-off with its defaults: the first restart at once, then 10 s, then 20 s.
    pod = wait_until(lambda: restarted(3), 90, "the third restart", interval=0.3)
    name = pod["metadata"]["name"]
    gaps = []
    for n in (1, 2, 3):
        st = seen[n]
        gaps.append(seconds(st["state"]["running"]["startedAt"]) - seconds(st["lastState"]["terminated"]["finishedAt"]))
    print(f"restart gaps {gaps} s")
    assert gaps[0] <= 1.5 and 8.5 <= gaps[1] <= 11.5 and 18.5 <= gaps[2] <= 21.5
    assert [m.split(" restarting")[0] for m in waiting if "back-off" in m] == ["back-off 10s", "back-off 20s"]
    assert all(m.endswith(f"container=model pod={name}_default({pod['metadata']['uid']})")
               for m in waiting if "back-off" in m)
    last = seen[3]["lastState"]["terminated"]
    # The model server drains on TERM and exits 0, which kubelet shows as Completed too.
    assert (last["exitCode"], last["reason"]) == (0, "Completed")

    described = cluster.run(["shoal", "describe", "pod", name]).stdout
    assert "Restart Count:  3" in described
    for reason, message in (("Unhealthy", "Liveness probe failed: HTTP probe failed with statuscode: 503"),
                            ("Killing", "Container model failed liveness probe, will be restarted"),
                            ("BackOff", "Back-off restarting failed container model in pod")):
        assert any(reason in line and message in line for line in described.splitlines()), (reason, described)
    events = cluster.run(["shoal", "get", "events"]).stdout
    assert all(reason in events for reason in ("Unhealthy", "Killing", "BackOff"))
    table = cluster.run(["shoal", "get", "pods", "-l", "app=flaky"]).stdout
    assert table.splitlines()[1].split()[3] == "3"  # RESTARTS

    # The previous run's log: loaded, probed, then told to stop by the liveness kill.
    previous = cluster.run(["shoal", "logs", "--previous", name]).stdout
    assert "model shoal/markov-tiny (v1) loaded" in previous
    assert '"GET /health HTTP/1.1" 503' in previous
    assert "SIGTERM: finishing 0 in-flight request(s), then exiting" in previous
    current = cluster.run(["shoal", "logs", name]).stdout
    assert current != previous and "loaded" in current
    cluster.run(["shoal", "delete", "deployment", "flaky"])


def test_logs_follow_shows_new_lines_as_they_come(cluster, tmp_path):
    apply(cluster, tmp_path / "tail.yaml", model_deployment("tail", replicas=1, port=8300))
    wait_until(lambda: serving(cluster, "tail"), 60, "a ready pod")
    name = pods(cluster, "app=tail")[0]["metadata"]["name"]
    follow = subprocess.Popen(["shoal", "logs", "-f", name], env=cluster.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follow.stdout], daemon=True).start()
    try:
        seen: list[str] = []

        def saw(text: str):
            while not lines.empty():
                seen.append(lines.get())
            return any(text in line for line in seen)

        wait_until(lambda: saw("loaded"), 15, "the log so far")
        for _ in range(3):
            marker = f"/marker-{uuid.uuid4().hex[:8]}"
            assert marker not in "".join(seen)
            assert get(cluster.gateway, marker, "tail.default") == 404  # logged with its path
            wait_until(lambda marker=marker: saw(marker), 10, f"{marker} in the followed log")
        assert follow.poll() is None  # still following
        # As kubectl's, following ends when the container does.
        cluster.run(["shoal", "delete", "deployment", "tail"])
        assert follow.wait(30) == 0
        wait_until(lambda: saw("SIGTERM: finishing"), 5, "the container's last words")
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(10)


def get(gateway: str, path: str, host: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{gateway}{path}", headers={"Host": host}), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
