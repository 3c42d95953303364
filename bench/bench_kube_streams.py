#!/usr/bin/env python3
"""kubectl's streams through Shoal: `kubectl exec` latency beside `kubectl get pod`, bytes
through exec's WebSocket, and bytes through `kubectl port-forward` beside the pod's port read
directly.

Starts a local cluster serving HTTPS (1 node), runs a pod serving a file of random bytes
with `python3 -m http.server` on the loopback, then times: `kubectl get pod` and `kubectl exec
POD -- true` (whole commands, process start-up included), `kubectl exec POD -- cat FILE`
(stdout through the server and the agent), and an HTTP GET of the file through `kubectl
port-forward` and directly. Writes the ``## Kubernetes API streams`` section of
BENCHMARKS.md (others kept) and stops exactly the cluster it started.

    .venv/bin/python bench/bench_kube_streams.py            # 64 MiB, 10 runs
    .venv/bin/python bench/bench_kube_streams.py --mib 16 --runs 3 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_foundation import load_average, machine_facts  # noqa: E402
from benchmarks_md import publish  # noqa: E402  (bench/ is on sys.path as the script's folder)
from tests.integration.cluster import LocalCluster, free_port, wait_until  # noqa: E402

SECTION = "## Kubernetes API streams"


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/bench_kube_streams.py", *(sys.argv[1:] if argv is None else argv)])
    started, facts = time.time(), machine_facts()
    c = LocalCluster(Path(tempfile.mkdtemp(prefix="shoal-bench-streams-")), nodes=1, gpus_per_node=2,
                     extra=("--tls", "on")).up()
    c.env.update(KUBECONFIG=str(c.root / "state" / "kubeconfig"), KUBECACHEDIR=str(c.root / "kube-cache"))
    env = {**os.environ, **c.env}
    size = args.mib << 20
    try:
        site = c.root / "site"
        site.mkdir()
        (site / "blob").write_bytes(os.urandom(size))
        port, local = free_port(), free_port()
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": [{
            "name": "web", "image": "busybox",
            "command": ["sh", "-c", f"cd {site} && exec python3 -m http.server {port} --bind 127.0.0.1"]}]}}
        (c.root / "web.json").write_text(json.dumps(pod))
        c.run(["kubectl", "apply", "-f", str(c.root / "web.json")])
        c.run(["kubectl", "wait", "--for=condition=Ready", "pod/web", "--timeout=60s"], timeout=70)

        def get(url: str) -> None:
            assert len(urllib.request.urlopen(url, timeout=120).read()) == size

        wait_until(lambda: subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{port}/"]).returncode
                   == 0, 30, "the pod's server")
        rows = {
            "`kubectl get pod web`": timed(lambda: c.run(["kubectl", "get", "pod", "web"]), args.runs),
            "`kubectl exec web -- true`": timed(lambda: c.run(["kubectl", "exec", "web", "--", "true"]), args.runs),
        }
        cat = timed(lambda: subprocess.run(["kubectl", "exec", "web", "--", "cat", str(site / "blob")], env=env,
                                           stdout=subprocess.DEVNULL, check=True), args.runs)
        direct = timed(lambda: get(f"http://127.0.0.1:{port}/blob"), args.runs)
        forward = subprocess.Popen(["kubectl", "port-forward", "pod/web", f"{local}:{port}"], env=env,
                                   stdout=subprocess.PIPE, text=True)
        try:
            forward.stdout.readline()
            forwarded = timed(lambda: get(f"http://127.0.0.1:{local}/blob"), args.runs)
        finally:
            forward.terminate()
            forward.wait()
    finally:
        c.down()

    def rate(xs: list[float]) -> str:
        return f"{args.mib / statistics.median(xs):.0f} MiB/s ({statistics.median(xs):.2f} s)"

    lines = [SECTION, "",
             f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{time.time() - started:.0f} s; load average at the end {load_average()}.", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()) + ".", "",
             "A local cluster of 1 node serving HTTPS; a process pod serving a file with `python3 -m http.server`. "
             f"Median (min-max) seconds of {args.runs} runs, each a whole command (process start-up included):", "",
             "| command | seconds |", "|---|---|"]
    for label, xs in rows.items():
        lines.append(f"| {label} | {statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f}) |")
    lines += ["", f"Bytes, {args.mib} MiB, median of {args.runs}: `kubectl exec web -- cat` {rate(cat)} "
              f"(WebSocket to the server, framed stream to the agent); an HTTP GET through `kubectl port-forward` "
              f"{rate(forwarded)} (SPDY in the WebSocket, then the agent's stream); the same GET from the pod's "
              f"port directly {rate(direct)}. Both relays are Python on the server and the agent: kubectl's "
              "streams are for a shell, a file copy or a debugging port, not bulk traffic. On a shared machine "
              "(see the load average) the figures are upper bounds for times, lower bounds for rates."]
    publish(SECTION, lines, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
