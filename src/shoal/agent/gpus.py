"""GPU discovery and health through NVML, and a fake NVML for machines without GPUs.

Discovery and health code call NVML's functions by name on an ``nvml`` object that is
either the real ``pynvml`` module or a :class:`FakeNVML` exposing the same functions and
raising the same ``pynvml.NVMLError`` subclasses. There is one code path for both: the
fake only replaces the driver, never the logic above it.

``pynvml`` is imported lazily so that importing this module stays cheap.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.model.resources import GPU

log = logging.getLogger(__name__)

_MiB = 1024 * 1024

# Values of NVML's C enums. They are fixed by the NVML ABI, so they are spelled out here
# rather than read from pynvml, which keeps the fake usable without importing it first.
_NVML_DEVICE_MIG_ENABLE = 1
_NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_NVML_VOLATILE_ECC = 0
_NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8

# XIDs that an application causes (illegal address, page fault in user code, ...): they
# say nothing about the GPU's health. The same default list as NVIDIA's device plugin.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_XID_DOUBLE_BIT_ECC = 48
_XID_FALLEN_OFF_BUS = 79

# What the XIDs that take a GPU out of service mean (NVIDIA's XID catalogue), for the
# node's drain reason; any other critical XID is named by its number alone.
XID_MEANINGS: Mapping[int, str] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

FAKE_FAULTS_FILE = "fake-gpu-faults"  # in the agent's work directory; read by the fake NVML only


class GPUDiscoveryError(RuntimeError):
    """NVML could not be opened or could not describe a GPU."""


class FakeGPUConfigError(ValueError):
    """A --fake-gpus flag or fake GPU file is wrong; the message names the field."""


# --------------------------------------------------------------------------- catalogue


@dataclass(frozen=True)
class GPUModel:
    """A GPU model as NVML reports it, under the short name users type (``--gpu-model``)."""

    name: str
    product: str  # nvmlDeviceGetName
    memory_mb: int  # nvmlDeviceGetMemoryInfo().total in MiB, as nvidia-smi prints it
    mig_capable: bool
    compute_capability: tuple[int, int]
    power_w: int = 300  # board power limit (TDP): what the fake draws when fully busy


GPU_MODELS: Mapping[str, GPUModel] = {
    m.name.lower(): m
    for m in (
        GPUModel("H100-SXM-80GB", "NVIDIA H100 80GB HBM3", 81559, True, (9, 0), 700),
        GPUModel("H100-PCIE-80GB", "NVIDIA H100 PCIe", 81559, True, (9, 0), 350),
        GPUModel("H200-SXM-141GB", "NVIDIA H200", 143771, True, (9, 0), 700),
        GPUModel("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 81920, True, (8, 0), 400),
        GPUModel("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 40960, True, (8, 0), 400),
        GPUModel("A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", 40960, True, (8, 0), 250),
        GPUModel("L40S", "NVIDIA L40S", 46068, False, (8, 9), 350),
        GPUModel("L4", "NVIDIA L4", 23034, False, (8, 9), 72),
        GPUModel("A10G", "NVIDIA A10G", 23028, False, (8, 6), 300),
        GPUModel("T4", "Tesla T4", 15360, False, (7, 5), 70),
        GPUModel("B200", "NVIDIA B200", 183359, True, (10, 0), 1000),
    )
}


def gpu_model(name: str) -> GPUModel:
    """The catalogue entry for a short model name, case-insensitively."""
    model = GPU_MODELS.get(name.strip().lower())
    if model is None:
        known = ", ".join(m.name for m in GPU_MODELS.values())
        raise FakeGPUConfigError(f"unknown GPU model {name!r}; known models: {known}")
    return model


def fake_uuid(seed: str, index: int) -> str:
    """A GPU UUID that is stable for (seed, index) and unique across seeds (node names)."""
    h = hashlib.sha256(f"shoal-fake-gpu:{seed}:{index}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# --------------------------------------------------------------------------- fake NVML


@dataclass(frozen=True)
class FakeGPUSpec:
    """One fake GPU: what the fake NVML reports for it."""

    product: str
    memory_mb: int
    mig_capable: bool
    mig_enabled: bool
    uuid: str
    compute_capability: tuple[int, int] = (0, 0)  # (0, 0): unknown, as GFD treats it
    power_w: int = 300  # drawn when fully busy; a tenth of it when idle

    def __post_init__(self) -> None:
        if self.mig_enabled and not self.mig_capable:
            raise FakeGPUConfigError(f"{self.product}: mig_enabled needs a MIG-capable GPU")
        if self.memory_mb <= 0:
            raise FakeGPUConfigError(f"{self.product}: memory_mb must be positive")

    @classmethod
    def of_model(cls, model: GPUModel, uuid: str, mig_enabled: bool = False) -> "FakeGPUSpec":
        return cls(model.product, model.memory_mb, model.mig_capable, mig_enabled, uuid,
                   model.compute_capability, model.power_w)


@dataclass(frozen=True)
class FakeMemoryInfo:
    """Shaped like pynvml's c_nvmlMemory_t: bytes."""

    total: int
    free: int
    used: int


