"""Request bodies at the API edge (pydantic). Internal code works on frozen dataclasses."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shoal.model.selectors import check_labels

from shoal.model.job import MAX_SCRIPT_BYTES
MAX_NAME = 255
MAX_ARG = 131072  # MAX_ARG_STRLEN: the longest argument or environment string execve accepts
MAX_ENV_VARS = 10000
MAX_ENV_BYTES = 2 * 1024 * 1024  # about what execve takes for argv and environment together
MAX_TIME_S = 2**31 - 1  # time limits are stored in 32-bit INTEGER columns (PostgreSQL enforces it)


class StoredText(BaseModel):
    """A body whose text fields are stored in text columns, which in PostgreSQL cannot hold NUL,
    and whose numbers are stored and served as JSON, which has no NaN or Infinity."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, v):
        if isinstance(v, str) and "\x00" in v:
            raise ValueError("must not contain NUL (\\x00) characters")
        return v


def _exec_text_error(text: str, what: str) -> str | None:
    """Why execve cannot take ``text`` as an argument or variable value, or None."""
    if "\x00" in text:
        return f"{what} contains a NUL (\\x00) character"
    try:
        # JSON can carry any lone surrogate; execve takes only those that stand for raw bytes
        # (Python's surrogateescape: a submitter's non-UTF-8 environment arrives that way).
        os.fsencode(text)
    except UnicodeEncodeError:
        return f"{what} is not valid UTF-8 text"
    if len(text) > MAX_ARG:
        return f"{what} is longer than {MAX_ARG} characters"
    return None


def check_argv(argv: list[str]) -> list[str]:
    """Arguments reach execve as they are: UTF-8, no NUL, none longer than the kernel takes."""
    for i, arg in enumerate(argv):
        why = _exec_text_error(arg, f"argument {i}")
        if why:
            raise ValueError(why)
    return argv


def check_environment(env: dict[str, str]) -> dict[str, str]:
    """A job's environment as execve can take it: names without '=' or NUL, bounded sizes."""
    if len(env) > MAX_ENV_VARS:
        raise ValueError(f"{len(env)} variables: at most {MAX_ENV_VARS} are accepted")
    total = 0
    for name, value in env.items():
        total += len(name) + len(value) + 2
        if name.isascii() and value.isascii() and name and "=" not in name and "\x00" not in name \
                and "\x00" not in value and len(name) <= MAX_ARG and len(value) <= MAX_ARG:
            continue  # the common case, at a fraction of the checks' cost
        if not name or "=" in name or _exec_text_error(name, ""):
            raise ValueError(f"invalid variable name {name[:64]!r}: it must be non-empty UTF-8, without '=' or NUL")
        why = _exec_text_error(value, f"variable {name[:64]}")
        if why:
            raise ValueError(why)
    if total > MAX_ENV_BYTES:
        raise ValueError(f"the environment holds {total} bytes: at most {MAX_ENV_BYTES} are accepted")
    return env


def check_node_labels(labels: dict) -> dict:
    """Node labels as Kubernetes takes them (key ``[prefix/]name``, value <= 63 characters),
    so pods' nodeSelectors can name them; a None value (removal) passes."""
    problems = check_labels({k: v for k, v in labels.items() if v is not None})
    if problems:
        key, why = problems[0]
        raise ValueError(f"label {key}: {why}")
    return labels


