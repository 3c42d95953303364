"""Where a job's gang fits: Slurm's select/cons_tres as one function with two modes.

``place(request, state, mode)`` answers for mode ``"now"`` (the free resources of a
``ClusterState``, updated as a pass commits starts) and ``"ever"`` (the same nodes empty:
could this request run at all?). It runs kube-scheduler-style steps: static Filters per
node (partition, node state, exclude, features, GPU type), a dynamic fit per node
(free CPUs, memory, GPUs, exclusivity, backfill reservations) and a best-fit Score.

Decisions worth knowing:

* ``features`` match ``NodeInfo.features`` only, exactly (case-sensitive, like Slurm's
  ``Features=``); an entry ``"a|b"`` is satisfied by either. Labels are not features.
* ``gpu_type`` matches a GPU when the words of the type appear, in order, among the words of
  the product, case-insensitively (words are runs of letters and digits): ``"h100"`` matches
  ``"NVIDIA H100 80GB HBM3"``, ``"a100 80gb"`` matches ``"NVIDIA A100-SXM4-80GB"``, but
  ``"a10"`` does not match an A100, which a plain substring test would.
* ``mem_per_node_mb == 0`` asks for the node's whole memory, so it fits only a node on which
  nothing else holds memory. An exclusive job takes every CPU, all memory and every GPU.
* A ``nodelist`` longer than ``nodes`` raises the gang size to the nodelist's length, as
  Slurm does.
* Score: fewest free GPUs, then fewest free CPUs, then node name in natural order
  (node2 < node10), so small jobs fill partly used nodes and nodelists come out contiguous.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_left, insort
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Literal, Mapping, Sequence

from shoal.model.node import NodeState
from shoal.model.gpu import gpu_type_matches
from shoal.model.timefmt import format_duration
from shoal.model.resources import Allocation, NodeAllocation, ResourceRequest
from shoal.model.snapshot import ActiveJob, NodeInfo, Partition, Snapshot
from shoal.model.topology import Topology
from shoal.sched.topology import fewest_switches

Mode = Literal["now", "ever"]

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders node2 before node10."""
    parts = _DIGITS.split(name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def feature_matches(feature: str, node_features: frozenset[str]) -> bool:
    return any(alt in node_features for alt in feature.split("|"))


@dataclass(frozen=True)
class Demand:
    """A request compiled once per pass: what every node of the gang must give."""

    nodes: int
    cpus: int
    mem_mb: int  # 0: the node's whole memory
    gpus: int
    gpu_type: str | None
    exclusive: bool
    features: tuple[str, ...]
    nodelist: tuple[str, ...]
    exclude: frozenset[str]

    @classmethod
    def of(cls, request: "ResourceRequest | Demand") -> "Demand":
        if isinstance(request, Demand):
            return request
        nodelist = tuple(dict.fromkeys(request.nodelist))
        return cls(
            nodes=max(request.nodes, len(nodelist), 1),
            cpus=request.cpus_per_node,
            mem_mb=request.mem_per_node_mb,
            gpus=request.gpus_per_node,
            gpu_type=(request.gpu_type or None) if request.gpus_per_node else None,
            exclusive=request.exclusive,
            features=tuple(sorted(set(request.features))),
            nodelist=nodelist,
            exclude=frozenset(request.exclude),
        )

    @functools.cached_property
    def static_key(self) -> tuple:
        """What the static filters depend on: jobs sharing it share candidate nodes."""
        return (self.features, self.gpu_type, self.exclude)

    @functools.cached_property
    def shape(self) -> tuple[int, int, int, int, bool]:
        return (self.nodes, self.cpus, self.mem_mb, self.gpus, self.exclusive)

    def dominates(self, other_shape: tuple[int, int, int, int, bool]) -> bool:
        """True when this demand needs at least as much as ``other_shape`` everywhere,
        so if that one did not fit, this one cannot either."""
        nodes, cpus, mem, gpus, exclusive = other_shape
        if self.mem_mb == 0 or mem == 0:
            mem_ok = self.mem_mb == mem
        else:
            mem_ok = self.mem_mb >= mem
        return (
            self.nodes >= nodes
            and self.cpus >= cpus
            and self.gpus >= gpus
            and mem_ok
            and (self.exclusive or not exclusive)
        )


@dataclass
class ReservedShare:
    """On one node of a backfill reservation: what a job that would still be running at the
    reservation's start may use there without delaying it. ``whole``: nothing at all."""

    cpus: int = 0
    mem_mb: int = 0
    gpus: frozenset[int] = frozenset()  # GPU indices the reserved job needs
    whole: bool = False


@dataclass(frozen=True)
class Placement:
    """place()'s answer: an allocation, or the reason there is none."""

    allocation: Allocation | None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.allocation is not None


class NodeFree:
    """One node's free resources during a pass (mutable; a pass owns its ClusterState)."""

    __slots__ = ("info", "rank", "cpus_free", "mem_free", "gpus_free", "jobs",
                 "exclusive_held", "_typed", "owner")

    def __init__(self, info: NodeInfo, rank: int) -> None:
        self.info = info
        self.rank = rank
        self.cpus_free = info.cpus
        self.mem_free = info.memory_mb
        self.gpus_free: list[int] = sorted(g.index for g in info.gpus)
        self.jobs = 0
        self.exclusive_held = False
        self._typed: dict[str | None, frozenset[int]] = {}
        self.owner: object = None  # the ClusterState token allowed to change it in place

    def copy(self) -> "NodeFree":
        """A copy to change independently (``gpus_free`` is replaced, never changed in place,
        so the list is shared; so is the per-type cache, which depends on ``info`` only)."""
        nf = NodeFree.__new__(NodeFree)
        nf.info, nf.rank, nf.cpus_free, nf.mem_free = self.info, self.rank, self.cpus_free, self.mem_free
        nf.gpus_free, nf.jobs, nf.exclusive_held = self.gpus_free, self.jobs, self.exclusive_held
        nf._typed = self._typed
        nf.owner = None
        return nf

    def gpus_of_type(self, gpu_type: str | None) -> frozenset[int]:
        """Indices of this node's GPUs of ``gpu_type`` (all of them for None)."""
        found = self._typed.get(gpu_type)
        if found is None:
            found = frozenset(
                g.index for g in self.info.gpus
                if gpu_type is None or gpu_type_matches(g.product, gpu_type)
            )
            self._typed[gpu_type] = found
        return found

    def fit(self, d: Demand, share: ReservedShare | None = None) -> NodeAllocation | None:
        """What this node would give ``d`` now, or None (the dynamic Filter)."""
        info = self.info
        if self.exclusive_held:
            return None
        if d.exclusive:
            if self.jobs or share is not None:
                return None
            if (info.cpus < d.cpus or info.memory_mb < d.mem_mb
                    or len(self.gpus_of_type(d.gpu_type)) < d.gpus):
                return None
            return NodeAllocation(info.cpus, info.memory_mb, tuple(self.gpus_free))
        cpus_free, mem_free = self.cpus_free, self.mem_free
        if share is not None:
            if share.whole:
                return None
            cpus_free = min(cpus_free, share.cpus)
            mem_free = min(mem_free, share.mem_mb)
        mem = d.mem_mb or info.memory_mb
        if cpus_free < d.cpus or mem_free < mem:
            return None
        gpus: tuple[int, ...] = ()
        if d.gpus:
            if len(self.gpus_free) < d.gpus:
                return None
            typed = self.gpus_of_type(d.gpu_type) if d.gpu_type else None
            reserved = share.gpus if share is not None else frozenset()
            picked = [
                g for g in self.gpus_free
                if (typed is None or g in typed) and g not in reserved
            ][: d.gpus]
            if len(picked) < d.gpus:
                return None
            gpus = tuple(picked)
        return NodeAllocation(d.cpus, mem, gpus)


class ClusterState:
    """Free resources per node, indexed for best fit; ``commit`` updates it as a pass plans.

    Nodes are kept in natural name order (their ``rank``); an index by free GPU count, then
    free CPUs, lets "now" placement visit nodes in score order and stop at the first fits.
    """

    def __init__(self, nodes: Iterable[NodeInfo], holding: Iterable[Allocation] = (),
                 cache: PlacementCache | None = None) -> None:
        self._token = object()
        self.nodes: list[NodeFree] = [nf.copy() for nf in _empty_nodes(nodes, cache)]
        for nf in self.nodes:
            nf.owner = self._token
        self.by_name: dict[str, NodeFree] = {nf.info.name: nf for nf in self.nodes}
        for allocation in holding:
            self._apply(allocation, +1)
        self._buckets: dict[int, list[tuple[int, int]]] = {}
        for nf in self.nodes:
            self._buckets.setdefault(len(nf.gpus_free), []).append((nf.cpus_free, nf.rank))
        for bucket in self._buckets.values():
            bucket.sort()
        self._candidates: dict[tuple, frozenset[int]] = {}

    def copy(self) -> "ClusterState":
        """An independent copy of the free resources (what-if questions: backfill's shadow).

        Nodes are shared until either side changes one (copy on write: ``_own``), so a copy
        costs the index, not thousands of nodes."""
        other = ClusterState.__new__(ClusterState)
        other._token = object()
        self._token = object()  # the shared nodes are no longer this state's to change
        other.nodes = list(self.nodes)
        other.by_name = dict(self.by_name)
        other._buckets = {k: list(v) for k, v in self._buckets.items()}
        other._candidates = self._candidates  # static filters: the same for every copy
        return other

    def _own(self, nf: NodeFree) -> NodeFree:
        """``nf`` as this state's own node, copied first if it is shared with another state."""
        if nf.owner is self._token:
            return nf
        mine = nf.copy()
        mine.owner = self._token
        self.nodes[nf.rank] = mine
        self.by_name[nf.info.name] = mine
        return mine

    def release(self, allocation: Allocation) -> None:
        """Give back what ``allocation`` holds (it ended): the inverse of ``commit``."""
        for nf in self._touched(allocation):
            self._unindex(nf)
        self._apply(allocation, -1)
        for nf in self._touched(allocation):
            self._index(nf)

    def overlay(self, allocations: Iterable[Allocation]) -> list[tuple]:
        """Commit ``allocations`` for a moment, even where they overlap what is held; returns
        what ``undo`` needs to put the touched nodes back exactly."""
        allocations = list(allocations)
        saved, seen = [], set()
        for allocation in allocations:
            for nf in self._touched(allocation):
                if nf.rank not in seen:
                    seen.add(nf.rank)
                    saved.append((nf, nf.cpus_free, nf.mem_free, nf.gpus_free, nf.jobs,
                                  nf.exclusive_held))
        for allocation in allocations:
            self.commit(allocation)
        return saved

    def undo(self, saved: list[tuple]) -> None:
        for nf, cpus, mem, gpus, jobs, exclusive in saved:
            self._unindex(nf)
            nf.cpus_free, nf.mem_free, nf.gpus_free, nf.jobs, nf.exclusive_held = (
                cpus, mem, gpus, jobs, exclusive)
            self._index(nf)

    def fitting_nodes(self, min_gpus: int) -> int:
        """How many nodes have at least ``min_gpus`` free GPUs (a cheap bound before placing)."""
        return sum(len(b) for k, b in self._buckets.items() if k >= min_gpus)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, cache: PlacementCache | None = None) -> "ClusterState":
        """Capacity minus what running and completing jobs hold.

        Successive snapshots over the same node tuple (the simulator; a caller between node
        changes) differ by a few starts and ends: with a ``cache``, the last result is kept
        in it and brought up to date by those, which is the same state as one built from
        scratch, at a fraction of the cost on thousands of nodes. The running jobs' ends
        (``running_ends``) are kept the same way.
        """
        nodes, partitions = snapshot.nodes, snapshot.partitions
        # Keyed by object identity (the kept objects are alive, so no id is reused): the
        # simulator passes the same ActiveJob objects from pass to pass, and the set
        # differences run in C; a job rebuilt equal (the server) is no change.
        held = dict(zip(map(id, snapshot.active), snapshot.active))
        last = cache.free if cache is not None else None
        if last is not None and last.nodes is nodes and last.partitions is partitions:
            before, state, ends = last.held, last.state, last.ends
            gone = [before[k] for k in before.keys() - held.keys()]
            came = [held[k] for k in held.keys() - before.keys()]
            if gone and came:
                was = {job.id: job for job in gone}
                same = {job.id for job in came if was.get(job.id) == job}
                if same:
                    gone = [job for job in gone if job.id not in same]
                    came = [job for job in came if job.id not in same]
            if len(gone) + len(came) <= max(len(held), len(before)):
                for job in gone:
                    state.release(job.allocation)
                    if job.time_limit_s is not None:
                        del ends[bisect_left(ends, (job.start_time + job.time_limit_s, job.id))]
                for job in came:
                    state.commit(job.allocation)
                    if job.time_limit_s is not None:
                        insort(ends, (job.start_time + job.time_limit_s, job.id, job.allocation))
                cache.free = _KeptState(nodes, partitions, held, state, ends, snapshot)
                return state.copy()
        state = cls(nodes, [job.allocation for job in held.values()], cache)
        if cache is not None and isinstance(nodes, tuple):
            cache.free = _KeptState(nodes, partitions, held, state, _ends_of(held.values()), snapshot)
        return state.copy()

    def commit(self, allocation: Allocation) -> None:
        """Take what ``allocation`` holds from the free resources."""
        for nf in self._touched(allocation):
            self._unindex(nf)
        self._apply(allocation, +1)
        for nf in self._touched(allocation):
            self._index(nf)

    def _touched(self, allocation: Allocation) -> list[NodeFree]:
        """The nodes ``allocation`` holds, as this state's own (about to change)."""
        return [self._own(self.by_name[name]) for name in allocation.node_names
                if name in self.by_name]

    def _apply(self, allocation: Allocation, sign: int) -> None:
        for name, alloc in allocation.nodes:
            nf = self.by_name.get(name)
            if nf is None:
                continue
            nf.cpus_free -= sign * alloc.cpus
            nf.mem_free -= sign * alloc.memory_mb
            nf.jobs += sign
            if sign > 0:
                held = set(alloc.gpus)
                nf.gpus_free = [g for g in nf.gpus_free if g not in held]
            else:
                nf.gpus_free = sorted(set(nf.gpus_free) | set(alloc.gpus))
            if allocation.exclusive:
                nf.exclusive_held = sign > 0

    def _index(self, nf: NodeFree) -> None:
        insort(self._buckets.setdefault(len(nf.gpus_free), []), (nf.cpus_free, nf.rank))

    def _unindex(self, nf: NodeFree) -> None:
        bucket = self._buckets[len(nf.gpus_free)]
        del bucket[bisect_left(bucket, (nf.cpus_free, nf.rank))]

    def in_score_order(self, min_gpus: int, min_cpus: int) -> Iterator[NodeFree]:
        """Nodes with at least that many free GPUs and CPUs, best fit first."""
        for free_gpus in sorted(k for k in self._buckets if k >= min_gpus):
            bucket = self._buckets[free_gpus]
            for i in range(bisect_left(bucket, (min_cpus, -1)), len(bucket)):
                yield self.nodes[bucket[i][1]]

    def candidates(self, d: Demand, partition: Partition | None, mode: Mode) -> frozenset[int]:
        """Ranks of the nodes passing the static Filters, cached per class of demand."""
        # One definition per partition name within a state: a pass reads one snapshot.
        key = (partition.name if partition else None, d.static_key, mode)
        found = self._candidates.get(key)
        if found is None:
            members = frozenset(partition.nodes) if partition is not None else None
            usable = _USABLE[mode]
            found = frozenset(
                nf.rank for nf in self.nodes
                if (members is None or nf.info.name in members)
                and nf.info.state in usable
                and nf.info.name not in d.exclude
                and all(feature_matches(f, nf.info.features) for f in d.features)
                and (d.gpu_type is None or nf.gpus_of_type(d.gpu_type))
            )
            self._candidates[key] = found
        return found


