"""The container toolkit's part: a CDI specification of the node's GPUs, as
``nvidia-ctk cdi generate`` writes one, so runtimes take GPUs by name (``nvidia.com/gpu=0``).

Each GPU is a CDI device with its device node; what every GPU container needs (the control
and UVM device nodes, the driver's libraries and binaries) is the spec's common edits.
Fake GPUs get stand-in device nodes (char 195:N, the NVIDIA major: opening one fails with
ENXIO, as the driver is absent), and a kind of their own agent (``fake-<tag>.shoal.io/gpu``),
since one machine runs several fake nodes. Podman 4.3 reads specs from /etc/cdi and
/var/run/cdi only, so the agent writes its own to /var/run/cdi (volatile, as nvidia-ctk's).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from shoal.agent.cgroups import fake_device_nodes

log = logging.getLogger("shoal.agent")
SPEC_DIR = Path("/var/run/cdi")
CDI_VERSION = "0.5.0"
# What nvidia-ctk mounts of the driver (the user-space libraries CUDA and NVML need, and tools).
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so",
                    "libcudadebugger.so", "libnvidia-opencl.so", "libnvidia-cfg.so")
DRIVER_BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
                   "nvidia-cuda-mps-server")


def driver_files() -> tuple[list[str], list[str]]:
    """The driver's libraries (from the linker cache) and binaries (on PATH) on this node."""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        cache = ""
    libs = sorted({line.rpartition("=> ")[2].strip() for line in cache.splitlines()
                   if "=> " in line and line.strip().startswith(DRIVER_LIBRARIES) and "x86-64" in line})
    from shutil import which

    bins = [p for p in (which(b) for b in DRIVER_BINARIES) if p]
    return libs, bins


def gpu_spec(kind: str, devices: dict[int, str], common_nodes: dict[str, str], libs: Iterable[str] = (),
             bins: Iterable[str] = ()) -> dict:
    """A CDI spec: one device per GPU index (``devices``: index -> its device node on the
    host, seen at ``/dev/nvidiaN`` inside), ``all``, and the common edits (``common_nodes``:
    container path -> host path; the driver's files mounted read-only where they are)."""
    def node(index: int, host: str) -> dict:
        return {"path": f"/dev/nvidia{index}", "hostPath": host}

    mounts = [{"hostPath": p, "containerPath": p, "options": ["ro", "nosuid", "nodev", "bind"]}
              for p in [*libs, *bins]]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [{"name": str(i), "containerEdits": {"deviceNodes": [node(i, host)]}}
                    for i, host in sorted(devices.items())]
                   + [{"name": "all", "containerEdits": {"deviceNodes": [node(i, h) for i, h in sorted(devices.items())]}}],
        "containerEdits": {
            "deviceNodes": [{"path": path, "hostPath": host} for path, host in common_nodes.items()],
            "mounts": mounts,
        },
    }


def write_node_spec(indices: list[int], fake: bool, workdir: Path, tag: str,
                    spec_dir: Path = SPEC_DIR) -> tuple[str, Path] | None:
    """Write this node's spec; returns its kind and file, or None (no GPUs, no stand-ins, or
    a spec directory the agent cannot write)."""
    if not indices:
        return None
    if fake:
        dev = fake_device_nodes(workdir / "dev", indices)
        if dev is None:
            return None
        kind = f"fake-{tag}.shoal.io/gpu"
        devices = {i: str(dev / f"nvidia{i}") for i in indices}
        common = {"/dev/nvidiactl": str(dev / "nvidiactl")}
        libs: list[str] = []
        bins: list[str] = []
    else:
        kind = "nvidia.com/gpu"
        devices = {i: f"/dev/nvidia{i}" for i in indices}
        common = {p: p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") if os.path.exists(p)}
        libs, bins = driver_files()
    path = spec_dir / f"shoal-{tag}.json"
    try:
        spec_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(gpu_spec(kind, devices, common, libs, bins), indent=1))
        tmp.replace(path)
    except OSError as e:
        log.warning("no CDI specification for this node's GPUs in %s: %s", spec_dir, e.strerror)
        return None
    return kind, path
