"""GPU discovery through NVML, with the fake NVML standing in for the driver."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import textwrap

import pynvml
import pytest

from shoal.agent.gpus import (
    GPU_MODELS,
    FakeGPUConfigError,
    FakeGPUSpec,
    FakeNVML,
    GPUDiscoveryError,
    GPUHealthKind,
    check_health,
    discover_gpus,
    discover_gpus_or_none,
    discover_inventory,
    fake_nvml_from_file,
    fake_nvml_from_flags,
    fake_uuid,
    gpu_model,
    open_nvml,
    watch_xids,
)
from shoal.agent.host import discover_host
from shoal.model.resources import GPU

UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _has_nvml_driver() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_eight_h100s_are_discovered_with_distinct_uuids():
    nvml = open_nvml(fake_nvml_from_flags(8, "H100-SXM-80GB", seed="gpu-node-01"))
    gpus = discover_gpus(nvml)

    assert [g.index for g in gpus] == list(range(8))
    assert len({g.uuid for g in gpus}) == 8
    assert all(UUID.fullmatch(g.uuid) for g in gpus)
    assert {g.product for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.memory_mb for g in gpus} == {81559}
    assert all(g.mig_capable and not g.mig_enabled for g in gpus)


def test_inventory_reports_driver_cuda_and_compute_capability():
    nvml = open_nvml(fake_nvml_from_flags(2, "h200-sxm-141gb", seed="n1"))
    inv = discover_inventory(nvml)
    assert inv.driver_version == "550.54.15"
    assert inv.cuda_version == 12040
    assert inv.compute_capabilities == ((9, 0), (9, 0))
    assert inv.gpus[0] == GPU(0, fake_uuid("n1", 0), "NVIDIA H200", 143771, True, False)


def test_uuids_are_stable_per_node_and_differ_between_nodes():
    a1 = discover_gpus(open_nvml(fake_nvml_from_flags(4, "A100-SXM4-80GB", seed="node-a")))
    a2 = discover_gpus(open_nvml(fake_nvml_from_flags(4, "A100-SXM4-80GB", seed="node-a")))
    b = discover_gpus(open_nvml(fake_nvml_from_flags(4, "A100-SXM4-80GB", seed="node-b")))
    assert [g.uuid for g in a1] == [g.uuid for g in a2]
    assert not {g.uuid for g in a1} & {g.uuid for g in b}


def test_l40s_is_not_mig_capable_because_nvml_says_not_supported():
    fake = fake_nvml_from_flags(4, "L40S", seed="inference-01")
    nvml = open_nvml(fake)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(0))

    gpus = discover_gpus(nvml)
    assert {(g.product, g.memory_mb) for g in gpus} == {("NVIDIA L40S", 46068)}
    assert not any(g.mig_capable or g.mig_enabled for g in gpus)


def test_mig_enabled_a100_is_reported_enabled():
    spec = FakeGPUSpec("NVIDIA A100-SXM4-40GB", 40960, True, True, fake_uuid("n", 0), (8, 0))
    (gpu,) = discover_gpus(open_nvml(FakeNVML([spec])))
    assert gpu.mig_capable and gpu.mig_enabled


def test_model_names_are_case_insensitive_and_unknown_ones_list_the_catalogue():
    assert gpu_model("t4").product == "Tesla T4"
    assert gpu_model(" b200 ").product == "NVIDIA B200"
    with pytest.raises(FakeGPUConfigError) as e:
        fake_nvml_from_flags(8, "H100-SXM-800GB", seed="n")
    message = str(e.value)
    assert "unknown GPU model 'H100-SXM-800GB'" in message
    for model in GPU_MODELS.values():
        assert model.name in message


def test_negative_count_is_rejected():
    with pytest.raises(FakeGPUConfigError, match="--fake-gpus"):
        fake_nvml_from_flags(-1, "T4", seed="n")


def test_fake_refuses_calls_before_init_like_the_driver():
    fake = fake_nvml_from_flags(1, "T4", seed="n")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    nvml = open_nvml(fake)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_lost_gpu_is_left_out_of_discovery_keeping_other_indices():
    fake = fake_nvml_from_flags(4, "H100-SXM-80GB", seed="n")
    fake.mark_lost(1)
    gpus = discover_gpus(open_nvml(fake))
    assert [g.index for g in gpus] == [0, 2, 3]


# --------------------------------------------------------------------- fake GPU files


def _write(tmp_path, text: str):
    path = tmp_path / "fake-gpus.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_fake_file_mixes_catalogue_and_explicit_entries(tmp_path):
    path = _write(tmp_path, """
        driver_version: "535.161.08"
        cuda_version: "12.2"
        gpus:
          - {model: a100-sxm4-80gb, count: 2}
          - {product: "NVIDIA L4", memory_mb: 23034, mig_capable: false}
          - {product: "Prototype X1", memory_mb: 1000, compute_capability: "12.0"}
        """)
    inv = discover_inventory(open_nvml(fake_nvml_from_file(path, seed="node-7")))
    assert [(g.index, g.product, g.memory_mb) for g in inv.gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", 81920),
        (1, "NVIDIA A100-SXM4-80GB", 81920),
        (2, "NVIDIA L4", 23034),
        (3, "Prototype X1", 1000),
    ]
    assert [g.uuid for g in inv.gpus] == [fake_uuid("node-7", i) for i in range(4)]
    assert inv.compute_capabilities == ((8, 0), (8, 0), (8, 9), (12, 0))
    assert (inv.driver_version, inv.cuda_version) == ("535.161.08", 12020)


@pytest.mark.parametrize("text, expected", [
    ("gpus: [{model: H100-SXM-80GB, count: 8}", "not valid YAML"),
    ("- model: T4", "expected a mapping with a 'gpus' list"),
    ("gpus: {model: T4}", "gpus: expected a list"),
    ("gpus: [{model: T4, count: eight}]", "gpus[0].count: expected an integer"),
    ("gpus: [{model: T4}, {model: V100}]", "gpus[1].model: unknown GPU model 'V100'"),
    ("gpus: [{model: T4, colour: green}]", "gpus[0]: unknown field(s) colour"),
    ("gpus: [{product: NVIDIA L4}]", "gpus[0].memory_mb: expected an integer >= 1"),
    ("gpus: [{product: X, memory_mb: 1, mig_capable: yes please}]", "gpus[0].mig_capable"),
    ("gpus: [{model: L40S, mig_enabled: true}]", "gpus[0].mig_enabled: L40S is not MIG"),
    ("gpus: [{count: 8}]", "gpus[0]: needs either 'model'"),
    ("gpus: [{product: X, memory_mb: 1, compute_capability: nine}]",
     "gpus[0].compute_capability"),
    ("gpus: []\ncuda_version: twelve", "cuda_version"),
    ("gpus: [{product: X, memory_mb: 1, uuid: GPU-1}, {product: Y, memory_mb: 1, uuid: GPU-1}]",
     "distinct UUIDs"),
])
def test_fake_file_errors_name_the_field(tmp_path, text, expected):
    path = _write(tmp_path, text)
    with pytest.raises(FakeGPUConfigError) as e:
        fake_nvml_from_file(path, seed="n")
    assert expected in str(e.value)
    assert str(path) in str(e.value)


def test_missing_fake_file_is_reported(tmp_path):
    with pytest.raises(FakeGPUConfigError, match="cannot read fake GPU file"):
        fake_nvml_from_file(tmp_path / "nope.yaml", seed="n")


# --------------------------------------------------------------------------- health


def test_healthy_gpus_report_nothing():
    nvml = open_nvml(fake_nvml_from_flags(8, "H100-SXM-80GB", seed="n"))
    assert check_health(nvml, watch_xids(nvml)) == []


def test_injected_faults_are_found_through_nvml():
    fake = fake_nvml_from_flags(8, "H100-SXM-80GB", seed="n")
    nvml = open_nvml(fake)
    events = watch_xids(nvml)

    fake.inject_xid(2, 13)  # an application's illegal address: not the GPU's fault
    fake.inject_xid(3, 94)  # contained ECC error
    fake.inject_ecc(5, uncorrected=2)
    fake.mark_lost(6)

    found = check_health(nvml, events)
    by_kind = {(e.kind, e.index) for e in found}
    assert by_kind == {(GPUHealthKind.XID, 3), (GPUHealthKind.ECC, 5), (GPUHealthKind.LOST, 6)}
    xid = next(e for e in found if e.kind is GPUHealthKind.XID)
    assert (xid.xid, xid.uuid) == (94, fake_uuid("n", 3))
    ecc = next(e for e in found if e.kind is GPUHealthKind.ECC)
    assert "2 uncorrected" in ecc.detail

    # States persist from poll to poll; the XID was an event and is consumed.
    again = {(e.kind, e.index) for e in check_health(nvml, events)}
    assert again == {(GPUHealthKind.ECC, 5), (GPUHealthKind.LOST, 6)}


def test_xid_side_effects_show_without_an_event_set():
    fake = fake_nvml_from_flags(4, "A100-SXM4-80GB", seed="n")
    nvml = open_nvml(fake)
    fake.inject_xid(0, 48)  # double-bit ECC error
    fake.inject_xid(1, 79)  # fallen off the bus
    found = {(e.kind, e.index) for e in check_health(nvml)}
    assert found == {(GPUHealthKind.ECC, 0), (GPUHealthKind.LOST, 1)}


def test_faults_appended_to_the_fault_file_break_a_running_fake(tmp_path, caplog):
    """The hook tests use to break a running agent's GPUs from outside: lines appended to a
    file are applied once each, through the same NVML calls the health check makes."""
    fake = fake_nvml_from_flags(4, "H100-SXM-80GB", seed="n")
    faults = tmp_path / "fake-gpu-faults"
    fake.follow_faults(faults)
    nvml = open_nvml(fake)
    events = watch_xids(nvml)
    assert check_health(nvml, events) == []  # no file yet: healthy

    faults.write_text("# comments and blank lines are skipped\n\nxid 1 79\necc 2 3\nbogus 7\nxid 3 6")
    found = check_health(nvml, events)
    assert {(e.kind, e.index) for e in found} == {
        (GPUHealthKind.XID, 1), (GPUHealthKind.LOST, 1), (GPUHealthKind.ECC, 2)}
    assert [e.describe() for e in found if e.kind is GPUHealthKind.XID] == [
        "GPU 1 XID 79 (GPU has fallen off the bus)"]
    assert "ignoring fault line 'bogus 7'" in caplog.text
    # The unfinished last line waits for its newline; then applied once, never again.
    with faults.open("a") as f:
        f.write("2\n")  # XID 62: not in the catalogue, named by its number
    assert [e.describe() for e in check_health(nvml, events) if e.kind is GPUHealthKind.XID] == ["GPU 3 XID 62"]
    assert [e.describe() for e in check_health(nvml, events) if not e.lasting] == []

    with faults.open("a") as f:
        f.write("reset 1\nreset 2\n")
    assert check_health(nvml, events) == []
    assert fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(1)) == fake_uuid("n", 1)


# --------------------------------------------------------------------------- real NVML


@pytest.mark.skipif(_has_nvml_driver(), reason="this machine has an NVIDIA driver")
def test_real_nvml_without_a_driver_fails_cleanly():
    with pytest.raises(GPUDiscoveryError) as e:
        open_nvml(None)
    assert "--fake-gpus" in str(e.value)
    assert isinstance(e.value.__cause__, pynvml.NVMLError_LibraryNotFound)


@pytest.mark.skipif(_has_nvml_driver(), reason="this machine has an NVIDIA driver")
def test_node_without_driver_or_fake_comes_up_with_no_gpus():
    assert discover_gpus_or_none(None) is None


def test_discover_or_none_with_a_fake_opens_and_closes_it():
    fake = fake_nvml_from_flags(2, "T4", seed="n")
    inv = discover_gpus_or_none(fake)
    assert inv is not None and len(inv.gpus) == 2
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


class _InitFails(FakeNVML):
    """A driver whose nvmlInit fails with ``error``."""

    def __init__(self, error):
        super().__init__([])
        self.error = error

    def nvmlInit(self):
        raise self.error()


def test_driver_not_loaded_means_a_node_without_gpus():
    assert discover_gpus_or_none(_InitFails(pynvml.NVMLError_DriverNotLoaded)) is None


def test_broken_driver_is_an_error_not_zero_gpus():
    with pytest.raises(GPUDiscoveryError, match="cannot open NVML") as e:
        discover_gpus_or_none(_InitFails(pynvml.NVMLError_LibRmVersionMismatch))
    assert "--fake-gpus" not in str(e.value)


def test_broken_gpu_raises_discovery_error_naming_it():
    class FailingName(FakeNVML):
        def nvmlDeviceGetName(self, handle):
            raise pynvml.NVMLError_Unknown()

    with pytest.raises(GPUDiscoveryError, match="GPU 0"):
        discover_gpus_or_none(FailingName([FakeGPUSpec("X", 1, False, False, "GPU-x")]))


def test_agent_modules_import_light():
    code = ("import sys, shoal.agent.gpus, shoal.agent.labels, shoal.agent.host; "
            "bad = {'pynvml', 'psutil', 'yaml', 'fastapi', 'sqlalchemy', 'shoal.server', "
            "'shoal.store'} & set(sys.modules); print(sorted(bad))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- host


def test_host_facts_come_from_the_machine_and_config_overrides_win():
    host = discover_host()
    assert host.cpus == os.cpu_count()
    assert host.memory_mb > 0 and host.boot_time > 0 and host.kernel and host.hostname
    assert "." not in host.hostname

    configured = discover_host(cpus=4, memory_mb=2048)
    assert (configured.cpus, configured.memory_mb) == (4, 2048)
    assert configured.kernel == host.kernel

    with pytest.raises(ValueError, match="memory_mb"):
        discover_host(memory_mb=0)