@dataclass(frozen=True)
class FakeUtilization:
    """Shaped like pynvml's c_nvmlUtilization_t: percent over the last sample period."""

    gpu: int
    memory: int


@dataclass(frozen=True)
class FakeHandle:
    """Stands for a c_nvmlDevice_t."""

    index: int


@dataclass(frozen=True)
class FakeEventData:
    """Shaped like pynvml's c_nvmlEventData_t."""

    device: FakeHandle
    eventType: int  # noqa: N815 - NVML's field name
    eventData: int  # noqa: N815
    gpuInstanceId: int = 0xFFFFFFFF  # noqa: N815
    computeInstanceId: int = 0xFFFFFFFF  # noqa: N815


@dataclass
class _FakeEventSet:
    registered: set[int] = field(default_factory=set)
    pending: list[FakeEventData] = field(default_factory=list)


def _nvml_error(name: str) -> Exception:
    import pynvml

    return getattr(pynvml, name)()


class FakeNVML:
    """The subset of pynvml that Shoal calls, backed by a list of :class:`FakeGPUSpec`.

    Errors are the real ``pynvml.NVMLError_*`` classes, raised where the driver would
    raise them: calls before ``nvmlInit`` (Uninitialized), a bad index (InvalidArgument),
    MIG mode on a GPU without MIG (NotSupported), any device call on a lost GPU
    (GpuIsLost), an empty event set (Timeout).

    Utilisation stands in for the work a GPU would do: a fake GPU is held by the processes
    below ``process_root`` (the agent that made the fake, by default) whose
    CUDA_VISIBLE_DEVICES names it, and is as busy as they keep the CPU, split evenly over
    the GPUs each holds: a process using one core on one GPU makes it 100% busy, a CPU
    model server under load shows a busy GPU and an idle one an idle GPU. Likewise its
    framebuffer holds what those processes keep resident (their RSS, split as their CPU is),
    and it draws a tenth of its power limit when idle, all of it when fully busy, its energy
    counter adding that up over time.
    """

    UTIL_PERIOD_S = 0.5  # the driver's sample period: calls within it see the same figures

    def __init__(self, gpus: list[FakeGPUSpec], driver_version: str = "550.54.15",
                 cuda_version: int = 12040, process_root: int | None = None) -> None:
        uuids = [g.uuid for g in gpus]
        if len(set(uuids)) != len(uuids):
            raise FakeGPUConfigError("fake GPUs must have distinct UUIDs")
        self.gpus: tuple[FakeGPUSpec, ...] = tuple(gpus)
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self._lock = threading.Lock()
        self._init_count = 0
        self._lost: set[int] = set()
        self._uncorrected_ecc: dict[int, int] = {}
        self._event_sets: list[_FakeEventSet] = []
        self.process_root = os.getpid() if process_root is None else process_root
        self._meter: Any = None  # shoal.agent.usage.CpuMeter, made on first use
        self._holders: dict[int, tuple[float, tuple[int, ...]]] = {}  # pid -> (create_time, GPU indices)
        self._load: dict[int, float] = {}
        self._mem: dict[int, int] = {}  # bytes per GPU index: its holders' RSS
        self._load_at = float("-inf")
        self._energy_mj = [0.0] * len(self.gpus)
        self._energy_at = time.monotonic()
        self._faults_path: Path | None = None
        self._faults_read = 0  # bytes of the fault file applied so far
        self._faults_lock = threading.Lock()

    # Fault injection, for health checks -------------------------------------------

    def follow_faults(self, path: Path) -> None:
        """Apply the lines appended to ``path`` as faults, from any NVML call on.

        The way tests break a running agent's fake GPUs from outside (the agent makes
        its fake follow ``WORKDIR/fake-gpu-faults``); one fault per line, applied once::

            xid GPU XID        # the driver reports XID on GPU (48 and 79 with their effects)
            ecc GPU [COUNT]    # uncorrected ECC errors (1 by default)
            lost GPU           # the GPU falls off the bus
            reset GPU          # a GPU reset: back on the bus, volatile ECC counters cleared

        The file may exist already: what it holds is applied at once.
        """
        self._faults_path = Path(path)
        self._faults_read = 0

    def _apply_fault_file(self) -> None:
        path = self._faults_path
        if path is None:
            return
        with self._faults_lock:
            try:
                with open(path, "rb") as f:
                    f.seek(self._faults_read)
                    data = f.read()
            except FileNotFoundError:
                return
            complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits
            self._faults_read += len(complete)
            for line in complete.decode(errors="replace").splitlines():
                words = line.partition("#")[0].split()
                if words:
                    try:
                        self._apply_fault(words)
                    except (ValueError, IndexError) as e:
                        log.warning("%s: ignoring fault line %r: %s", path, line, e)

    def _apply_fault(self, words: list[str]) -> None:
        op, args = words[0], [int(w) for w in words[1:]]
        if op == "xid" and len(args) == 2:
            self.inject_xid(*args)
        elif op == "ecc" and len(args) in (1, 2):
            self.inject_ecc(*args)
        elif op == "lost" and len(args) == 1:
            self.mark_lost(*args)
        elif op == "reset" and len(args) == 1:
            self.reset(*args)
        else:
            raise ValueError("expected 'xid GPU XID', 'ecc GPU [COUNT]', 'lost GPU' or 'reset GPU'")

    def inject_xid(self, index: int, xid: int) -> None:
        """The driver reports XID ``xid`` on GPU ``index``, with its usual side effects."""
        self._check_index(index)
        with self._lock:
            event = FakeEventData(FakeHandle(index), _NVML_EVENT_TYPE_XID_CRITICAL_ERROR, xid)
            for es in self._event_sets:
                if index in es.registered:
                    es.pending.append(event)
            if xid == _XID_DOUBLE_BIT_ECC:
                self._uncorrected_ecc[index] = self._uncorrected_ecc.get(index, 0) + 1
            if xid == _XID_FALLEN_OFF_BUS:
                self._lost.add(index)

    def inject_ecc(self, index: int, uncorrected: int = 1) -> None:
        """Raise GPU ``index``'s volatile uncorrected ECC counter."""
        self._check_index(index)
        with self._lock:
            self._uncorrected_ecc[index] = self._uncorrected_ecc.get(index, 0) + uncorrected

    def mark_lost(self, index: int) -> None:
        """GPU ``index`` falls off the bus: every call on it raises NVMLError_GpuIsLost."""
        self._check_index(index)
        with self._lock:
            self._lost.add(index)

    def reset(self, index: int) -> None:
        """GPU ``index`` is reset (nvidia-smi -r): it answers again, its volatile ECC counter is 0."""
        self._check_index(index)
        with self._lock:
            self._lost.discard(index)
            self._uncorrected_ecc.pop(index, None)

    # NVML: library ------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names, on purpose
        with self._lock:
            self._init_count += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        with self._lock:
            if self._init_count == 0:
                raise _nvml_error("NVMLError_Uninitialized")
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._check_init()
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._check_init()
        return self.cuda_version

    # NVML: devices ------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:  # noqa: N802
        self._check_init()
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise _nvml_error("NVMLError_InvalidArgument")
        self._check_alive(index)
        return FakeHandle(index)

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:  # noqa: N802
        # Host-side bookkeeping: answers even for a lost GPU, so its XIDs can be placed.
        self._check_init()
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise _nvml_error("NVMLError_InvalidArgument")
        return handle.index

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:  # noqa: N802
        return self.gpus[self._spec_index(handle)].uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:  # noqa: N802
        return self.gpus[self._spec_index(handle)].product

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> FakeMemoryInfo:  # noqa: N802
        index = self._spec_index(handle)
        total = self.gpus[index].memory_mb * _MiB
        with self._lock:
            used = min(self._mem.get(index, 0), total)
        return FakeMemoryInfo(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> FakeUtilization:  # noqa: N802
        index = self._spec_index(handle)
        with self._lock:
            self._refresh()
            return FakeUtilization(gpu=self._util(index), memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:  # noqa: N802
        """Milliwatts, as NVML gives them."""
        index = self._spec_index(handle)
        with self._lock:
            self._refresh()
            return round(self._power_w(index) * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:  # noqa: N802
        """Millijoules since the fake was made (since the driver loaded, for a real GPU)."""
        index = self._spec_index(handle)
        with self._lock:
            self._refresh()
            return int(self._energy_mj[index])

    def _util(self, index: int) -> int:
        return round(min(self._load.get(index, 0.0), 100.0))

    def _power_w(self, index: int) -> float:
        return self.gpus[index].power_w * (0.1 + 0.9 * self._util(index) / 100)

    def _refresh(self) -> None:
        """Energy counted up to now at the power drawn so far; then, once a sample period has
        passed, the GPUs' load and memory read again. Called with the lock held."""
        now = time.monotonic()
        for i in range(len(self.gpus)):
            self._energy_mj[i] += self._power_w(i) * (now - self._energy_at) * 1000
        self._energy_at = now
        if now - self._load_at >= self.UTIL_PERIOD_S:
            (self._load, self._mem), self._load_at = self._gpu_load(), now

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:  # noqa: N802
        spec = self.gpus[self._spec_index(handle)]
        if not spec.mig_capable:
            raise _nvml_error("NVMLError_NotSupported")
        mode = _NVML_DEVICE_MIG_ENABLE if spec.mig_enabled else 0
        return [mode, mode]

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeHandle) -> tuple[int, int]:  # noqa: N802
        return self.gpus[self._spec_index(handle)].compute_capability

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, errorType: int,  # noqa: N802,N803
                                    counterType: int) -> int:  # noqa: N803
        index = self._spec_index(handle)
        if errorType != _NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        with self._lock:
            return self._uncorrected_ecc.get(index, 0)

    # NVML: events -------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _FakeEventSet:  # noqa: N802
        self._check_init()
        es = _FakeEventSet()
        with self._lock:
            self._event_sets.append(es)
        return es

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, eventTypes: int,  # noqa: N802,N803
                                 eventSet: _FakeEventSet) -> None:  # noqa: N803
        index = self._spec_index(handle)
        if eventTypes & _NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
            with self._lock:
                eventSet.registered.add(index)

    def nvmlEventSetWait_v2(self, eventSet: _FakeEventSet, timeoutms: int) -> FakeEventData:  # noqa: N802,N803
        self._check_init()
        with self._lock:
            if eventSet.pending:
                return eventSet.pending.pop(0)
        raise _nvml_error("NVMLError_Timeout")

    def nvmlEventSetFree(self, eventSet: _FakeEventSet) -> None:  # noqa: N802,N803
        with self._lock:
            if eventSet in self._event_sets:
                self._event_sets.remove(eventSet)

    # ---------------------------------------------------------------------------------

    def _gpu_load(self) -> tuple[dict[int, float], dict[int, int]]:
        """Percent per GPU index (its holders' CPU cores since the last call, x 100), and bytes
        (its holders' resident memory, split as their CPU is)."""
        import psutil

        from shoal.agent.usage import CpuMeter, descendants

        if self._meter is None:
            self._meter = CpuMeter()
        pids = descendants([self.process_root]).get(self.process_root, [])[1:]
        holders: dict[int, tuple[float, tuple[int, ...]]] = {}
        for pid in pids:
            try:
                p = psutil.Process(pid)
                created = p.create_time()
                known = self._holders.get(pid)
                if known is not None and abs(known[0] - created) < 0.01:
                    holders[pid] = known  # a process's environment is fixed at exec
                    continue
                holders[pid] = (created, self._visible(p.environ().get("CUDA_VISIBLE_DEVICES", "")))
            except psutil.Error:
                continue
        self._holders = holders
        using = {pid: devs for pid, (_, devs) in holders.items() if devs}
        load: dict[int, float] = {}
        for pid, cores in self._meter.cores(using).items():
            for d in using[pid]:
                load[d] = load.get(d, 0.0) + 100.0 * cores / len(using[pid])
        mem: dict[int, int] = {}
        for pid, devs in using.items():
            try:
                rss = psutil.Process(pid).memory_info().rss
            except psutil.Error:
                continue
            for d in devs:
                mem[d] = mem.get(d, 0) + rss // len(devs)
        return load, mem

    def _visible(self, text: str) -> tuple[int, ...]:
        """The GPU indices CUDA_VISIBLE_DEVICES names, by index or UUID."""
        by_uuid = {g.uuid: i for i, g in enumerate(self.gpus)}
        out = []
        for item in (s.strip() for s in text.split(",")):
            if item.isdigit() and int(item) < len(self.gpus):
                out.append(int(item))
            elif item in by_uuid:
                out.append(by_uuid[item])
        return tuple(out)

    def _check_init(self) -> None:
        self._apply_fault_file()
        if self._init_count == 0:
            raise _nvml_error("NVMLError_Uninitialized")

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self.gpus):
            raise IndexError(f"no fake GPU {index}; this node has {len(self.gpus)}")

    def _check_alive(self, index: int) -> None:
        with self._lock:
            lost = index in self._lost
        if lost:
            raise _nvml_error("NVMLError_GpuIsLost")

    def _spec_index(self, handle: Any) -> int:
        self._check_init()
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise _nvml_error("NVMLError_InvalidArgument")
        self._check_alive(handle.index)
        return handle.index


