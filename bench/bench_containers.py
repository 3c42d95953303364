#!/usr/bin/env python3
"""Container step start-up: a bare-process step, a container step with a cold image cache
(pulled from a local registry) and with a warm one, side by side, on a one-node local
cluster with podman; writes the ``## Container steps`` section of BENCHMARKS.md.

    .venv/bin/python bench/bench_containers.py [--rounds 5] [--tasks 8] [--no-write]

Each figure is the wall time of ``srun -n TASKS true`` inside a running allocation's job
(sbatch script timing each srun), so the allocation's own start is not counted. The
image is the tests' busybox image (a few MiB): a cold start's pull of a real image is
dominated by its size and the registry's bandwidth, which this cannot stand for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks_md import write_section  # noqa: E402  (bench/ is on sys.path as the script's folder)
from tests.integration.cluster import LocalCluster  # noqa: E402
from tests.integration.registry import Registry, build_image, podman, podman_env, push  # noqa: E402

IMAGE = "nvcr.io/nvidia/pytorch:24.10-py3"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-containers-") as tmp:
        root = Path(tmp)
        penv = podman_env(root)
        registry = Registry(root / "registry").start()
        remote = f"{registry.address}/nvidia/pytorch:24.10-py3"
        cluster = None
        try:
            build_image(penv, root, f"localhost/bench-{registry.port}:1", "bench image")
            push(penv, f"localhost/bench-{registry.port}:1", remote)
            podman(penv, "rmi", f"localhost/bench-{registry.port}:1")
            config = root / "cluster.yaml"
            config.write_text(json.dumps({
                "cluster_name": "bench", "partitions": [{"name": "gpu", "nodes": "node01", "default": True}],
                "containers": {"registry_mirrors": {"nvcr.io": registry.address},
                               "insecure_registries": [registry.address]}}))
            cluster = LocalCluster(root / "cluster", nodes=1, gpus_per_node=8, config=str(config),
                                   extra=("--runtime", "podman"))
            cluster.env.update(penv)
            cluster.up()
            index = root / "cluster" / "state" / "nodes" / "node01" / "images" / "index.json"
            n = args.tasks
            # One job: each round times a bare step, then a cold container step (the image
            # removed and forgotten before it), then a warm one.
            script = "#!/bin/bash\nt() { s=$(date +%s%N); \"$@\" >/dev/null; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }\n"
            for _ in range(args.rounds):
                script += (f"echo bare $(t srun -n{n} true)\n"
                           f"podman rmi --force {remote} >/dev/null 2>&1; rm -f {index}\n"
                           f"echo cold $(t srun -n{n} --container-image={IMAGE} true)\n"
                           f"echo warm $(t srun -n{n} --container-image={IMAGE} true)\n")
            job = cluster.sbatch("-n", str(n), script=script)
            done = cluster.wait_for(job, timeout=600)
            text = (cluster.workdir / f"slurm-{job}.out").read_text()
            # Each cold step's tasks start at once; the registry says how often the image was fetched.
            pulls = (registry.root / "registry.log").read_text().count(
                '"GET /v2/nvidia/pytorch/manifests/24.10-py3 HTTP/1.1" 200')
            if done["state"] != "COMPLETED":
                print(text)
                return 1
        finally:
            if cluster is not None:
                cluster.down()
            registry.stop()
            podman(penv, "rmi", "--force", remote, check=False)
    times: dict[str, list[float]] = {"bare": [], "cold": [], "warm": []}
    for line in text.splitlines():
        kind, _, value = line.partition(" ")
        if kind in times and value.strip():
            times[kind].append(float(value) / 1000)  # ms
    rows = [(k, statistics.median(v), min(v), max(v)) for k, v in times.items()]
    table = ["| step | median (s) | min (s) | max (s) |", "| --- | ---: | ---: | ---: |"]
    names = {"bare": f"bare processes, {n} tasks", "cold": f"container, cold cache (pull), {n} tasks",
             "warm": f"container, warm cache, {n} tasks"}
    table += [f"| {names[k]} | {med:.2f} | {lo:.2f} | {hi:.2f} |" for k, med, lo, hi in rows]
    table.append(f"\n{args.rounds} cold steps of {n} tasks each fetched the image's manifest {pulls} times "
                 "(one pull per step: the tasks wait on the node's lock for that image).")
    body = "\n".join(table)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(body)
    if not args.no_write:
        write_section("## Container steps", "## Container steps\n\n"
                      f"`bench/bench_containers.py --rounds {args.rounds} --tasks {n}`: `srun -n{n} true` inside a "
                      "job on one node, bare and in a podman container (runc, a busybox image of a few MiB from a "
                      "local registry through the cluster's mirror setting). Cold: the image removed from the "
                      "node first, so the step pulls it (once for all its tasks); warm: it is in the node's "
                      "cache. A container step starts one keeper container per node and starts each "
                      f"task in it (its OCI runtime's own exec). Load average during the run: {load}.\n\n{body}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
