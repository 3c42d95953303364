"""The web console on a busy local cluster: screenshots of every page for docs/console/, and
the pages' load time with 1,000 jobs in the queue (BENCHMARKS.md).

    .venv/bin/python bench/bench_console.py shots      # docs/console/*.png (8 nodes, then 64)
    .venv/bin/python bench/bench_console.py load       # page load with 1,000 jobs, into BENCHMARKS.md

Needs Debian's chromium and chromium-driver and selenium (the test extra), as the browser tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_foundation import load_average, machine_facts  # noqa: E402
from benchmarks_md import write_section  # noqa: E402  (bench/ is on sys.path as the script's folder)
from tests.integration.cluster import LocalCluster, free_port, wait_until  # noqa: E402
from tests.integration.test_console import log_in, open_browser, rendered  # noqa: E402

SERVER = REPO / "examples" / "serving" / "model_server.py"
SHOTS = REPO / "docs" / "console"
PAGES = ("overview", "queue", "serving", "accounting", "nodes")

DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm-llama-8b"},
              "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "vllm"}},
                       "template": {"metadata": {"labels": {"app": "vllm"}}, "spec": {"containers": [{
                           "name": "vllm", "image": "vllm/vllm-openai:latest", "ports": [{"containerPort": 8000}],
                           "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}}
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "vllm"},
           "spec": {"selector": {"app": "vllm"}, "ports": [{"port": 80, "targetPort": 8000}]}}
PRETRAIN = """#!/bin/bash
#SBATCH -J llama-8b-pretrain
#SBATCH -N 2
#SBATCH --gres=gpu:8
#SBATCH -t 12:00:00
for i in $(seq 1 100000); do echo "step $i loss $((3000 - i % 1000))e-3 tokens/s 41872"; sleep 1; done
"""


FINETUNE = """#!/bin/bash
#SBATCH -J lora-finetune
#SBATCH -N 2
#SBATCH --gres=gpu:1
#SBATCH -t 2:00:00
# A stand-in for the model on each node: the fake GPUs are as busy as their holders keep a CPU,
# and hold what they keep resident; this one's load rises and falls, a little out of step per node.
echo "LoRA fine-tuning llama-8b on $SLURM_JOB_NUM_NODES nodes, rank 16"
srun python3 -c "
import math, os, time
b = bytearray((300 + 100 * int(os.environ['SLURM_NODEID'])) << 20); b[::4096] = b'x' * len(b[::4096])
t0, phase = time.time(), int(os.environ['SLURM_NODEID'])
while True:
    duty = 0.45 + 0.3 * math.sin((time.time() - t0) / 12 + phase)
    end = time.time() + duty * 0.5
    while time.time() < end: pass
    time.sleep((1 - duty) * 0.5)
