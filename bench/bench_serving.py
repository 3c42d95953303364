#!/usr/bin/env python3
"""Serving start-up: time from `shoal apply` to every replica ready, on an idle local cluster.

Starts a local cluster (4 nodes x 8 fake H100s, the vLLM manifest's product label and
NoSchedule taint, the example CPU model server standing in for the vLLM image), then for
each workload applies a Deployment, polls the API every 20 ms until all its replicas are
Ready, deletes it and waits until its pods are gone, several times, the workloads
interleaved round by round. Writes the ``## Serving start-up`` section of BENCHMARKS.md
(other sections are kept) and stops exactly the cluster it started.

    .venv/bin/python bench/bench_serving.py            # full: 7 rounds, ~2 minutes
    .venv/bin/python bench/bench_serving.py --short    # 3 rounds
    .venv/bin/python bench/bench_serving.py --no-write

Each run is split into phases read off the same polls: the `shoal apply` command itself
(process start-up included), until every pod object exists, until every pod's containers
run (phase Running), until every pod is Ready (the Deployment's availableReplicas).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_foundation import load_average, machine_facts  # noqa: E402
from benchmarks_md import write_section  # noqa: E402  (bench/ is on sys.path as the script's folder)
from tests.integration.cluster import LocalCluster  # noqa: E402

SECTION = "## Serving start-up"
MODEL_SERVER = REPO / "examples" / "serving" / "model_server.py"
VLLM = REPO / "examples" / "serving" / "vllm-llama-70b.yaml"
POLL_S = 0.02


@dataclass
class Workload:
    label: str
    name: str
    replicas: int
    manifest: str  # YAML or JSON text for `shoal apply -f -`
    app: str  # the pods' `app` label
    phases: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in PHASES})


PHASES = ("apply command", "all pods created", "all containers running", "all replicas ready")


def deployment(name: str, replicas: int, gpus: int, container: dict) -> str:
    doc = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
           "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                                 "spec": {"terminationGracePeriodSeconds": 5,
                                          "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                           "effect": "NoSchedule"}],
                                          "containers": [{"name": name, "image": "shoal/bench:1",
                                                          "resources": {"limits": {"nvidia.com/gpu": gpus}},
                                                          **container}]}}}}
    return json.dumps(doc)


def workloads() -> list[Workload]:
    probed = {"command": ["python3", str(MODEL_SERVER)], "ports": [{"containerPort": 8000}],
              "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1}}
    return [
        Workload("the issue's vLLM manifest as written: 4 replicas x 4 GPUs, no readiness probe",
                 "vllm-llama-70b", 4, VLLM.read_text(), "vllm"),
        Workload("model server, 4 replicas x 4 GPUs, httpGet readiness probe every 1 s",
                 "probed", 4, deployment("probed", 4, 4, probed), "probed"),
        Workload("32 replicas x 1 GPU (a sleeping container), fills the 32 GPUs",
                 "wide", 32, deployment("wide", 32, 1, {"command": ["sleep", "3600"]}), "wide"),
    ]


def pods_of(c: LocalCluster, app: str) -> list[dict]:
    return c.api("GET", f"/shoal/v1/kube/objects/pods?namespace=default&selector=app%3D{app}")["items"]


def is_ready(pod: dict) -> bool:
    return any(k["type"] == "Ready" and k["status"] == "True" for k in pod.get("status", {}).get("conditions", []))


def run_once(c: LocalCluster, w: Workload, timeout: float = 120.0) -> None:
    t0 = time.perf_counter()
    c.run(["shoal", "apply", "-f", "-"], input=w.manifest)
    marks = {"apply command": time.perf_counter() - t0}
    deadline = t0 + timeout
    while time.perf_counter() < deadline:
        pods = pods_of(c, w.app)
        now = time.perf_counter() - t0
        if len(pods) >= w.replicas:
            marks.setdefault("all pods created", now)
            if all(p["status"].get("phase") == "Running" for p in pods):
                marks.setdefault("all containers running", now)
            if sum(is_ready(p) for p in pods) >= w.replicas:
                marks.setdefault("all containers running", now)
                marks["all replicas ready"] = now
                break
        time.sleep(POLL_S)
    else:
        states = [(p["metadata"]["name"], p["status"].get("phase"),
                   [c.get("state") for c in p["status"].get("containerStatuses") or ()]) for p in pods]
        pending = [p["metadata"]["name"] for p in pods if p["status"].get("phase") != "Running"]
        detail = "".join(c.run(["shoal", "describe", "pod", name], check=False).stdout for name in pending[:2])
        raise RuntimeError(f"{w.name}: not all {w.replicas} replicas ready within {timeout} s: {marks}; {states}\n"
                           f"{detail}\n{c.run(['squeue'], check=False).stdout}")
    for phase in PHASES:
        w.phases[phase].append(marks[phase])
    c.run(["shoal", "delete", "deployment", w.name])
    end = time.time() + timeout
    while (pods_of(c, w.app) or any(n["gpus_alloc"] for n in c.nodes_json())) and time.time() < end:
        time.sleep(0.1)


def render(facts: dict[str, str], command: str, rounds: int, ws: list[Workload], seconds: float) -> str:
    lines = [SECTION, "",
             f"Written by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{seconds:.0f} s; load average at the end {load_average()}.",
             "", "Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()) + ".", "",
             "A local cluster of 4 nodes x 8 fake H100s (label `nvidia.com/gpu.product=NVIDIA-H100-SXM`, "
             "taint `nvidia.com/gpu=present:NoSchedule`), idle between runs; each Deployment applied, "
             f"polled every {POLL_S * 1000:.0f} ms until all replicas are Ready, deleted; {rounds} rounds, "
             "the workloads interleaved. Median (min-max) seconds from before `shoal apply` to each phase:",
             "", "| workload | " + " | ".join(PHASES) + " |", "|---" * (len(PHASES) + 1) + "|"]
    for w in ws:
        cells = [f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in w.phases.values()]
        lines.append(f"| {w.label} | " + " | ".join(cells) + " |")
    lines += ["", "The apply command's own time is mostly the `shoal` process start-up and the manifest's "
              "validation; pods with a readiness probe wait for their first successful probe "
              "(the model server answers /health 503 while it trains its chain)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="3 rounds instead of 7")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write BENCHMARKS.md")
    args = ap.parse_args(argv)
    rounds = 3 if args.short else 7
    command = shlex.join([".venv/bin/python", "bench/bench_serving.py", *(sys.argv[1:] if argv is None else argv)])
    started = time.time()
    facts = machine_facts()
    ws = workloads()
    c = LocalCluster(Path(tempfile.mkdtemp(prefix="shoal-bench-serving-")), nodes=4, gpus_per_node=8,
                     gpu_model="H100-SXM-80GB", memory="1T",
                     extra=("--label", "nvidia.com/gpu.product=NVIDIA-H100-SXM",
                            "--taint", "nvidia.com/gpu=present:NoSchedule",
                            "--image", f"vllm/vllm-openai:*=python3 {MODEL_SERVER}")).up()
    try:
        for r in range(rounds):
            for w in ws:
                run_once(c, w)
                print(f"round {r + 1}/{rounds} {w.name}: " +
                      ", ".join(f"{k} {v[-1]:.2f} s" for k, v in w.phases.items()), flush=True)
    finally:
        c.down()
    text = render(facts, command, rounds, ws, time.time() - started)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
