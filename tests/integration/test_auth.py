"""Who may do what: every refusal an administrator relies on, as one table against a real server.

Root (the admin) owns a running job; alice has a user token; a node has its agent credential;
the cluster has a join token. Each row is one request and the status it must get.
"""

from __future__ import annotations

import json
import socket

import pytest

from tests.integration.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("auth"), nodes=2, gpus_per_node=4)
    c.up()
    yield c
    c.down()


@pytest.fixture(scope="module")
def creds(cluster) -> dict:
    alice = cluster.api("POST", "/api/v1/tokens", {"user": "alice", "role": "user"})["token"]
    job = cluster.sbatch("--wrap", "sleep 300")
    cluster.wait_for(job, states=("RUNNING",), timeout=15)
    node = cluster.node_names()[0]
    join = (cluster.root / "state" / "join.token").read_text().strip()
    from shoal.server.auth import agent_credential

    secret = (cluster.root / "state" / "server" / "cluster.key").read_bytes()
    yield {"alice": alice, "bad": "shoal_not-a-real-token", "node": agent_credential(secret, node),
           "join": join, "admin": cluster.admin_token, "job": job, "node_name": node}
    cluster.api("POST", f"/api/v1/jobs/{job}/cancel", {})


def raw(cluster, method: str, path: str, token: str | None, body: dict | None = None) -> tuple[int, dict]:
    """One HTTP request with exactly these headers (no X-Shoal-User), returning status and JSON."""
    payload = json.dumps(body).encode() if body is not None else b""
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{cluster.port}", "Connection: close",
            f"Content-Length: {len(payload)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    if token:
        head.append(f"Authorization: Bearer {token}")
    with socket.create_connection(("127.0.0.1", cluster.port), timeout=10) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    body_bytes = rest.partition(b"\r\n\r\n")[2]
    try:
        doc = json.loads(body_bytes)
    except ValueError:
        doc = {}
    return int(status_line.split()[1]), doc


SUBMIT = {"script": "#!/bin/sh\ntrue\n", "workdir": "/tmp"}

CASES = [
    # (who, method, path, body, expected status)
    ("none", "GET", "/api/v1/jobs", None, 401),
    ("none", "POST", "/api/v1/jobs", SUBMIT, 401),
    ("bad", "GET", "/api/v1/jobs", None, 401),
    ("bad", "POST", "/api/v1/jobs/{job}/cancel", {}, 401),
    ("alice", "POST", "/api/v1/jobs/{job}/cancel", {}, 403),
    ("alice", "POST", "/api/v1/jobs/{job}/cancel", {"signal": "USR1"}, 403),
    ("alice", "POST", "/api/v1/jobs/{job}/hold", None, 403),
    ("alice", "PATCH", "/api/v1/jobs/{job}", {"name": "mine-now"}, 403),
    ("alice", "POST", "/api/v1/jobs/{job}/requeue", None, 403),
    ("alice", "PATCH", "/api/v1/nodes/{node_name}", {"state": "DRAIN", "reason": "alice says"}, 403),
    ("alice", "POST", "/api/v1/tokens", {"user": "alice", "role": "admin"}, 403),
    ("node", "GET", "/api/v1/jobs", None, 403),
    ("node", "POST", "/api/v1/jobs", SUBMIT, 403),
    ("node", "POST", "/api/v1/jobs/{job}/cancel", {}, 403),
    ("join", "POST", "/api/v1/jobs", SUBMIT, 403),
    ("join", "POST", "/api/v1/jobs/{job}/cancel", {}, 403),
    ("alice", "GET", "/api/v1/agents/{node_name}/work", None, 403),
    ("admin", "GET", "/api/v1/agents/{node_name}/work", None, 403),
]


@pytest.mark.parametrize("who,method,path,body,status", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_refused(cluster, creds, who, method, path, body, status):
    token = None if who == "none" else creds[who]
    got, doc = raw(cluster, method, path.format(**creds), token, body)
    assert got == status, (got, doc)
    assert isinstance(doc.get("detail"), str) and doc["detail"], doc
    # Whatever was refused left root's job as it was.
    job = cluster.job(creds["job"])
    assert (job["state"], job["name"], job["held"]) == ("RUNNING", "wrap", False), job
    node = [n for n in cluster.nodes_json() if n["name"] == creds["node_name"]][0]
    assert node["state"] == "UP"


def test_alice_may_submit_and_manage_her_own_jobs(cluster, creds):
    got, doc = raw(cluster, "POST", "/api/v1/jobs", creds["alice"], {**SUBMIT, "hold": True})
    assert got == 201, doc
    job_id = doc["job_id"]
    assert cluster.job(job_id)["user"] == "alice"
    assert raw(cluster, "PATCH", f"/api/v1/jobs/{job_id}", creds["alice"], {"name": "renamed"})[0] == 200
    assert raw(cluster, "POST", f"/api/v1/jobs/{job_id}/cancel", creds["alice"], {})[0] == 200
    assert cluster.job(job_id)["state"] == "CANCELLED"
    # The CLI with alice's token acts as alice, whatever the login name says.
    out = cluster.run(["squeue", "-h", "-o", "%u", "-j", str(creds["job"])], env={"SHOAL_TOKEN": creds["alice"]})
    assert out.stdout.strip() == "root"
    who = cluster.api("GET", "/api/v1/whoami", token=creds["alice"])
    assert (who["user"], who["role"]) == ("alice", "user")
