"""From a trace's job to the scheduler's PendingJob: the gang shape on this cluster's nodes.

Traces record totals (GPUs, CPUs, memory); Shoal schedules a gang of identical per-node
shares, as ``sbatch --gpus=N`` does after the server's normalisation. Rules:

* GPU jobs: ``nodes`` is the trace's node count when it divides the GPUs and each share fits
  a node, else ``ceil(gpus / gpus_per_node)``; each node gets ``ceil(gpus / nodes)`` GPUs.
* CPU-only jobs: ``nodes`` is the trace's node count, else ``ceil(cpus / cpus_per_node)``.
* CPUs and memory not recorded: the share of the node that the job's GPUs are (a 2-of-8-GPU
  job gets a quarter of the CPUs and memory), so GPUs, not CPUs, are what runs out.
  Recorded CPUs and memory are spread over the nodes and capped at one node's worth
  (counted in ``Workload.capped``) so that a trace from a bigger machine still replays.
* GPU types in the trace (PAI's gpu_type) are not asked for: the simulated cluster has its
  own GPUs, and a V100 request on an H100 cluster would only be rejected.
* The partition is the trace's (vc, SWF partition) when the cluster has one of that name,
  else the default partition.
* The QOS: ``qos_map`` (``--qos-map NAME=QOS``) names a QOS per trace account (vc, SWF
  group), else per user, else ``*`` for every other job; none: the default QOS. The
  account is the trace's (None when it has none: the user's default).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Mapping

from shoal.model.resources import ResourceRequest
from shoal.model.snapshot import NodeInfo, Partition, PendingJob
from shoal.sched.queue import effective_time_limit
from shoal.sim.cluster import SimCluster
from shoal.sim.trace import TraceJob


@dataclass(frozen=True)
class NodeShape:
    """The node a partition's jobs are sized against: its largest GPU node."""

    cpus: int
    memory_mb: int
    gpus: int

    @classmethod
    def of(cls, nodes: list[NodeInfo]) -> "NodeShape":
        best = max(nodes, key=lambda n: (len(n.gpus), n.cpus, n.memory_mb))
        return cls(best.cpus, best.memory_mb, len(best.gpus))


@dataclass
class Workload:
    """Maps trace jobs onto one cluster; keeps counts of what it had to adjust."""

    cluster: SimCluster
    exact_limits: bool = False  # no recorded limit: use the recorded run time (perfect estimates)
    capped: Counter = field(default_factory=Counter)
    qos_map: Mapping[str, str] = field(default_factory=dict)  # account, user or "*" -> QOS

    def __post_init__(self) -> None:
        by_name = {n.name: n for n in self.cluster.nodes}
        self.partitions = {p.name: p for p in self.cluster.partitions}
        self.shapes = {p.name: NodeShape.of([by_name[n] for n in p.nodes] or list(self.cluster.nodes))
                       for p in self.cluster.partitions}
        self.default = self.cluster.default_partition
        self.requests: dict[ResourceRequest, ResourceRequest] = {}

    def partition_of(self, job: TraceJob) -> Partition:
        for name in (job.partition, job.account):
            if name and name in self.partitions:
                return self.partitions[name]
        return self.default

    def pending(self, job: TraceJob) -> PendingJob:
        part = self.partition_of(job)
        request = self.request(job, self.shapes[part.name])
        # Equal requests share one object (frozen): a pass then compiles and finds each
        # shape's demand by identity.
        request = self.requests.setdefault(request, request)
        limit = job.time_limit_s
        if limit is None and self.exact_limits:
            limit = max(60, math.ceil(job.duration / 60) * 60)
        pending = PendingJob(
            id=job.id, user=job.user or "-", name=job.name, partition=part.name, request=request,
            submit_time=job.submit, time_limit_s=limit, account=job.account or None,
            qos=self.qos_of(job),
        )
        # The server stores the limit a job runs under at submit; so does the simulator.
        effective = effective_time_limit(pending, part.default_time_s, part.max_time_s)
        return pending if effective == limit else replace(pending, time_limit_s=effective)

    def qos_of(self, job: TraceJob) -> str | None:
        m = self.qos_map
        if not m:
            return None
        return m.get(job.account) or m.get(job.user) or m.get("*")

    def request(self, job: TraceJob, shape: NodeShape) -> ResourceRequest:
        if job.gpus > 0:
            per = max(shape.gpus, 1)
            nodes = job.nodes if (job.nodes and job.gpus % job.nodes == 0
                                  and job.gpus // job.nodes <= per) else math.ceil(job.gpus / per)
            gpn = math.ceil(job.gpus / nodes)
            fraction = gpn / per if shape.gpus else 1.0
        else:
            cpus = job.cpus or 1
            nodes = job.nodes or math.ceil(cpus / shape.cpus)
            gpn = 0
            fraction = min(1.0, math.ceil(cpus / nodes) / shape.cpus)
        if job.cpus:
            cpn = math.ceil(job.cpus / nodes)
            if cpn > shape.cpus:
                self.capped["cpus"] += 1
                cpn = shape.cpus
        else:
            cpn = max(1, int(shape.cpus * fraction))
        if job.mem_mb:
            mem = math.ceil(job.mem_mb / nodes)
            if mem > shape.memory_mb:
                self.capped["memory"] += 1
                mem = shape.memory_mb
        else:
            mem = max(1, int(shape.memory_mb * fraction))
        return ResourceRequest(
            nodes=nodes, ntasks=nodes, ntasks_per_node=1, cpus_per_task=cpn,
            mem_per_node_mb=mem, gpus_per_node=gpn,
        )

