"""Pods supervised on a node with real processes (the process runtime), as an administrator
would watch them: crash loops, probes, grace periods, logs, exits, and nothing left behind."""

from __future__ import annotations

import copy
import os
import pwd
import re
import signal
import socket
import sys
import threading
import time

import psutil
import pytest

from shoal.agent.identity import JobUsers
from shoal.agent.pods import LogNotFound, PodManager, go_duration

PY = sys.executable


class Changes:
    """The on_change callback: every status and event the manager hands over, in order."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seen: list[tuple[float, str, dict, list]] = []

    def __call__(self, key: str, status: dict, events: list) -> None:
        with self.cond:
            self.seen.append((time.monotonic(), key, copy.deepcopy(status), list(events)))
            self.cond.notify_all()

    def wait(self, pred, timeout: float = 5.0, start: int = 0) -> tuple[int, float, dict]:
        """The first status from ``start`` on that satisfies ``pred``: (next index, when, status)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            i = start
            while True:
                while i < len(self.seen):
                    t, _, status, _ = self.seen[i]
                    i += 1
                    if pred(status):
                        return i, t, status
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no such status within {timeout}s; last: "
                                         f"{self.seen[-1][2] if self.seen else None}")
                self.cond.wait(left)

    def events(self, reason: str | None = None) -> list[dict]:
        with self.cond:
            return [e for _, _, _, evs in self.seen for e in evs if reason is None or e["reason"] == reason]


ME = pwd.getpwuid(os.geteuid()).pw_name  # the agent's own user: its pods run without a switch


@pytest.fixture
def changes() -> Changes:
    return Changes()


@pytest.fixture
def pods(tmp_path, changes):
    m = PodManager("node1", tmp_path / "work", "127.0.0.1", changes, images={},
                   backoff_base_s=0.2, backoff_max_s=1.0)
    yield m
    m.shutdown()


def entry(name: str, *containers: dict, policy: str = "Always", grace: float = 30, gpus=(), key: str = "7.0"):
    return {"key": key, "job_id": 7, "run": 0, "gpus": list(gpus), "cpus": 1, "user": ME,
            "pod": {"namespace": "default", "name": name, "uid": f"uid-{name}", "labels": {},
                    "spec": {"containers": list(containers), "restartPolicy": policy,
                             "terminationGracePeriodSeconds": grace},
                    "runtime": "process",
                    "env": {"POD_NAME": name, "POD_NAMESPACE": "default", "POD_IP": "127.0.0.1",
                            "NODE_NAME": "node1"}}}


def container(command: list[str], name: str = "app", **extra) -> dict:
    return {"name": name, "image": "example/app:v1", "command": command, **extra}


def cs(status: dict, i: int = 0) -> dict:
    return status["containerStatuses"][i]


def condition(status: dict, kind: str) -> str:
    return next(c["status"] for c in status["conditions"] if c["type"] == kind)


def waiting_reason(status: dict, i: int = 0) -> str | None:
    return cs(status, i)["state"].get("waiting", {}).get("reason")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stop_all(pods: PodManager, key: str, timeout: float = 5.0) -> float:
    """Call stop() the way the daemon does, until everything is gone; returns the seconds it took."""
    t0 = time.monotonic()
    while not pods.stop(key):
        assert time.monotonic() - t0 < timeout, "the pod's processes outlived the stop"
        time.sleep(0.02)
    return time.monotonic() - t0


def test_a_crashing_container_restarts_with_growing_back_off(pods, changes, tmp_path):
    starts = tmp_path / "starts"
    crash = [PY, "-c", "import sys, time; open(sys.argv[1], 'a').write(f'{time.monotonic()}\\n'); sys.exit(1)",
             str(starts)]
    pods.ensure(entry("crash", container(crash)))
    _, _, status = changes.wait(lambda s: cs(s)["restartCount"] >= 4 and waiting_reason(s) == "CrashLoopBackOff")
    assert status["phase"] == "Running" and condition(status, "Ready") == "False"
    c = cs(status)
    assert c["state"]["waiting"]["message"].startswith("back-off ")
    assert c["state"]["waiting"]["message"].endswith(" restarting failed container=app pod=crash_default(uid-crash)")
    assert c["lastState"]["terminated"]["exitCode"] == 1 and c["lastState"]["terminated"]["reason"] == "Error"
    messages = [cs(s)["state"]["waiting"]["message"].split()[1] for _, _, s, _ in changes.seen
                if waiting_reason(s) == "CrashLoopBackOff"]
    assert messages[:3] == ["200ms", "400ms", "800ms"]  # the first restart is at once, as kubelet's
    times = [float(t) for t in starts.read_text().split()]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[1] >= 0.2 and gaps[2] >= 0.4 and gaps[3] >= 0.8
    assert gaps[0] < gaps[2] and gaps[1] < gaps[3]  # at once, then doubling
    back_offs = changes.events("BackOff")
    assert back_offs and back_offs[0]["type"] == "Warning"
    assert back_offs[0]["message"] == "Back-off restarting failed container app in pod crash_default(uid-crash)"
    assert pods.exit_of("7.0") is None and pods.alive_keys() == ["7.0"]