def fake_nvml_from_flags(count: int, model: str, seed: str) -> FakeNVML:
    """``--fake-gpus COUNT --gpu-model MODEL``: COUNT identical GPUs, UUIDs from ``seed``."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise FakeGPUConfigError(f"--fake-gpus must be a non-negative integer, got {count!r}")
    m = gpu_model(model)
    return FakeNVML([FakeGPUSpec.of_model(m, fake_uuid(seed, i)) for i in range(count)])


_MODEL_KEYS = frozenset({"model", "count", "mig_enabled"})
_EXPLICIT_KEYS = frozenset({"product", "memory_mb", "mig_capable", "mig_enabled", "uuid",
                            "compute_capability"})
_TOP_KEYS = frozenset({"gpus", "driver_version", "cuda_version"})


def fake_nvml_from_file(path: str | Path, seed: str) -> FakeNVML:
    """A fake GPU file (``--fake-gpus-file``), YAML::

        driver_version: "550.54.15"     # optional
        cuda_version: 12040             # optional; or "12.4"
        gpus:
          - {model: H100-SXM-80GB, count: 8}                 # from the catalogue
          - {product: "NVIDIA H100 80GB HBM3", memory_mb: 81559, mig_capable: true}

    Explicit entries may also give ``mig_enabled``, ``uuid`` and ``compute_capability``
    ("9.0"); a product found in the catalogue takes its compute capability from there.
    """
    import yaml

    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise FakeGPUConfigError(f"{where}: cannot read fake GPU file: {e.strerror}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FakeGPUConfigError(f"{where}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise FakeGPUConfigError(f"{where}: expected a mapping with a 'gpus' list at the top")
    _reject_unknown(where, data, _TOP_KEYS)
    entries = data.get("gpus")
    if not isinstance(entries, list):
        raise FakeGPUConfigError(f"{where}: gpus: expected a list of GPU entries")

    specs: list[FakeGPUSpec] = []
    for n, entry in enumerate(entries):
        at = f"{where}: gpus[{n}]"
        if not isinstance(entry, dict):
            raise FakeGPUConfigError(f"{at}: expected a mapping, got {type(entry).__name__}")
        if "model" in entry:
            _reject_unknown(at, entry, _MODEL_KEYS)
            try:
                m = gpu_model(_str(at, entry, "model"))
            except FakeGPUConfigError as e:
                raise FakeGPUConfigError(f"{at}.model: {e}") from None
            count = _int(at, entry, "count", default=1, minimum=0)
            mig_enabled = _bool(at, entry, "mig_enabled", default=False)
            if mig_enabled and not m.mig_capable:
                raise FakeGPUConfigError(f"{at}.mig_enabled: {m.name} is not MIG capable")
            for _ in range(count):
                specs.append(FakeGPUSpec.of_model(m, fake_uuid(seed, len(specs)), mig_enabled))
        elif "product" in entry:
            _reject_unknown(at, entry, _EXPLICIT_KEYS)
            product = _str(at, entry, "product")
            known = next((m for m in GPU_MODELS.values() if m.product == product), None)
            cc = known.compute_capability if known else (0, 0)
            if "compute_capability" in entry:
                cc = _compute_capability(at, entry["compute_capability"])
            mig_capable = _bool(at, entry, "mig_capable", default=False)
            mig_enabled = _bool(at, entry, "mig_enabled", default=False)
            if mig_enabled and not mig_capable:
                raise FakeGPUConfigError(f"{at}.mig_enabled: needs mig_capable: true")
            uuid = _str(at, entry, "uuid") if "uuid" in entry else fake_uuid(seed, len(specs))
            specs.append(FakeGPUSpec(product, _int(at, entry, "memory_mb", minimum=1),
                                     mig_capable, mig_enabled, uuid, cc))
        else:
            raise FakeGPUConfigError(f"{at}: needs either 'model' (a catalogue name) or "
                                     "'product' and 'memory_mb'")

    driver = _str(where, data, "driver_version") if "driver_version" in data else "550.54.15"
    cuda = _cuda_version(where, data["cuda_version"]) if "cuda_version" in data else 12040
    try:
        return FakeNVML(specs, driver_version=driver, cuda_version=cuda)
    except FakeGPUConfigError as e:
        raise FakeGPUConfigError(f"{where}: gpus: {e}") from None


def _reject_unknown(at: str, entry: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(str(k) for k in entry if k not in allowed)
    if unknown:
        raise FakeGPUConfigError(f"{at}: unknown field(s) {', '.join(unknown)}; "
                                 f"allowed: {', '.join(sorted(allowed))}")


def _str(at: str, entry: Mapping[str, Any], key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise FakeGPUConfigError(f"{at}.{key}: expected a non-empty string, got {value!r}")
    return value


def _int(at: str, entry: Mapping[str, Any], key: str, *, default: int | None = None,
         minimum: int) -> int:
    if key not in entry and default is not None:
        return default
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FakeGPUConfigError(f"{at}.{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _bool(at: str, entry: Mapping[str, Any], key: str, *, default: bool) -> bool:
    value = entry.get(key, default)
    if not isinstance(value, bool):
        raise FakeGPUConfigError(f"{at}.{key}: expected true or false, got {value!r}")
    return value


def _compute_capability(at: str, value: Any) -> tuple[int, int]:
    try:
        major, minor = str(value).split(".")
        return int(major), int(minor)
    except ValueError:
        raise FakeGPUConfigError(
            f"{at}.compute_capability: expected MAJOR.MINOR such as \"9.0\", got {value!r}"
        ) from None


def _cuda_version(at: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        try:
            major, minor = value.split(".")
            return int(major) * 1000 + int(minor) * 10
        except ValueError:
            pass
    raise FakeGPUConfigError(f"{at}: cuda_version: expected NVML's integer (12040) or "
                             f"\"12.4\", got {value!r}")


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class GPUInventory:
    """What NVML says about this node's GPUs and driver."""

    gpus: tuple[GPU, ...] = ()
    driver_version: str | None = None  # "550.54.15"
    cuda_version: int | None = None  # nvmlSystemGetCudaDriverVersion: 12040 is CUDA 12.4
    compute_capabilities: tuple[tuple[int, int], ...] = ()  # aligned with gpus


