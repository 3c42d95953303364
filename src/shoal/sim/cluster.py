"""The simulated cluster: the server's cluster file (partitions) plus a ``sim_nodes`` list.

The server learns its nodes from agents that register; the simulator has none, so the
same YAML file gains one key the server does not read::

    partitions:                     # exactly the server's schema (DefaultTime, MaxTime, ...)
      - {name: gpu, nodes: "dgx[001-032]", default: true, default_time: "4:00:00"}
    sim_nodes:                      # what each group of nodes has
      - {names: "dgx[001-032]", cpus: 224, memory: 2T, gpus: 8, gpu_model: H100-SXM-80GB}

The shared sections (``cluster_name``, ``partitions``, ``priority``, ``accounts``, ``qos``)
are read by the server's own parser, ``shoal.sched.clusterfile``, which needs neither
pydantic nor the server; ``sim_nodes`` is read here. Of the ``scheduler`` section,
``policy`` is the default policy of ``shoal simulate`` and ``preempt_grace_s`` caps a
preemption victim's grace (GraceTime); ``nodes`` (node lifecycle) is accepted and ignored,
and ``priority.type`` gives way to each policy's ``priority=``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from shoal.model.accounting import QOS, Account
from shoal.model.hostlist import HostlistError, expand
from shoal.model.node import NodeState
from shoal.model.resources import GPU
from shoal.model.snapshot import NodeInfo, Partition
from shoal.model.units import parse_size_mb
from shoal.sched.clusterfile import SECTIONS, ClusterFileError, parse_cluster_file
from shoal.sched.config import Multifactor

_NODE_KEYS = {"names", "cpus", "memory", "gpus", "gpu_model", "gpu_memory_mb", "features"}
_TOP_KEYS = SECTIONS | {"scheduler", "nodes", "sim_nodes"}


class SimClusterError(ClusterFileError):
    """The cluster file cannot describe a simulated cluster; the message names the field."""


@dataclass(frozen=True)
class SimCluster:
    """Nodes and partitions of a simulated cluster, as the scheduler's snapshot holds them."""

    name: str
    nodes: tuple[NodeInfo, ...]
    partitions: tuple[Partition, ...]
    policy: str = "backfill"
    multifactor: Multifactor = Multifactor()  # the ``priority:`` section's weights and half-life
    accounts: tuple[Account, ...] = ()  # empty: fair-share over a flat tree of the trace's users
    qos: tuple[QOS, ...] = ()
    preempt_grace_s: float = 60.0  # scheduler.preempt_grace_s (GraceTime), the server's default

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
    try:
        shared = parse_cluster_file(data)
    except ClusterFileError as e:
        raise SimClusterError(f"{source}: {e}") from None
    names = {n.name for n in nodes}
    for part in shared.partitions:
        missing = [n for n in part.nodes if n not in names]
        if missing:
            raise SimClusterError(
                f"{source}: partition {part.name} names nodes that sim_nodes does not describe: "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
            )
    scheduler = data.get("scheduler") or {}
    policy = str(scheduler.get("policy", "backfill"))
    grace = scheduler.get("preempt_grace_s", 60.0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        raise SimClusterError(f"{source}: scheduler.preempt_grace_s: expected seconds >= 0, got {grace!r}")
    return SimCluster(shared.cluster_name, nodes, shared.partitions, policy,
                      multifactor=shared.priority.multifactor(), accounts=shared.accounts,
                      qos=shared.qos, preempt_grace_s=float(grace))


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
