"""Who may do what: every refusal an administrator relies on, as one table against a real server.

Root (the admin) owns a running job; alice has a user token; a node has its agent credential;
the cluster has a join token. Each row is one request and the status it must get.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.integration.cluster import LocalCluster, wait_until

# root's serving Deployment: one pod that sleeps (the process runtime runs its command).
WEB = {"apiVersion": "apps/v1", "kind": "Deployment",
       "metadata": {"name": "web", "namespace": "default"},
       "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                             "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                                 "name": "app", "image": "example/web:v1", "command": ["sleep", "300"],
                                 "env": [{"name": "API_KEY", "value": "root-only"}]}]}}}}
WEB_V2 = {**WEB, "spec": {**WEB["spec"], "replicas": 3}}
KUBE = "/shoal/v1/kube"
RBAC = "rbac.authorization.k8s.io/v1"
TEAM_A = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
TEAM_A_BINDINGS = [
    {"apiVersion": RBAC, "kind": "RoleBinding", "metadata": {"name": "ml-edit", "namespace": "team-a"},
     "subjects": [{"kind": "Group", "name": "ml"}], "roleRef": {"kind": "ClusterRole", "name": "edit"}},
    {"apiVersion": RBAC, "kind": "RoleBinding", "metadata": {"name": "vic-view", "namespace": "team-a"},
     "subjects": [{"kind": "User", "name": "vic"}], "roleRef": {"kind": "ClusterRole", "name": "view"}},
]
TRAIN = {**WEB, "metadata": {"name": "train", "namespace": "team-a"}, "spec": {**WEB["spec"], "replicas": 0}}
ALICE_IN_TEAM_A = {**TRAIN, "metadata": {"name": "alices", "namespace": "team-a"}}
BINDING_FOR_ALICE = {**TEAM_A_BINDINGS[0], "metadata": {"name": "alice-admin", "namespace": "team-a"},
                     "subjects": [{"kind": "User", "name": "alice"}],
                     "roleRef": {"kind": "ClusterRole", "name": "admin"}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("auth"), nodes=2, gpus_per_node=4)
    c.up()
    yield c
    c.down()


@pytest.fixture(scope="module")
def creds(cluster) -> dict:
    alice = cluster.api("POST", "/shoal/v1/tokens", {"user": "alice", "role": "user"})["token"]
    job = cluster.sbatch("--wrap", "sleep 300")
    cluster.wait_for(job, states=("RUNNING",), timeout=15)
    node = cluster.node_names()[0]
    join = (cluster.root / "state" / "join.token").read_text().strip()
    from shoal.server.auth import agent_credential

    secret = (cluster.root / "state" / "server" / "cluster.key").read_bytes()
    olga = cluster.api("POST", "/shoal/v1/tokens", {"user": "olga", "role": "operator"})["token"]
    rita = cluster.api("POST", "/shoal/v1/tokens", {"user": "rita", "role": "read-only"})["token"]
    bob = cluster.api("POST", "/shoal/v1/tokens", {"user": "bob", "role": "user", "groups": ["ml"]})["token"]
    vic = cluster.api("POST", "/shoal/v1/tokens", {"user": "vic", "role": "user"})["token"]
    from shoal.server.auth import hash_token, token_id

    ids = {f"{who}_id": token_id(hash_token(t)) for who, t in (("olga", olga), ("alice", alice))}
    # team-a: the ml group may edit, vic may view; root's Deployment "train" lives there.
    cluster.api("POST", "/shoal/v1/kube/apply", {"documents": [TEAM_A, *TEAM_A_BINDINGS, TRAIN, WEB]})
    pod = wait_until(lambda: next((p["metadata"]["name"] for p in cluster.api(
        "GET", "/shoal/v1/kube/objects/pods?namespace=default")["items"]
        if p["status"].get("phase") == "Running"), None), 60, "root's web pod to run")
    yield {"alice": alice, "bad": "shoal_not-a-real-token", "node": agent_credential(secret, node),
           "join": join, "admin": cluster.admin_token, "job": job, "node_name": node, "pod": pod,
           "olga": olga, "rita": rita, "bob": bob, "vic": vic, **ids}
    cluster.api("POST", f"/shoal/v1/jobs/{job}/cancel", {})


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
    ("none", "GET", "/shoal/v1/jobs", None, 401),
    ("none", "POST", "/shoal/v1/jobs", SUBMIT, 401),
    ("bad", "GET", "/shoal/v1/jobs", None, 401),
    ("bad", "POST", "/shoal/v1/jobs/{job}/cancel", {}, 401),
    ("alice", "POST", "/shoal/v1/jobs/{job}/cancel", {}, 403),
    ("alice", "POST", "/shoal/v1/jobs/{job}/cancel", {"signal": "USR1"}, 403),
    ("alice", "POST", "/shoal/v1/jobs/{job}/hold", None, 403),
    ("alice", "PATCH", "/shoal/v1/jobs/{job}", {"name": "mine-now"}, 403),
    ("alice", "POST", "/shoal/v1/jobs/{job}/requeue", None, 403),
    ("alice", "PATCH", "/shoal/v1/nodes/{node_name}", {"state": "DRAIN", "reason": "alice says"}, 403),
    ("alice", "POST", "/shoal/v1/tokens", {"user": "alice", "role": "admin"}, 403),
    ("node", "GET", "/shoal/v1/jobs", None, 403),
    ("node", "POST", "/shoal/v1/jobs", SUBMIT, 403),
    ("node", "POST", "/shoal/v1/jobs/{job}/cancel", {}, 403),
    ("join", "POST", "/shoal/v1/jobs", SUBMIT, 403),
    ("join", "POST", "/shoal/v1/jobs/{job}/cancel", {}, 403),
    ("alice", "GET", "/shoal/v1/agents/{node_name}/work", None, 403),
    ("admin", "GET", "/shoal/v1/agents/{node_name}/work", None, 403),
    # Serving objects: root's Deployment "web" and its pod, which alice did not apply.
    ("none", "GET", KUBE + "/objects/deployments/default/web", None, 401),
    ("bad", "POST", KUBE + "/objects/deployments/default/web/scale", {"replicas": 0}, 401),
    ("alice", "GET", KUBE + "/objects/deployments/default/web", None, 403),
    ("alice", "GET", KUBE + "/objects/deployments/default/web/history", None, 403),
    ("alice", "POST", KUBE + "/objects/deployments/default/web/scale", {"replicas": 0}, 403),
    ("alice", "POST", KUBE + "/objects/deployments/default/web/undo", {}, 403),
    ("alice", "DELETE", KUBE + "/objects/deployments/default/web", None, 403),
    ("alice", "POST", KUBE + "/apply", {"documents": [WEB_V2]}, 403),
    ("alice", "GET", KUBE + "/objects/pods/default/{pod}", None, 403),
    ("alice", "DELETE", KUBE + "/objects/pods/default/{pod}", None, 403),
    ("alice", "GET", KUBE + "/pods/default/{pod}/log", None, 403),
    ("alice", "POST", KUBE + "/pods/default/{pod}/exec", {"command": ["cat", "/proc/self/environ"]}, 403),
    ("node", "POST", KUBE + "/objects/deployments/default/web/scale", {"replicas": 0}, 403),
    ("node", "POST", KUBE + "/pods/default/{pod}/exec", {"command": ["true"]}, 403),
    ("join", "POST", KUBE + "/apply", {"documents": [WEB_V2]}, 403),
    ("alice", "GET", KUBE + "/routes", None, 403),
    ("alice", "POST", KUBE + "/metrics", {"pods": {}}, 403),
    # An operator manages nodes and jobs, not credentials, bindings or others' serving objects.
    ("olga", "POST", "/shoal/v1/tokens", {"user": "olga", "role": "admin"}, 403),
    ("olga", "POST", KUBE + "/apply", {"documents": [BINDING_FOR_ALICE]}, 403),
    ("olga", "POST", KUBE + "/objects/deployments/default/web/scale", {"replicas": 0}, 403),
    ("olga", "POST", KUBE + "/pods/default/{pod}/exec", {"command": ["true"]}, 403),
    # A read-only token sees and changes nothing.
    ("rita", "POST", "/shoal/v1/jobs", SUBMIT, 403),
    ("rita", "POST", "/shoal/v1/jobs/test", SUBMIT, 403),
    ("rita", "POST", "/shoal/v1/jobs/{job}/cancel", {}, 403),
    ("rita", "POST", "/shoal/v1/jobs/{job}/hold", None, 403),
    ("rita", "PATCH", "/shoal/v1/jobs/{job}", {"name": "mine-now"}, 403),
    ("rita", "PATCH", "/shoal/v1/nodes/{node_name}", {"state": "DRAIN", "reason": "rita says"}, 403),
    ("rita", "POST", "/shoal/v1/reservations", {"name": "r", "duration_s": 60, "node_count": 1, "users": ["rita"]}, 403),
    ("rita", "POST", "/shoal/v1/tokens", {"user": "rita", "role": "user"}, 403),
    ("rita", "POST", KUBE + "/apply", {"documents": [WEB_V2]}, 403),
    ("rita", "POST", KUBE + "/objects/deployments/default/web/scale", {"replicas": 0}, 403),
    ("rita", "DELETE", KUBE + "/objects/deployments/default/web", None, 403),
    ("rita", "POST", KUBE + "/pods/default/{pod}/exec", {"command": ["true"]}, 403),
    # Namespaces: alice is bound nowhere in team-a; vic only views there; bob's group edits.
    ("alice", "POST", KUBE + "/apply", {"documents": [ALICE_IN_TEAM_A]}, 403),
    ("alice", "GET", KUBE + "/objects/deployments/team-a/train", None, 403),
    ("alice", "POST", KUBE + "/apply", {"documents": [{**TEAM_A, "metadata": {"name": "alices-ns"}}]}, 403),
    ("alice", "POST", KUBE + "/apply", {"documents": [BINDING_FOR_ALICE]}, 403),
    ("vic", "POST", KUBE + "/apply", {"documents": [ALICE_IN_TEAM_A]}, 403),
    ("vic", "POST", KUBE + "/objects/deployments/team-a/train/scale", {"replicas": 2}, 403),
    ("vic", "DELETE", KUBE + "/objects/deployments/team-a/train", None, 403),
    ("bob", "POST", KUBE + "/apply", {"documents": [BINDING_FOR_ALICE]}, 403),  # edit is not admin
    ("bob", "DELETE", KUBE + "/objects/rolebindings/team-a/vic-view", None, 403),
    ("bob", "DELETE", KUBE + "/objects/namespaces/_/team-a", None, 403),
    # Tokens: listed and revoked by a person's token; anyone's by an admin, else only one's own.
    ("none", "GET", "/shoal/v1/tokens", None, 401),
    ("bad", "DELETE", "/shoal/v1/tokens/{olga_id}", None, 401),
    ("alice", "DELETE", "/shoal/v1/tokens/{olga_id}", None, 403),
    ("olga", "DELETE", "/shoal/v1/tokens/{alice_id}", None, 403),
    ("rita", "DELETE", "/shoal/v1/tokens/{olga_id}", None, 403),
    ("node", "GET", "/shoal/v1/tokens", None, 403),
    ("node", "DELETE", "/shoal/v1/tokens/{olga_id}", None, 403),
    ("join", "GET", "/shoal/v1/tokens", None, 403),
    ("join", "DELETE", "/shoal/v1/tokens/{alice_id}", None, 403),
    ("alice", "DELETE", "/shoal/v1/tokens/0123abcd", None, 404),
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
    web = cluster.api("GET", KUBE + "/objects/deployments/default/web")
    assert web["spec"]["replicas"] == 1 and "deletionTimestamp" not in web["metadata"], web
    pod = cluster.api("GET", KUBE + f"/objects/pods/default/{creds['pod']}")
    assert pod["status"]["phase"] == "Running" and "deletionTimestamp" not in pod["metadata"], pod
    train = cluster.api("GET", KUBE + "/objects/deployments/team-a/train")
    assert train["spec"]["replicas"] == 0 and train["metadata"]["annotations"]["shoal.io/owner"] == "root", train
    bindings = cluster.api("GET", KUBE + "/objects/rolebindings?namespace=team-a")["items"]
    assert sorted(b["metadata"]["name"] for b in bindings) == ["ml-edit", "vic-view"], bindings
    assert cluster.api("GET", "/shoal/v1/reservations")["reservations"] == []
    listed = {t["id"] for t in cluster.api("GET", "/shoal/v1/tokens")["tokens"]}
    assert {creds["olga_id"], creds["alice_id"]} <= listed, listed


def test_alice_may_submit_and_manage_her_own_jobs(cluster, creds):
    got, doc = raw(cluster, "POST", "/shoal/v1/jobs", creds["alice"], {**SUBMIT, "hold": True})
    assert got == 201, doc
    job_id = doc["job_id"]
    assert cluster.job(job_id)["user"] == "alice"
    assert raw(cluster, "PATCH", f"/shoal/v1/jobs/{job_id}", creds["alice"], {"name": "renamed"})[0] == 200
    assert raw(cluster, "POST", f"/shoal/v1/jobs/{job_id}/cancel", creds["alice"], {})[0] == 200
    assert cluster.job(job_id)["state"] == "CANCELLED"
    # The CLI with alice's token acts as alice, whatever the login name says.
    out = cluster.run(["squeue", "-h", "-o", "%u", "-j", str(creds["job"])], env={"SHOAL_TOKEN": creds["alice"]})
    assert out.stdout.strip() == "root"
    who = cluster.api("GET", "/shoal/v1/whoami", token=creds["alice"])
    assert (who["user"], who["role"]) == ("alice", "user")


def test_alice_lists_only_the_serving_objects_she_applied(cluster, creds):
    mine = {**WEB, "metadata": {"name": "alices", "namespace": "default"},
            "spec": {**WEB["spec"], "replicas": 0}}
    assert raw(cluster, "POST", KUBE + "/apply", creds["alice"], {"documents": [mine]})[0] == 200
    for plural in ("deployments", "replicasets", "pods"):
        got, doc = raw(cluster, "GET", f"{KUBE}/objects/{plural}?namespace=default", creds["alice"])
        assert got == 200, doc
        names = [i["metadata"]["name"] for i in doc["items"]]
        assert not any(n.startswith("web") for n in names), (plural, names)
    got, doc = raw(cluster, "GET", KUBE + "/objects/deployments/default/alices", creds["alice"])
    assert got == 200 and doc["metadata"]["annotations"]["shoal.io/owner"] == "alice", doc
    admin_view = [i["metadata"]["name"] for i in cluster.api("GET", KUBE + "/objects/deployments")["items"]]
    assert {"web", "alices"} <= set(admin_view)
    assert raw(cluster, "DELETE", KUBE + "/objects/deployments/default/alices", creds["alice"])[0] == 200


def test_an_operator_manages_anyones_jobs_and_the_nodes(cluster, creds):
    got, doc = raw(cluster, "POST", "/shoal/v1/jobs", creds["alice"], {**SUBMIT, "hold": True})
    assert got == 201, doc
    alices = doc["job_id"]
    assert raw(cluster, "PATCH", f"/shoal/v1/jobs/{alices}", creds["olga"], {"time_limit_s": 7200})[0] == 200
    assert raw(cluster, "POST", f"/shoal/v1/jobs/{alices}/cancel", creds["olga"], {})[0] == 200
    assert cluster.job(alices)["state"] == "CANCELLED"
    other = cluster.node_names()[1]
    assert raw(cluster, "PATCH", f"/shoal/v1/nodes/{other}", creds["olga"], {"state": "DRAIN", "reason": "olga"})[0] == 200
    assert raw(cluster, "PATCH", f"/shoal/v1/nodes/{other}", creds["olga"], {"state": "RESUME"})[0] == 200
    assert [n["state"] for n in cluster.nodes_json() if n["name"] == other] == ["UP"]


def test_read_only_and_operator_tokens_see_everything(cluster, creds):
    for who in ("rita", "olga"):
        assert raw(cluster, "GET", f"/shoal/v1/jobs/{creds['job']}", creds[who])[0] == 200
        got, doc = raw(cluster, "GET", KUBE + "/objects/deployments?namespace=all", creds[who])
        assert got == 200 and {"web", "train"} <= {i["metadata"]["name"] for i in doc["items"]}, doc
    assert cluster.api("GET", "/shoal/v1/whoami", token=creds["rita"])["role"] == "read-only"


def test_a_group_binding_lets_its_members_work_in_the_namespace_and_a_view_binding_lets_others_look(cluster, creds):
    who = cluster.api("GET", "/shoal/v1/whoami", token=creds["bob"])
    assert (who["user"], who["groups"]) == ("bob", ["ml"])
    mine = {**TRAIN, "metadata": {"name": "bobs", "namespace": "team-a"}}
    assert raw(cluster, "POST", KUBE + "/apply", creds["bob"], {"documents": [mine]})[0] == 200
    assert raw(cluster, "POST", KUBE + "/objects/deployments/team-a/train/scale", creds["bob"], {"replicas": 0})[0] == 200
    got, doc = raw(cluster, "GET", KUBE + "/objects/deployments?namespace=team-a", creds["vic"])
    assert got == 200 and {"train", "bobs"} <= {i["metadata"]["name"] for i in doc["items"]}, doc
    got, doc = raw(cluster, "GET", KUBE + "/objects/deployments?namespace=team-a", creds["alice"])
    assert got == 200 and doc["items"] == [], doc
    # An editor who applies another's Deployment takes it over: its pods would run as the editor.
    shared = {**TRAIN, "metadata": {"name": "shared", "namespace": "team-a"}}
    cluster.api("POST", KUBE + "/apply", {"documents": [shared]})
    taken = {**shared, "spec": {**shared["spec"], "minReadySeconds": 1}}
    assert raw(cluster, "POST", KUBE + "/apply", creds["bob"], {"documents": [taken]})[0] == 200
    owner = cluster.api("GET", KUBE + "/objects/deployments/team-a/shared")["metadata"]["annotations"]
    assert owner["shoal.io/owner"] == "bob", owner
    for name in ("bobs", "shared"):
        assert raw(cluster, "DELETE", KUBE + f"/objects/deployments/team-a/{name}", creds["bob"])[0] == 200


def test_tokens_are_listed_by_id_and_a_revoked_token_is_refused_on_its_next_request(cluster, creds):
    from shoal.server.auth import hash_token, token_id

    carol = cluster.run(["shoal", "token", "create", "--user", "carol", "--group", "ml", "--expires", "30d"]).stdout
    carol = carol.strip()
    spare = cluster.api("POST", "/shoal/v1/tokens", {"user": "carol", "role": "read-only"})
    mine, spare_id = token_id(hash_token(carol)), spare["id"]
    assert spare_id == token_id(hash_token(spare["token"]))

    # The admin's table shows every token, with who made it; the values are never shown again.
    table = cluster.run(["shoal", "token", "list"]).stdout.splitlines()
    assert table[0].split() == ["ID", "USER", "ROLE", "GROUPS", "CREATED", "EXPIRES", "CREATED", "BY"], table
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows[mine][1:4] == ["carol", "user", "ml"] and rows[mine][-1] == "root", rows[mine]
    assert rows[mine][5] != "never" and rows[spare_id][5] == "never", (rows[mine], rows[spare_id])
    assert {"alice", "olga", "root", "join"} <= {r[1] for r in rows.values()}, rows
    listed = cluster.api("GET", "/shoal/v1/tokens")["tokens"]
    assert not any(carol in json.dumps(t) or spare["token"] in json.dumps(t) or "token_hash" in t
                   for t in listed), listed

    # carol sees her own tokens only, and uses hers.
    got, doc = raw(cluster, "GET", "/shoal/v1/tokens", carol)
    assert got == 200 and sorted(t["id"] for t in doc["tokens"]) == sorted([mine, spare_id]), doc
    out = cluster.run(["shoal", "token", "list", "--no-headers"], env={"SHOAL_TOKEN": carol}).stdout
    assert sorted(line.split()[0] for line in out.splitlines()) == sorted([mine, spare_id]), out
    assert raw(cluster, "GET", "/shoal/v1/whoami", carol)[1]["user"] == "carol"

    # Not hers, and no such token: clear refusals, no traceback.
    out = cluster.run(["shoal", "token", "revoke", creds["alice_id"]], env={"SHOAL_TOKEN": carol}, check=False)
    assert out.returncode == 1 and "belongs to another user" in out.stderr and "Traceback" not in out.stderr, out
    out = cluster.run(["shoal", "token", "revoke", "deadbeef"], check=False)
    assert out.returncode == 1 and "no token with id deadbeef" in out.stderr and "Traceback" not in out.stderr, out
    got, doc = raw(cluster, "DELETE", "/shoal/v1/tokens/not-an-id", cluster.admin_token)
    assert got == 404 and "not-an-id" in doc["detail"], doc
    assert raw(cluster, "GET", "/shoal/v1/whoami", creds["alice"])[0] == 200

    # The admin revokes carol's token: her very next request is refused.
    assert raw(cluster, "GET", "/shoal/v1/whoami", carol)[0] == 200  # cached on the server
    out = cluster.run(["shoal", "token", "revoke", mine]).stdout
    assert out.strip() == f"token {mine} revoked (user carol, role user)", out
    got, doc = raw(cluster, "GET", "/shoal/v1/whoami", carol)
    assert got == 401 and "revoked" in doc["detail"], doc
    out = cluster.run(["squeue"], env={"SHOAL_TOKEN": carol}, check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out

    # A user revokes her own token with it (logging out), and it is gone from the list.
    assert raw(cluster, "DELETE", f"/shoal/v1/tokens/{spare_id}", spare["token"])[0] == 200
    assert raw(cluster, "GET", "/shoal/v1/tokens", spare["token"])[0] == 401
    assert not {mine, spare_id} & {t["id"] for t in cluster.api("GET", "/shoal/v1/tokens")["tokens"]}
    got, doc = raw(cluster, "DELETE", f"/shoal/v1/tokens/{spare_id}", cluster.admin_token)
    assert got == 404 and spare_id in doc["detail"], doc


def test_an_expired_token_is_refused_and_the_last_admin_token_cannot_be_revoked(cluster, creds):
    brief = cluster.api("POST", "/shoal/v1/tokens", {"user": "dave", "expires_in_s": 1})
    assert raw(cluster, "GET", "/shoal/v1/whoami", brief["token"])[0] == 200
    time.sleep(1.1)
    got, doc = raw(cluster, "GET", "/shoal/v1/whoami", brief["token"])
    assert got == 401 and "expired" in doc["detail"], doc
    row = [t for t in cluster.api("GET", "/shoal/v1/tokens")["tokens"] if t["id"] == brief["id"]]
    assert row and row[0]["expires"] == pytest.approx(row[0]["created"] + 1, abs=0.5), row
    assert "(expired)" in cluster.run(["shoal", "token", "list"]).stdout

    root = [t["id"] for t in cluster.api("GET", "/shoal/v1/tokens")["tokens"] if t["role"] == "admin"]
    assert len(root) == 1
    got, doc = raw(cluster, "DELETE", f"/shoal/v1/tokens/{root[0]}", cluster.admin_token)
    assert got == 409 and "last admin token" in doc["detail"], doc
    assert raw(cluster, "GET", "/shoal/v1/whoami", cluster.admin_token)[0] == 200
