"""An existing site's slurm.conf (with the gres.conf and topology.conf beside it) as a Shoal cluster file.

``convert(text, gres_text, topology)`` is pure: slurm.conf's text in, the cluster file's data
(the mapping ``ClusterConfig`` validates), the nodes it declares (for the agents' flags) and a
warning for every line or key it does not use out. Nothing is dropped silently: a key Shoal
has no use for is named in a warning, one it cannot take is an error (SlurmConfError).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.model.hostlist import HostlistError, compress, expand

# Keys of daemons, paths, plugins and logging that Shoal has its own of: read, named in one
# warning together, never applied.
OWN_MECHANISM = {
    "slurmctldhost", "controlmachine", "controladdr", "backupcontroller", "slurmctldport", "slurmdport",
    "slurmuser", "slurmduser", "authtype", "credtype", "authinfo", "cryptotype", "statesavelocation",
    "slurmdspooldir", "slurmctldpidfile", "slurmdpidfile", "slurmctldlogfile", "slurmdlogfile",
    "slurmctlddebug", "slurmddebug", "proctracktype", "taskplugin", "taskpluginparam", "mpidefault",
    "switchtype", "jobcomptype", "jobcomploc", "jobacctgathertype", "jobacctgatherfrequency",
    "accountingstoragetype", "accountingstoragehost", "accountingstorageport", "accountingstorageenforce",
    "accountingstoragetres", "launchtype", "mailprog", "plugindir", "returntoservice", "selecttype",
    "selecttypeparameters", "gprestype", "gresTypes".lower(), "slurmdparameters", "cgroupplugin",
    "epilog", "prolog", "healthcheckprogram", "healthcheckinterval", "inactivelimit", "waittime",
    "minjobage", "slurmctldtimeout", "messagetimeout", "tmpfs", "communicationparameters", "schedulertimeslice",
}


class SlurmConfError(ValueError):
    """A slurm.conf that cannot become a cluster file; the message names the line."""


@dataclass
class NodeDecl:
    """A NodeName line's node: what its agent should advertise (shoal agent --cpus ...)."""

    name: str
    cpus: int | None = None
    memory_mb: int | None = None
    gpus: int = 0
    gpu_type: str | None = None
    features: list[str] = field(default_factory=list)


@dataclass
class Imported:
    config: dict[str, Any]
    nodes: list[NodeDecl]
    warnings: list[str]


def parse_lines(text: str) -> list[tuple[int, dict[str, str], list[str]]]:
    """slurm.conf's lines (comments dropped, ``\\`` continuations joined) as (line number,
    {lower-case key: value}, the keys as written). A line may hold several Key=Value pairs."""
    out = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if not line:
            continue
        pairs: dict[str, str] = {}
        keys = []
        for token in re.findall(r'(?:[^\s"]+|"[^"]*")+', line):
            key, eq, value = token.partition("=")
            if not eq:
                raise SlurmConfError(f"line {start}: '{token}' is not Key=Value")
            pairs[key.lower()] = value.strip('"')
            keys.append(key)
        out.append((start, pairs, keys))
    return out