def open_nvml(fake: FakeNVML | None) -> Any:
    """``fake`` after its nvmlInit, or the real ``pynvml`` after nvmlInit.

    The caller owns the session and calls ``nvmlShutdown()`` when done.
    """
    try:
        import pynvml
    except ImportError as e:
        raise GPUDiscoveryError(
            "the NVML bindings (nvidia-ml-py) are not installed; install them, or pass "
            "--fake-gpus to run on a machine without GPUs"
        ) from e
    nvml: Any = fake if fake is not None else pynvml
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise _open_error(e) from e
    return nvml


class _NoNVML(GPUDiscoveryError):
    """No NVIDIA driver on this machine at all (as opposed to a broken one)."""


def _open_error(e: Exception) -> GPUDiscoveryError:
    import pynvml

    if isinstance(e, (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded)):
        return _NoNVML(
            f"cannot open NVML ({e}): this machine has no NVIDIA driver; pass --fake-gpus "
            "(with --gpu-model) or --fake-gpus-file to run on a machine without GPUs"
        )
    return GPUDiscoveryError(f"cannot open NVML: {e}")


def discover_inventory(nvml: Any) -> GPUInventory:
    """Every GPU NVML can describe, with the driver and CUDA versions. ``nvml`` is open.

    A GPU that is lost (fallen off the bus) is left out, keeping the others' NVML
    indices; :func:`check_health` reports it.
    """
    import pynvml

    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda: int | None = None
        get_cuda = getattr(nvml, "nvmlSystemGetCudaDriverVersion", None)
        if get_cuda is not None:
            try:
                cuda = int(get_cuda())
            except pynvml.NVMLError as e:
                log.warning("NVML does not report the CUDA driver version: %s", e)
        count = nvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as e:
        raise GPUDiscoveryError(f"NVML failed to list GPUs: {e}") from e

    gpus: list[GPU] = []
    ccs: list[tuple[int, int]] = []
    for index in range(count):
        try:
            gpu, cc = _describe(nvml, index)
        except pynvml.NVMLError_GpuIsLost:
            log.warning("GPU %d is lost (fallen off the bus); leaving it out", index)
            continue
        except pynvml.NVMLError as e:
            raise GPUDiscoveryError(f"NVML failed to describe GPU {index}: {e}") from e
        gpus.append(gpu)
        ccs.append(cc)
    return GPUInventory(tuple(gpus), driver, cuda, tuple(ccs))


