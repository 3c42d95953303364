"""An administrator's Prometheus: `shoal up --prometheus` starts a real one (Debian's), which
scrapes the server, the agents and the gateway of a busy cluster; what it stores agrees with
squeue, sinfo and scontrol, a job's GPUs carry its id, a pod's its name, and every query of
the shipped Grafana dashboards (examples/grafana/) runs against it."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "serving" / "model_server.py"
DASHBOARDS = sorted((ROOT / "examples" / "grafana").glob("*.json"))
# Dashboard queries that may rightly be empty on this cluster: nothing is preempted here.
MAY_BE_EMPTY = {'sum by (partition, qos) (increase(shoal_preemptions_total[1h]))'}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    gw = free_port()
    c = LocalCluster(tmp_path_factory.mktemp("prometheus"), nodes=3, gpus_per_node=4,
                     extra=("--image", f"vllm/vllm-openai:*=python3 {SERVER}", "--gateway", str(gw),
                            "--prometheus", str(free_port())))
    c.gateway = f"http://127.0.0.1:{gw}"
    c.up()
    yield c
    c.down()


def query(c: LocalCluster, expr: str) -> list[dict]:
    """An instant query's result vector; a query Prometheus refuses fails the test."""
    url = f"{c.state['prometheus']}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", (expr, doc)
    return doc["data"]["result"]


def scalar(c: LocalCluster, expr: str) -> float | None:
    result = query(c, expr)
    return float(result[0]["value"][1]) if result else None


def by(c: LocalCluster, expr: str, label: str) -> dict[str, float]:
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in query(c, expr)}


