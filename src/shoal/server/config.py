"""The cluster configuration file (YAML): partitions, scheduler and node-lifecycle settings.

Names follow slurm.conf where one exists (DefaultTime, MaxTime, SlurmdTimeout, KillWait).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shoal.model.hostlist import HostlistError, expand
from shoal.model.snapshot import Partition
from shoal.model.timefmt import TimeFormatError, parse_time_limit


class ConfigError(ValueError):
    """The cluster configuration file is wrong; the message names the field."""


def _time(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value * 60  # bare numbers are minutes, as in slurm.conf
    try:
        return parse_time_limit(str(value))
    except TimeFormatError as e:
        raise ValueError(str(e)) from None


class PartitionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    nodes: str = Field(min_length=1, description="hostlist, e.g. dgx[001-032]")
    default: bool = False
    default_time: str | int | None = None
    max_time: str | int | None = None
    max_nodes: int | None = Field(default=None, ge=1)
    state: str = "UP"

    @field_validator("nodes")
    @classmethod
    def _hostlist(cls, v: str) -> str:
        try:
            expand(v)
        except HostlistError as e:
            raise ValueError(f"invalid hostlist: {e}") from None
        return v

    @field_validator("default_time", "max_time")
    @classmethod
    def _timefmt(cls, v):
        _time(v)
        return v

    def to_partition(self) -> Partition:
        return Partition(
            name=self.name,
            nodes=tuple(expand(self.nodes)),
            default=self.default,
            default_time_s=_time(self.default_time),
            max_time_s=_time(self.max_time),
            max_nodes=self.max_nodes,
            state=self.state,
        )


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str = Field(default="backfill", pattern="^(fifo|backfill)$")
    interval_s: float = Field(default=1.0, gt=0, description="time between periodic passes")
    max_array_size: int = Field(default=1001, ge=1)
    def_mem_per_cpu_mb: int = Field(default=1024, ge=0, description="DefMemPerCPU")


class NodeLifecycleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    heartbeat_timeout_s: float = Field(default=60.0, gt=0, description="SlurmdTimeout")
    kill_wait_s: float = Field(default=30.0, ge=0, description="KillWait: SIGTERM to SIGKILL")


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cluster_name: str = "shoal"
    partitions: list[PartitionConfig] = Field(min_length=1)
    scheduler: SchedulerConfig = SchedulerConfig()
    nodes: NodeLifecycleConfig = NodeLifecycleConfig()

    @field_validator("partitions")
    @classmethod
    def _one_default(cls, parts: list[PartitionConfig]) -> list[PartitionConfig]:
        names = [p.name for p in parts]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"partition names must be unique: {', '.join(sorted(dup))}")
        if sum(p.default for p in parts) > 1:
            raise ValueError("only one partition may have default: true")
        return parts

    def partition_list(self) -> tuple[Partition, ...]:
        parts = [p.to_partition() for p in self.partitions]
        if not any(p.default for p in parts):  # Slurm: the first is the default when none is marked
            first = parts[0]
            parts[0] = Partition(**{**first.__dict__, "default": True})
        return tuple(parts)


def load_cluster_config(path: str | Path) -> ClusterConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read cluster configuration {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    return parse_cluster_config(data, str(path))


def parse_cluster_config(data: dict, source: str = "cluster configuration") -> ClusterConfig:
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {loc}: {err['msg']}")
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(lines)) from None
