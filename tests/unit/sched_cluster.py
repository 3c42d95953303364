"""Small builders for scheduler tests: clusters, partitions, jobs, in an administrator's words."""

from __future__ import annotations

from shoal.model.node import NodeState
from shoal.model.resources import GPU, Allocation, NodeAllocation, ResourceRequest
from shoal.model.snapshot import (
    ActiveJob,
    Dependency,
    JobRecord,
    NodeInfo,
    Partition,
    PendingJob,
    Snapshot,
)

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def gpu_node(name: str, gpus: int = 8, cpus: int = 64, memory_mb: int = 512_000,
             product: str = H100, state: NodeState = NodeState.UP,
             features: tuple[str, ...] = ()) -> NodeInfo:
    return NodeInfo(
        name=name, state=state, cpus=cpus, memory_mb=memory_mb,
        gpus=tuple(GPU(i, f"GPU-{name}-{i}", product, 81_559) for i in range(gpus)),
        features=frozenset(features),
    )


def nodes(prefix: str, count: int, **kw) -> tuple[NodeInfo, ...]:
    return tuple(gpu_node(f"{prefix}{i}", **kw) for i in range(1, count + 1))


def partition(name: str, members, **kw) -> Partition:
    return Partition(name=name, nodes=tuple(n.name if isinstance(n, NodeInfo) else n
                                            for n in members), **kw)


def job(id: int, partition: str = "gpu", *, user: str = "alice", name: str = "train",
        submit_time: float | None = None, time_limit_s: int | None = 3600, priority: int = 0,
        held: bool = False, begin_time: float | None = None,
        dependencies: tuple[Dependency, ...] = (), dependency_any: bool = False,
        array_job_id: int | None = None, array_task_id: int | None = None,
        array_throttle: int | None = None, **request) -> PendingJob:
    request.setdefault("mem_per_node_mb", 1000)
    return PendingJob(
        id=id, user=user, name=name, partition=partition, request=ResourceRequest(**request),
        submit_time=float(id if submit_time is None else submit_time),
        time_limit_s=time_limit_s, priority=priority, held=held, begin_time=begin_time,
        dependencies=dependencies, dependency_any=dependency_any, array_job_id=array_job_id,
        array_task_id=array_task_id, array_throttle=array_throttle,
    )


def running(id: int, holding: dict[str, tuple[int, int, tuple[int, ...]]], *,
            start_time: float = 0.0, time_limit_s: int | None = 3600, exclusive: bool = False,
            user: str = "bob", name: str = "sim", partition: str = "gpu",
            array_job_id: int | None = None) -> ActiveJob:
    """An active job holding, per node, (cpus, memory_mb, gpu indices)."""
    allocation = Allocation(
        tuple((n, NodeAllocation(c, m, g)) for n, (c, m, g) in holding.items()), exclusive)
    return ActiveJob(id=id, user=user, name=name, partition=partition, allocation=allocation,
                     start_time=start_time, time_limit_s=time_limit_s,
                     array_job_id=array_job_id)


def snapshot(cluster, partitions, pending=(), active=(), jobs: dict[int, JobRecord] | None = None,
             now: float = 1000.0) -> Snapshot:
    return Snapshot(now=now, nodes=tuple(cluster), partitions=tuple(partitions),
                    pending=tuple(pending), active=tuple(active), jobs=dict(jobs or {}))


def alloc_of(plan, job_id: int) -> dict[str, tuple[int, int, tuple[int, ...]]] | None:
    """The started job's allocation as {node: (cpus, memory_mb, gpus)}, or None."""
    for start in plan.starts:
        if start.job_id == job_id:
            return {n: (a.cpus, a.memory_mb, a.gpus) for n, a in start.allocation.nodes}
    return None


def started(plan) -> list[int]:
    return [s.job_id for s in plan.starts]
