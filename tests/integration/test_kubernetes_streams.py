"""kubectl's streaming commands against Shoal, with the real kubectl 1.32 (WebSockets:
``v5.channel.k8s.io``) and the official Python client: exec (stdin, a terminal and its size,
the exit code), cp, attach, logs -f and its options, watch bookmarks and the status
subresources. The pods run on the process runtime: a container is a process on the node.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

from tests.integration.cluster import LocalCluster, free_port, wait_until
from tests.integration.terminal import Terminal

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")]

TICKER = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.3; done"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("kubestreams"), nodes=1, gpus_per_node=2, extra=("--tls", "on"))
    c.up()
    c.kubeconfig = str(c.root / "state" / "kubeconfig")
    c.env.update(KUBECONFIG=c.kubeconfig, KUBECACHEDIR=str(c.root / "kube-cache"))
    yield c
    c.down()


def kubectl(c: LocalCluster, *args: str, check: bool = True, timeout: float = 60, stdin: str | None = None):
    return c.run(["kubectl", *args], check=check, timeout=timeout, input=stdin)


def pod(name: str, script: str, *, env: dict | None = None, restart: str = "Always", extra: list | None = None) -> dict:
    container = {"name": "main", "image": "busybox", "command": ["sh", "-c", script],
                 "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"test": "streams"}},
            "spec": {"restartPolicy": restart, "containers": [container, *(extra or [])]}}


def create(c: LocalCluster, manifest: dict) -> None:
    path = c.root / f"{manifest['metadata']['name']}.json"
    path.write_text(json.dumps(manifest))
    kubectl(c, "apply", "-f", str(path))


def running(c: LocalCluster, name: str) -> None:
    kubectl(c, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=60s", timeout=70)


def test_exec_runs_in_the_pod_and_returns_its_exit_code(cluster):
    c = cluster
    create(c, pod("shell", "echo started; sleep 3600", env={"GREETING": "hello from the pod"}))
    running(c, "shell")

    out = kubectl(c, "exec", "shell", "--", "sh", "-c", 'echo "$GREETING"; echo oops >&2; exit 3', check=False)
    assert out.stdout == "hello from the pod\n"
    assert out.stderr == "oops\ncommand terminated with exit code 3\n"
    assert out.returncode == 3

    assert kubectl(c, "exec", "shell", "-c", "main", "--", "true").returncode == 0

    # -i: kubectl's standard input, its end passed on (cat ends).
    data = "".join(f"line {i}\n" for i in range(2000))
    out = kubectl(c, "exec", "-i", "shell", "--", "sh", "-c", "wc -l; cat", stdin=data)
    assert out.stdout == "2000\n"  # wc read it all; cat found the end

    out = kubectl(c, "exec", "shell", "--", "nosuchcommand", check=False)
    assert out.returncode != 0 and 'exec: "nosuchcommand"' in out.stderr

    out = kubectl(c, "exec", "shell", "-c", "nosuch", "--", "true", check=False)
    assert out.returncode == 1 and "container nosuch is not valid for pod shell" in out.stderr

    out = kubectl(c, "exec", "nosuch", "--", "true", check=False)
    assert out.stderr.strip() == 'Error from server (NotFound): pods "nosuch" not found'

    # kubectl stopped: the command it ran in the pod is killed.
    p = subprocess.Popen(["kubectl", "exec", "shell", "--", "sh", "-c", "sleep $((300 + 7)); echo never"],
                         env={**os.environ, **c.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: subprocess.run(["pgrep", "-f", "sleep 307"], capture_output=True).returncode == 0, 30,
               "the command to start")
    p.kill()
    p.wait()
    wait_until(lambda: subprocess.run(["pgrep", "-f", "sleep 307"], capture_output=True).returncode == 1, 30,
               "the command to be killed")

    # The Python client's exec (v4.channel.k8s.io).
    from kubernetes import client, config
    from kubernetes.stream import stream

    config.load_kube_config(c.kubeconfig)
    said = stream(client.CoreV1Api().connect_get_namespaced_pod_exec, "shell", "default",
                  command=["sh", "-c", 'echo "$GREETING" from python'], stdout=True, stderr=True, stdin=False,
                  tty=False)
    assert said == "hello from the pod from python\n"


def test_exec_with_a_terminal_follows_its_size(cluster):
    """``kubectl exec -it``: the command gets a terminal of kubectl's terminal's size, and a
    resize of kubectl's terminal reaches it."""
    c = cluster
    create(c, pod("term", "sleep 3600"))
    running(c, "term")
    term = Terminal(["kubectl", "exec", "-it", "term", "--", "sh"], c.env, 33, 101)
    try:
        term.write(b"tty; stty size\n")
        text = term.read_until(b"\n33 101")
        assert "/dev/pts/" in text
        term.resize(20, 70)
        os.kill(term.pid, 28)  # SIGWINCH: kubectl reads its new size and sends it on
        time.sleep(1)
        term.write(b"stty size\n")
        term.read_until(b"\n20 70")
        # ^C reaches the terminal's foreground job (the terminal is the session's controlling one).
        term.write(b"sleep 60; echo slept\n")
        time.sleep(1)
        term.write(b"\x03")
        term.write(b"echo after-$((1+1))\n")
        term.read_until(b"after-2", timeout=20)
        term.write(b"exit 7\n")
        assert term.wait() == 7
    finally:
        term.close()