"
"""


def cluster_config(root: Path, nodes: int) -> Path:
    path = root / "cluster.yaml"
    path.write_text(json.dumps({"cluster_name": "local", "nodes": {"heartbeat_interval_s": 2.0},
                                "accounts": [{"name": "research", "shares": 3, "accounts": [
                                                 {"name": "llm-pretrain", "users": ["alice"]},
                                                 {"name": "alignment", "users": ["bob"]}]},
                                             {"name": "inference", "users": ["root"]}],
                                "partitions": [{"name": "gpu-h100", "nodes": f"node[01-{nodes:02d}]", "default": True},
                                               {"name": "debug", "nodes": "node[07-08]", "max_time": "1:00:00"}]}))
    return path


def busy_cluster(root: Path) -> LocalCluster:
    """8 nodes of 8 H100s: two training gangs, an array, a serving Deployment under load, a drained
    node, a job waiting for resources, and some finished work for the accounting page."""
    gw = free_port()
    c = LocalCluster(root, nodes=8, gpus_per_node=8, gpu_model="H100-SXM-80GB", memory="2T",
                     config=str(cluster_config(root, 8)),
                     # alice's and bob's jobs run as the agent: they have no accounts on this machine
                     extra=("--image", f"vllm/vllm-openai:*=python3 {SERVER}", "--gateway", str(gw),
                            "--run-jobs-as", "agent"))
    c.gateway = f"http://127.0.0.1:{gw}"
    c.up()
    tokens = {u: c.api("POST", "/shoal/v1/tokens", {"user": u, "role": "user"})["token"] for u in ("alice", "bob")}
    as_user = {u: {**c.env, "SHOAL_TOKEN": t} for u, t in tokens.items()}
    c.api("POST", "/shoal/v1/kube/apply", {"documents": [DEPLOYMENT, SERVICE]})
    c.sbatch("--wrap", "sleep 2", "-J", "warmup", "--gres=gpu:8", "-N", "2", env=as_user["bob"])
    time.sleep(4)  # a finished job: GPU-hours on the accounting page
    c.sbatch(script=PRETRAIN, env=as_user["alice"])
    c.sbatch("-J", "rlhf-7b", "-N", "1", "--gres=gpu:8", "-t", "4:00:00", "--wrap", "sleep 3600", env=as_user["bob"])
    c.sbatch("-J", "sweep", "--array=0-11%4", "--gres=gpu:1", "-t", "1:00:00", "--wrap", "sleep 3600",
             env=as_user["bob"])
    c.sbatch("-J", "llama-70b-sft", "-N", "4", "--gres=gpu:8", "-t", "24:00:00", "--wrap", "sleep 3600",
             env=as_user["alice"])
    c.sbatch("-J", "eval", "-p", "debug", "--gres=gpu:2", "--hold", "--wrap", "sleep 60", env=as_user["alice"])
    c.sbatch(script=FINETUNE, env=as_user["bob"])
    c.run(["scontrol", "update", "NodeName=node08", "State=DRAIN", "Reason=ECC errors on GPU 3"])
    wait_until(lambda: sum(p["status"].get("phase") == "Running" for p in
                           c.api("GET", "/shoal/v1/kube/objects/pods?namespace=all")["items"]) == 3, 60,
               "the Deployment's pods running")
    return c


def load_gateway(c: LocalCluster, stop: threading.Event) -> None:
    """A few requests a second through the gateway, so the serving page has request rates."""
    while not stop.is_set():
        req = urllib.request.Request(f"{c.gateway}/v1/completions", method="POST",
                                     data=json.dumps({"prompt": "the cluster", "max_tokens": 8}).encode(),
                                     headers={"Host": "vllm.default", "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=5).read()
        except OSError:
            pass
        stop.wait(0.1)


def full_page(driver, path: Path, width: int = 1360) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, max(600, min(height + 140, 4000)))
    time.sleep(0.3)
    driver.save_screenshot(str(path))


def visit(driver, c: LocalCluster, page: str) -> None:
    driver.get(f"{c.server}/console/{page}")
    wait_until(lambda: rendered(driver) >= 1, 15, f"the {page} page")


def shots(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="shoal-console-shots-"))
    c = busy_cluster(root)
    stop = threading.Event()
    threading.Thread(target=load_gateway, args=(c, stop), daemon=True).start()
    driver = open_browser()
    try:
        log_in(driver, c, c.admin_token)
        time.sleep(90)  # the gateway's and agents' figures reach the server; GPU samples for the plots
        for page in PAGES:
            visit(driver, c, page)
            full_page(driver, out / f"{page}.png")
        job = next(j for j in c.jobs() if j["name"] == "lora-finetune")
        visit(driver, c, f"jobs/{job['job_id']}")
        time.sleep(3)
        full_page(driver, out / "job.png")
        driver.set_window_size(420, 900)
        visit(driver, c, "overview")
        full_page(driver, out / "overview-narrow.png", width=420)
        # 64 nodes: 56 more register as agents would (no processes behind them: they are shown
        # before their missing heartbeats mark them down).
        join = (root / "state" / "join.token").read_text().strip()
        for i in range(9, 65):
            body = {"name": f"node{i:02d}", "address": "127.0.0.1", "port": 1, "cpus": 128, "memory_mb": 2 ** 21,
                    "gpus": [{"index": g, "uuid": f"GPU-fake-{i}-{g}", "product": "NVIDIA H100 80GB HBM3",
                              "memory_mb": 81559} for g in range(8)]}
            c.api("POST", "/shoal/v1/agents/register", body, token=join)
        driver.set_window_size(1360, 900)
        visit(driver, c, "overview")
        full_page(driver, out / "overview-64-nodes.png")
    finally:
        stop.set()
        driver.quit()
        shutil.rmtree(driver.profile_dir, ignore_errors=True)
        c.down()
    print(f"screenshots in {out}")


def load(jobs: int = 1000, runs: int = 7) -> dict:
    """Time from navigation to the first render of each page, with ``jobs`` jobs queued."""
    root = Path(tempfile.mkdtemp(prefix="shoal-console-load-"))
    c = LocalCluster(root, nodes=4, gpus_per_node=8).up()
    driver = open_browser()
    try:
        body = {"script": "#!/bin/bash\nsleep 600\n", "name": "queued", "workdir": str(c.workdir),
                "gpus_per_node": 8, "nodes": 1, "time_limit_s": 3600, "environment": {}}
        t0 = time.perf_counter()
        for _ in range(jobs):
            c.api("POST", "/shoal/v1/jobs", body)
        submit_s = time.perf_counter() - t0
        wait_until(lambda: len(c.jobs()) >= jobs, 60, "the jobs listed")
        log_in(driver, c, c.admin_token)
        out = {"jobs": jobs, "submit_s": round(submit_s, 1), "pages": {}, "load": load_average(),
               "facts": machine_facts()}
        running = next(j["job_id"] for j in c.jobs() if j["state"] == "RUNNING")
        time.sleep(10)  # GPU samples for the job page's plot
        for page, path in (("overview", "overview"), ("queue", "queue"), ("job (GPU plot)", f"jobs/{running}"),
                           ("accounting", "accounting"), ("nodes", "nodes")):
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                visit(driver, c, path)
                times.append(time.perf_counter() - t)
            out["pages"][page] = {"median_ms": round(1000 * statistics.median(times)),
                                  "max_ms": round(1000 * max(times))}
            if page == "queue":
                out["rows"] = driver.execute_script("return document.querySelectorAll('tr[data-job]').length")
        return out
    finally:
        driver.quit()
        shutil.rmtree(driver.profile_dir, ignore_errors=True)
        c.down()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["shots", "load"])
    p.add_argument("--out", type=Path, default=SHOTS)
    p.add_argument("--jobs", type=int, default=1000)
    args = p.parse_args()
    if args.what == "shots":
        shots(args.out)
        return 0
    r = load(args.jobs)
    print(json.dumps(r, indent=2))
    rows = "\n".join(f"| {page} | {v['median_ms']} | {v['max_ms']} |" for page, v in r["pages"].items())
    facts = "\n".join(f"| {k} | {v} |" for k, v in r["facts"].items())
    heading = "## Web console: page load with many jobs"
    write_section(heading, f"""{heading}

`.venv/bin/python bench/bench_console.py load`: a 4-node local cluster with {r['jobs']:,} pending jobs; headless
Chromium (Debian's) navigates to each page and waits for its first render (the page's HTML, its
script and style, `whoami`, and the page's API reads, rendered). Seven loads per page; the queue
page showed {r['rows']:,} rows; the job page is a running job's, with its GPU plot (its
`/gpu-usage` read and drawn). Load average {r['load']} (1/5/15 min) on this shared machine
when the loads began: other work inflates these figures. The queue page reads whole Job
objects (for start estimates and GPU counts), most of its time with a thousand rows.

| Machine | |
|---|---|
{facts}

| page | median (ms) | max (ms) |
|---|---|---|
{rows}
""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
