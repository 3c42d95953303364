"""Topology-aware node choice for multi-node jobs (Slurm's topology/tree).

Given every node that could hold one share of a gang (best fit first), choose ``need`` of
them spanning as few leaf switches as possible:

1. If one leaf switch has enough, take the one with the fewest such nodes (best fit among
   switches; ties: the switch holding the better-scored node), its best-fit nodes first.
2. Otherwise take the lowest switch above the leaves whose leaves together have enough
   (ties: the fewest leaf switches needed, then the fewest nodes to spare), and within it
   the fewest leaves: largest leaves first, and for the last the smallest one that fills
   what is left.
3. With no such switch (separate trees, or nodes outside the topology, each of which counts
   as a leaf of its own), the same choice over all leaves.

Within a chosen leaf, nodes keep placement's best-fit order, so packing is unchanged.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

from shoal.model.topology import Topology

T = TypeVar("T", bound=tuple)  # (rank, node name, what the node gives): placement's choice


def fewest_switches(fitting: Sequence[T], need: int, topology: Topology) -> list[T]:
    """``need`` entries of ``fitting`` (best fit first) under the fewest leaf switches;
    [] when there are fewer than ``need``."""
    if len(fitting) < need:
        return []
    leaves: dict[str, list[T]] = {}
    for entry in fitting:
        name = entry[1]
        leaves.setdefault(topology.leaf_of.get(name, "\0" + name), []).append(entry)
    order = {leaf: i for i, leaf in enumerate(leaves)}  # the leaf's best node's place in fitting

    whole = [leaf for leaf, members in leaves.items() if len(members) >= need]
    if whole:
        best = min(whole, key=lambda leaf: (len(leaves[leaf]), order[leaf]))
        return leaves[best][:need]

    under: dict[str, list[str]] = {}  # switch -> the leaves below it that have fitting nodes
    level: dict[str, int] = {}
    for leaf in leaves:
        for depth, above in enumerate(topology.path(leaf)[1:], 1):
            under.setdefault(above, []).append(leaf)
            level[above] = max(level.get(above, 0), depth)
    options = []
    for switch, members in under.items():
        total = sum(len(leaves[leaf]) for leaf in members)
        if total >= need:
            picked = _fewest_leaves(members, leaves, order, need)
            options.append(((level[switch], len(picked), total, min(order[m] for m in members)), picked))
    picked = min(options)[1] if options else _fewest_leaves(list(leaves), leaves, order, need)
    chosen: list[T] = []
    for leaf in picked:
        chosen.extend(leaves[leaf][:need - len(chosen)])
    return chosen


def _fewest_leaves(members: list[str], leaves: dict[str, list], order: dict[str, int],
                   need: int) -> list[str]:
    """The fewest of ``members`` holding ``need`` nodes: largest first, the last a best fit."""
    by_size = sorted(members, key=lambda leaf: (-len(leaves[leaf]), order[leaf]))
    picked: list[str] = []
    have = 0
    for leaf in by_size:
        if have + len(leaves[leaf]) >= need:
            rest = need - have
            last = min((m for m in by_size if m not in picked and len(leaves[m]) >= rest),
                       key=lambda m: (len(leaves[m]), order[m]))
            return picked + [last]
        picked.append(leaf)
        have += len(leaves[leaf])
    return picked
