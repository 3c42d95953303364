"""Usage sampling on a node: pods' CPU cores from their process trees, GPU utilisation through
NVML (the fake's stands in for GPU work with its holders' CPU), and the DCGM-style text."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pynvml
import pytest

from shoal.agent.gpus import (
    FakeGPUSpec,
    FakeHandle,
    FakeNVML,
    discover_gpus,
    fake_nvml_from_flags,
    gpu_model,
)
from shoal.agent.usage import (
    CpuMeter,
    UsageSampler,
    descendants,
    holder_labels,
    prometheus_text,
    read_gpus,
)

BURN = "import time\nend = time.time() + 20\nwhile time.time() < end: pass\n"
IDLE = "import time; time.sleep(20)"


@pytest.fixture
def spawn():
    procs: list[subprocess.Popen] = []

    def start(code: str, gpus: str | None = None, shell_parent: bool = False) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        argv = [sys.executable, "-c", code]
        if shell_parent:  # a container whose main process is a shell running the server
            argv = ["/bin/sh", "-c", f'"{sys.executable}" -c "$CODE"; true']
            env["CODE"] = code
        p = subprocess.Popen(argv, env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _settle(sample, enough, timeout: float = 10.0):
    """Take ``sample()`` until ``enough(value)`` (the machine is shared: a burner may wait for
    a core) and return the last value."""
    deadline = time.time() + timeout
    while True:
        time.sleep(0.7)
        value = sample()
        if enough(value) or time.time() > deadline:
            return value


def test_a_process_busy_on_a_fake_gpu_makes_that_gpu_busy_and_no_other(spawn):
    nvml = fake_nvml_from_flags(3, "H100-SXM-80GB", seed="node1")
    nvml.nvmlInit()
    spawn(BURN, gpus="1")
    spawn(IDLE, gpus="2")
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
    nvml.nvmlDeviceGetUtilizationRates(handles[0])  # the driver's first period: no baseline yet

    gpu0, gpu1, gpu2 = _settle(lambda: [nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles],
                               lambda r: r[1] >= 40)
    assert gpu1 >= 40 and gpu0 == 0 and gpu2 <= 5
    assert nvml.nvmlDeviceGetUtilizationRates(handles[1]).memory == 0


def test_a_process_on_two_gpus_splits_its_load_and_uuids_name_gpus_too(spawn):
    nvml = fake_nvml_from_flags(2, "A100-SXM4-80GB", seed="n")
    nvml.nvmlInit()
    uuid1 = nvml.gpus[1].uuid
    spawn(BURN, gpus=f"0,{uuid1}")
    h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceGetUtilizationRates(h0)
    a, b = _settle(lambda: (nvml.nvmlDeviceGetUtilizationRates(h0).gpu, nvml.nvmlDeviceGetUtilizationRates(h1).gpu),
                   lambda r: r[0] >= 20)
    assert 20 <= a <= 60 and abs(a - b) <= 1  # one core over two GPUs: at most half each


def test_processes_outside_the_agents_tree_hold_no_fake_gpu(spawn):
    spawn(BURN, gpus="0")  # busy on "GPU 0", but not below this fake's agent
    nvml = FakeNVML([FakeGPUSpec.of_model(gpu_model("L4"), "GPU-y")], process_root=1 << 22)  # no such pid
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceGetUtilizationRates(h)
    time.sleep(0.7)
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu == 0


def test_utilisation_follows_the_driver_rules():
    nvml = fake_nvml_from_flags(2, "H100-SXM-80GB", seed="node1")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetUtilizationRates(None)
    nvml.nvmlInit()
    nvml.mark_lost(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetUtilizationRates(FakeHandle(0))
    # A lost GPU is left out of a sample; the others are read.
    assert [g.index for g in read_gpus(nvml, [0, 1])] == [1]
    used = read_gpus(nvml, [1])[0]
    assert used.fb_free_mb == 81559 and used.fb_used_mb == 0


def test_cpu_meter_counts_cores_between_calls(spawn):
    busy, idle = spawn(BURN), spawn(IDLE)
    meter = CpuMeter()
    assert meter.cores([busy.pid, idle.pid]) == {}  # no baseline yet
    cores = _settle(lambda: meter.cores([busy.pid, idle.pid]), lambda c: c.get(busy.pid, 0) >= 0.4)
    assert 0.4 <= cores[busy.pid] <= 1.2 and cores[idle.pid] < 0.1
    # A process born since the last call counts from its start: all the CPU time it has used
    # (waited for, not slept for: on a loaded machine a burner may wait long for a core).
    before = time.time()
    meter.cores([busy.pid, idle.pid], now=before)
    late = spawn(BURN)
    deadline = time.time() + 20
    while _cpu_s(late.pid) < 0.3 and time.time() < deadline:
        time.sleep(0.05)
    now = time.time()
    used = _cpu_s(late.pid)
    share = meter.cores([late.pid], now=now).get(late.pid, 0)
    assert used >= 0.3 and share * (now - before) >= 0.9 * used - 0.05


def test_a_pods_cpu_is_its_whole_process_tree(spawn):
    pod = spawn(BURN, shell_parent=True)
    tree = _settle(lambda: descendants([pod.pid]), lambda t: len(t.get(pod.pid, [])) >= 2)
    assert len(tree[pod.pid]) == 2 and tree[pod.pid][0] == pod.pid
    assert descendants([1 << 22]) == {}
    sampler = UsageSampler(None, ())
    sampler.sample({"7.0": [pod.pid]})
    sample = _settle(lambda: sampler.sample({"7.0": [pod.pid]}), lambda s: s.pod_cpu.get("7.0", 0) >= 0.4)
    assert sample.pod_cpu["7.0"] >= 0.4, "the pod's child never showed in its CPU"
    assert sample.report()["gpu_util"] == {} and set(sample.report()["pod_cpu"]) == {"7.0"}


def test_the_sample_is_reported_and_exported_as_dcgm_exporter_writes_it(spawn):
    nvml = fake_nvml_from_flags(2, "H100-SXM-80GB", seed="node1")
    nvml.nvmlInit()
    gpus = discover_gpus(nvml)
    sampler = UsageSampler(nvml, gpus)
    assert prometheus_text(sampler.last, gpus, "node1", {}, {}) == ""
    sample = sampler.sample({})
    assert sample.report() == {"gpu_util": {"0": 0.0, "1": 0.0}, "pod_cpu": {}, "gpu_usage": []}
    held = sample.report({1: (12, 0)})["gpu_usage"]
    assert [(x["job_id"], x["run"], x["gpu"], x["util"], x["mem_mib"]) for x in held] == [(12, 0, 1, 0.0, 0)]
    assert held[0]["energy_mj"] >= 0 and held[0]["power_w"] == 70.0  # idle: a tenth of an H100's 700 W
    text = prometheus_text(sample, gpus, "node1", {1: {"namespace": "default", "pod": "llm-abc", "container": "vllm"},
                                                   0: {"hpc_job": "1234"}}, {})
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
    assert (f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{gpus[1].uuid}",device="nvidia1",'
            f'modelName="NVIDIA H100 80GB HBM3",Hostname="node1",namespace="default",pod="llm-abc",'
            f'container="vllm"}} 0') in text
    assert f'DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="{gpus[0].uuid}"' in text and "pod=" not in text.split("\n")[2]
    assert 'Hostname="node1",hpc_job="1234"} 0' in text.split("\n")[2]
    assert "# TYPE DCGM_FI_DEV_POWER_USAGE gauge" in text and 'hpc_job="1234"} 70.0' in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text


def test_a_busy_fake_gpu_holds_its_holders_memory_and_draws_more_power(spawn):
    nvml = fake_nvml_from_flags(2, "A100-SXM4-80GB", seed="node1")
    nvml.nvmlInit()
    spawn("b = bytearray(120 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])\n" + BURN, gpus="1")
    busy, idle = FakeHandle(1), FakeHandle(0)
    _settle(lambda: nvml.nvmlDeviceGetUtilizationRates(busy).gpu, lambda u: u >= 50)
    used = _settle(lambda: nvml.nvmlDeviceGetMemoryInfo(busy).used, lambda u: u >= 120 * 1024 * 1024)
    assert used >= 120 * 1024 * 1024 and nvml.nvmlDeviceGetMemoryInfo(idle).used == 0
    info = nvml.nvmlDeviceGetMemoryInfo(busy)
    assert info.used + info.free == info.total
    assert nvml.nvmlDeviceGetPowerUsage(idle) == 40_000  # mW: a tenth of the A100's 400 W

    def util_and_power():  # read in one sample period (the fake keeps its figures for 0.5 s)
        return nvml.nvmlDeviceGetUtilizationRates(busy).gpu, nvml.nvmlDeviceGetPowerUsage(busy)

    util, power = _settle(util_and_power, lambda up: up[0] >= 30)
    assert power == 40_000 + 3_600 * util, (util, power)  # the rest of the 400 W in step with the load
    e0 = [nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in (idle, busy)]
    time.sleep(1.0)
    e1 = [nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in (idle, busy)]
    assert 35_000 <= e1[0] - e0[0] <= 60_000, (e0, e1)  # ~40 J a second, in mJ
    assert e1[1] - e0[1] > e1[0] - e0[0], (e0, e1)
    usage = read_gpus(nvml, [0, 1])
    assert usage[1].fb_used_mb >= 120 and usage[0].power_w == 40.0 and usage[1].energy_mj >= e1[1]


def test_a_gpu_holders_labels_are_dcgm_exporters_job_mapping():
    batch = {"key": "12.0", "job_id": 12, "run": 0, "gpus": [0, 1]}
    assert holder_labels(batch) == {"hpc_job": "12"}
    pod = {**batch, "pod": {"namespace": "serve", "name": "vllm-7d9f-abcde", "spec": {"containers": [
        {"name": "sidecar"}, {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    assert holder_labels(pod) == {"namespace": "serve", "pod": "vllm-7d9f-abcde", "container": "vllm"}
