"""Pods re-adopted by an agent that starts again after a crash: an earlier agent (a real
process, killed with SIGKILL) leaves its containers running under their supervisors, and a
new PodManager on the same work directory takes them over, as kubelet re-attaches through
conmon: same process, same restart count, its real exit code when it ends."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shoal.agent.pods import PodManager
from tests.unit.test_pods import PY, Changes, container, cs, entry, gone, stop_all

# The earlier agent: start the pod, say the container's pid once it runs, then wait to be killed.
EARLIER_AGENT = """
import json, sys, time
from shoal.agent.pods import PodManager
m = PodManager("node1", sys.argv[1], "127.0.0.1", lambda *a: None, backoff_base_s=0.2, backoff_max_s=1.0)
m.ensure(json.loads(sys.argv[2]))
while True:
    s = m.status(json.loads(sys.argv[2])["key"])
    if s and "running" in s["containerStatuses"][0]["state"]:
        print(s["containerStatuses"][0]["containerID"].split("://")[1], flush=True)
        break
    time.sleep(0.02)
time.sleep(600)
"""


def crash_after_start(workdir: Path, pod: dict) -> int:
    """Run ``pod`` under an agent process, kill -9 that agent once the container runs;
    the container's pid."""
    agent = subprocess.Popen([sys.executable, "-c", EARLIER_AGENT, str(workdir), json.dumps(pod)],
                             stdout=subprocess.PIPE, text=True)
    try:
        pid = int(agent.stdout.readline())
    finally:
        agent.kill()
        agent.wait()
        agent.stdout.close()
    return pid


@pytest.fixture
def restarted(tmp_path):
    """A new agent's PodManager on the earlier one's work directory, and its Changes."""
    made = []

    def make() -> tuple[PodManager, Changes]:
        changes = Changes()
        made.append(PodManager("node1", tmp_path / "work", "127.0.0.1", changes, backoff_base_s=0.2,
                               backoff_max_s=1.0))
        return made[0], changes

    yield make
    for m in made:
        m.shutdown()


def test_a_running_container_is_adopted_not_restarted(tmp_path, restarted):
    serve = [PY, "-c", ("import signal, sys, time; print('up', flush=True); "
                        "signal.signal(signal.SIGTERM, lambda *a: (print('bye', flush=True), sys.exit(3))); "
                        "[time.sleep(0.05) or print('tick', flush=True) for _ in iter(int, 1)]")]
    pod = entry("server", container(serve, readinessProbe={"exec": {"command": ["true"]}, "periodSeconds": 1}),
                grace=5)
    pid = crash_after_start(tmp_path / "work", pod)
    pods, changes = restarted()
    assert pods.adopt() == ["7.0"]
    _, _, status = changes.wait(lambda s: cs(s)["ready"])  # held back until its first readiness probe
    assert cs(status)["containerID"] == f"process://{pid}" and cs(status)["restartCount"] == 0
    assert all(cs(s)["ready"] for _, _, s, _ in changes.seen)  # never reported unready
    assert not gone(pid)
    log = pods.log_path("7.0", "app")
    size = log.stat().st_size
    time.sleep(0.3)
    assert log.stat().st_size > size  # the log goes on in the same file
    # `shoal exec` reaches it; the server lists the pod, then deletes it: TERM, and its own exit code.
    assert pods.exec_target("7.0", "app", ["true"]).argv == ["true"]
    pods.ensure(pod)
    stop_all(pods, "7.0")
    assert gone(pid)
    assert cs(pods.status("7.0"))["state"]["terminated"]["exitCode"] == 3
    assert log.read_text().endswith("bye\n")


def test_a_container_that_ended_while_no_agent_watched_restarts_only_once_listed(tmp_path, restarted):
    flag = tmp_path / "go"
    script = f"while [ ! -e {flag} ]; do sleep 0.02; done; echo ending; exit 4"
    pod = entry("batchy", container(["sh", "-c", script]), policy="OnFailure")
    pid = crash_after_start(tmp_path / "work", pod)
    flag.touch()
    deadline = time.monotonic() + 5
    while not gone(pid):
        assert time.monotonic() < deadline, "the container did not end"
        time.sleep(0.02)
    pods, changes = restarted()
    assert pods.adopt() == ["7.0"]
    _, _, status = changes.wait(lambda s: "terminated" in cs(s)["state"] or cs(s)["lastState"])
    ended = cs(status)["state"].get("terminated") or cs(status)["lastState"]["terminated"]
    assert ended["exitCode"] == 4 and cs(status)["restartCount"] == 0
    time.sleep(0.5)
    assert cs(pods.status("7.0"))["restartCount"] == 0  # not listed yet: not started again
    pods.ensure(pod)
    changes.wait(lambda s: cs(s)["restartCount"] == 1 and "running" in cs(s)["state"])
    assert pods.log_path("7.0", "app", previous=True).read_text() == "ending\n"


def test_a_stopped_pod_leaves_nothing_for_a_later_agent_to_adopt(tmp_path, restarted):
    pod = entry("sleepy", container(["sh", "-c", "sleep 600"]))
    pid = crash_after_start(tmp_path / "work", pod)
    pods, _ = restarted()
    assert pods.adopt() == ["7.0"]
    assert pods.adopt() == []  # known already
    assert stop_all(pods, "7.0") < 5
    assert gone(pid)
    pods.forget_dead(set())
    assert not any((tmp_path / "work" / "pods").glob("*/entry.json"))
    assert not any((tmp_path / "work" / "pods").glob("*/app/run.*"))