def test_kubectl_cp_both_ways(cluster):
    c = cluster
    create(c, pod("files", "sleep 3600"))
    running(c, "files")
    src = c.root / "upload"
    src.mkdir()
    (src / "weights.txt").write_text("layer0 0.5\n" * 1000)
    remote = c.root / "in-pod"
    kubectl(c, "cp", str(src), f"files:{remote}")
    assert (remote / "weights.txt").read_text() == "layer0 0.5\n" * 1000
    back = c.root / "download"
    kubectl(c, "cp", f"files:{remote}/weights.txt", str(back))
    assert back.read_text() == "layer0 0.5\n" * 1000


def test_attach_streams_what_the_container_writes_from_now_on(cluster):
    c = cluster
    create(c, pod("ticker", TICKER))
    running(c, "ticker")
    p = subprocess.Popen(["kubectl", "attach", "ticker"], env={**os.environ, **c.env}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        second = p.stdout.readline()
        assert first.startswith("tick ") and second == f"tick {int(first.split()[1]) + 1}\n"
        assert int(first.split()[1]) > 1  # from now on: not the log's beginning
    finally:
        p.kill()
        p.wait()


def test_logs_follow_tail_container_previous_and_since(cluster):
    c = cluster
    side = {"name": "side", "image": "busybox", "command": ["sh", "-c", "echo side says hi; sleep 3600"]}
    create(c, pod("chatty", "for i in 1 2 3 4 5; do echo main $i; done; " + TICKER, extra=[side]))
    running(c, "chatty")
    wait_until(lambda: "tick 2" in kubectl(c, "logs", "chatty", "-c", "main").stdout, 30, "ticks")

    assert kubectl(c, "logs", "chatty", "-c", "side").stdout == "side says hi\n"
    out = kubectl(c, "logs", "chatty")  # kubectl picks the first container, and says so
    assert out.stdout.startswith("main 1\nmain 2\n") and 'Defaulted container "main"' in out.stderr
    tail = kubectl(c, "logs", "chatty", "-c", "main", "--tail=2").stdout.splitlines()
    assert len(tail) == 2 and all(x.startswith("tick ") for x in tail)
    assert int(tail[1].split()[1]) == int(tail[0].split()[1]) + 1

    # -f: what the container writes next, as it writes it.
    p = subprocess.Popen(["kubectl", "logs", "-f", "--tail=1", "chatty", "-c", "main"], env={**os.environ, **c.env},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [p.stdout.readline() for _ in range(4)]
        numbers = [int(x.split()[1]) for x in lines]
        assert numbers == list(range(numbers[0], numbers[0] + 4)), lines
    finally:
        p.kill()
        p.wait()

    # --since: the whole log of a container that started within the window; refused beyond it
    # (the lines carry no times), with kubectl's wording for a server's refusal.
    assert kubectl(c, "logs", "chatty", "-c", "side", "--since=1h").stdout == "side says hi\n"
    time.sleep(2)
    out = kubectl(c, "logs", "chatty", "-c", "side", "--since=1s", check=False)
    assert out.returncode == 1
    assert out.stderr.startswith('Error from server (BadRequest): the log of container "side" in pod "chatty" '
                                 'has no times on its lines')

    # -f of a container that ends: kubectl returns with all of it.
    create(c, pod("short", "sleep 2; for i in 1 2 3; do echo line $i; sleep 0.3; done", restart="Never"))
    running(c, "short")
    out = kubectl(c, "logs", "-f", "short", timeout=30)
    assert out.stdout == "line 1\nline 2\nline 3\n"


def test_logs_previous_after_a_restart(cluster):
    c = cluster
    create(c, pod("crashy", 'echo "run at $(date +%s%N)"; sleep 1; exit 1'))

    def restarted() -> bool:
        doc = json.loads(kubectl(c, "get", "pod", "crashy", "-o", "json").stdout)
        return any(s.get("restartCount", 0) >= 1 for s in doc["status"].get("containerStatuses", []))

    wait_until(restarted, 90, "the container to restart")
    wait_until(lambda: kubectl(c, "logs", "crashy", check=False).stdout.startswith("run at"), 60,
               "the current run's log")
    previous = kubectl(c, "logs", "crashy", "--previous").stdout
    assert previous.startswith("run at ")
    current = kubectl(c, "logs", "crashy").stdout
    assert current.startswith("run at ") and current != previous
    create(c, pod("steady", "sleep 3600"))
    running(c, "steady")
    out = kubectl(c, "logs", "steady", "--previous", check=False)
    assert out.returncode == 1 and "previous terminated container" in out.stderr


def test_watch_bookmarks_and_initial_events(cluster):
    """The Python client's watch with bookmarks: while nothing it watches changes but other
    pods do, BOOKMARKs move its position on; sendInitialEvents lists first, then marks the end."""
    from kubernetes import client, config, watch

    c = cluster
    config.load_kube_config(c.kubeconfig)
    core = client.CoreV1Api()
    create(c, pod("marked", "sleep 3600"))
    listed = core.list_namespaced_pod("default", label_selector="test=nothing-here")
    start = int(listed.metadata.resource_version)
    seen: list[dict] = []
    w = watch.Watch()
    create(c, pod("unwatched", "sleep 3600"))  # moves the cache's position, invisible to the watch
    for ev in w.stream(core.list_namespaced_pod, "default", label_selector="test=nothing-here",
                       resource_version=str(start), allow_watch_bookmarks=True, timeout_seconds=12):
        seen.append({"type": ev["type"], "object": ev["raw_object"]})
    assert seen and all(e["type"] == "BOOKMARK" for e in seen), seen
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in seen]
    assert versions == sorted(versions) and versions[0] > start
    assert seen[0]["object"]["kind"] == "Pod" and seen[0]["object"]["apiVersion"] == "v1"
    assert w.resource_version == str(versions[-1])  # the client resumes from the last bookmark

    initial = []
    for ev in w.stream(core.list_namespaced_pod, "default", label_selector="test=streams",
                       allow_watch_bookmarks=True, send_initial_events=True, resource_version_match="NotOlderThan",
                       timeout_seconds=3):
        initial.append((ev["type"], ev["raw_object"]["metadata"]))
    names = [m["name"] for t, m in initial if t == "ADDED"]
    assert "marked" in names and "unwatched" in names
    ends = [i for i, (t, m) in enumerate(initial)
            if t == "BOOKMARK" and (m.get("annotations") or {}).get("k8s.io/initial-events-end") == "true"]
    assert ends and ends[0] == len(names)  # right after the ADDED events

    out = kubectl(c, "get", "--raw", "/api/v1/namespaces/default/pods?watch=1&sendInitialEvents=true"
                  "&timeoutSeconds=1", check=False)
    assert "sendInitialEvents is forbidden for watch unless allowWatchBookmarks=true" in out.stderr


def test_status_subresources(cluster):
    """GET and PATCH of deployments/status, jobs/status and pods/status: a write there changes
    the status only; a controller's condition on a pod (a readiness gate's) stays."""
    from kubernetes import client, config

    c = cluster
    config.load_kube_config(c.kubeconfig)
    core, apps, batch = client.CoreV1Api(), client.AppsV1Api(), client.BatchV1Api()
    create(c, pod("gated", "sleep 3600"))
    running(c, "gated")
    cond = {"type": "example.com/warmed-up", "status": "True", "reason": "CacheLoaded",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}
    got = core.patch_namespaced_pod_status("gated", "default", {"status": {"conditions": [cond]}})
    assert any(x.type == "example.com/warmed-up" for x in got.status.conditions)
    time.sleep(3)  # the node reports the pod's status again meanwhile
    pod_now = core.read_namespaced_pod_status("gated", "default")
    types = [x.type for x in pod_now.status.conditions]
    assert "example.com/warmed-up" in types and "Ready" in types
    assert pod_now.status.phase == "Running"

    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "statused"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "statused"}},
                           "template": {"metadata": {"labels": {"app": "statused"}}, "spec": {"containers": [
                               {"name": "main", "image": "busybox", "command": ["sleep", "3600"]}]}}}}
    create(c, deployment)
    wait_until(lambda: (apps.read_namespaced_deployment_status("statused", "default").status.ready_replicas or 0)
               == 1, 60, "the deployment's pod ready")
    before = apps.read_namespaced_deployment_status("statused", "default")
    assert before.kind == "Deployment" and before.spec.replicas == 1
    # A status write carrying a spec change: the spec stays.
    after = apps.patch_namespaced_deployment_status("statused", "default",
                                                    {"spec": {"replicas": 3}, "status": {"replicas": 1}})
    assert after.spec.replicas == 1 and after.metadata.generation == before.metadata.generation
    out = kubectl(c, "get", "deploy", "statused", "--subresource=status", "-o", "jsonpath={.status.readyReplicas}")
    assert out.stdout == "1"
    stale = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "statused", "resourceVersion": "1"},
             "spec": deployment["spec"], "status": {"replicas": 1}}
    with pytest.raises(client.ApiException) as err:
        apps.replace_namespaced_deployment_status("statused", "default", stale)
    assert err.value.status == 409

    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "quick"},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "main", "image": "busybox", "command": ["true"]}]}}}}
    create(c, job)
    kubectl(c, "wait", "--for=condition=complete", "job/quick", "--timeout=60s", timeout=70)
    status = batch.read_namespaced_job_status("quick", "default").status
    assert status.succeeded == 1 and any(x.type == "Complete" for x in status.conditions)
    # The Job's controller owns its status (and writes it again); a status patch leaves the spec.
    out = kubectl(c, "patch", "job", "quick", "--subresource=status", "--type=merge",
                  "-p", '{"spec":{"suspend":true},"status":{"ready":0}}')
    assert out.stdout.strip() == "job.batch/quick patched"
    assert not batch.read_namespaced_job("quick", "default").spec.suspend


