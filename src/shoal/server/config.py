"""The cluster configuration file (YAML): partitions, scheduler, priority, accounts, QOS
and node-lifecycle settings. The sections the simulator shares are parsed by
shoal.sched.clusterfile (one parser for both); the server-only ones are validated here.

Names follow slurm.conf and sacctmgr where one exists (DefaultTime, MaxTime, SlurmdTimeout,
KillWait, PriorityWeightAge, PriorityMaxAge, PriorityDecayHalfLife, PriorityJobFactor,
Shares, MaxWall, GrpJobs). Times are slurm.conf time strings (``7-0``, ``1:00:00``) or bare
minutes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from shoal.model.accounting import QOS, Account
from shoal.model.node import FenceTiming, fence_timing
from shoal.model.snapshot import Partition
from shoal.model.topology import Topology, TopologyError, parse_topology_conf, switch
from shoal.sched.clusterfile import SECTIONS, ClusterFile, ClusterFileError, Priority, parse_cluster_file


class ConfigError(ValueError):
    """The cluster configuration file is wrong; the message names the field."""


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str = Field(default="backfill", pattern="^(fifo|backfill)$")
    interval_s: float = Field(default=1.0, gt=0, description="time between periodic passes")
    stream_gap_s: float = Field(default=0.02, ge=0, description="submissions closer together than "
                                "this are a stream, whose jobs are started in batches")
    stream_pause_s: float = Field(default=0.25, ge=0, description="a stream goes on while its "
                                  "submissions come closer together than this, and has paused "
                                  "once this long passed without one (at least stream_gap_s): a "
                                  "loop's hiccup on a busy machine does not end it")
    stream_defer_s: float = Field(default=3.0, ge=0, description="during a stream of submissions, "
                                  "passes wait for it to pause, at most this long after the last "
                                  "pass (Slurm's batch_sched_delay, 3 s by default, for the same "
                                  "purpose); 0: a pass per wake")
    max_array_size: int = Field(default=1001, ge=1)
    def_mem_per_cpu_mb: int = Field(default=1024, ge=0, description="DefMemPerCPU")
    preemption: bool = Field(default=True, description="PreemptType=preempt/qos (acts only where "
                             "some QOS lists others under preempt); false: preempt/none")
    preempt_grace_s: float = Field(default=60.0, ge=0, description="the most a victim's --signal "
                                   "@secs may delay its requeue or cancel (GraceTime)")
    backfill: str = Field(default="easy", pattern="^(easy|conservative)$",
                          description="easy: reserve for the first blocked job only; "
                          "conservative: for every blocked job up to bf_max_job_test")
    bf_max_job_test: int | None = Field(default=None, ge=1, description="the most jobs a "
                                        "backfill pass tests (SchedulerParameters=bf_max_job_test)")
    bf_window_s: int | None = Field(default=None, ge=1, description="how far ahead backfill "
                                    "reserves, in seconds (bf_window)")
    bf_resolution_s: int = Field(default=0, ge=0, description="backfill's time step: job ends "
                                 "rounded up to it (bf_resolution; 0: exact)")
    bf_interval_s: float = Field(default=0.0, ge=0, description="the least time between full "
                                 "backfill passes; passes in between are quick, and stop once "
                                 "nothing more can start (bf_interval; 0: every pass is a full one)")
    idle_pass_s: float = Field(default=60.0, gt=0, description="while nothing a pass reads has "
                               "changed, a periodic pass at most this often (sched_interval): "
                               "the others would plan what the last one did")


def default_heartbeat_interval(timeout_s: float, lease_s: float | None) -> float:
    """The heartbeat interval when none is set: a third of the timeout, as Slurm pings slurmd
    every SlurmdTimeout/3, and at most half the agents' lease (``lease_s``; None: no fencing)
    so a lease always spans two heartbeats. Kubernetes' kubelet renews its Lease every 10 s
    against a 40 s grace: a quarter."""
    interval = timeout_s / 3
    return min(interval, lease_s / 2) if lease_s is not None and lease_s > 0 else interval


class NodeLifecycleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Unset, a third of the timeout (Slurm pings slurmd every SlurmdTimeout/3), at most half
    # the agents' lease: 20 s under the default 60 s timeout (docs/SCALE.md: why not 5 s).
    heartbeat_interval_s: float = Field(default=20.0, gt=0)
    heartbeat_timeout_s: float = Field(default=60.0, gt=0, description="SlurmdTimeout")
    kill_wait_s: float = Field(default=30.0, ge=0, description="KillWait: SIGTERM to SIGKILL")
    # Agents silent past heartbeat_timeout_s kill their own tasks, which the server restarts
    # elsewhere, so none runs twice after a partition. The price: a control plane down for
    # longer than the timeout stops every node's work (agents cannot tell it from a cut).
    fencing: bool = Field(default=True, description="agents fence themselves when their lease runs out")

    @property
    def fence(self) -> FenceTiming:
        """The lease and fence that fit in the heartbeat timeout (docs/FENCING.md)."""
        return fence_timing(self.heartbeat_timeout_s, self.kill_wait_s)

    @model_validator(mode="after")
    def _lease_holds_two_heartbeats(self) -> NodeLifecycleConfig:
        if "heartbeat_interval_s" not in self.model_fields_set:
            self.heartbeat_interval_s = default_heartbeat_interval(self.heartbeat_timeout_s,
                                                                   self.fence.lease_s if self.fencing else None)
        if self.fencing and self.fence.lease_s < 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"heartbeat_timeout_s {self.heartbeat_timeout_s:g} leaves agents a lease of {self.fence.lease_s:.1f}s "
                f"(the rest is the fence's grace, check period and clock skew: docs/FENCING.md), under two "
                f"heartbeats of heartbeat_interval_s {self.heartbeat_interval_s:g}: raise the timeout or shorten "
                "the interval")
        return self


class SwitchConfig(BaseModel):
    """One switch of topology.conf in YAML: ``{name: s0, nodes: "node[01-04]"}`` or
    ``{name: top, switches: "s[0-1]"}``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    nodes: str | None = None
    switches: str | None = None