@dataclass(frozen=True)
class _KeptState:
    """The last ``from_snapshot`` result, kept to be brought up to date by the next."""

    nodes: tuple[NodeInfo, ...]
    partitions: tuple[Partition, ...]
    held: dict[int, ActiveJob]  # by id() of the kept objects
    state: ClusterState
    ends: list[tuple[float, int, Allocation]]  # sorted; see running_ends
    snapshot: Snapshot


class PlacementCache:
    """What one caller keeps between its passes over the same node tuple: the last free
    state (brought up to date by the next snapshot), the empty states and the nodes' sorted
    order. Pure speed: a pass with a new or no cache computes the same plan.

    Each caller owns one (the controller's loop, the simulator) and uses it from one thread
    at a time; callers that do not pass one (``--test-only``, the submit check) build what
    they need afresh, so no state is shared between threads behind anyone's back.
    """

    __slots__ = ("free", "empty", "order")

    def __init__(self) -> None:
        self.free: _KeptState | None = None
        self.empty: tuple[tuple[NodeInfo, ...], tuple[Partition, ...], dict[bool, ClusterState]] | None = None
        self.order: list[tuple[tuple[NodeInfo, ...], list[NodeFree]]] = []


def _ends_of(jobs: Iterable[ActiveJob]) -> list[tuple[float, int, Allocation]]:
    by_id = {job.id: job for job in jobs}
    return sorted((job.start_time + job.time_limit_s, jid, job.allocation)
                  for jid, job in by_id.items() if job.time_limit_s is not None)