def test_back_off_is_capped_and_printed_as_kubelet_prints_it():
    assert [go_duration(s) for s in (0.2, 10, 20, 40, 80, 160, 300)] == \
        ["200ms", "10s", "20s", "40s", "1m20s", "2m40s", "5m0s"]


def test_a_failing_liveness_probe_restarts_the_container(pods, changes, tmp_path):
    healthy = tmp_path / "healthy"
    healthy.touch()
    probe = {"exec": {"command": ["sh", "-c", f"test -e {healthy} || {{ echo model server hung; exit 1; }}"]},
             "periodSeconds": 0.1, "failureThreshold": 2, "terminationGracePeriodSeconds": 1}
    pods.ensure(entry("live", container(["sleep", "30"], livenessProbe=probe)))
    i, _, _ = changes.wait(lambda s: "running" in cs(s)["state"])
    time.sleep(0.3)
    assert cs(pods.status("7.0"))["restartCount"] == 0  # healthy: left alone
    healthy.unlink()
    i, _, status = changes.wait(lambda s: cs(s)["restartCount"] == 1 and "running" in cs(s)["state"], start=i)
    healthy.touch()
    last = cs(status)["lastState"]["terminated"]
    assert last["signal"] == signal.SIGTERM and last["exitCode"] == 128 + signal.SIGTERM
    assert [e["message"] for e in changes.events("Unhealthy")][:2] == ["Liveness probe failed: model server hung"] * 2
    assert changes.events("Killing")[0]["message"] == "Container app failed liveness probe, will be restarted"
    assert {e["reason"] for e in changes.events()} >= {"Created", "Started", "Unhealthy", "Killing"}