class JobSubmit(StoredText):
    """What sbatch/srun send. Field names match docs/API.md; unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=MAX_NAME)
    partition: str | None = Field(default=None, max_length=64)
    script: str | None = Field(default=None, max_length=MAX_SCRIPT_BYTES)
    script_base64: str | None = Field(default=None, max_length=MAX_SCRIPT_BYTES * 4 // 3 + 4,
                                      description="the script's bytes in base64, instead of script, when they "
                                                  "are not UTF-8 (JSON strings cannot carry them)")
    script_sha256: str | None = Field(default=None, pattern="^[0-9a-f]{64}$",
                                      description="hex SHA-256 of the script's bytes, as the submitter read them")
    argv: list[str] = Field(default_factory=list, max_length=4096)
    workdir: str = Field(min_length=1, max_length=4096)
    environment: dict[str, str] = Field(default_factory=dict)
    stdout: str | None = Field(default=None, max_length=4096)
    stderr: str | None = Field(default=None, max_length=4096)
    stdin: str | None = Field(default=None, max_length=4096)
    open_mode: str | None = Field(default=None, pattern="^(truncate|append)$")
    nodes: int | None = Field(default=None, ge=1, le=100000)
    nodes_max: int | None = Field(default=None, ge=1, le=100000)
    ntasks: int | None = Field(default=None, ge=1, le=10_000_000)
    ntasks_per_node: int | None = Field(default=None, ge=1, le=100000)
    cpus_per_task: int | None = Field(default=None, ge=1, le=100000)
    mem_per_node_mb: int | None = Field(default=None, ge=0)
    mem_per_cpu_mb: int | None = Field(default=None, ge=0)
    gpus: int | None = Field(default=None, ge=0, le=1_000_000)
    gpus_per_node: int | None = Field(default=None, ge=0, le=1024)
    gpus_per_task: int | None = Field(default=None, ge=0, le=1024)
    gpu_type: str | None = Field(default=None, max_length=64)
    exclusive: bool = False
    time_limit_s: int | None = Field(default=None, ge=-1, le=MAX_TIME_S,
                                     description="-1: UNLIMITED; null: partition default")
    time_min_s: int | None = Field(default=None, ge=-1, le=MAX_TIME_S)
    hold: bool = False
    requeue: bool = False
    array: str | None = Field(default=None, max_length=4096)
    dependency: str | None = Field(default=None, max_length=4096)
    begin_time: float | None = None
    constraint: str | None = Field(default=None, max_length=1024)
    nodelist: str | None = Field(default=None, max_length=65536)
    exclude: str | None = Field(default=None, max_length=65536)
    signal: str | None = Field(default=None, max_length=32)
    interactive: bool = False
    comment: str | None = Field(default=None, max_length=4096)
    account: str | None = Field(default=None, max_length=64)
    qos: str | None = Field(default=None, max_length=64)
    reservation: str | None = Field(default=None, max_length=64)
    kill_on_invalid_dep: bool | None = None
    container: dict | None = Field(default=None, description="Pyxis' --container-* options (model.container)")
    # Options Slurm takes that Shoal keeps but does not act on (--wckey, --mail-type, ...).
    recorded_options: dict[str, str] = Field(default_factory=dict, max_length=32)

    _argv = field_validator("argv")(check_argv)
    _environment = field_validator("environment")(check_environment)

    @model_validator(mode="after")
    def _script_bytes(self):
        # The rest of the server, the store and the agent hold a script as text: bytes that
        # are not UTF-8 become surrogates (surrogateescape), which give them back exactly.
        if self.script_base64 is not None:
            if self.script is not None:
                raise ValueError("give script or script_base64, not both")
            import binascii

            try:
                data = binascii.a2b_base64(self.script_base64.encode("ascii"), strict_mode=True)
            except (binascii.Error, UnicodeEncodeError) as e:
                raise ValueError(f"script_base64 is not base64: {e}") from None
            self.script, self.script_base64 = data.decode("utf-8", "surrogateescape"), None
        return self

    @field_validator("container")
    @classmethod
    def _container(cls, doc: dict | None) -> dict | None:
        from shoal.model.container import check_request

        return None if doc is None else check_request(doc)


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    signal: str | int | None = None
    batch: bool = False
    full: bool = False


class BulkCancelRequest(CancelRequest):
    job_ids: list[str] = Field(default_factory=list)
    user: str | None = None
    partition: str | None = None
    states: list[str] = Field(default_factory=list)
    name: str | None = None
    qos: str | None = None
    account: str | None = None

    @field_validator("job_ids", "states", mode="before")
    @classmethod
    def _null_is_empty(cls, v):
        return [] if v is None else v  # scancel sends null for "not given"


class JobUpdate(StoredText):
    model_config = ConfigDict(extra="forbid")

    time_limit_s: int | None = Field(default=None, ge=0, le=MAX_TIME_S)
    name: str | None = Field(default=None, max_length=MAX_NAME)
    partition: str | None = None
    nodes: int | None = Field(default=None, ge=1)
    comment: str | None = Field(default=None, max_length=4096)
    array_throttle: int | None = Field(default=None, ge=0, le=1_000_000, description="ArrayTaskThrottle; 0: none")


class StepCreate(StoredText):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=MAX_NAME)
    argv: list[str] = Field(min_length=1, max_length=4096)
    nodes: int | None = Field(default=None, ge=1)
    ntasks: int | None = Field(default=None, ge=1)
    ntasks_per_node: int | None = Field(default=None, ge=1)
    cpus_per_task: int | None = Field(default=None, ge=1)
    gpus_per_task: int | None = Field(default=None, ge=0)
    gpus_per_node: int | None = Field(default=None, ge=0)
    nodelist: str | None = Field(default=None, max_length=65536)
    exclude: str | None = Field(default=None, max_length=65536)

    _argv = field_validator("argv")(check_argv)


class StepComplete(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exit_code: int = 0
    signal: int = 0
    reason: str | None = Field(default=None, max_length=256)  # why its tasks never started (their container)


class InteractiveComplete(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exit_code: int = 0
    signal: int = 0
    reason: str | None = Field(default=None, max_length=256)


class NodeUpdate(StoredText):
    model_config = ConfigDict(extra="forbid")

    state: str | None = Field(default=None, pattern="^(DRAIN|RESUME|DOWN|UP|IDLE)$")
    reason: str | None = Field(default=None, max_length=255)
    taints: list[Taint] | None = Field(default=None, max_length=64)  # the whole new list
    labels: dict[str, str | None] | None = Field(default=None, max_length=256)  # merged; null removes one

    @field_validator("labels")
    @classmethod
    def _labels(cls, v):
        return None if v is None else check_node_labels(v)


class AccountingChange(StoredText):
    """sacctmgr add/modify/delete: names and ``where`` select, ``set`` gives the values (sacctmgr's
    keys, lower-case); ``dry_run`` checks and words the change without storing it."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["add", "modify", "delete"]
    kind: Literal["account", "user", "qos"]
    names: list[Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")]] = \
        Field(default_factory=list, max_length=1000)
    where: dict[str, Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict, max_length=50)
    set: dict[str, Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict, max_length=50)
    dry_run: bool = False


class PartitionUpdate(StoredText):
    """scontrol update PartitionName=...: only the fields given change (null: UNLIMITED/NONE)."""

    model_config = ConfigDict(extra="forbid")

    state: str | None = Field(default=None, max_length=16)
    max_time_s: int | None = Field(default=None, ge=0, le=MAX_TIME_S)
    default_time_s: int | None = Field(default=None, ge=0, le=MAX_TIME_S)
    max_nodes: int | None = Field(default=None, ge=1, le=100000)
    default: bool | None = None
    priority_job_factor: int | None = Field(default=None, ge=0, le=65533)
    nodes: str | None = Field(default=None, max_length=65536)


class GPUFacts(BaseModel):
    index: int
    uuid: str
    product: str
    memory_mb: int
    mig_capable: bool = False
    mig_enabled: bool = False


class Taint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9]([A-Za-z0-9_./-]*[A-Za-z0-9])?$")
    value: str = Field(default="", max_length=63)
    effect: str = Field(pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$")


class AgentRegister(StoredText):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    address: str = Field(min_length=1, max_length=255)
    port: int = Field(ge=1, le=65535)
    cpus: int = Field(ge=1)
    memory_mb: int = Field(ge=1)
    gpus: list[GPUFacts] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    features: list[str] = Field(default_factory=list)
    boot_time: float | None = None
    alive: list[str] = Field(default_factory=list)
    # Applied when the node first registers (kubelet's --register-with-taints); later
    # registrations keep what `shoal taint` set.
    taints: list[Taint] = Field(default_factory=list, max_length=64)
    # Runs this agent stopped because its lease ran out while it could not reach the server.
    fenced: list[str] = Field(default_factory=list, max_length=100_000)
    # Exits it holds (runs that ended while it was away), taken before the node is UP again, so
    # no job is started anew before the node has said how its last run really ended.
    events: list[AgentEvent] = Field(default_factory=list, max_length=100_000)
    # An agent that serves HTTPS: a PEM certificate signing request for its key; the reply
    # carries the certificate the cluster CA issued for it.
    csr: str | None = Field(default=None, max_length=16_384)


class AgentEvent(BaseModel):
    type: str  # "exit"; "step": an srun step's end on the node, with what it used there
    key: str
    job_id: int
    run: int
    step_id: int | None = None  # a "step" event's step
    exit_code: int | None = None
    signal: int | None = None
    time: float | None = None
    reason: str | None = Field(default=None, max_length=1024)  # why the run never started
    oom_kills: int = 0  # the kernel's OOM kills in the run's cgroup: it ends OUT_OF_MEMORY
    # What the run used, from its cgroup (sacct's MaxRSS, TotalCPU, UserCPU, SystemCPU).
    max_rss_kb: int | None = None
    cpu_s: float | None = None
    user_cpu_s: float | None = None
    system_cpu_s: float | None = None
    fenced: bool = False  # its supervisor stopped it: the node's lease had run out
    killed: bool = False  # the agent stopped it (scancel, a time limit, the server no longer listing it)


class PodReport(BaseModel):
    """One pod's PodStatus as the agent sees it, and the events since its last report."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(max_length=64)
    job_id: int
    run: int
    status: dict = Field(default_factory=dict)
    events: list[dict] = Field(default_factory=list, max_length=256)


class NodeImage(BaseModel):
    """One image a node holds, as Kubernetes' node.status.images lists them."""

    model_config = ConfigDict(extra="forbid")

    names: list[str] = Field(max_length=8)
    sizeBytes: int = Field(ge=0)
    lastUsed: float | None = None


class GPUProblem(BaseModel):
    """One GPU health problem the agent's NVML watch found (shoal.agent.gpus.GPUHealthEvent)."""

    model_config = ConfigDict(extra="forbid")

    index: int
    uuid: str | None = Field(default=None, max_length=96)
    kind: str = Field(pattern="^(xid|ecc|lost)$")
    xid: int | None = None
    reason: str = Field(max_length=200)  # "GPU 1 XID 79 (GPU has fallen off the bus)"


class GPUUsageSample(BaseModel):
    """One GPU held by a run, at one heartbeat (shoal.agent.usage.Sample.report)."""
    model_config = ConfigDict(extra="forbid")

    job_id: int
    run: int = Field(ge=0)
    gpu: int = Field(ge=0)
    util: float = Field(ge=0, le=100)  # %
    mem_mib: int = Field(ge=0)
    energy_mj: int | None = Field(default=None, ge=0)  # the GPU's counter since the driver loaded
    power_w: float | None = Field(default=None, ge=0)


class AgentReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[AgentEvent] = Field(default_factory=list)
    alive: list[str] = Field(default_factory=list)
    pods: list[PodReport] = Field(default_factory=list)
    # Per-GPU utilisation (%, DCGM_FI_DEV_GPU_UTIL) and per-pod CPU use (cores), for the HPA.
    gpu_util: dict[str, float] = Field(default_factory=dict)
    pod_cpu: dict[str, float] = Field(default_factory=dict)
    # The GPUs held by runs, for per-job GPU accounting (sacct's gres/gpuutil, gres/gpumem).
    gpu_usage: list[GPUUsageSample] = Field(default_factory=list, max_length=1024)
    # What is wrong with the node's GPUs now, and XIDs since the last report; [] when healthy.
    gpu_health: list[GPUProblem] = Field(default_factory=list, max_length=256)
    # The images in the node's cache; None: unchanged since the agent's last report.
    images: list[NodeImage] | None = Field(default=None, max_length=1024)


class ApplyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[dict] = Field(max_length=1000)
    dry_run: bool = False


class ScaleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replicas: int = Field(ge=0, le=10000)


class UndoRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to_revision: int = Field(default=0, ge=0)


class ExecRequest(BaseModel):
    """``shoal exec``: a command (an argv, never a shell line) for a running container."""

    model_config = ConfigDict(extra="forbid")

    container: str | None = Field(default=None, max_length=63)
    command: list[str] = Field(min_length=1, max_length=4096)
    stdin: str = Field(default="", max_length=MAX_SCRIPT_BYTES)

    @field_validator("command")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if not v[0]:
            raise ValueError("the command's first word (the program) must not be empty")
        if any("\x00" in a for a in v):
            raise ValueError("must not contain NUL (\\x00) characters")
        return v


class GatewayMetrics(BaseModel):
    """What a gateway measured in its last second: per pod (``NS/POD``) and held requests per Service."""

    model_config = ConfigDict(extra="forbid")

    pods: dict[str, dict[str, float]] = Field(default_factory=dict)
    held: dict[str, int] = Field(default_factory=dict)


class TokenCreate(StoredText):
    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: str = Field(default="user", pattern="^(admin|operator|user|read-only)$")
    description: str | None = Field(default=None, max_length=200)
    groups: list[Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")]] = \
        Field(default_factory=list, max_length=64)
    expires_in_s: int | None = Field(default=None, ge=1, le=100 * 365 * 86400)  # None: never expires


RESERVATION_NAME = r"^[A-Za-z0-9_.@-]+$"


class ReservationCreate(StoredText):
    """scontrol create reservation. Times are epochs; give ``end_time`` or ``duration_s``;
    ``nodes`` (hostlist) or ``node_count``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=RESERVATION_NAME)
    start_time: float | None = Field(default=None, description="null: now")
    end_time: float | None = None
    duration_s: int | None = Field(default=None, ge=1, le=MAX_TIME_S)
    nodes: str | None = Field(default=None, max_length=65536)
    node_count: int | None = Field(default=None, ge=1, le=100000)
    users: list[str] = Field(default_factory=list)
    accounts: list[str] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list)
    partition: str | None = Field(default=None, max_length=64)


class ReservationUpdate(StoredText):
    """scontrol update ReservationName=...: only the fields given change."""

    model_config = ConfigDict(extra="forbid")

    start_time: float | None = None
    end_time: float | None = None
    duration_s: int | None = Field(default=None, ge=1, le=MAX_TIME_S)
    nodes: str | None = Field(default=None, max_length=65536)
    node_count: int | None = Field(default=None, ge=1, le=100000)
    users: list[str] | None = None
    accounts: list[str] | None = None
    flags: list[str] | None = None
    partition: str | None = Field(default=None, max_length=64)
