"""The simulated cluster: the server's cluster file (partitions) plus a ``sim_nodes`` list.

The server learns its nodes from agents that register; the simulator has none, so the
same YAML file gains one key the server does not read::

    partitions:                     # exactly the server's schema (DefaultTime, MaxTime, ...)
      - {name: gpu, nodes: "dgx[001-032]", default: true, default_time: "4:00:00"}
    sim_nodes:                      # what each group of nodes has
      - {names: "dgx[001-032]", cpus: 224, memory: 2T, gpus: 8, gpu_model: H100-SXM-80GB}

The partitions are parsed here with the server's rules (bare numbers are minutes, a
hostlist per partition, the first partition is the default when none is marked) so that
``shoal.sim`` needs neither pydantic nor the server. Other keys the server reads
(``scheduler``, ``nodes``, ``cluster_name``) are accepted; ``scheduler.policy`` is the
default policy of ``shoal simulate``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from shoal.model.hostlist import HostlistError, expand
from shoal.model.node import NodeState
from shoal.model.resources import GPU
from shoal.model.snapshot import NodeInfo, Partition
from shoal.model.timefmt import TimeFormatError, parse_time_limit
from shoal.model.units import parse_size_mb

_PARTITION_KEYS = {"name", "nodes", "default", "default_time", "max_time", "max_nodes", "state"}
_NODE_KEYS = {"names", "cpus", "memory", "gpus", "gpu_model", "gpu_memory_mb", "features"}
_TOP_KEYS = {"cluster_name", "partitions", "scheduler", "nodes", "sim_nodes"}


class SimClusterError(ValueError):
    """The cluster file cannot describe a simulated cluster; the message names the field."""


@dataclass(frozen=True)
class SimCluster:
    """Nodes and partitions of a simulated cluster, as the scheduler's snapshot holds them."""

    name: str
    nodes: tuple[NodeInfo, ...]
    partitions: tuple[Partition, ...]
    policy: str = "backfill"

    @property
    def default_partition(self) -> Partition:
        return next(p for p in self.partitions if p.default)

    @property
    def total_gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @property
    def total_cpus(self) -> int:
        return sum(n.cpus for n in self.nodes)


def parse_sim_cluster(data: Mapping[str, Any], source: str = "cluster file") -> SimCluster:
    """Build a SimCluster from the parsed YAML of a cluster file (see the module docstring)."""
    if not isinstance(data, Mapping):
        raise SimClusterError(f"{source}: expected a mapping at the top level")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise SimClusterError(f"{source}: unknown keys {', '.join(sorted(unknown))}")
    nodes = _nodes(data.get("sim_nodes"), source)
    parts = _partitions(data.get("partitions"), source)
    names = {n.name for n in nodes}
    for part in parts:
        missing = [n for n in part.nodes if n not in names]
        if missing:
            raise SimClusterError(
                f"{source}: partition {part.name} names nodes that sim_nodes does not describe: "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
            )
    policy = str((data.get("scheduler") or {}).get("policy", "backfill"))
    return SimCluster(str(data.get("cluster_name", "shoal")), nodes, parts, policy)


def _nodes(entries: Any, source: str) -> tuple[NodeInfo, ...]:
    if not entries or not isinstance(entries, list):
        raise SimClusterError(
            f"{source}: sim_nodes is required: a list like "
            '[{names: "dgx[001-032]", cpus: 224, memory: 2T, gpus: 8, gpu_model: H100-SXM-80GB}]'
        )
    out: dict[str, NodeInfo] = {}
    for i, entry in enumerate(entries):
        at = f"{source}: sim_nodes[{i}]"
        if not isinstance(entry, Mapping):
            raise SimClusterError(f"{at}: expected a mapping")
        unknown = set(entry) - _NODE_KEYS
        if unknown:
            raise SimClusterError(f"{at}: unknown keys {', '.join(sorted(unknown))}")
        try:
            names = expand(str(entry["names"]))
        except KeyError:
            raise SimClusterError(f"{at}: 'names' (a hostlist) is required") from None
        except HostlistError as e:
            raise SimClusterError(f"{at}.names: {e}") from None
        cpus = _positive_int(entry.get("cpus"), f"{at}.cpus")
        memory_mb = size_mb(entry.get("memory"), f"{at}.memory")
        gpus = _positive_int(entry.get("gpus", 0), f"{at}.gpus", zero=True)
        model = str(entry.get("gpu_model", "H100-SXM-80GB"))
        product = model if model.lower().startswith("nvidia") else f"NVIDIA {model}"
        gpu_mem = _positive_int(entry.get("gpu_memory_mb", 81_559), f"{at}.gpu_memory_mb")
        features = frozenset(str(f) for f in entry.get("features", ()) or ())
        for name in names:
            if name in out:
                raise SimClusterError(f"{at}: node {name} is described twice")
            out[name] = NodeInfo(
                name=name, state=NodeState.UP, cpus=cpus, memory_mb=memory_mb,
                gpus=tuple(GPU(g, f"GPU-sim-{name}-{g}", product, gpu_mem) for g in range(gpus)),
                features=features,
            )
    return tuple(out.values())


def _partitions(entries: Any, source: str) -> tuple[Partition, ...]:
    if not entries or not isinstance(entries, list):
        raise SimClusterError(f"{source}: partitions is required (the server's schema)")
    parts: list[Partition] = []
    for i, entry in enumerate(entries):
        at = f"{source}: partitions[{i}]"
        if not isinstance(entry, Mapping):
            raise SimClusterError(f"{at}: expected a mapping")
        unknown = set(entry) - _PARTITION_KEYS
        if unknown:
            raise SimClusterError(f"{at}: unknown keys {', '.join(sorted(unknown))}")
        if "name" not in entry or "nodes" not in entry:
            raise SimClusterError(f"{at}: 'name' and 'nodes' are required")
        try:
            nodes = tuple(expand(str(entry["nodes"])))
        except HostlistError as e:
            raise SimClusterError(f"{at}.nodes: invalid hostlist: {e}") from None
        max_nodes = entry.get("max_nodes")
        parts.append(Partition(
            name=str(entry["name"]),
            nodes=nodes,
            default=bool(entry.get("default", False)),
            default_time_s=_time(entry.get("default_time"), f"{at}.default_time"),
            max_time_s=_time(entry.get("max_time"), f"{at}.max_time"),
            max_nodes=None if max_nodes is None else _positive_int(max_nodes, f"{at}.max_nodes"),
            state=str(entry.get("state", "UP")),
        ))
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise SimClusterError(f"{source}: partition names must be unique")
    if sum(p.default for p in parts) > 1:
        raise SimClusterError(f"{source}: only one partition may have default: true")
    if not any(p.default for p in parts):  # Slurm: the first is the default when none is marked
        parts[0] = dataclasses.replace(parts[0], default=True)
    return tuple(parts)


def _time(value: Any, at: str) -> int | None:
    """The server's rule: bare numbers are minutes (slurm.conf), strings are Slurm forms."""
    if value is None:
        return None
    if isinstance(value, int):
        return value * 60
    try:
        return parse_time_limit(str(value))
    except TimeFormatError as e:
        raise SimClusterError(f"{at}: {e}") from None


def _positive_int(value: Any, at: str, zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise SimClusterError(f"{at}: expected an integer {'>= 0' if zero else '>= 1'}, got {value!r}")
    return value


def size_mb(value: Any, at: str) -> int:
    """'2T', '512G', '4096M' or a number of MiB, as the agent's --memory takes sizes."""
    try:
        return parse_size_mb(value)
    except ValueError as e:
        raise SimClusterError(f"{at}: {e}") from None