def test_port_forward_reaches_the_pods_port(cluster):
    """``kubectl port-forward`` (SPDY tunnelled in a WebSocket): HTTP requests through the
    local port reach the pod's server, one after another and several at once, and a large
    answer arrives whole."""
    c = cluster
    port, local = free_port(), free_port()
    site = c.root / "site"
    site.mkdir()
    (site / "hello.txt").write_text("hello through the tunnel\n")
    big = os.urandom(3 * 1024 * 1024)
    (site / "big.bin").write_bytes(big)
    web = pod("web", f"cd {site} && exec python3 -m http.server {port} --bind 127.0.0.1")
    web["spec"]["containers"][0]["ports"] = [{"containerPort": port}]
    create(c, web)
    running(c, "web")
    wait_until(lambda: "Serving HTTP" in kubectl(c, "logs", "web").stdout + kubectl(c, "logs", "web").stderr, 30,
               "the pod's server")
    p = subprocess.Popen(["kubectl", "port-forward", "pod/web", f"{local}:{port}"], env={**os.environ, **c.env},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        assert first.startswith(f"Forwarding from 127.0.0.1:{local} -> {port}"), (first, p.communicate(timeout=10))
        for _ in range(3):  # a connection each
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/hello.txt", timeout=20) as r:
                assert r.read() == b"hello through the tunnel\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/big.bin", timeout=60) as r:
            assert r.read() == big
        out = subprocess.run(["curl", "-sS", "--max-time", "20", f"http://127.0.0.1:{local}/hello.txt",
                              f"http://127.0.0.1:{local}/hello.txt"], capture_output=True, text=True, timeout=30)
        assert out.stdout == "hello through the tunnel\n" * 2, out.stderr
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda _: urllib.request.urlopen(f"http://127.0.0.1:{local}/hello.txt",
                                                                 timeout=20).read(), range(8)))
        assert got == [b"hello through the tunnel\n"] * 8
    finally:
        p.terminate()
        p.wait(10)

    # The Python client's port-forward (the WebSocket channel protocol): a socket to the pod's port.
    from kubernetes import client, config
    from kubernetes.stream import portforward

    config.load_kube_config(c.kubeconfig)
    pf = portforward(client.CoreV1Api().connect_get_namespaced_pod_portforward, "web", "default", ports=str(port))
    conn = http.client.HTTPConnection("web", port, timeout=20)
    conn.sock = pf.socket(port)
    conn.sock.settimeout(30)
    conn.request("GET", "/big.bin")
    assert conn.getresponse().read() == big
    conn.close()
    assert pf.error(port) is None

    # Nothing listens there: kubectl says why, and (as against a real cluster) gives up.
    closed, local = free_port(), free_port()
    p = subprocess.Popen(["kubectl", "port-forward", "pod/web", f"{local}:{closed}"], env={**os.environ, **c.env},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith(f"Forwarding from 127.0.0.1:{local} -> {closed}")
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{local}/hello.txt", timeout=20).read()
        _, err = p.communicate(timeout=30)
        assert f"error forwarding port {closed} to pod" in err and "connection refused" in err, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_exec_and_port_forward_need_edit_rights(cluster):
    """A user who may only view a namespace reads its pods and logs, but kubectl exec and
    port-forward get the API server's Forbidden for pods/exec and pods/portforward."""
    c = cluster
    viewer = str(c.root / "viewer.kubeconfig")
    c.run(["shoal", "kubeconfig", "--user", "viewer", "-o", viewer])
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "watched"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "viewer-view", "namespace": "watched"},
             "subjects": [{"kind": "User", "name": "viewer"}],
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}}]
    path = c.root / "viewer-rbac.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    kubectl(c, "apply", "-f", str(path))
    manifest = pod("private", "echo private; sleep 3600")
    manifest["metadata"]["namespace"] = "watched"
    create(c, manifest)
    kubectl(c, "wait", "-n", "watched", "--for=condition=Ready", "pod/private", "--timeout=60s", timeout=70)

    def as_viewer(*args):
        return c.run(["kubectl", "-n", "watched", *args], check=False, env={"KUBECONFIG": viewer})

    wait_until(lambda: as_viewer("logs", "private").stdout == "private\n", 30, "the viewer reads the log")
    out = as_viewer("exec", "private", "--", "true")
    assert out.returncode == 1
    assert out.stderr.startswith('Error from server (Forbidden): pods "private" is forbidden: User "viewer" cannot '
                                 'create resource "pods/exec" in API group "" in the namespace "watched"'), out.stderr
    out = as_viewer("port-forward", "pod/private", f"{free_port()}:80")
    assert out.returncode == 1 and 'cannot create resource "pods/portforward"' in out.stderr, out.stderr
    assert kubectl(c, "exec", "-n", "watched", "private", "--", "echo", "admin may").stdout == "admin may\n"