def running_ends(snapshot: Snapshot, cache: PlacementCache | None = None) -> list[tuple[float, int, Allocation]]:
    """The snapshot's jobs with a time limit as (start + limit, job id, allocation), sorted:
    the list kept in ``cache`` when ``from_snapshot`` last read this snapshot (the caller
    must not change it), else one built afresh; both are the same list."""
    last = cache.free if cache is not None else None
    if last is not None and last.snapshot is snapshot:
        return last.ends
    return _ends_of(snapshot.active)


def empty_state(nodes: tuple[NodeInfo, ...], partitions: tuple[Partition, ...],
                revived: bool, cache: PlacementCache | None = None) -> ClusterState:
    """The nodes with nothing running: the UP ones, or all of them as if UP (``revived``).
    Only read ("could it fit at all?"), so ``cache`` keeps one per node and partition tuple."""
    last = cache.empty if cache is not None else None
    if last is None or last[0] is not nodes or last[1] is not partitions:
        last = (nodes, partitions, {})
        if cache is not None:
            cache.empty = last
    states = last[2]
    if revived not in states:
        states[revived] = ClusterState(
            tuple(replace(n, state=NodeState.UP) for n in nodes) if revived
            else nodes if all(n.state is NodeState.UP for n in nodes)
            else tuple(n for n in nodes if n.state is NodeState.UP), cache=cache)
    return states[revived]


