"""What this node's pods and GPUs use now: pods' CPU cores (psutil) and GPU utilisation
and memory (NVML), sampled with each heartbeat for the HPA and served as DCGM-style
Prometheus text on the step server's ``GET /metrics``.

Sampling never blocks: CPU use is the difference of processes' CPU times since the
previous sample (as ``top`` computes it), and GPU utilisation is NVML's own figure over
the driver's sample period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from shoal.model.exposition import label_set
from shoal.model.resources import GPU

log = logging.getLogger("shoal.agent.usage")

_MiB = 1024 * 1024
# psutil's create_time rests on the kernel's boot time in whole seconds, so it may be up to a
# second early; a process that young and unseen is taken as born since the last sample.
_CREATE_TIME_SLACK_S = 1.0


def descendants(roots: Iterable[int]) -> dict[int, list[int]]:
    """Each live root with every process below it (root first), from one read of the
    process table. A root that is gone is left out."""
    roots = list(roots)
    if not roots:
        return {}
    children: dict[int, list[int]] = {}
    live: set[int] = set()
    for p in psutil.process_iter(["ppid"]):
        live.add(p.pid)
        children.setdefault(p.info["ppid"], []).append(p.pid)
    out: dict[int, list[int]] = {}
    for root in roots:
        if root not in live:
            continue
        tree, todo = [], [root]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(c for c in children.get(pid, ()) if c != pid)
        out[root] = tree
    return out


class CpuMeter:
    """CPU cores each process used since the previous call of :meth:`cores`.

    A process seen for the first time counts from its start when it began since that
    call, and is otherwise left out (it has no baseline yet).
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[float, float]] = {}  # pid -> (create_time, CPU seconds)
        self._at: float | None = None  # time.time() of the previous call

    def cores(self, pids: Iterable[int], now: float | None = None) -> dict[int, float]:
        now = time.time() if now is None else now
        seen: dict[int, tuple[float, float]] = {}
        out: dict[int, float] = {}
        for pid in pids:
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    created = p.create_time()
                    t = p.cpu_times()
            except psutil.Error:
                continue
            used = t.user + t.system
            seen[pid] = (created, used)
            before = self._seen.get(pid)
            if before is not None and abs(before[0] - created) < 0.01 and self._at is not None:
                base, since = before[1], self._at
            elif self._at is not None and created >= self._at - _CREATE_TIME_SLACK_S:
                base, since = 0.0, self._at  # born since the last call: all its CPU time is new
            else:
                continue
            if now > since:
                out[pid] = max(used - base, 0.0) / (now - since)
        self._seen, self._at = seen, now
        return out


@dataclass(frozen=True)
class GPUUsage:
    """One GPU at one moment, in DCGM's units."""

    index: int
    util: int  # DCGM_FI_DEV_GPU_UTIL, %
    mem_copy_util: int  # DCGM_FI_DEV_MEM_COPY_UTIL, %
    fb_used_mb: int  # DCGM_FI_DEV_FB_USED, MiB
    fb_free_mb: int  # DCGM_FI_DEV_FB_FREE, MiB
    power_w: float | None = None  # DCGM_FI_DEV_POWER_USAGE, W (None: the GPU does not say)
    energy_mj: int | None = None  # DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ since the driver loaded


def _optional(call, *args) -> Any:
    """An NVML figure some GPUs lack (power and energy on older boards): None when NotSupported."""
    import pynvml

    try:
        return call(*args)
    except pynvml.NVMLError_NotSupported:
        return None


def read_gpus(nvml: Any, indices: Iterable[int]) -> list[GPUUsage]:
    """Utilisation, framebuffer use, power and energy of each GPU NVML can read now; a GPU
    that fails (lost, or no utilisation counters, as MIG-enabled GPUs) is left out."""
    import pynvml

    out = []
    for index in indices:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            power_mw = _optional(nvml.nvmlDeviceGetPowerUsage, handle)
            energy_mj = _optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        except pynvml.NVMLError as e:
            log.debug("GPU %d: no utilisation: %s", index, e)
            continue
        out.append(GPUUsage(index, int(rates.gpu), int(rates.memory), int(mem.used) // _MiB,
                            int(mem.free) // _MiB, None if power_mw is None else round(power_mw / 1000, 3),
                            None if energy_mj is None else int(energy_mj)))
    return out


@dataclass(frozen=True)
class Sample:
    time: float
    gpus: tuple[GPUUsage, ...] = ()
    pod_cpu: Mapping[str, float] = field(default_factory=dict)  # run key -> cores used

    def report(self, holders: Mapping[int, tuple[int, int]] | None = None) -> dict:
        """The agent report's fields: ``gpu_util`` {"index": %} and ``pod_cpu`` {"run key": cores}
        for the HPA, and ``gpu_usage``, each GPU a run holds (``holders``: GPU index -> (job id,
        run)) with its figures, for per-job GPU accounting."""
        holders = holders or {}
        return {"gpu_util": {str(g.index): float(g.util) for g in self.gpus},
                "pod_cpu": {k: round(v, 4) for k, v in self.pod_cpu.items()},
                "gpu_usage": [{"job_id": holders[g.index][0], "run": holders[g.index][1], "gpu": g.index,
                               "util": float(g.util), "mem_mib": g.fb_used_mb, "energy_mj": g.energy_mj,
                               "power_w": g.power_w} for g in self.gpus if g.index in holders]}