def ask_gateway(c: LocalCluster) -> bool:
    req = urllib.request.Request(f"{c.gateway}/v1/completions", method="POST",
                                 data=json.dumps({"prompt": "the metrics", "max_tokens": 2}).encode(),
                                 headers={"Host": "llm.default", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def busy(cluster):
    """Two serving replicas behind the gateway, four one-GPU jobs running, a three-node gang
    waiting, a held job, a finished one, and a drained node."""
    c = cluster
    c.run(["shoal", "apply", "-f", str(ROOT / "examples" / "serving" / "hpa.yaml")])
    wait_until(lambda: json.loads(c.run(["shoal", "get", "deploy", "llm", "-o", "json"]).stdout)["status"]
               .get("readyReplicas") == 2, 40, "two ready llm replicas")
    done = c.sbatch("--gpus=1", "--wrap", "true")
    running = [c.sbatch("--gpus=1", "--wrap", "sleep 600") for _ in range(4)]
    gang = c.sbatch("--nodes=3", "--gpus-per-node=4", "--wrap", "sleep 600")
    held = c.sbatch("-H", "--gpus=1", "--wrap", "sleep 600")
    c.wait_for(done)
    wait_until(lambda: all(c.job(j)["state"] == "RUNNING" for j in running), 30, "four running jobs")
    c.run(["scontrol", "update", "nodename=node03", "state=drain", "reason=maintenance"])
    wait_until(lambda: ask_gateway(c), 20, "an answer through the gateway")
    for _ in range(5):
        ask_gateway(c)
    return {"running": running, "gang": gang, "held": held, "done": done}


def squeue_counts(c: LocalCluster) -> tuple[Counter, Counter]:
    """Jobs per state (pods are jobs too) and pending jobs per reason, as squeue shows them."""
    lines = c.run(["squeue", "-h", "-o", "%i|%T|%r"]).stdout.split()
    states = Counter(line.split("|")[1].lower() for line in lines)
    reasons = Counter(line.split("|")[2] for line in lines if line.split("|")[1] == "PENDING")
    return states, reasons


def test_prometheus_sees_what_squeue_sinfo_and_scontrol_show(cluster, busy):
    c = cluster
    targets = wait_until(lambda: (lambda up: up if len(up) == 5 and all(v == 1 for v in up.values()) else None)(
        by(c, "up", "instance")), 30, "the server, three agents and the gateway scraped")
    assert len(targets) == 5
    states, reasons = squeue_counts(c)
    assert states == Counter({"running": 6, "pending": 2}), states  # four jobs and two pods run
    # Prometheus scrapes every 2 s: wait for a scrape made after the drain.
    wait_until(lambda: scalar(c, 'sum(shoal_partition_gpus{state="drained"})') is not None
               and by(c, "shoal_node_state", "node").get("node03") is not None
               and by(c, 'shoal_node_state{state="drain"}', "node") == {"node03": 1.0}, 20, "the drain scraped")
    jobs = by(c, "sum by (state) (shoal_jobs)", "state")
    assert jobs == {s: float(n) for s, n in states.items()}
    assert by(c, "sum by (reason) (shoal_pending_jobs)", "reason") == {r: float(n) for r, n in reasons.items()}
    assert reasons["JobHeldUser"] == 1

    # GPUs per node as scontrol's AllocTRES gives them; CPUs per partition as sinfo's A/I/O/T.
    show = c.run(["scontrol", "show", "node"]).stdout
    alloc = {m[0]: float(m[1]) for m in re.findall(r"NodeName=(\S+).*?AllocTRES=\S*?gres/gpu=(\d+)", show, re.S)}
    for node in c.node_names():
        alloc.setdefault(node, 0.0)
    assert by(c, 'shoal_node_gpus{state="allocated"}', "node") == alloc
    assert sum(alloc.values()) == 6  # four jobs and two replicas
    lines = c.run(["sinfo", "-h", "-o", "%C"]).stdout.split()  # a line per group of nodes in one state
    a, i, o, t = (sum(float(line.split("/")[k]) for line in lines) for k in range(4))
    cpus = by(c, "sum by (state) (shoal_partition_cpus)", "state")
    assert (cpus["allocated"], cpus["idle"], cpus["drained"], sum(cpus.values())) == (a, i, o, t)
    assert scalar(c, "shoal_agents_connected") == 3

    # Per-workload GPU series: a job's GPU by its id (dcgm-exporter's hpc_job), a replica's by its pod.
    job = busy["running"][0]
    series = query(c, f'DCGM_FI_DEV_GPU_UTIL{{hpc_job="{job}"}}')
    node = c.job(job)["nodelist"]
    assert len(series) == 1 and series[0]["metric"]["Hostname"] == node, (series, node)
    # ...and what it draws: an idle GPU's power (a tenth of the A100's 400 W), its energy counting up.
    assert scalar(c, f'DCGM_FI_DEV_POWER_USAGE{{hpc_job="{job}"}}') == 40.0
    assert scalar(c, f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{hpc_job="{job}"}}') > 0
    pods = query(c, 'DCGM_FI_DEV_GPU_UTIL{namespace="default", pod=~"llm-.*"}')
    assert len(pods) == 2 and {s["metric"]["container"] for s in pods} == {"vllm"}
    assert scalar(c, 'shoal_deployment_spec_replicas{deployment="llm"}') == 2
    assert scalar(c, 'shoal_deployment_status_replicas_ready{deployment="llm"}') == 2

    # Events: the finished job's run time, every start's queue wait, the requests by route.
    assert scalar(c, "sum(shoal_job_run_time_seconds_count)") >= 1
    assert scalar(c, "sum(shoal_jobs_started_total)") >= 7  # five jobs and two pods
    # A scrape's own request is counted once it is answered: the next scrape carries it.
    wanted = {"/shoal/v1/agents/{node}/work", "/shoal/v1/commands/{name}", "/metrics"}
    wait_until(lambda: wanted <= set(by(c, 'sum by (route) (shoal_http_request_duration_seconds_count{code="200"})',
                                        "route")), 10, "requests by route template")


def test_every_grafana_dashboard_query_runs(cluster, busy):
    c = cluster
    exprs = [t["expr"] for d in DASHBOARDS for p in json.loads(d.read_text())["panels"] for t in p["targets"]]
    assert len(DASHBOARDS) == 3 and len(exprs) >= 30
    # Rates need two scrapes of each series: wait for the HPA's decisions and the gateway's requests.
    wait_until(lambda: query(c, "sum(rate(shoal_gateway_requests_total[5m]))")
               and query(c, "sum(increase(shoal_hpa_decisions_total[1h]))"), 30, "rates over two scrapes")
    empty = [e for e in exprs if not query(c, e) and e not in MAY_BE_EMPTY]
    assert empty == []


def test_shoal_down_stops_prometheus(cluster, busy):
    pid = cluster.state["pids"]["prometheus"]
    cluster.down()
    assert not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text().split(") ")[1][:1]