def _empty_nodes(nodes: Iterable[NodeInfo], cache: PlacementCache | None) -> list[NodeFree]:
    """The nodes, empty, in natural name order. Passes over the same node tuple (the
    simulator, a server between node changes) reuse one sorted template from ``cache``:
    sorting and building thousands of nodes is most of a small pass otherwise."""
    keep = cache is not None and isinstance(nodes, tuple)
    if keep:
        for cached, template in cache.order:
            if cached is nodes:
                return template
    ordered = sorted(nodes, key=lambda n: natural_key(n.name))
    template = [NodeFree(info, i) for i, info in enumerate(ordered)]
    if keep:
        cache.order[:] = [(nodes, template), *cache.order[:3]]
    return template


_USABLE: dict[str, frozenset[NodeState]] = {
    "now": frozenset({NodeState.UP}),
    "ever": frozenset({NodeState.UP, NodeState.DRAIN}),
}


def place(
    request: ResourceRequest | Demand,
    state: ClusterState,
    mode: Mode = "now",
    *,
    partition: Partition | None = None,
    reserved: Sequence[Mapping[str, ReservedShare]] = (),
    topology: Topology | None = None,
) -> Placement:
    """Find nodes for the whole gang of ``request``, or say why there are none.

    ``mode="now"`` uses the free resources in ``state`` and UP nodes only; ``"ever"`` treats
    UP and DRAIN nodes as empty and returns a reason naming what is short. ``partition``
    limits the nodes (None: all of them). ``reserved``: backfill shares that limit what this
    job may take on reserved nodes. ``topology``: a multi-node gang without a nodelist goes
    under the fewest leaf switches (``shoal.sched.topology``). Nothing in ``state`` changes;
    call ``state.commit``.
    """
    d = Demand.of(request)
    if mode == "ever":
        return _place_ever(d, state, partition)
    cand = state.candidates(d, partition, "now")

    def share_on(name: str) -> ReservedShare | None:
        found = [s for s in (shares.get(name) for shares in reserved) if s is not None]
        if len(found) < 2:
            return found[0] if found else None
        # Several reservations on one node (conservative backfill): respect them all.
        return ReservedShare(cpus=min(s.cpus for s in found), mem_mb=min(s.mem_mb for s in found),
                             gpus=frozenset().union(*(s.gpus for s in found)),
                             whole=any(s.whole for s in found))

    chosen: list[tuple[int, str, NodeAllocation]] = []
    for name in d.nodelist:
        nf = state.by_name.get(name)
        if nf is None or nf.rank not in cand:
            return Placement(None, f"ReqNodeNotAvail, UnavailableNodes:{name}")
        alloc = nf.fit(d, share_on(name))
        if alloc is None:
            return Placement(None, "Resources")
        chosen.append((nf.rank, name, alloc))
    if topology is not None and d.nodes > 1 and not chosen:
        fitting = []
        for nf in state.in_score_order(d.gpus, d.cpus):
            if nf.rank in cand:
                alloc = nf.fit(d, share_on(nf.info.name) if reserved else None)
                if alloc is not None:
                    fitting.append((nf.rank, nf.info.name, alloc))
        chosen = fewest_switches(fitting, d.nodes, topology)
        if not chosen:
            return Placement(None, "Resources")
    if len(chosen) < d.nodes:
        required = {rank for rank, _, _ in chosen}
        min_cpus = d.cpus
        for nf in state.in_score_order(d.gpus, min_cpus):
            if nf.rank not in cand or nf.rank in required:
                continue
            alloc = nf.fit(d, share_on(nf.info.name) if reserved else None)
            if alloc is not None:
                chosen.append((nf.rank, nf.info.name, alloc))
                if len(chosen) == d.nodes:
                    break
        if len(chosen) < d.nodes:
            return Placement(None, "Resources")
    chosen.sort()
    return Placement(Allocation(tuple((name, a) for _, name, a in chosen), d.exclusive))