class UsageSampler:
    """Takes a :class:`Sample` on demand and keeps the last one for ``GET /metrics``.
    ``nvml`` is an open NVML (or fake), or None on a node without GPUs."""

    def __init__(self, nvml: Any | None, gpus: Iterable[GPU]) -> None:
        self.nvml = nvml
        self.gpus = tuple(gpus)
        self._meter = CpuMeter()
        self._lock = threading.Lock()
        self.last: Sample | None = None

    def sample(self, pod_pids: Mapping[str, Iterable[int]], now: float | None = None) -> Sample:
        """``pod_pids``: each pod's (run key's) container main processes; their trees count."""
        now = time.time() if now is None else now
        with self._lock:
            roots = {key: list(pids) for key, pids in pod_pids.items()}
            trees = descendants(pid for pids in roots.values() for pid in pids)
            per_pid = self._meter.cores((pid for tree in trees.values() for pid in tree), now)
            pod_cpu = {}
            for key, pids in roots.items():
                used = [per_pid[p] for root in pids for p in trees.get(root, ()) if p in per_pid]
                if used:
                    pod_cpu[key] = sum(used)
            gpus = tuple(read_gpus(self.nvml, (g.index for g in self.gpus))) if self.nvml is not None else ()
            self.last = Sample(now, gpus, pod_cpu)
            return self.last


# --------------------------------------------------------------------------- Prometheus

# dcgm-exporter's names, help and types (its default-counters.csv).
_DCGM_FIELDS = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge", lambda g: g.util),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "gauge", lambda g: g.mem_copy_util),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge", lambda g: g.fb_used_mb),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge", lambda g: g.fb_free_mb),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge", lambda g: g.power_w),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "counter",
     lambda g: g.energy_mj),
)


def holder_labels(run: Mapping[str, Any]) -> dict[str, str]:
    """The labels dcgm-exporter gives a GPU's series for its holder: ``namespace``, ``pod``
    and ``container`` (its Kubernetes mapping) for a pod, ``hpc_job`` (its HPC job mapping,
    the Slurm job id) for a batch job. ``run``: the run entry of the agent's work."""
    pod = run.get("pod")
    if pod is None:
        return {"hpc_job": str(run["job_id"])}
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    # The GPUs go to the container whose limits ask for them (one such container in a pod
    # here); a pod that names none has them on its first container.
    holder = next((c for c in containers if any(k.endswith("/gpu") for k in
                                                ((c.get("resources") or {}).get("limits") or {}))), containers[0])
    return {"namespace": pod["namespace"], "pod": pod["name"], "container": holder.get("name", "")}


def prometheus_text(sample: Sample | None, gpus: Iterable[GPU], hostname: str,
                    gpu_holders: Mapping[int, Mapping[str, str]], pod_names: Mapping[str, tuple[str, str]]) -> str:
    """The last sample as dcgm-exporter writes it (gauges labelled ``gpu``, ``UUID``,
    ``device``, ``modelName``, ``Hostname``, and the :func:`holder_labels` of the run holding
    the GPU), plus ``shoal_pod_cpu_cores{namespace,pod}``. ``gpu_holders``: GPU index ->
    holder labels; ``pod_names``: run key -> (namespace, pod)."""
    lines: list[str] = []
    if sample is None:
        return ""
    info = {g.index: g for g in gpus}
    for name, help_text, kind, value in _DCGM_FIELDS:
        if all(value(g) is None for g in sample.gpus):
            continue  # a figure these GPUs do not give
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for g in sample.gpus:
            if value(g) is None:
                continue
            gpu = info.get(g.index)
            labels = {"gpu": str(g.index), "UUID": gpu.uuid if gpu else "", "device": f"nvidia{g.index}",
                      "modelName": gpu.product if gpu else "", "Hostname": hostname,
                      **gpu_holders.get(g.index, {})}
            lines.append(f"{name}{label_set(**labels)} {value(g)}")
    lines += ["# HELP shoal_pod_cpu_cores CPU cores used by the pod's processes since the previous sample.",
              "# TYPE shoal_pod_cpu_cores gauge"]
    for key, cores in sorted(sample.pod_cpu.items()):
        if key in pod_names:
            ns, pod = pod_names[key]
            lines.append(f"shoal_pod_cpu_cores{label_set(namespace=ns, pod=pod)} {cores:.4f}")
    return "\n".join(lines) + "\n"