SERVER = r"""
import http.server, os, sys
flag = sys.argv[1]
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if os.path.exists(flag) else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer((os.environ["POD_IP"], int(os.environ["PORT"])), Health).serve_forever()
"""


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_readiness_flips_ready_and_reaches_on_change_within_a_period(pods, changes, tmp_path):
    loaded = tmp_path / "model-loaded"
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 0.1, "failureThreshold": 1}
    server = container([PY, "-c", SERVER, str(loaded)], ports=[{"name": "http", "containerPort": _free_port()}],
                       readinessProbe=probe)
    pods.ensure(entry("ready", server))
    i, _, status = changes.wait(lambda s: "running" in cs(s)["state"])
    assert condition(status, "Ready") == "False" and not cs(status)["ready"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ContainersNotReady" and ready["message"] == "containers with unready status: [app]"
    time.sleep(0.3)  # the model loads
    loaded.touch()
    t0 = time.monotonic()
    i, t, status = changes.wait(lambda s: condition(s, "Ready") == "True", start=i)
    assert t - t0 < 0.1 + 0.5  # one period, and some slack for a busy machine
    assert cs(status)["ready"] and condition(status, "ContainersReady") == "True"
    loaded.unlink()
    t0 = time.monotonic()
    i, t, status = changes.wait(lambda s: condition(s, "Ready") == "False", start=i)
    assert t - t0 < 0.1 + 0.5
    assert "running" in cs(status)["state"] and cs(status)["restartCount"] == 0
    assert "Readiness probe failed: HTTP probe failed with statuscode: 503" in \
        {e["message"] for e in changes.events("Unhealthy")}
    loaded.touch()
    changes.wait(lambda s: condition(s, "Ready") == "True", start=i)


def test_a_startup_probe_holds_back_liveness_until_it_succeeds(pods, changes, tmp_path):
    started = tmp_path / "started"
    startup = {"exec": {"command": ["test", "-e", str(started)]}, "periodSeconds": 0.05, "failureThreshold": 100}
    liveness = {"exec": {"command": ["true"]}, "periodSeconds": 0.05}
    readiness = {"exec": {"command": ["true"]}, "periodSeconds": 0.05}
    pods.ensure(entry("slow", container(["sleep", "30"], startupProbe=startup, livenessProbe=liveness,
                                        readinessProbe=readiness)))
    i, _, status = changes.wait(lambda s: "running" in cs(s)["state"])
    time.sleep(0.3)
    status = pods.status("7.0")
    assert not cs(status)["started"] and not cs(status)["ready"]
    started.touch()
    _, _, status = changes.wait(lambda s: cs(s)["started"] and cs(s)["ready"], start=i)
    assert condition(status, "Ready") == "True"


def test_a_startup_probe_that_never_succeeds_kills_the_container(pods, changes):
    startup = {"exec": {"command": ["sh", "-c", "exit 1"]}, "periodSeconds": 0.05, "failureThreshold": 2,
               "terminationGracePeriodSeconds": 1}
    pods.ensure(entry("never", container(["sleep", "30"], startupProbe=startup)))
    changes.wait(lambda s: cs(s)["restartCount"] >= 1)
    assert changes.events("Killing")[0]["message"] == "Container app failed startup probe, will be restarted"


def test_a_container_ignoring_term_is_killed_after_the_grace_period(pods, changes):
    stubborn = [PY, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "print('ignoring TERM', flush=True); time.sleep(60)"]
    pods.ensure(entry("stubborn", container(stubborn), grace=0.5, policy="Never"))
    changes.wait(lambda s: "running" in cs(s)["state"])
    log = pods.log_path("7.0", "app")
    deadline = time.monotonic() + 5
    while b"ignoring TERM" not in log.read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pid = int((log.parent / "pid").read_text().split()[0])
    took = stop_all(pods, "7.0")
    assert 0.4 <= took < 3.0
    assert gone(pid)
    term = cs(pods.status("7.0"))["state"]["terminated"]
    assert term["signal"] == signal.SIGKILL and term["exitCode"] == 137
    assert pods.exit_of("7.0") == (0, signal.SIGKILL)
    assert changes.events("Killing")[0]["message"] == "Stopping container app"
    assert pods.stop("7.0") is True  # safe to call again


def test_logs_are_kept_per_restart_and_the_previous_one_is_readable(pods, changes, tmp_path):
    script = 'n=$(cat count 2>/dev/null || echo 0); echo "out $n"; echo "err $n" >&2; echo $((n+1)) > count; exit 1'
    pods.ensure(entry("logs", container(["sh", "-c", script], workingDir=str(tmp_path)), policy="OnFailure"))
    changes.wait(lambda s: cs(s)["restartCount"] >= 2 and "running" not in cs(s)["state"])
    current = int(pods.log_path("7.0", "app").stem)
    previous = pods.log_path(("default", "logs"), "app", previous=True)
    assert int(previous.stem) == current - 1
    assert previous.read_text() == f"out {current - 1}\nerr {current - 1}\n"
    assert previous == tmp_path / "work" / "pods" / "default_logs_uid-logs" / "app" / f"{current - 1}.log"
    with pytest.raises(LogNotFound, match="container sidecar is not valid for pod logs"):
        pods.log_path("7.0", "sidecar")
    stop_all(pods, "7.0")
    # A restarted agent finds the logs on disk.
    other = PodManager("node1", tmp_path / "work", "127.0.0.1", lambda *a: None)
    try:
        assert other.log_path(("default", "logs"), "app", previous=True) == previous
        with pytest.raises(LogNotFound):
            other.log_path(("default", "nope"), "app")
    finally:
        other.shutdown()


def test_no_previous_log_before_a_restart(pods, changes):
    pods.ensure(entry("once", container(["sh", "-c", "echo hello"]), policy="Never"))
    changes.wait(lambda s: s["phase"] == "Succeeded")
    assert pods.log_path("7.0", "app").read_text() == "hello\n"
    with pytest.raises(LogNotFound, match='previous terminated container "app" in pod "once" not found'):
        pods.log_path("7.0", "app", previous=True)


def test_restart_policy_never_reports_the_pods_exit(pods, changes):
    pods.ensure(entry("job", container(["sh", "-c", "exit 0"], name="a"), container(["sh", "-c", "exit 3"], name="b"),
                      policy="Never"))
    _, _, status = changes.wait(lambda s: s["phase"] == "Failed")
    assert cs(status, 0)["state"]["terminated"]["reason"] == "Completed"
    assert cs(status, 1)["state"]["terminated"]["exitCode"] == 3
    assert cs(status, 1)["state"]["terminated"]["reason"] == "Error"
    assert cs(status, 1)["restartCount"] == 0
    deadline = time.monotonic() + 5
    while pods.exit_of("7.0") is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert pods.exit_of("7.0") == (3, 0)
    assert pods.alive_keys() == []


def test_restart_policy_on_failure_ends_once_every_container_exits_zero(pods, changes, tmp_path):
    flag = tmp_path / "second-try"
    script = f'[ -e {flag} ] && exit 0; touch {flag}; exit 1'
    pods.ensure(entry("retry", container(["sh", "-c", script]), policy="OnFailure"))
    _, _, status = changes.wait(lambda s: s["phase"] == "Succeeded")
    assert cs(status)["restartCount"] == 1 and cs(status)["state"]["terminated"]["reason"] == "Completed"
    deadline = time.monotonic() + 5
    while pods.exit_of("7.0") is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert pods.exit_of("7.0") == (0, 0)


def test_the_container_sees_its_gpus_and_the_pod_environment(pods, changes):
    show = container(["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $POD_NAME $POD_IP $NODE_NAME $PORT"'],
                     ports=[{"containerPort": 8000}])
    pods.ensure(entry("gpus", show, policy="Never", gpus=[4, 5, 6, 7]))
    changes.wait(lambda s: s["phase"] == "Succeeded")
    assert pods.log_path("7.0", "app").read_text() == "4,5,6,7 gpus 127.0.0.1 node1 8000\n"


def test_status_has_the_shape_of_a_pod_status(pods, changes):
    pods.ensure(entry("shape", container(["sleep", "30"])))
    _, _, status = changes.wait(lambda s: s["phase"] == "Running")
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    assert status["podIP"] == "127.0.0.1" and status["hostIP"] == "127.0.0.1"
    assert stamp.match(status["startTime"])
    assert [c["type"] for c in status["conditions"]] == ["Ready", "ContainersReady", "Initialized", "PodScheduled"]
    assert all(stamp.match(c["lastTransitionTime"]) for c in status["conditions"])
    c = cs(status)
    assert c["ready"] and c["started"] and c["restartCount"] == 0 and c["lastState"] == {}
    assert c["image"] == "example/app:v1" and stamp.match(c["state"]["running"]["startedAt"])
    assert condition(status, "Ready") == "True"  # no readiness probe: ready once running


def test_ensure_is_idempotent(pods, changes, tmp_path):
    e = entry("twice", container(["sleep", "30"]))
    pods.ensure(e)
    pods.ensure(e)
    changes.wait(lambda s: "running" in cs(s)["state"])
    pods.ensure(e)
    time.sleep(0.1)
    assert len(list((tmp_path / "work" / "pods" / "default_twice_uid-twice" / "app").glob("*.log"))) == 1


def test_every_process_is_gone_after_stop(pods, changes, tmp_path):
    forks = ["sh", "-c", "sleep 30 & sleep 30 & wait"]
    pods.ensure(entry("many", container(forks, name="a"), container(forks, name="b"), grace=2))
    changes.wait(lambda s: all("running" in c["state"] for c in s["containerStatuses"]))
    pids = []
    deadline = time.monotonic() + 5
    for name in ("a", "b"):
        pid = int((tmp_path / "work" / "pods" / "default_many_uid-many" / name / "pid").read_text().split()[0])
        while len(psutil.Process(pid).children()) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        pids += [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    assert len(pids) == 6
    assert stop_all(pods, "7.0") < 2.0  # TERM was enough
    assert all(gone(p) for p in pids)
    assert pods.alive_keys() == [] and pods.exit_of("7.0") is not None


def test_stop_during_back_off_ends_the_pod_at_once(pods, changes):
    pods.ensure(entry("crashy", container(["sh", "-c", "exit 1"])))
    changes.wait(lambda s: waiting_reason(s) == "CrashLoopBackOff")
    assert stop_all(pods, "7.0") < 1.0
    assert pods.exit_of("7.0") == (1, 0)
    assert pods.status("7.0")["phase"] == "Failed"


def test_a_command_the_node_cannot_run_is_a_start_error_that_backs_off(pods, changes):
    pods.ensure(entry("typo", container(["/nonexistent/vllm-serve"])))
    _, _, status = changes.wait(lambda s: cs(s)["restartCount"] >= 1 and waiting_reason(s) == "CrashLoopBackOff")
    last = cs(status)["lastState"]["terminated"]
    assert last["reason"] == "StartError" and last["exitCode"] == 128
    assert "No such file or directory" in last["message"]


def test_no_command_and_no_image_mapping_waits_with_create_container_error(pods, changes):
    pods.ensure(entry("unmapped", {"name": "app", "image": "vllm/vllm-openai:v0.6.3"}))
    _, _, status = changes.wait(lambda s: waiting_reason(s) == "CreateContainerError")
    assert cs(status)["state"]["waiting"]["message"] == (
        "the process runtime needs a command for image vllm/vllm-openai:v0.6.3 "
        "(set command, or map the image in the agent's images:)")
    assert status["phase"] == "Pending"
    assert "Error: the process runtime needs a command" in changes.events("Failed")[0]["message"]


def test_a_mapped_image_runs_the_mapped_argv_with_the_args(tmp_path, changes):
    m = PodManager("node1", tmp_path / "work", "127.0.0.1", changes,
                   images={"vllm/vllm-openai:*": ["sh", "-c", 'echo "serving $0 $1"']})
    try:
        m.ensure(entry("mapped", {"name": "app", "image": "vllm/vllm-openai:v0.6.3", "args": ["--model", "x"]},
                       policy="Never"))
        changes.wait(lambda s: s["phase"] == "Succeeded")
        assert m.log_path("7.0", "app").read_text() == "serving --model x\n"
    finally:
        m.shutdown()


def test_a_missing_runtime_binary_and_a_failed_pull(tmp_path, changes, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    podman = bin_dir / "podman"
    podman.write_text('#!/bin/sh\n[ "$1" = run ] || exit 0\n'
                      'echo "Trying to pull docker.io/example/nope:v1..." >&2\n'
                      'echo "Error: initializing source docker://example/nope:v1: reading manifest v1 in '
                      'docker.io/example/nope: manifest unknown" >&2\nexit 125\n')
    podman.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    m = PodManager("node1", tmp_path / "work", "127.0.0.1", changes, backoff_base_s=0.2, backoff_max_s=1.0)
    try:
        pull = entry("pull", {"name": "app", "image": "example/nope:v1"})
        pull["pod"]["runtime"] = "podman"
        m.ensure(pull)
        i, _, status = changes.wait(lambda s: waiting_reason(s) == "ErrImagePull")
        assert cs(status)["state"]["waiting"]["message"].startswith("Error: initializing source")
        assert cs(status)["restartCount"] == 0 and status["phase"] == "Pending"
        _, _, status = changes.wait(lambda s: waiting_reason(s) == "ImagePullBackOff", start=i)
        assert cs(status)["state"]["waiting"]["message"] == 'Back-off pulling image "example/nope:v1"'
        assert cs(status)["restartCount"] == 0
        assert any(e["message"].startswith('Failed to pull image "example/nope:v1": Error: initializing source')
                   for e in changes.events("Failed"))
        nodocker = entry("nodocker", {"name": "app", "image": "example/app:v1"}, key="8.0")
        nodocker["pod"]["runtime"] = "docker"
        m.ensure(nodocker)
        _, _, status = changes.wait(lambda s: waiting_reason(s) == "CreateContainerError"
                                    and "docker" in cs(s)["state"]["waiting"].get("message", ""))
        assert cs(status)["state"]["waiting"]["message"] == "docker not found on node node1"
    finally:
        m.shutdown()


def test_a_pod_whose_owner_has_no_account_on_the_node_never_starts(tmp_path, changes):
    """An agent running as root starts pods as their owner; an owner unknown on the node is a
    config error the pod shows, never a container run as root."""
    m = PodManager("node1", tmp_path / "work", "127.0.0.1", changes, users=JobUsers(switch=True))
    try:
        e = entry("stranger", {"name": "app", "image": "example/app:v1", "command": ["true"]}, policy="Never")
        e["user"] = "no-such-user-on-this-node"
        m.ensure(e)
        _, _, status = changes.wait(lambda s: s["containerStatuses"][0]["state"].get("waiting", {}).get("reason")
                                    == "CreateContainerConfigError")
        assert status["containerStatuses"][0]["state"]["waiting"]["message"] == \
            "user no-such-user-on-this-node is unknown on node node1"
        assert not (tmp_path / "work" / "pods" / "default_stranger_uid-stranger" / "app" / "0.log").exists()
    finally:
        m.shutdown()


def test_a_forgotten_pod_has_no_status_rather_than_an_error(pods, changes):
    # The agent's reporter lists pods, then asks each one's status; forget_dead may run between.
    pods.ensure(entry("brief", container(["true"]), policy="Never"))
    changes.wait(lambda s: s["phase"] == "Succeeded")
    stop_all(pods, "7.0")
    pods.forget_dead(keep=set())
    assert pods.status("7.0") is None