def discover_gpus(nvml: Any) -> tuple[GPU, ...]:
    """The GPUs of :func:`discover_inventory`."""
    return discover_inventory(nvml).gpus


def discover_gpus_or_none(fake: FakeNVML | None) -> GPUInventory | None:
    """Open NVML (or ``fake``), discover, and shut it down again.

    Returns None when the machine has no NVIDIA driver at all: that is a CPU-only node
    and comes up with zero GPUs and no GPU labels. A driver that is present but broken
    (version mismatch, no permission, a GPU that fails to answer) still raises
    GPUDiscoveryError, because a GPU node silently reporting no GPUs hides a fault.
    """
    try:
        nvml = open_nvml(fake)
    except _NoNVML as e:
        log.info("%s", e)
        return None
    try:
        return discover_inventory(nvml)
    finally:
        nvml.nvmlShutdown()


def _describe(nvml: Any, index: int) -> tuple[GPU, tuple[int, int]]:
    import pynvml

    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    name = _text(nvml.nvmlDeviceGetName(handle))
    memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MiB
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        mig_capable, mig_enabled = True, current == _NVML_DEVICE_MIG_ENABLE
    except pynvml.NVMLError_NotSupported:
        mig_capable, mig_enabled = False, False
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    gpu = GPU(index=index, uuid=uuid, product=name, memory_mb=memory_mb,
              mig_capable=mig_capable, mig_enabled=mig_enabled)
    return gpu, (int(major), int(minor))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --------------------------------------------------------------------------- health