def _int(value: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SlurmConfError(f"{where}: '{value}' is not a number") from None


def _yes(value: str) -> bool:
    return value.strip().upper() in ("YES", "Y", "TRUE", "1")


def _gpus(gres: str) -> tuple[int, str | None]:
    """``gpu:a100:8`` or ``gpu:8`` (and other gres, ignored): the GPU count and type."""
    for item in gres.split(","):
        parts = item.split(":")
        if parts[0] != "gpu":
            continue
        count = parts[-1].split("(")[0]
        return (int(count) if count.isdigit() else 1), (parts[1] if len(parts) == 3 else None)
    return 0, None


def convert(text: str, gres_text: str | None = None, topology_file: str | None = None) -> Imported:
    warnings: list[str] = []
    config: dict[str, Any] = {"partitions": []}
    scheduler: dict[str, Any] = {}
    priority: dict[str, Any] = {}
    nodes_cfg: dict[str, Any] = {}
    nodes: dict[str, NodeDecl] = {}
    node_default: dict[str, str] = {}
    part_default: dict[str, str] = {}
    ignored: list[str] = []
    for number, pairs, keys in parse_lines(text):
        where = f"line {number}"
        first = next(iter(pairs))
        if first == "nodename":
            name = pairs["nodename"]
            if name.upper() == "DEFAULT":
                node_default.update({k: v for k, v in pairs.items() if k != "nodename"})
                continue
            _node_line(name, {**node_default, **pairs}, nodes, warnings, where)
        elif first == "partitionname":
            name = pairs["partitionname"]
            if name.upper() == "DEFAULT":
                part_default.update({k: v for k, v in pairs.items() if k != "partitionname"})
                continue
            config["partitions"].append(_partition_line(name, {**part_default, **pairs}, warnings, where))
        elif first in ("nodeset", "downnodes", "frontendname"):
            warnings.append(f"{where}: {keys[0]} lines are not used by Shoal (ignored)")
        else:
            for key, value in pairs.items():
                _global(key, value, config, scheduler, priority, nodes_cfg, warnings, ignored, where,
                        topology_file)
    if ignored:
        warnings.append(f"not used by Shoal, which has its own daemons, plugins and paths (ignored): "
                        f"{', '.join(ignored)}")
    if not config["partitions"]:
        raise SlurmConfError("no PartitionName line: Shoal needs at least one partition")
    everything = compress(list(nodes)) if nodes else ""
    for part in config["partitions"]:
        if part["nodes"].upper() == "ALL":
            if not everything:
                raise SlurmConfError(f"partition {part['name']}: Nodes=ALL but no NodeName line declares nodes")
            part["nodes"] = everything
    if gres_text:
        _gres(gres_text, nodes, warnings)
    for key, section in (("scheduler", scheduler), ("priority", priority), ("nodes", nodes_cfg)):
        if section:
            config[key] = section
    return Imported(config, list(nodes.values()), warnings)


def _node_line(name: str, pairs: dict[str, str], nodes: dict[str, NodeDecl], warnings: list[str],
               where: str) -> None:
    try:
        names = expand(name)
    except HostlistError as e:
        raise SlurmConfError(f"{where}: NodeName={name}: {e}") from None
    gpus, gpu_type = _gpus(pairs.get("gres", ""))
    unused = sorted(set(pairs) - {"nodename", "cpus", "realmemory", "gres", "feature", "features", "state",
                                  "nodeaddr", "nodehostname", "port", "sockets", "corespersocket",
                                  "threadspercore", "boards", "socketsperboard", "weight"})
    if unused:
        warnings.append(f"{where}: NodeName={name}: {', '.join(unused)} not used by Shoal (ignored)")
    for n in names:
        nodes[n] = NodeDecl(n, cpus=_int(pairs["cpus"], where) if "cpus" in pairs else None,
                            memory_mb=_int(pairs["realmemory"], where) if "realmemory" in pairs else None,
                            gpus=gpus, gpu_type=gpu_type,
                            features=[f for f in (pairs.get("features") or pairs.get("feature") or "").split(",")
                                      if f])


def _partition_line(name: str, pairs: dict[str, str], warnings: list[str], where: str) -> dict[str, Any]:
    part: dict[str, Any] = {"name": name, "nodes": pairs.get("nodes", "")}
    if not part["nodes"]:
        raise SlurmConfError(f"{where}: PartitionName={name} has no Nodes=")
    if _yes(pairs.get("default", "NO")):
        part["default"] = True
    for key, out in (("maxtime", "max_time"), ("defaulttime", "default_time")):
        value = pairs.get(key)
        if value and value.upper() not in ("INFINITE", "UNLIMITED"):
            part[out] = value
    if pairs.get("maxnodes", "").upper() not in ("", "INFINITE", "UNLIMITED"):
        part["max_nodes"] = _int(pairs["maxnodes"], where)
    if "state" in pairs:
        part["state"] = pairs["state"].upper()
    if "priorityjobfactor" in pairs:
        part["priority_job_factor"] = _int(pairs["priorityjobfactor"], where)
    unused = sorted(set(pairs) - {"partitionname", "nodes", "default", "maxtime", "defaulttime", "maxnodes",
                                  "state", "priorityjobfactor"})
    if unused:
        warnings.append(f"{where}: PartitionName={name}: {', '.join(unused)} not used by Shoal (ignored)")
    return part


PRIORITY_WEIGHTS = {"priorityweightage": "weight_age", "priorityweightfairshare": "weight_fairshare",
                    "priorityweightjobsize": "weight_jobsize", "priorityweightpartition": "weight_partition",
                    "priorityweightqos": "weight_qos"}
SCHEDULER_PARAMETERS = {"bf_max_job_test": ("bf_max_job_test", 1), "bf_window": ("bf_window_s", 60),
                        "bf_resolution": ("bf_resolution_s", 1), "bf_interval": ("bf_interval_s", 1),
                        "sched_interval": ("idle_pass_s", 1)}


def _global(key: str, value: str, config: dict, scheduler: dict, priority: dict, nodes_cfg: dict,
            warnings: list[str], ignored: list[str], where: str, topology_file: str | None) -> None:
    if key == "clustername":
        config["cluster_name"] = value
    elif key == "schedulertype":
        if value == "sched/builtin":
            scheduler["policy"] = "fifo"
        elif value != "sched/backfill":
            warnings.append(f"{where}: SchedulerType={value} is not Shoal's (sched/backfill is used)")
    elif key == "schedulerparameters":
        for item in value.split(","):
            name, _, arg = item.partition("=")
            if name in SCHEDULER_PARAMETERS:
                out, scale = SCHEDULER_PARAMETERS[name]
                scheduler[out] = _int(arg, f"{where}: {name}") * scale
            elif name == "bf_continue":
                continue
            else:
                warnings.append(f"{where}: SchedulerParameters {name} not used by Shoal (ignored)")
    elif key == "maxarraysize":
        scheduler["max_array_size"] = _int(value, where)
    elif key == "defmempercpu":
        scheduler["def_mem_per_cpu_mb"] = _int(value, where)
    elif key == "preempttype":
        scheduler["preemption"] = value != "preempt/none"
        if value not in ("preempt/none", "preempt/qos"):
            warnings.append(f"{where}: PreemptType={value}: Shoal preempts by QOS (preempt/qos)")
    elif key == "preemptmode":
        if value.upper() not in ("OFF", "CANCEL", "REQUEUE"):
            warnings.append(f"{where}: PreemptMode={value}: Shoal's QOS take CANCEL, REQUEUE or OFF (per QOS)")
    elif key == "prioritytype":
        priority["type"] = "multifactor" if value == "priority/multifactor" else "basic"
    elif key in PRIORITY_WEIGHTS:
        priority[PRIORITY_WEIGHTS[key]] = _int(value, where)
    elif key == "prioritymaxage":
        priority["max_age"] = value
    elif key == "prioritydecayhalflife":
        priority["decay_half_life"] = value
    elif key == "priorityfavorsmall":
        priority["favor_small"] = _yes(value)
    elif key == "slurmdtimeout":
        nodes_cfg["heartbeat_timeout_s"] = float(_int(value, where))
    elif key == "killwait":
        nodes_cfg["kill_wait_s"] = float(_int(value, where))
    elif key == "topologyplugin":
        if value == "topology/tree" and topology_file:
            config["topology"] = {"file": topology_file}
        elif value == "topology/tree":
            warnings.append(f"{where}: TopologyPlugin=topology/tree but no topology.conf beside slurm.conf")
        elif value not in ("topology/none", "topology/default"):
            warnings.append(f"{where}: TopologyPlugin={value} is not Shoal's (topology/tree)")
    elif key in OWN_MECHANISM:
        ignored.append(key)
    elif key == "include":
        warnings.append(f"{where}: Include {value} is not followed: import that file's lines too")
    else:
        warnings.append(f"{where}: {key} not used by Shoal (ignored)")


def _gres(text: str, nodes: dict[str, NodeDecl], warnings: list[str]) -> None:
    """gres.conf's ``NodeName=... Name=gpu [Type=...] Count=N|File=...``: counts and types of GPUs."""
    for number, pairs, _ in parse_lines(text):
        if pairs.get("name") != "gpu":
            continue
        if "file" in pairs:
            count = len(expand(pairs["file"].replace("/dev/", "")))
        else:
            count = int(pairs.get("count", "1"))
        names = expand(pairs["nodename"]) if "nodename" in pairs else list(nodes)
        for n in names:
            if n not in nodes:
                warnings.append(f"gres.conf line {number}: node {n} is not declared in slurm.conf (ignored)")
                continue
            nodes[n].gpus = count
            nodes[n].gpu_type = pairs.get("type") or nodes[n].gpu_type


def import_files(path: str | Path) -> Imported:
    """slurm.conf at ``path``, with gres.conf and topology.conf if they are beside it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SlurmConfError(f"cannot read {path}: {e.strerror}") from None
    gres = path.with_name("gres.conf")
    topology = path.with_name("topology.conf")
    return convert(text, gres.read_text(encoding="utf-8") if gres.exists() else None,
                   str(topology.resolve()) if topology.exists() else None)


def agent_flags(node: NodeDecl, name: str | None = None) -> str:
    """What to start this node's agent with so it advertises what slurm.conf declares."""
    flags = [f"--name {name or node.name}"]
    if node.cpus:
        flags.append(f"--cpus {node.cpus}")
    if node.memory_mb:
        flags.append(f"--memory {node.memory_mb}M")
    flags += [f"--feature {f}" for f in node.features]
    return "shoal agent " + " ".join(flags)


def to_yaml(imported: Imported, source: str) -> str:
    """The cluster file, with where it came from, its warnings and the agents' flags as comments."""
    import yaml

    head = [f"# Imported from {source} by `shoal import-slurm-conf`."]
    head += [f"# warning: {w}" for w in imported.warnings]
    groups: dict[str, list[str]] = {}  # nodes declared alike share one line
    for n in imported.nodes:
        gpus = f"   # {n.gpus} GPUs" + (f" ({n.gpu_type})" if n.gpu_type else "") if n.gpus else ""
        groups.setdefault(agent_flags(n, "NODE") + gpus, []).append(n.name)
    if groups:
        head.append("# Nodes join by running an agent each; to advertise what slurm.conf declares:")
        head += [f"#   {compress(names)}: {line}" for line, names in groups.items()]
    config = {"cluster_name": imported.config.get("cluster_name", "shoal"),
              **{k: v for k, v in imported.config.items() if k != "cluster_name"}}
    return "\n".join(head) + "\n" + yaml.safe_dump(config, sort_keys=False)
