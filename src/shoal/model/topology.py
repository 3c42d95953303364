"""The network tree of Slurm's topology/tree: leaf switches hold nodes, upper switches hold
switches. Parsed from topology.conf (``SwitchName=s0 Nodes=node[01-04]``,
``SwitchName=top Switches=s[0-1]``) or the same data from YAML. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from shoal.model.hostlist import HostlistError, expand


class TopologyError(ValueError):
    """A topology description that is inconsistent; the message names the switch or node."""


@dataclass(frozen=True)
class Switch:
    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


@dataclass(frozen=True)
class Topology:
    """``leaf_of``: node -> its leaf switch; ``parent_of``: switch -> the switch above it."""

    leaf_of: Mapping[str, str] = field(default_factory=dict)
    parent_of: Mapping[str, str] = field(default_factory=dict)

    def path(self, switch: str) -> tuple[str, ...]:
        """``switch`` and every switch above it, leaf first."""
        out = [switch]
        while out[-1] in self.parent_of:
            out.append(self.parent_of[out[-1]])
        return tuple(out)

    @classmethod
    def of(cls, switches: Iterable[Switch]) -> "Topology":
        """Check the switches form a forest (one leaf per node, one parent per switch)."""
        switches = list(switches)
        names = [s.name for s in switches]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise TopologyError(f"switch {dup[0]} is defined more than once")
        known = set(names)
        leaf_of: dict[str, str] = {}
        parent_of: dict[str, str] = {}
        for s in switches:
            for node in s.nodes:
                if node in leaf_of:
                    raise TopologyError(f"node {node} is under both switch {leaf_of[node]} and {s.name}")
                leaf_of[node] = s.name
            for child in s.switches:
                if child not in known:
                    raise TopologyError(f"switch {s.name} names unknown switch {child}")
                if child in parent_of:
                    raise TopologyError(f"switch {child} is under both switch {parent_of[child]} and {s.name}")
                parent_of[child] = s.name
        topo = cls(leaf_of, parent_of)
        for name in names:
            seen = {name}
            up = name
            while up in parent_of:
                up = parent_of[up]
                if up in seen:
                    raise TopologyError(f"switch {name} is inside itself (a loop through {up})")
                seen.add(up)
        return topo


def _hosts(value: str, where: str) -> tuple[str, ...]:
    try:
        return tuple(expand(value))
    except HostlistError as e:
        raise TopologyError(f"{where}: {e}") from None


def switch(name: str, nodes: str | None = None, switches: str | None = None) -> Switch:
    """One switch from hostlist strings, as topology.conf and the YAML form give them."""
    if not name:
        raise TopologyError("a switch needs a name")
    if not nodes and not switches:
        raise TopologyError(f"switch {name} has neither Nodes= nor Switches=")
    return Switch(name, _hosts(nodes, f"switch {name} Nodes") if nodes else (),
                  _hosts(switches, f"switch {name} Switches") if switches else ())


def parse_topology_conf(text: str, source: str = "topology.conf") -> Topology:
    """Slurm's topology.conf: one ``SwitchName=...`` line per switch; ``#`` starts a comment,
    keys are case-insensitive, and LinkSpeed= is accepted and ignored."""
    switches = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for word in line.split():
            key, eq, value = word.partition("=")
            if not eq:
                raise TopologyError(f"{source} line {number}: expected Key=Value, got '{word}'")
            fields[key.lower()] = value
        unknown = sorted(set(fields) - {"switchname", "nodes", "switches", "linkspeed"})
        if unknown:
            raise TopologyError(f"{source} line {number}: unknown key {unknown[0]} "
                                f"(expected SwitchName, Nodes, Switches, LinkSpeed)")
        if "switchname" not in fields:
            raise TopologyError(f"{source} line {number}: a line needs SwitchName=")
        try:
            switches.append(switch(fields["switchname"], fields.get("nodes"), fields.get("switches")))
        except TopologyError as e:
            raise TopologyError(f"{source} line {number}: {e}") from None
    return Topology.of(switches)