class GPUHealthKind(str, enum.Enum):
    XID = "xid"  # the driver reported a critical XID
    ECC = "ecc"  # uncorrected (double-bit) memory errors since the driver loaded
    LOST = "lost"  # the GPU no longer answers (fallen off the bus)


@dataclass(frozen=True)
class GPUHealthEvent:
    """One reason a GPU is unhealthy, for node conditions and pod events."""

    index: int
    kind: GPUHealthKind
    detail: str
    uuid: str | None = None
    xid: int | None = None

    @property
    def lasting(self) -> bool:
        """A state that lasts until the GPU is repaired (lost, ECC), not a one-off XID event."""
        return self.kind is not GPUHealthKind.XID

    def describe(self) -> str:
        """``GPU 1 XID 79 (GPU has fallen off the bus)``: the GPU and its condition, as a
        node's drain reason names them."""
        return f"GPU {self.index} {self.detail}" if self.index >= 0 else f"a GPU: {self.detail}"


def watch_xids(nvml: Any, indices: Iterable[int] | None = None) -> Any | None:
    """An NVML event set receiving critical XIDs from the GPUs (all by default).

    Returns None if this driver has no event support; health then rests on the ECC
    counters and lost-GPU detection alone. Free it with ``nvmlEventSetFree``.
    """
    import pynvml

    try:
        event_set = nvml.nvmlEventSetCreate()
    except pynvml.NVMLError as e:
        log.warning("NVML event sets unavailable, XIDs will not be watched: %s", e)
        return None
    for index in indices if indices is not None else range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceRegisterEvents(handle, _NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
        except pynvml.NVMLError as e:
            log.warning("GPU %d: cannot watch XIDs: %s", index, e)
    return event_set


def check_health(nvml: Any, xid_events: Any | None = None,
                 max_events: int = 1000) -> list[GPUHealthEvent]:
    """Every health problem NVML reports now, one poll, safe to call at any time.

    Lost GPUs and uncorrected ECC errors are states: reported on every call while they
    last. XIDs are events: each is reported once, by draining ``xid_events`` (from
    :func:`watch_xids`) without waiting. Application XIDs are ignored.
    """
    import pynvml

    found: list[GPUHealthEvent] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        uuid: str | None = None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            ecc = nvml.nvmlDeviceGetTotalEccErrors(
                handle, _NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _NVML_VOLATILE_ECC)
        except pynvml.NVMLError_GpuIsLost:
            found.append(GPUHealthEvent(index, GPUHealthKind.LOST, "is lost", uuid))
            continue
        except pynvml.NVMLError as e:
            # ECC off or unsupported (NotSupported) is normal for consumer and some
            # inference GPUs; anything else is logged rather than guessed at.
            if not isinstance(e, pynvml.NVMLError_NotSupported):
                log.warning("GPU %d: health query failed: %s", index, e)
            continue
        if ecc > 0:
            found.append(GPUHealthEvent(index, GPUHealthKind.ECC,
                                        f"has {ecc} uncorrected ECC error(s)", uuid))

    if xid_events is None:
        return found
    for _ in range(max_events):
        try:
            data = nvml.nvmlEventSetWait_v2(xid_events, 0)
        except pynvml.NVMLError_Timeout:
            break
        except pynvml.NVMLError as e:
            log.warning("reading NVML events failed: %s", e)
            break
        if not data.eventType & _NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
            continue
        xid = int(data.eventData)
        if xid in APPLICATION_XIDS:
            continue
        try:
            index = nvml.nvmlDeviceGetIndex(data.device)
        except pynvml.NVMLError:
            index = -1
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            uuid = None
        meaning = XID_MEANINGS.get(xid)
        detail = f"XID {xid} ({meaning})" if meaning else f"XID {xid}"
        found.append(GPUHealthEvent(index, GPUHealthKind.XID, detail, uuid, xid))
    return found
