"""What a job asks for and what it was given, in integer units (MiB, CPUs, GPU indices)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GPU:
    """One physical GPU as NVML describes it."""

    index: int
    uuid: str
    product: str  # NVML's name, e.g. "NVIDIA H100 80GB HBM3"
    memory_mb: int
    mig_capable: bool = False
    mig_enabled: bool = False


@dataclass(frozen=True)
class ResourceRequest:
    """A job's demand, normalised by the server from the user's options.

    ``nodes`` is the gang size: that many nodes are allocated at once or not at all.
    Per-node figures apply to every node of the gang. ``mem_per_node_mb == 0`` means
    all of each node's memory (Slurm's ``--mem=0``). ``ntasks`` is the total task count;
    when ``ntasks_per_node`` is None tasks are spread as CPUs allow.
    """

    nodes: int = 1
    ntasks: int = 1
    ntasks_per_node: int | None = None
    cpus_per_task: int = 1
    mem_per_node_mb: int = 0
    gpus_per_node: int = 0
    gpu_type: str | None = None  # matched case-insensitively against the GPU product
    exclusive: bool = False
    features: tuple[str, ...] = ()  # --constraint, all required (AND)
    nodelist: tuple[str, ...] = ()  # --nodelist: every one of these must be in the allocation
    exclude: tuple[str, ...] = ()  # --exclude

    @property
    def tasks_per_node(self) -> int:
        if self.ntasks_per_node is not None:
            return self.ntasks_per_node
        return -(-self.ntasks // self.nodes)

    @property
    def cpus_per_node(self) -> int:
        return self.tasks_per_node * self.cpus_per_task

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class NodeAllocation:
    """What one node gives to one job."""

    cpus: int
    memory_mb: int
    gpus: tuple[int, ...] = ()  # GPU indices on that node


@dataclass(frozen=True)
class Allocation:
    """A job's whole gang: node name -> what it holds there, in nodelist order."""

    nodes: tuple[tuple[str, NodeAllocation], ...] = field(default_factory=tuple)
    exclusive: bool = False

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.nodes)

    def on(self, node: str) -> NodeAllocation | None:
        for name, alloc in self.nodes:
            if name == node:
                return alloc
        return None

    def to_json(self) -> dict:
        return {
            "exclusive": self.exclusive,
            "nodes": [
                {"name": n, "cpus": a.cpus, "memory_mb": a.memory_mb, "gpus": list(a.gpus)}
                for n, a in self.nodes
            ],
        }

    @classmethod
    def from_json(cls, data: dict | None) -> "Allocation":
        if not data:
            return cls()
        return cls(
            nodes=tuple(
                (n["name"], NodeAllocation(n["cpus"], n["memory_mb"], tuple(n["gpus"])))
                for n in data["nodes"]
            ),
            exclusive=bool(data.get("exclusive")),
        )
