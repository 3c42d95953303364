"""Live load figures the HPA reads: per pod from the gateways, per GPU and pod from agents.

Kept in memory only (like metrics-server): after a restart the HPA waits for fresh figures,
and a figure older than ``STALE_S`` counts as missing; an agent's, sent once per heartbeat,
only when older than two heartbeat intervals (``agent_stale_s``).
"""

from __future__ import annotations

import threading

from shoal.kube.hpa import METRIC_ALIASES

STALE_S = 10.0


class Metrics:
    def __init__(self, heartbeat_interval_s: float = STALE_S / 2) -> None:
        self._lock = threading.Lock()
        self.agent_stale_s = max(STALE_S, 2 * heartbeat_interval_s)
        self._pods: dict[str, tuple[float, float, float]] = {}  # "NS/POD" -> (rps, inflight, time)
        self._held: dict[str, tuple[int, float]] = {}  # "NS/SVC" -> (waiting requests, time)
        self._gpu: dict[tuple[str, int], tuple[float, float]] = {}  # (node, gpu index) -> (util %, time)
        self._cpu: dict[str, tuple[float, float]] = {}  # run key -> (cores used, time)

    def gateway_report(self, pods: dict, held: dict, now: float) -> None:
        with self._lock:
            for key, m in pods.items():
                self._pods[key] = (float(m.get("rps", 0.0)), float(m.get("inflight", 0.0)), now)
            for key, n in held.items():
                self._held[key] = (int(n), now)

    def agent_report(self, node: str, gpu_util: dict, pod_cpu: dict, now: float) -> None:
        with self._lock:
            for index, util in gpu_util.items():
                self._gpu[(node, int(index))] = (float(util), now)
            for key, cores in pod_cpu.items():
                self._cpu[key] = (float(cores), now)

    def gpu_utilisation(self, now: float) -> dict[tuple[str, int], float]:
        """Each GPU's last fresh utilisation (%), by (node, index): the console's grid."""
        with self._lock:
            return {g: u for g, (u, t) in self._gpu.items() if now - t < self.agent_stale_s}

    def pod_load(self, now: float) -> dict[str, dict]:
        """Each pod's fresh request rate and in-flight requests from the gateways, by "NS/POD"."""
        with self._lock:
            return {k: {"rps": rps, "inflight": inflight} for k, (rps, inflight, t) in self._pods.items()
                    if now - t < STALE_S}

    def held(self, namespace: str, services: list[str], now: float | None = None) -> int:
        import time

        now = time.time() if now is None else now
        with self._lock:
            return sum(n for key, (n, t) in self._held.items()
                       if now - t < STALE_S and key in {f"{namespace}/{s}" for s in services})

    def for_pods(self, server, pods, now: float) -> dict[str, list[float | None]]:
        """Per metric name, one value per pod (None: missing), in ``pods`` order. CPU is
        cores used; the HPA divides by the pods' requests for Utilization targets."""
        from shoal.server.kube.pods import job_key

        out: dict[str, list[float | None]] = {"requests_per_second": [], "inflight_requests": [],
                                               "DCGM_FI_DEV_GPU_UTIL": [], "cpu": []}
        with self._lock:
            for row in pods:
                running = row.state == "RUNNING"
                m = self._pods.get(f"{row.namespace}/{row.name}")
                fresh = m is not None and now - m[2] < STALE_S
                # A running pod the gateway has not reported had no requests; a pending one is missing.
                out["requests_per_second"].append(m[0] if fresh else (0.0 if running else None))
                out["inflight_requests"].append(m[1] if fresh else (0.0 if running else None))
                gpus = [g for n in (row.allocation or {}).get("nodes", ()) for g in
                        [(n["name"], i) for i in n["gpus"]]]
                utils = [self._gpu[g][0] for g in gpus if g in self._gpu and now - self._gpu[g][1] < self.agent_stale_s]
                out["DCGM_FI_DEV_GPU_UTIL"].append(sum(utils) / len(utils) if utils and len(utils) == len(gpus)
                                                   else None)
                c = self._cpu.get(job_key(row))
                out["cpu"].append(c[0] if c is not None and now - c[1] < self.agent_stale_s else None)
        for alias, name in METRIC_ALIASES.items():
            out[alias] = out[name]
        return out