def _place_ever(d: Demand, state: ClusterState, partition: Partition | None) -> Placement:
    """Fit on empty nodes, narrowing step by step so the reason names the first shortfall."""
    where = f"partition {partition.name}" if partition is not None else "the cluster"
    members = frozenset(partition.nodes) if partition is not None else None
    nodes = [nf.info for nf in state.nodes
             if (members is None or nf.info.name in members)
             and nf.info.state in _USABLE["ever"]]
    if not nodes:
        return Placement(None, f"{where} has no nodes that are up")
    names = {n.name for n in nodes}
    for name in d.nodelist:
        if name in d.exclude:
            return Placement(None, f"node {name} is both requested and excluded")
        if name not in names:
            return Placement(None, f"requested node {name} is not an available node of {where}")
    nodes = [n for n in nodes if n.name not in d.exclude]
    if not nodes:
        return Placement(None, f"every node of {where} that is up is excluded")
    for feature in d.features:
        nodes = [n for n in nodes if feature_matches(feature, n.features)]
        if not nodes:
            return Placement(None, f"no node in {where} has feature {feature}"
                             f" (with the other constraints asked for)")
    typed = {n.name: len(state.by_name[n.name].gpus_of_type(d.gpu_type)) for n in nodes}
    if d.gpu_type is not None:
        nodes = [n for n in nodes if typed[n.name]]
        if not nodes:
            return Placement(None, f"no node in {where} has GPUs of type {d.gpu_type}")
    kind = f" of type {d.gpu_type}" if d.gpu_type else ""
    steps = (
        (lambda n: typed[n.name] >= d.gpus, lambda n: typed[n.name],
         f"requested {d.gpus} GPUs{kind} per node", ""),
        (lambda n: n.cpus >= d.cpus, lambda n: n.cpus,
         f"requested {d.cpus} CPUs per node", ""),
        (lambda n: n.memory_mb >= d.mem_mb, lambda n: n.memory_mb,
         f"requested {d.mem_mb} MiB of memory per node", " MiB"),
    )
    for fits, amount, asked, unit in steps:
        fitting = [n for n in nodes if fits(n)]
        if not fitting:
            largest = max(amount(n) for n in nodes)
            return Placement(None, f"{asked} but the largest node in {where} has {largest}{unit}")
        nodes = fitting
    fit_names = {n.name for n in nodes}
    for name in d.nodelist:
        if name not in fit_names:
            return Placement(None, f"requested node {name} cannot hold one node's share of the job")
    if len(nodes) < d.nodes:
        return Placement(None, f"requested {d.nodes} nodes but only {len(nodes)} in {where}"
                         f" can hold one node's share of the job")
    return Placement(_fit_empty(d, ClusterState(nodes)))


