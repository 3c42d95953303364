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
default policy of ``shoal simulate``, ``scheduler.preempt_grace_s`` caps a preemption
victim's grace (GraceTime). The server's ``priority`` (multifactor weights, half-life),
``accounts`` (the fair-share tree) and ``qos`` sections are read with the server's
defaults and checks (a small parser here: the server's is pydantic, and ``shoal.sim`` may
not import the server); ``priority.type`` is ignored in favour of each policy's ``priority=``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from shoal.model.accounting import DEFAULT_QOS, QOS, Account, UserShare
from shoal.model.hostlist import HostlistError, expand
from shoal.model.node import NodeState
from shoal.model.resources import GPU
from shoal.model.snapshot import NodeInfo, Partition
from shoal.model.timefmt import TimeFormatError, parse_time_limit
from shoal.model.units import parse_size_mb
from shoal.sched.config import Multifactor, SchedConfigError

_PARTITION_KEYS = {"name", "nodes", "default", "default_time", "max_time", "max_nodes", "state",
                   "priority_job_factor"}
_NODE_KEYS = {"names", "cpus", "memory", "gpus", "gpu_model", "gpu_memory_mb", "features"}
_TOP_KEYS = {"cluster_name", "partitions", "scheduler", "nodes", "sim_nodes", "priority",
             "accounts", "qos"}
_PRIORITY_KEYS = {"type", "weight_age", "weight_fairshare", "weight_jobsize", "weight_partition",
                  "weight_qos", "max_age", "decay_half_life", "favor_small", "usage_tres"}
_ACCOUNT_KEYS = {"name", "parent", "shares", "users", "accounts"}
_QOS_KEYS = {"name", "priority", "max_wall", "max_gpus_per_user", "max_jobs_per_user",
             "max_submit_per_user", "grp_gpus", "grp_jobs", "preempt", "preempt_mode"}


class SimClusterError(ValueError):
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
    parts = _partitions(data.get("partitions"), source)
    names = {n.name for n in nodes}
    for part in parts:
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
    return SimCluster(str(data.get("cluster_name", "shoal")), nodes, parts, policy,
                      multifactor=_priority(data.get("priority"), source),
                      accounts=_accounts(data.get("accounts"), source),
                      qos=_qos(data.get("qos"), source), preempt_grace_s=float(grace))


def _priority(entry: Any, source: str) -> Multifactor:
    """The ``priority:`` section as the server reads it (PriorityConfig.multifactor)."""
    at = f"{source}: priority"
    entry = _mapping(entry or {}, _PRIORITY_KEYS, at)
    values = {k: entry[k] for k in ("weight_age", "weight_fairshare", "weight_jobsize",
                                    "weight_partition", "weight_qos") if k in entry}
    for k, v in values.items():
        _positive_int(v, f"{at}.{k}", zero=True)
    max_age = _time(entry.get("max_age", "7-0"), f"{at}.max_age")
    half_life = _time(entry.get("decay_half_life", "7-0"), f"{at}.decay_half_life")
    try:
        return Multifactor(**values, max_age_s=max_age or 0, decay_half_life_s=half_life or 0,
                           favor_small=bool(entry.get("favor_small", False)),
                           usage_tres=str(entry.get("usage_tres", "gpu")))  # type: ignore[arg-type]
    except SchedConfigError as e:
        raise SimClusterError(f"{at}: {e}") from None


def _accounts(entries: Any, source: str, parent: str | None = None) -> tuple[Account, ...]:
    """The ``accounts:`` tree (``parent:`` or nested ``accounts:``), flattened as the server does."""
    out: list[Account] = []
    for at, entry in _named_entries(entries, f"{source}: accounts", _ACCOUNT_KEYS):
        name = str(entry["name"])
        if parent is not None and entry.get("parent") not in (None, parent):
            raise SimClusterError(f"{at}: account {name} is nested under {parent} but says "
                                  f"parent: {entry['parent']}")
        users = []
        for u in entry.get("users") or ():
            if isinstance(u, Mapping):
                users.append(UserShare(str(u["name"]), _positive_int(u.get("shares", 1),
                                                                     f"{at}.users", zero=True)))
            else:
                users.append(UserShare(str(u)))
        out.append(Account(name, parent or entry.get("parent"),
                           _positive_int(entry.get("shares", 1), f"{at}.shares", zero=True),
                           tuple(users)))
        out.extend(_accounts(entry.get("accounts"), f"{at}", name))
    return tuple(out)


def _qos(entries: Any, source: str) -> tuple[QOS, ...]:
    """The ``qos:`` list as the server reads it (QOSConfig.to_qos), with its checks."""
    out: list[QOS] = []
    for at, entry in _named_entries(entries, f"{source}: qos", _QOS_KEYS):
        limits = {k: _positive_int(entry[k], f"{at}.{k}", zero=True)
                  for k in ("max_gpus_per_user", "max_jobs_per_user", "max_submit_per_user",
                            "grp_gpus", "grp_jobs") if entry.get(k) is not None}
        mode = str(entry.get("preempt_mode", "cancel"))
        if mode not in ("cancel", "requeue", "off"):
            raise SimClusterError(f"{at}.preempt_mode: expected cancel, requeue or off, not {mode!r}")
        out.append(QOS(name=str(entry["name"]),
                       priority=_positive_int(entry.get("priority", 0), f"{at}.priority", zero=True),
                       max_wall_s=_time(entry.get("max_wall"), f"{at}.max_wall"),
                       preempt=tuple(str(q) for q in entry.get("preempt") or ()),
                       preempt_mode=mode, **limits))  # type: ignore[arg-type]
    names = [q.name for q in out]
    if len(set(names)) != len(names):
        raise SimClusterError(f"{source}: qos names must be unique")
    known = set(names) | {DEFAULT_QOS}
    for q in out:
        unknown = [n for n in q.preempt if n not in known]
        if unknown:
            raise SimClusterError(f"{source}: qos {q.name}: preempt names unknown QOS {', '.join(unknown)}")
    return tuple(out)


def _named_entries(entries: Any, at: str, keys: set[str]) -> list[tuple[str, Mapping[str, Any]]]:
    """A list section's entries, each a mapping of known keys with a ``name``, and where each is."""
    if not entries:
        return []
    if not isinstance(entries, list):
        raise SimClusterError(f"{at}: expected a list")
    out = []
    for i, entry in enumerate(entries):
        here = f"{at}[{i}]"
        entry = _mapping(entry, keys, here)
        if "name" not in entry:
            raise SimClusterError(f"{here}: 'name' is required")
        out.append((here, entry))
    return out


def _mapping(entry: Any, keys: set[str], at: str) -> Mapping[str, Any]:
    if not isinstance(entry, Mapping):
        raise SimClusterError(f"{at}: expected a mapping")
    unknown = set(entry) - keys
    if unknown:
        raise SimClusterError(f"{at}: unknown keys {', '.join(sorted(unknown))}")
    return entry


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
            priority_job_factor=_positive_int(entry.get("priority_job_factor", 1),
                                              f"{at}.priority_job_factor", zero=True),
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