class TopologyConfig(BaseModel):
    """Slurm's topology/tree: a topology.conf ``file`` (relative to the cluster file), or
    the same ``switches`` inline."""

    model_config = ConfigDict(extra="forbid")

    file: str | None = None
    switches: list[SwitchConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> "TopologyConfig":
        if self.file and self.switches:
            raise ValueError("give either file or switches, not both")
        if not self.file and not self.switches:
            raise ValueError("give a topology.conf file or a list of switches")
        if self.switches:
            try:
                self.tree(None)
            except TopologyError as e:
                raise ValueError(str(e)) from None
        return self

    def tree(self, base: Path | None) -> Topology:
        """The switch tree; reads ``file`` (relative paths from ``base``)."""
        if self.file:
            path = Path(self.file)
            if base is not None and not path.is_absolute():
                path = base / path
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as e:
                raise TopologyError(f"cannot read topology file {path}: {e.strerror}") from None
            return parse_topology_conf(text, str(path))
        return Topology.of(switch(s.name, s.nodes, s.switches) for s in self.switches)


class ServingConfig(BaseModel):
    """Serving (pods of Deployments): where pods run and how the controllers pace themselves."""

    model_config = ConfigDict(extra="forbid")

    partition: str | None = None  # the partition pods are placed in (default: the default partition)
    drain_s: float = Field(default=1.0, ge=0, le=300)  # out of the routes this long before SIGTERM
    interval_s: float = Field(default=1.0, gt=0, le=60)  # controllers' resync period (they also run on change)
    hpa_sync_s: float = Field(default=15.0, gt=0, le=600)  # --horizontal-pod-autoscaler-sync-period


class ContainersConfig(BaseModel):
    """The agents' image pulls: registry mirrors (as sites set pull-through caches) and
    registries served over plain HTTP; docs/CONTAINERS.md."""

    model_config = ConfigDict(extra="forbid")

    # registry -> mirror, e.g. {"nvcr.io": "cache.example:5000"}: nvcr.io/nvidia/x pulls from the mirror
    registry_mirrors: dict[str, str] = Field(default_factory=dict)
    insecure_registries: list[str] = Field(default_factory=list)  # pulled over HTTP, unverified
    image_cache_mb: int = Field(default=0, ge=0, description="per node; 0: unlimited")


class AuthConfig(BaseModel):
    """Who sees and may do what, beyond the token roles (see shoal.server.auth)."""

    model_config = ConfigDict(extra="forbid")

    # Every user may create serving objects in the `default` namespace; false: only those a
    # RoleBinding there grants edit (as in any other namespace).
    default_namespace_open: bool = True
    # Slurm's PrivateData: "jobs" hides other users' jobs from users and read-only tokens
    # (operators and admins see all). Empty, the default, as in Slurm: squeue shows everyone's.
    private_data: list[Literal["jobs"]] = Field(default_factory=list)


class ClusterConfig(BaseModel):
    """The server-only sections, validated here; the sections the simulator shares
    (cluster_name, partitions, priority, accounts, qos) are read by shoal.sched.clusterfile."""

    model_config = ConfigDict(extra="forbid")

    scheduler: SchedulerConfig = SchedulerConfig()
    nodes: NodeLifecycleConfig = NodeLifecycleConfig()
    topology: TopologyConfig | None = None
    serving: ServingConfig = ServingConfig()
    containers: ContainersConfig = ContainersConfig()
    auth: AuthConfig = AuthConfig()
    # Where relative paths (topology.file) start: the cluster file's folder.
    _base_dir: Path | None = PrivateAttr(default=None)
    _shared: ClusterFile = PrivateAttr()

    @property
    def cluster_name(self) -> str:
        return self._shared.cluster_name

    @property
    def priority(self) -> Priority:
        return self._shared.priority

    def partition_list(self) -> tuple[Partition, ...]:
        return self._shared.partitions

    def account_list(self) -> tuple[Account, ...]:
        """The account tree, flattened (nested ``accounts`` get their parent filled in)."""
        return self._shared.accounts

    def qos_list(self) -> tuple[QOS, ...]:
        return self._shared.qos

    def topology_tree(self) -> Topology | None:
        """The switch tree placement uses (None: no topology configured)."""
        if self.topology is None:
            return None
        return self.topology.tree(self._base_dir)


def load_cluster_config(path: str | Path) -> ClusterConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read cluster configuration {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    config = parse_cluster_config(data, str(path))
    config._base_dir = Path(path).resolve().parent
    try:
        config.topology_tree()
    except TopologyError as e:
        raise ConfigError(f"{path} is invalid:\n  topology: {e}") from None
    return config


def parse_cluster_config(data: dict, source: str = "cluster configuration") -> ClusterConfig:
    try:
        shared = parse_cluster_file(data)
    except ClusterFileError as e:
        raise ConfigError(f"{source} is invalid:\n  {e}") from None
    try:
        config = ClusterConfig.model_validate({k: v for k, v in data.items() if k not in SECTIONS})
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {loc}: {err['msg']}")
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(lines)) from None
    name = config.serving.partition
    if name is not None and name not in {p.name for p in shared.partitions}:
        raise ConfigError(f"{source} is invalid:\n  serving.partition: no partition named {name}")
    config._shared = shared
    return config