def _fit_empty(d: Demand, empty: ClusterState) -> Allocation:
    """Best-fit allocation on empty nodes whatever their state (DRAIN counts for "ever")."""
    chosen: list[tuple[int, str, NodeAllocation]] = []
    required = set(d.nodelist)
    pool = [nf for nf in empty.nodes if nf.info.name in required] + sorted(
        (nf for nf in empty.nodes if nf.info.name not in required),
        key=lambda nf: (len(nf.gpus_free), nf.cpus_free, nf.rank),
    )
    for nf in pool:
        alloc = nf.fit(d)
        if alloc is not None:
            chosen.append((nf.rank, nf.info.name, alloc))
            if len(chosen) == d.nodes:
                break
    chosen.sort()
    return Allocation(tuple((name, a) for _, name, a in chosen), d.exclusive)


def check_feasible(
    request: ResourceRequest,
    partition: Partition,
    nodes: Iterable[NodeInfo],
    *,
    time_limit_s: int | None = None,
) -> str | None:
    """Why this request could never run in ``partition`` (None: it could, on an empty cluster
    of the partition's UP and DRAIN nodes). For submit-time rejection, as sbatch does."""
    if partition.state in ("DRAIN", "INACTIVE"):
        return f"partition {partition.name} is not accepting jobs (State={partition.state})"
    d = Demand.of(request)
    if partition.max_nodes is not None and d.nodes > partition.max_nodes:
        return (f"requested {d.nodes} nodes but partition {partition.name} allows at most "
                f"{partition.max_nodes} (MaxNodes)")
    if (time_limit_s is not None and partition.max_time_s is not None
            and time_limit_s > partition.max_time_s):
        return (f"requested time limit {format_duration(time_limit_s)} exceeds partition "
                f"{partition.name}'s MaxTime {format_duration(partition.max_time_s)}")
    return place(d, ClusterState(nodes), "ever", partition=partition).reason


@dataclass(frozen=True)
class Headroom:
    """The most free GPUs and CPUs any one node has: a job needing more on each of its nodes
    cannot start until something ends (or preemption frees room for it).

    The controller keeps the headroom left by its last pass, so a submission that cannot
    start now does not cost a pass over the whole queue; its reason is set by the next
    periodic pass, as Slurm's is.
    """

    gpus: int
    cpus: int

    def may_fit(self, request: ResourceRequest) -> bool:
        """False only when no node could hold one of the request's gangs now (cheap checks
        only: anything finer is the pass's to decide)."""
        return request.gpus_per_node <= self.gpus and request.cpus_per_node <= self.cpus


def headroom(snapshot: Snapshot, starts: Iterable[Allocation] = (),
             cache: PlacementCache | None = None) -> Headroom:
    """What the nodes that take work (not DOWN or DRAIN) have free once ``starts`` hold theirs."""
    state = ClusterState.from_snapshot(snapshot, cache)
    for allocation in starts:
        state.commit(allocation)
    taking = [nf for nf in state.nodes if nf.info.state is NodeState.UP]
    return Headroom(gpus=max((len(nf.gpus_free) for nf in taking), default=0),
                    cpus=max((nf.cpus_free for nf in taking), default=0))
