"""A step's TRESUsageIn* and ConsumedEnergy fields as sacct and sstat print them.

Slurm (23.02 and later, with ``AccountingStorageTRES=gres/gpu``) fills ``gres/gpuutil`` and
``gres/gpumem`` from NVML, next to ``cpu``, ``energy`` and ``mem``; Shoal fills them from
the Job's ``gpu_usage`` (the agents' GPU samples, shoal.model.gpuusage) and the batch step's
cgroup figures. The names are sorted and joined with commas, as Slurm's
slurmdb_make_tres_string_from_simple does; counts go through convert_num_unit (divided by
1024 while exact: ``2G``, ``1268K``), CPU time through secs2time_str. The GPU figures belong
to the job, not to one step: they are on its batch step's line (sacct's ``ID.batch``,
``sstat -j ID.batch``), or on the job's own line for a job without a batch step (salloc, pods).
"""

from __future__ import annotations

from shoal.model.timefmt import format_hms

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

STATS = ("ave", "max", "min", "tot")


def count_text(n: float | None) -> str | None:
    """Slurm's convert_num_unit with CONVERT_NUM_UNIT_EXACT (sacct's default) on a plain count:
    divided by 1024 while no precision is lost (half units count as exact), then ``%d`` or
    ``%.2f`` and the unit: ``73``, ``1268K``, ``2G``, ``2.50G``."""
    if n is None:
        return None
    num, unit = float(int(n)), 0
    if num == 0:
        return "0"
    while num >= 1024 and int(num) % 512 == 0:
        num /= 1024
        unit += 1
    suffix = ("", "K", "M", "G", "T", "P")[unit] if unit < 6 else "?"
    return f"{int(num)}{suffix}" if num == int(num) else f"{num:.2f}{suffix}"


def energy_text(joules: float | None) -> str | None:
    """ConsumedEnergy: convert_num_unit2 with a divisor of 1000, dividing while it can
    (``950``, ``12.35K``, ``3M``)."""
    if joules is None:
        return None
    num, unit = float(int(joules)), 0
    if num == 0:
        return "0"
    while num >= 1000:
        num /= 1000
        unit += 1
    suffix = ("", "K", "M", "G", "T", "P")[unit] if unit < 6 else "?"
    return f"{int(num)}{suffix}" if num == int(num) else f"{num:.2f}{suffix}"


def carries_usage(step: Mapping[str, Any] | None, job: Mapping[str, Any]) -> bool:
    """Whether this line (a step, or the job's own when ``step`` is None) shows the GPU figures."""
    if step is not None:
        return step.get("step_id") == "batch"
    return not any(s.get("step_id") == "batch" for s in job.get("steps") or ())


def _figures(step: Mapping[str, Any] | None, job: Mapping[str, Any], stat: str) -> dict[str, tuple[float, str | None]]:
    """TRES name -> (value, node) for one statistic of this line."""
    out: dict[str, tuple[float, str | None]] = {}
    if step is not None and "tres" in step:  # sstat's: figures over the step's nodes
        out.update(step["tres"][stat])
    elif step is not None:  # sacct's batch step: one task, one node
        if step.get("cpu_s") is not None:
            out["cpu"] = (step["cpu_s"], job.get("batch_host"))
        if step.get("max_rss_kb") is not None:
            out["mem"] = (step["max_rss_kb"] * 1024, job.get("batch_host"))
    gpu = job.get("gpu_usage")
    if gpu and carries_usage(step, job):
        for name, key in (("energy", "energy_j"), ("gres/gpumem", "gpumem_bytes"), ("gres/gpuutil", "gpuutil")):
            fig = gpu[key]
            out[name] = (fig[stat], fig.get(f"{stat}_node"))
    return out


def usage_text(step: Mapping[str, Any] | None, job: Mapping[str, Any], stat: str) -> str | None:
    """TRESUsageIn{Ave,Max,Min,Tot}: ``cpu=00:01:05,energy=5120,gres/gpumem=2G,gres/gpuutil=73,mem=1268K``."""
    figures = _figures(step, job, stat)
    if not figures:
        return None
    parts = []
    for name, (value, _) in sorted(figures.items()):
        if name == "cpu":
            parts.append(f"cpu={format_hms(value)}")
        else:
            parts.append(f"{name}={count_text(round(value))}")
    return ",".join(parts)


def node_text(step: Mapping[str, Any] | None, job: Mapping[str, Any], stat: str) -> str | None:
    """TRESUsageIn{Max,Min}Node: each TRES with the node of its extreme (``gres/gpuutil=node03``)."""
    figures = _figures(step, job, stat)
    parts = [f"{name}={node}" for name, (_, node) in sorted(figures.items()) if node]
    return ",".join(parts) or None


def consumed_energy(step: Mapping[str, Any] | None, job: Mapping[str, Any]) -> float | None:
    """Joules the job's GPUs drew (Slurm's acct_gather_energy/gpu): on the job's line and the line
    that carries its GPU figures."""
    gpu = job.get("gpu_usage")
    if not gpu or (step is not None and not carries_usage(step, job)):
        return None
    return gpu["energy_j"]["tot"]
