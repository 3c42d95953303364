"""What a job did with its GPUs, folded from the agents' per-heartbeat GPU samples: pure
functions over plain JSON, kept per (job, run, node) in the store and summed per job for
sacct's and sstat's TRESUsageIn* fields, the API and the console's plot (docs/METRICS.md).

A node's record keeps, per GPU, its number of samples, the sums and peaks of utilisation (%)
and framebuffer memory used (MiB), and the energy its counter advanced (J); and a series of
(time, mean utilisation, memory used, power, samples) points for the plot, at most
``MAX_POINTS``: when full, neighbouring points merge in pairs and each point takes twice as
many heartbeats from then on, so a long job keeps its whole span, evenly, at a coarser step
rather than only its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_POINTS = 120
_MiB = 1024 * 1024


@dataclass(frozen=True)
class GPUSample:
    """One GPU of a job at one heartbeat, as the agent read it (DCGM's units)."""

    index: int
    util: float  # DCGM_FI_DEV_GPU_UTIL, %
    mem_mib: int  # DCGM_FI_DEV_FB_USED, MiB
    energy_mj: int | None = None  # DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: a counter, mJ
    power_w: float | None = None  # DCGM_FI_DEV_POWER_USAGE, W


def fold(record: Mapping[str, Any] | None, when: float, samples: Iterable[GPUSample]) -> dict:
    """``record`` (a node's, or None for its first sample) with one heartbeat's samples added."""
    samples = list(samples)
    out: dict[str, Any] = {"first": when, "gpus": {}, "series": [], "per_point": 1} if not record else {
        "first": record["first"], "gpus": {k: dict(v) for k, v in record["gpus"].items()},
        "series": [list(p) for p in record["series"]], "per_point": record["per_point"]}
    # The time since the previous heartbeat is spent as this one found the GPUs.
    since = 0.0 if not record else max(0.0, when - record["last"])
    out["last"] = when
    for g in samples:
        gpu = out["gpus"].get(str(g.index))
        if gpu is None:
            gpu = out["gpus"][str(g.index)] = {"n": 0, "util_sum": 0.0, "util_max": 0.0, "mem_sum": 0,
                                               "mem_max": 0, "energy_j": 0.0, "counter_mj": None, "busy_s": 0.0}
        gpu["n"] += 1
        gpu["busy_s"] += g.util / 100 * since
        gpu["util_sum"] += g.util
        gpu["util_max"] = max(gpu["util_max"], g.util)
        gpu["mem_sum"] += g.mem_mib
        gpu["mem_max"] = max(gpu["mem_max"], g.mem_mib)
        if g.energy_mj is not None:
            before = gpu["counter_mj"]
            # The counter counts since the driver loaded: a smaller value means it reloaded.
            if before is not None and g.energy_mj >= before:
                gpu["energy_j"] += (g.energy_mj - before) / 1000
            gpu["counter_mj"] = g.energy_mj
    if samples:
        power = [g.power_w for g in samples if g.power_w is not None]
        point = [when, round(sum(g.util for g in samples) / len(samples), 1), sum(g.mem_mib for g in samples),
                 round(sum(power), 1) if power else None, 1]
        points = out["series"]
        if points and points[-1][4] < out["per_point"]:
            points[-1] = _merge(points[-1], point)
        else:
            points.append(point)
        if len(points) > MAX_POINTS:
            out["series"] = [_merge(*points[i:i + 2]) if i + 1 < len(points) else points[i]
                             for i in range(0, len(points), 2)]
            out["per_point"] *= 2
    return out


def _merge(a: list, b: list) -> list:
    """Two neighbouring plot points as one: their means, weighted by the heartbeats each holds."""
    n = a[4] + b[4]

    def mean(i: int, digits: int | None = 1):
        return round((a[i] * a[4] + b[i] * b[4]) / n, digits)

    return [mean(0, 3), mean(1), mean(2, None), None if a[3] is None or b[3] is None else mean(3), n]


def _extremes(values: list[tuple[float, str]]) -> dict:
    top = max(values)
    low = min(values)
    return {"max": top[0], "max_node": top[1], "min": low[0], "min_node": low[1]}


def summarise(records: Iterable[tuple[str, Mapping[str, Any]]]) -> dict | None:
    """A job's GPU use over its (node, record) pairs, or None before any sample.

    As Slurm's TRESUsageIn* fields treat tasks, these treat GPUs: ``max``/``min`` are the
    highest and lowest of the GPUs' peaks (with the node of each), ``ave`` the mean over the
    GPUs of each one's average over time, ``tot`` the sum of those averages; energy is per
    node (as Slurm's energy TRES), ``tot`` the job's. ``busy_gpu_s``: GPU-seconds weighted by
    utilisation between the first sample and the last (a GPU 50% busy for an hour is half a
    GPU-hour)."""
    util: list[tuple[float, str]] = []
    util_peaks: list[tuple[float, str]] = []
    mem: list[tuple[float, str]] = []
    mem_peaks: list[tuple[float, str]] = []
    energy: list[tuple[float, str]] = []
    first, last, samples, busy = None, None, 0, 0.0
    for node, rec in records:
        if not rec.get("gpus"):
            continue
        first = rec["first"] if first is None else min(first, rec["first"])
        last = rec["last"] if last is None else max(last, rec["last"])
        node_energy = 0.0
        for g in rec["gpus"].values():
            n = g["n"] or 1
            samples += g["n"]
            util.append((g["util_sum"] / n, node))
            util_peaks.append((g["util_max"], node))
            mem.append((round(g["mem_sum"] / n) * _MiB, node))  # whole MiB, as the samples are
            mem_peaks.append((g["mem_max"] * _MiB, node))
            node_energy += g["energy_j"]
            busy += g["busy_s"]
        energy.append((node_energy, node))
    if not util:
        return None
    total_energy = sum(e for e, _ in energy)
    return {
        "gpus": len(util), "samples": samples, "first_time": first, "last_time": last,
        "busy_gpu_s": round(busy, 1),
        "gpuutil": {"ave": round(sum(u for u, _ in util) / len(util), 1), "tot": round(sum(u for u, _ in util), 1),
                    **_extremes(util_peaks)},
        "gpumem_bytes": {"ave": int(sum(m for m, _ in mem) / len(mem)), "tot": int(sum(m for m, _ in mem)),
                         **_extremes(mem_peaks)},
        "energy_j": {"ave": round(total_energy / len(energy), 1), "tot": round(total_energy, 1),
                     **_extremes(energy)},
    }


def series(records: Iterable[tuple[str, Mapping[str, Any]]]) -> list[dict]:
    """Each node's plot points: ``{"node", "points": [[time, util %, memory MiB, power W|None,
    heartbeats]]}``."""
    return [{"node": node, "points": rec.get("series") or []} for node, rec in sorted(records, key=lambda r: r[0])]
