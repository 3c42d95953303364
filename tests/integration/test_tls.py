"""A cluster served over HTTPS (as off loopback by default; `--tls on` here, since 127.x is
loopback): the agents join and the commands and jobs work through the cluster CA, and a
client without the CA is refused with a message that says what to do. The agents serve
HTTPS too (srun's task I/O, pod logs and exec), with certificates the cluster CA issued them
for their node names, and refuse plain HTTP and clients that trust another CA. The same hardened
cluster closes the default namespace and keeps jobs private (PrivateData=jobs)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest

from shoal.api_client import Client, ClientError
from tests.integration.cluster import LocalCluster, free_port, wait_until

HARDENED = {"cluster_name": "tls", "partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}],
            "nodes": {"heartbeat_interval_s": 2.0, "heartbeat_timeout_s": 30.0, "kill_wait_s": 2.0},
            "auth": {"default_namespace_open": False, "private_data": ["jobs"]}}
WEB = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
       "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                             "spec": {"containers": [{"name": "app", "image": "example/web:v1"}]}}}}
SHELL = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shell", "namespace": "default"},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "shell"}},
                  "template": {"metadata": {"labels": {"app": "shell"}},
                               "spec": {"terminationGracePeriodSeconds": 1, "containers": [
                                   {"name": "main", "image": "busybox",
                                    "command": ["sh", "-c", "echo ready over tls; exec sleep 600"]}]}}}}


class TLSCluster(LocalCluster):
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        return str(self.root / "state" / "server" / "ca.crt")

    def api(self, method: str, path: str, body: dict | None = None, token: str | None = None):
        c = Client(self.server, token or self.admin_token, ca_file=self.ca_file)
        c.job_token = None
        return c.request(method, path, body)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> TLSCluster:
    root = tmp_path_factory.mktemp("tls")
    (root / "cluster.yaml").write_text(json.dumps(HARDENED))
    gw = free_port()
    c = TLSCluster(root, nodes=2, gpus_per_node=2, config=str(root / "cluster.yaml"),
                   extra=("--tls", "on", "--gateway", str(gw)))
    c.gateway = f"http://127.0.0.1:{gw}"
    c.up()
    yield c
    c.down()


def test_agents_commands_and_jobs_speak_https_with_the_cluster_ca(cluster):
    conf = json.loads((cluster.root / "client.yaml").read_text())
    assert conf["server"] == cluster.server and conf["ca_data"].startswith("-----BEGIN CERTIFICATE-----")
    out = cluster.run(["sinfo", "-h", "-o", "%D %t"])
    assert out.stdout.split() == ["2", "idle"], out.stdout  # both agents registered over TLS
    job = cluster.sbatch("-N2", "--wrap", "srun hostname; echo server=$SHOAL_SERVER")
    done = cluster.wait_for(job, timeout=60)
    text = (cluster.workdir / f"slurm-{job}.out").read_text()
    assert done["state"] == "COMPLETED", (done, text)  # srun verified the server and both agents (HTTPS only)
    assert f"server={cluster.server}" in text and len(text.splitlines()) == 3, text
    out = cluster.run(["squeue", "-h", "-t", "all", "-j", str(job), "-o", "%i %T"])  # the compiled front end hands https to Python
    assert out.stdout.split() == [str(job), "COMPLETED"], out


def test_a_client_without_the_ca_is_refused_with_what_to_do(cluster, tmp_path):
    bare = tmp_path / "no-ca.yaml"
    bare.write_text(json.dumps({"server": cluster.server, "token": cluster.admin_token}))
    out = cluster.run(["squeue"], check=False, env={"SHOAL_CONFIG": str(bare)})
    assert out.returncode == 1, out
    assert "does not trust" in out.stderr and "ca_file" in out.stderr and "SHOAL_CA" in out.stderr, out.stderr
    with pytest.raises(ClientError, match="if it serves HTTPS, use an https:// URL"):
        Client(f"http://127.0.0.1:{cluster.port}", cluster.admin_token).get("/shoal/v1/jobs")
    out = cluster.run(["squeue", "-h"], env={"SHOAL_CONFIG": str(bare), "SHOAL_CA": cluster.ca_file})
    assert out.returncode == 0, out


def test_token_create_writes_a_config_that_works_from_anywhere(cluster, tmp_path):
    path = tmp_path / "alice.yaml"
    cluster.run(["shoal", "token", "create", "--user", "alice", "--write-config", str(path)])
    assert path.stat().st_mode & 0o077 == 0
    out = cluster.run(["shoal", "get", "deployments"], check=False,
                      env={"SHOAL_CONFIG": str(path)})
    assert out.returncode == 0, out


def test_a_closed_default_namespace_and_private_jobs(cluster):
    alice = cluster.api("POST", "/shoal/v1/tokens", {"user": "alice", "role": "user"})["token"]
    bob = cluster.api("POST", "/shoal/v1/tokens", {"user": "bob", "role": "user", "groups": ["web"]})["token"]
    with pytest.raises(ClientError) as refused:
        cluster.api("POST", "/shoal/v1/kube/apply", {"documents": [WEB]}, token=alice)
    assert refused.value.status == 403 and 'in the namespace "default"' in str(refused.value)
    cluster.api("POST", "/shoal/v1/kube/apply", {"documents": [{
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "web-team", "namespace": "default"},
        "subjects": [{"kind": "Group", "name": "web"}], "roleRef": {"kind": "ClusterRole", "name": "edit"}}]})
    cluster.api("POST", "/shoal/v1/kube/apply", {"documents": [WEB]}, token=bob)  # bob's group is bound
    table = cluster.run(["shoal", "get", "rolebindings", "-o", "wide"]).stdout.split("\n")
    assert table[0].split() == ["NAME", "ROLE", "AGE", "USERS", "GROUPS", "SERVICEACCOUNTS"], table
    assert table[1].split()[:2] == ["web-team", "ClusterRole/edit"] and table[1].split()[-1] == "web", table
    mine = cluster.api("POST", "/shoal/v1/jobs", {"script": "#!/bin/sh\ntrue\n", "workdir": "/tmp", "hold": True},
                       token=bob)["job_id"]
    assert [j["job_id"] for j in cluster.api("GET", "/shoal/v1/jobs", token=alice)["jobs"]] == []
    with pytest.raises(ClientError) as hidden:
        cluster.api("GET", f"/shoal/v1/jobs/{mine}", token=alice)
    assert hidden.value.status == 404
    assert mine in [j["job_id"] for j in cluster.api("GET", "/shoal/v1/jobs", token=bob)["jobs"]]
    operator = cluster.api("POST", "/shoal/v1/tokens", {"user": "olga", "role": "operator"})["token"]
    assert mine in [j["job_id"] for j in cluster.api("GET", "/shoal/v1/jobs", token=operator)["jobs"]]
    cluster.api("POST", f"/shoal/v1/jobs/{mine}/cancel", {}, token=operator)


def test_the_gateway_follows_the_routes_over_https_with_the_cluster_ca(cluster):
    def health():
        with urllib.request.urlopen(f"{cluster.gateway}/gateway/healthz", timeout=5) as r:
            doc = json.loads(r.read())
        return doc if doc["routes_loaded"] else None

    assert wait_until(health, 30, "the gateway's first routes from the HTTPS server")["ok"]



def _agent_get(node: dict, context: ssl.SSLContext, path: str = "/healthz") -> bytes:
    with socket.create_connection((node["address"], node["port"]), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=node["name"]) as conn:
        conn.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        return b"".join(iter(lambda: conn.recv(65536), b""))


def test_the_agents_serve_https_only_with_certificates_for_their_node_names(cluster):
    from shoal.server.tls import _new_ca

    pem = _new_ca(datetime.datetime.now(datetime.timezone.utc))  # another cluster's CA (key, then certificate)
    other = ssl.create_default_context(cadata=pem[pem.index(b"-----BEGIN CERTIFICATE"):].decode())
    for node in cluster.nodes_json():
        with pytest.raises(urllib.error.HTTPError) as plain:
            urllib.request.urlopen(f"http://{node['address']}:{node['port']}/healthz", timeout=10)
        assert plain.value.code == 400 and "serves HTTPS only" in plain.value.read().decode()
        answer = _agent_get(node, ssl.create_default_context(cafile=cluster.ca_file))
        assert answer.startswith(b"HTTP/1.0 200") and f'"node": "{node["name"]}"'.encode() in answer, answer
        with pytest.raises(ssl.SSLCertVerificationError):
            _agent_get(node, other)  # a certificate the cluster CA issued, but this client trusts another
        with pytest.raises(ssl.SSLCertVerificationError):
            wrong_name = {**node, "name": "some-other-node"}  # issued for its node name only
            _agent_get(wrong_name, ssl.create_default_context(cafile=cluster.ca_file))


def test_pod_logs_and_exec_are_relayed_from_the_agents_over_https(cluster):
    cluster.run(["shoal", "apply", "-f", "-"], input=json.dumps(SHELL))

    def running_pod():
        items = json.loads(cluster.run(["shoal", "get", "pods", "-o", "json"]).stdout)["items"]
        return next((p["metadata"]["name"] for p in items
                     if p["metadata"]["name"].startswith("shell-") and p["status"].get("phase") == "Running"), None)

    pod = wait_until(running_pod, 30, "the shell pod running")
    logs = wait_until(lambda: cluster.run(["shoal", "logs", pod]).stdout, 10, "the pod's first log line")
    assert logs == "ready over tls\n", logs
    out = cluster.run(["shoal", "exec", pod, "--", "sh", "-c", "echo from inside; exit 4"], check=False)
    assert out.returncode == 4 and out.stdout == "from inside\n", out


def test_a_step_whose_srun_goes_away_is_killed_over_https_as_over_http(cluster, tmp_path):
    pidfile = tmp_path / "task.pid"
    srun = subprocess.Popen(["srun", "-N1", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"], env=cluster.env,
                            cwd=cluster.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "the task to start"))
        srun.send_signal(signal.SIGKILL)
        srun.wait(10)

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return "zombie" in open(f"/proc/{pid}/status").read().lower()

        wait_until(gone, 10, "the agent to kill the task of an srun that went away")
    finally:
        srun.kill()
        srun.wait(10)
        for job in cluster.api("GET", "/shoal/v1/jobs?all=true")["jobs"]:
            if job["state"] == "RUNNING" and job["name"] == "sh":  # srun's own allocation, left by the kill
                cluster.api("POST", f"/shoal/v1/jobs/{job['job_id']}/cancel", {})


def test_the_console_over_https_keeps_jobs_private(cluster):
    """The console's login cookie is Secure over HTTPS, and under PrivateData=jobs its own routes
    show a user nothing of another's job: the grid colours it without naming it, GPU-hours leave
    it out, its output is 404 as its Job is, its script 403."""
    context = ssl.create_default_context(cafile=cluster.ca_file)
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context),
                                         _NoRedirect())
    carol = cluster.api("POST", "/shoal/v1/tokens", {"user": "carol", "role": "user"})["token"]
    # Another user's running job: root's, run as root (a user the machine has).
    theirs = cluster.api("POST", "/shoal/v1/jobs", {"script": "#!/bin/sh\nsleep 300\n", "workdir": "/tmp",
                                                   "stdout": "/dev/null", "name": "roots-secret",
                                                   "gpus_per_node": 1})["job_id"]
    started = cluster.wait_for(theirs, states=("RUNNING", "FAILED", "COMPLETED"), timeout=30)
    assert started["state"] == "RUNNING", started
    try:
        login = urllib.request.Request(f"{cluster.server}/console/login", method="POST",
                                       data=f"token={carol}&next=/console/queue".encode())
        with pytest.raises(urllib.error.HTTPError) as redirect:
            opener.open(login, timeout=10)
        assert redirect.value.code == 303 and redirect.value.headers["location"] == "/console/queue"
        cookie = redirect.value.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" in cookie, cookie

        def get(path: str):
            req = urllib.request.Request(f"{cluster.server}{path}", headers={
                "Cookie": cookie.split(";")[0], "X-Shoal-Console": "1"})
            try:
                with opener.open(req, timeout=10) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, overview = get("/console/api/overview")
        cells = [g for n in overview["nodes"] for g in n["gpus"] if g["holder"] == "training"]
        assert status == 200 and len(cells) == 1 and cells[0]["job"] is None, cluster.job(theirs)
        assert "roots-secret" not in json.dumps(overview)
        usage = get("/console/api/usage")[1]
        assert (usage["accounts"], usage["users"], usage["over_time"]["buckets"]) == ([], [], 0), usage
        assert get(f"/shoal/v1/jobs/{theirs}/script")[0] == 403  # as scontrol write batch_script
        assert get(f"/shoal/v1/jobs/{theirs}/output")[0] == 404
        assert get("/shoal/v1/whoami")[1]["user"] == "carol"
    finally:
        if cluster.job(theirs)["state"] == "RUNNING":
            cluster.api("POST", f"/shoal/v1/jobs/{theirs}/cancel", {})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
