#!/usr/bin/env python3
"""The Kubernetes API under a thousand pods: `kubectl get pods` beside `shoal get pods`, and a
watch fanned out to a hundred watchers.

Starts a local cluster serving HTTPS (2 nodes x 8 fake GPUs), applies a Deployment of 1,000
replicas of 1 GPU (16 run a sleeping container, the rest stay Pending: every one is a pod in
the listing), then times, several times each: `kubectl get pods` (tables printed by the
server), `kubectl get pods -o json`, `shoal get pods` (Shoal's own route, printed by the
command). Then opens 100 watches on the pods (raw HTTP streams, as informers hold them),
scales the Deployment up by one and times until every watcher has the new pod's ADDED event.
Writes the ``## Kubernetes API`` section of BENCHMARKS.md (others kept) and stops exactly the
cluster it started.

    .venv/bin/python bench/bench_kubeapi.py            # 1,000 pods, 100 watchers, 5 runs
    .venv/bin/python bench/bench_kubeapi.py --pods 200 --no-write
"""

from __future__ import annotations

import argparse
import http.client
import json
import shlex
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_foundation import load_average, machine_facts  # noqa: E402
from benchmarks_md import write_section  # noqa: E402  (bench/ is on sys.path as the script's folder)
from tests.integration.cluster import LocalCluster, wait_until  # noqa: E402

SECTION = "## Kubernetes API"


def deployment(replicas: int) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "many"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "many"}},
                     "template": {"metadata": {"labels": {"app": "many"}}, "spec": {
                         "containers": [{"name": "sleep", "image": "busybox", "command": ["sleep", "3600"],
                                         "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}


def timed(c: LocalCluster, argv: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        c.run(argv, timeout=120)
        out.append(time.perf_counter() - t)
    return out


class Watcher(threading.Thread):
    """One watch stream on the pods from a resourceVersion; notes when each pod is ADDED."""

    def __init__(self, host: str, port: int, token: str, ca: str, rv: str) -> None:
        super().__init__(daemon=True)
        self.added: dict[str, float] = {}
        ctx = ssl.create_default_context(cafile=ca)
        self.conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=120)
        self.conn.request("GET", f"/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv}",
                          headers={"Authorization": f"Bearer {token}"})
        self.response = self.conn.getresponse()

    def run(self) -> None:
        try:
            for line in self.response:
                ev = json.loads(line)
                if ev["type"] == "ADDED":
                    self.added[ev["object"]["metadata"]["name"]] = time.perf_counter()
        except (OSError, ValueError, AttributeError, http.client.HTTPException):  # closed at the end
            pass


def fan_out(c: LocalCluster, watchers: int, replicas: int, kubeconfig: str) -> tuple[float, float, float]:
    """Open the watches, scale up by one, return (open s, median s, slowest s) to the event."""
    conf = json.loads(Path(kubeconfig).read_text())
    token = conf["users"][0]["user"]["token"]
    ca = str(c.root / "state" / "server" / "ca.crt")
    rv = json.loads(c.run(["kubectl", "get", "pods", "-o", "json"], timeout=120).stdout)["metadata"]["resourceVersion"]
    t = time.perf_counter()
    ws = [Watcher("127.0.0.1", c.port, token, ca, rv) for _ in range(watchers)]
    for w in ws:
        w.start()
    opened = time.perf_counter() - t
    listed = json.loads(c.run(["kubectl", "get", "pods", "-o", "json"], timeout=120).stdout)["items"]
    before = {pod["metadata"]["name"] for pod in listed}
    start = time.perf_counter()
    c.run(["kubectl", "scale", "deploy/many", f"--replicas={replicas + 1}"])
    new = wait_until(lambda: next((n for n in ws[0].added if n not in before), None), 60, "the new pod's event")
    wait_until(lambda: all(new in w.added for w in ws), 60, "every watcher to see it")
    delays = sorted(w.added[new] - start for w in ws)
    for w in ws:
        w.conn.close()
    return opened, statistics.median(delays), delays[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--watchers", type=int, default=100)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/bench_kubeapi.py", *(sys.argv[1:] if argv is None else argv)])
    started, facts = time.time(), machine_facts()
    c = LocalCluster(Path(tempfile.mkdtemp(prefix="shoal-bench-kubeapi-")), nodes=2, gpus_per_node=8,
                     extra=("--tls", "on")).up()
    kubeconfig = str(c.root / "state" / "kubeconfig")
    c.env.update(KUBECONFIG=kubeconfig, KUBECACHEDIR=str(c.root / "kube-cache"))
    try:
        manifest = c.root / "many.json"
        manifest.write_text(json.dumps(deployment(args.pods)))
        c.run(["kubectl", "apply", "-f", str(manifest)])
        wait_until(lambda: len(json.loads(c.run(["shoal", "get", "pods", "-o", "json"]).stdout)["items"])
                   == args.pods, 120, "every pod object", interval=1)
        rows = {
            "`kubectl get pods` (server-side Table)": timed(c, ["kubectl", "get", "pods"], args.runs),
            "`kubectl get pods -o json`": timed(c, ["kubectl", "get", "pods", "-o", "json"], args.runs),
            "`shoal get pods` (Shoal's own route)": timed(c, ["shoal", "get", "pods"], args.runs),
        }
        opened, median, slowest = fan_out(c, args.watchers, args.pods, kubeconfig)
    finally:
        c.down()
    lines = [SECTION, "",
             f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{time.time() - started:.0f} s; load average at the end {load_average()}.", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()) + ".", "",
             f"A local cluster of 2 nodes x 8 fake GPUs serving HTTPS; one Deployment of {args.pods:,} replicas "
             "of 1 GPU (16 running a sleeping container, the rest Pending). Median (min-max) seconds of "
             f"{args.runs} runs, each a whole command (process start-up included):", "",
             "| command | seconds |", "|---|---|"]
    for label, xs in rows.items():
        lines.append(f"| {label} | {statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f}) |")
    lines += ["", f"Watch fan-out: {args.watchers} watch streams on the pods opened in {opened:.2f} s; after "
              f"`kubectl scale` adds one replica, the new pod's ADDED event reached the median watcher "
              f"{median:.2f} s and the last {slowest:.2f} s after the command started (the streams opened one "
              "after another, each with its TLS handshake; the time to the event is mostly `kubectl scale` itself, "
              "the controller's round and one read of every pod, which all watchers share: the first and the last "
              "watcher differ by the spread between them)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
